"""Python's overhead over the Rust calls it wraps, measured in one process:
``learner.update(x)`` called from Python versus the same call in a Rust
loop (``_native._time_update``), and ``learner.etrace_grad(xs, ys)`` over a
sequence likewise. Rounds alternate Python and Rust so both see the same
machine load; the medians of the rounds are reported.

    python python/bench/overhead.py            # GRU 32 units, batch 1 and 16
    python python/bench/overhead.py --quick

Goals (issue 36): update overhead <= 5 us per call; etrace_grad within
1.05x of Rust.
"""

import argparse
import os
import statistics
import time

# One core for the library's kernels (as bench_learn's default): the time
# measured is this thread's.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("MATMUL_NUM_THREADS", "1")

import numpy as np

import braintrace_rs as bt
from braintrace_rs import _native, nn


def learner(hidden, batch, algo):
    model = nn.Sequential(nn.GRUCell(16, hidden, name="rnn"), nn.Linear(hidden, 4, name="out"))
    a = bt.D_RTRL() if algo == "d_rtrl" else bt.pp_prop(0.95)
    return bt.compile(model, a, np.zeros((batch, 16), np.float32), batch_size=batch)


# CPU time of the process (all its threads: some kernels run on the
# library's one pool thread): far steadier than wall time on a shared machine.
clock = time.process_time


def python_update(l, x, n):
    t0 = clock()
    for _ in range(n):
        l.update(x)
    return clock() - t0


def rust_update(l, x, n):
    t0 = clock()
    _native._time_update(l, x, n)
    return clock() - t0


def python_etrace(l, xs, ys, n):
    t0 = clock()
    for _ in range(n):
        l.etrace_grad(xs, ys, "mse")
    return clock() - t0


def rust_etrace(l, xs, ys, n):
    t0 = clock()
    _native._time_etrace_grad(l, xs, ys, n)
    return clock() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    rounds = 2 if args.quick else args.rounds
    n_upd = 200 if args.quick else 3000
    n_seq, t_len = (2, 20) if args.quick else (20, 100)
    rng = np.random.default_rng(0)
    print(f"{'config':<26} {'python us':>10} {'rust us':>9} {'overhead us':>12} {'ratio':>7}")
    for algo in ("d_rtrl", "pp_prop"):
        for batch in (1, 16):
            l = learner(32, batch, algo)
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            py_t, rs_t = [], []
            python_update(l, x, 50)
            for _ in range(rounds):
                py_t.append(python_update(l, x, n_upd) / n_upd * 1e6)
                rs_t.append(rust_update(l, x, n_upd) / n_upd * 1e6)
            a, b = statistics.median(py_t), statistics.median(rs_t)
            print(f"update {algo} h32 b{batch:<10} {a:10.2f} {b:9.2f} {a - b:12.2f} {a / b:7.3f}", flush=True)

            xs = rng.standard_normal((t_len, batch, 16)).astype(np.float32)
            ys = rng.standard_normal((t_len, batch, 4)).astype(np.float32)
            python_etrace(l, xs, ys, 1)
            py_t, rs_t = [], []
            for _ in range(rounds):
                py_t.append(python_etrace(l, xs, ys, n_seq) / n_seq * 1e6)
                rs_t.append(rust_etrace(l, xs, ys, n_seq) / n_seq * 1e6)
            a, b = statistics.median(py_t), statistics.median(rs_t)
            print(f"etrace_grad T{t_len} {algo} b{batch:<5} {a:10.1f} {b:9.1f} {a - b:12.1f} {a / b:7.3f}", flush=True)


if __name__ == "__main__":
    main()
