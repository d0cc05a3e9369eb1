"""Online training of a GRU network on evidence accumulation, from Python:
count left and right cues over 30 steps, hold the count through a 10-step
delay, answer on a go signal (chance is 50%). The Python version of
``cargo run --release --example train_gru``: D-RTRL (or ``--algo
pp_prop``), one Adam step per batch of 32 trials, the gradient clipped to
norm 1, memory constant in the trial length.

    python python/examples/train_gru.py            # ~800 iterations, checks >= 90%
    python python/examples/train_gru.py --quick    # 10 iterations, no check

Exits with status 1 when the test accuracy stays below the threshold.
"""

import argparse
import sys
import time

import numpy as np

import braintrace_rs as bt
from braintrace_rs import nn

CUE, DELAY, GO = 30, 10, 2
P_CUE, P_MAJOR = 0.5, 0.6
N_IN, N_OUT = 3, 2


def sample(batch, rng):
    """``batch`` trials, time-major: inputs ``(T, B, 3)`` (left cue, right
    cue, go), one-hot targets ``(T, B, 2)`` on the go steps (zeros
    elsewhere), and each trial's answer (0 left, 1 right). Ties in the cue
    counts are drawn again."""
    t_len = CUE + DELAY + GO
    xs = np.zeros((t_len, batch, N_IN), np.float32)
    ys = np.zeros((t_len, batch, N_OUT), np.float32)
    labels = np.zeros(batch, np.int64)
    for b in range(batch):
        while True:
            major = rng.integers(2)
            cue = rng.random(CUE) < P_CUE
            side = np.where(rng.random(CUE) < P_MAJOR, major, 1 - major)
            left, right = np.sum(cue & (side == 0)), np.sum(cue & (side == 1))
            if left != right:
                break
        label = int(right > left)
        labels[b] = label
        xs[:CUE, b, 0] = cue & (side == 0)
        xs[:CUE, b, 1] = cue & (side == 1)
        xs[CUE + DELAY :, b, 2] = 1.0
        ys[CUE + DELAY :, b, label] = 1.0
    return xs, ys, labels


def accuracy(learner, xs, labels):
    """The fraction of trials whose output at the last step points to the
    right answer (the model run over the whole batch, without learning)."""
    out = learner.forward(xs)
    return float(np.mean(np.argmax(out[-1], axis=-1) == labels))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["d_rtrl", "pp_prop"], default="d_rtrl")
    p.add_argument("--pp-decay", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="iterations (default 800, 10 with --quick)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--quick", action="store_true", help="a few iterations; the threshold is not checked")
    p.add_argument("--save", default=None, help="write the trained parameters (safetensors) here")
    args = p.parse_args(argv)
    steps = args.steps if args.steps is not None else (10 if args.quick else 800)

    model = nn.Sequential(nn.GRUCell(N_IN, args.hidden, name="rnn"), nn.Linear(args.hidden, N_OUT, name="readout"))
    if args.algo == "d_rtrl":
        algo = bt.D_RTRL(non_temporal="in_step")
    else:
        algo = bt.pp_prop(args.pp_decay, non_temporal="in_step")
    x0 = np.zeros((args.batch, N_IN), np.float32)
    learner = bt.compile(model, algo, x0, batch_size=args.batch, seed=args.seed)
    opt = bt.Adam(args.lr)
    rng = np.random.default_rng(args.seed + 1)
    eval_xs, _, eval_labels = sample(256, np.random.default_rng(args.seed + 77))
    print(f"evidence accumulation: {CUE} cue steps, {DELAY} delay steps, {GO} go steps; "
          f"GRU with {args.hidden} units, {args.algo}")

    start = time.perf_counter()
    smooth = None
    for it in range(steps):
        xs, ys, _ = sample(args.batch, rng)
        learner.reset_state()
        grads, losses = learner.etrace_grad(xs, ys, "cross_entropy", "sum")
        loss = float(losses.sum()) / GO
        grads, _ = bt.clip_grad_norm(grads, 1.0)
        opt.step(learner, grads)
        smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
        if (it + 1) % 50 == 0 or it + 1 == steps:
            acc = accuracy(learner, eval_xs, eval_labels)
            print(f"iteration {it + 1:>5}/{steps}  loss {smooth:.4f}  held-out accuracy {100 * acc:.1f}%  "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
    elapsed = time.perf_counter() - start

    test_xs, _, test_labels = sample(1000, np.random.default_rng(args.seed + 1_000_003))
    acc = accuracy(learner, test_xs, test_labels)
    print(f"trained {steps} iterations of {args.batch} trials in {elapsed:.1f} s")
    if args.save:
        learner.save(args.save)
        print(f"weights: {args.save}")
    if args.quick:
        print(f"test accuracy {100 * acc:.1f}% on 1000 new trials (chance 50%); quick mode, "
              f"the {100 * args.threshold:.0f}% threshold is not checked")
        return 0
    ok = acc >= args.threshold
    print(f"test accuracy {100 * acc:.1f}% on 1000 new trials (chance 50%, required "
          f"{100 * args.threshold:.0f}%): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
