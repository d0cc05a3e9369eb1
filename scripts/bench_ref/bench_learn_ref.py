#!/usr/bin/env python3
"""Reference for ``examples/bench_learn/``: the same online-learning workloads
on braintrace 0.2.6 / JAX, printing the same JSON lines.

Grid: model {gru, lif} x algorithm {d_rtrl, pp_prop (decay 0.95)} x hidden
{128, 512} x batch {16, 64}; input 16, output 4, T = 100, float32. The
filters ``--model``, ``--algo``, ``--n-rec``, ``--batch``, ``--T`` take one
value or a comma-separated list, as in the Rust example.

Models (golden README section 6.1, the same equations as the Rust nets):

* gru: ``braintrace.nn.GRUCell(16, n_rec)`` (attribute ``rnn``) then
  ``braintrace.nn.Linear(n_rec, 4)`` (``out``).
* lif: ``s = S(v - v_th)``, ``i' = g*i + [x, s] @ rec.W + rec.b``,
  ``v' = b*(v - v_th*s) + i'``, then ``braintrace.nn.LeakyRateReadout`` of
  ``S(v' - v_th)`` with decay ``exp(-dt/tau)``, ``dt = 1``, ``tau = 5``;
  beta 0.8, gamma 0.6, v_th 1; ``S`` is the Heaviside step with the
  surrogate derivative ``1 / (1 + (pi u)^2)`` (a ``jax.custom_jvp``).
* lif_syn: ``braintrace.nn.Linear(16 + n_rec, n_rec)`` (``syn_in``) over
  ``[x, neu.get_spike()]``, ``brainpy.state.Expon(tau=5)`` (``syn``),
  ``brainpy.state.LIF(tau=10)`` (``neu``; V_th 1, soft reset, ReluGrad),
  ``braintrace.nn.LeakyRateReadout(tau=5)`` (``readout``) of its spikes.
* alif: the same without the synapse, with ``brainpy.state.ALIF(tau=10,
  tau_a=100, beta=0.1)``.
  Both train with the cross-entropy against ``softmax(y)``
  (``mean_b sum_k softmax(y)_k * -log_softmax(o)_k``), the others with MSE.

Each configuration: ``braintrace.compile(model, algo, zeros(B, 16),
batch_size=B)`` (timed: ``compile_ms``), then one function
``brainstate.transform.jit(lambda xs, ys: learner.etrace_grad(xs, ys,
step_fn=mse, return_value=True))`` over the whole (T, B, .) sequence. Its
first call (XLA compile + one run) is ``first_call_ms``; then it is timed up
to three times while the time budget (``--budget-s``, default 20 s) lasts, at
least once, and ``ms_per_step`` is the median call time / T;
``cpu_ms_per_step`` is the same with the process's CPU time
(``time.process_time``, all threads), much steadier than wall time on a
shared, loaded machine (the budget counts CPU time). Every timed call ends
with ``jax.block_until_ready``. Each configuration runs in its own
child process so ``peak_rss_mb`` (``VmHWM`` of ``/proc/self/status``, MiB)
is its own.

One core: by default every child is pinned to one CPU
(``os.sched_setaffinity``) and ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`` is set before JAX is imported, because
braintrace-rs is single-threaded (the flags alone were measured not to stop
XLA from using both cores). ``--all-cores`` lifts both. ``--cpu N`` chooses
the CPU (default: the lowest allowed).

Setup: ``scripts/ref_venv.sh`` makes the venv ``.venv-ref/`` in the
repository (or set ``BRAINTRACE_REF_PY`` to a python with braintrace 0.2.6).

Run (from the repository root)::

    "$(scripts/ref_python.sh)" scripts/bench_ref/bench_learn_ref.py > ref.jsonl
    cargo run --release --example bench_learn > rs.jsonl
    python3 scripts/bench_compare.py rs.jsonl ref.jsonl

``BENCH_QUICK=1`` runs a smoke grid (hidden 32, batch 4, T 5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N_IN, N_OUT = 16, 4
PP_DECAY = 0.95
# The other algorithms, by braintrace's name, with the options their
# defaults need (bench_learn runs them through `Algorithm::by_name`).
ALGO_OPTIONS = {
    "eprop": lambda: {},
    "ostl_recurrent": lambda: {},
    "ostl_feedforward": lambda: {},
    "three_factor": lambda: {"modulator": 1.0},
    # DNI gets braintrace's default (zero) synthesiser once compiled.
    "dni": lambda: {},
}
# SnAp (order 1 or 2), UORO and random projection, with their options.
EXTRA_ALGOS = ("snap1", "snap2", "uoro", "random_projection")
SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
QUICK = os.environ.get("BENCH_QUICK") is not None


# bench_learn's cell zoo (examples/zoo): braintrace.nn's cell `rnn` and a
# Linear readout `out`; `<cell>_ce` trains with softmax cross-entropy on
# integer labels instead of the MSE.
ZOO_CELLS = {
    "vanilla": "ValinaRNNCell", "mgu": "MGUCell", "minimal": "MinimalRNNCell",
    "cfn": "CFNCell", "lstm": "LSTMCell", "urlstm": "URLSTMCell", "minigru": "MiniGRU",
    "minilstm": "MiniLSTM", "lru": "LRUCell",
}


def csv(kind):
    def parse(s):
        return [kind(v.strip()) for v in s.split(",")]
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=csv(str), default=["gru", "lif"])
    p.add_argument("--algo", type=csv(str), default=["d_rtrl", "pp_prop"])
    p.add_argument("--n-rec", type=csv(int), default=[32] if QUICK else [128, 512])
    p.add_argument("--batch", type=csv(int), default=[4] if QUICK else [16, 64])
    p.add_argument("--T", type=csv(int), default=[5] if QUICK else [100])
    p.add_argument("--budget-s", type=float, default=20.0,
                   help="time budget for the timed calls of one configuration")
    p.add_argument("--all-cores", action="store_true",
                   help="do not pin to one CPU and do not restrict XLA's threads")
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for m in a.model:
        if (m not in ("gru", "lif", "lif_syn", "alif")
                and m.removesuffix("_ce") not in ZOO_CELLS):
            p.error(f"--model: {m!r} is not gru, lif, lif_syn, alif nor a cell of"
                    f" {sorted(ZOO_CELLS)} (optionally with `_ce`)")
    for al in a.algo:
        if al not in ("d_rtrl", "pp_prop") and al not in ALGO_OPTIONS and al not in EXTRA_ALGOS:
            p.error(f"--algo: {al!r} is not one of d_rtrl, pp_prop, "
                    f"{', '.join(list(ALGO_OPTIONS) + list(EXTRA_ALGOS))}")
    return a


def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return None


# ---------------------------------------------------------------------------
# child: one configuration
# ---------------------------------------------------------------------------

def run_child(a):
    if not a.all_cores:
        os.environ.setdefault("XLA_FLAGS", SINGLE_THREAD_FLAGS)
        cpu = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
    # jax must be imported only after XLA_FLAGS and the affinity are final.
    import numpy as np
    import jax
    import jax.numpy as jnp
    import brainstate
    import braintrace

    model_name, algo, n_rec, batch, t_len = (
        a.model[0], a.algo[0], a.n_rec[0], a.batch[0], a.T[0])
    brainstate.environ.set(dt=1.0)
    brainstate.random.seed(0)

    @jax.custom_jvp
    def spike(u):
        return (u > 0).astype(u.dtype)

    @spike.defjvp
    def _spike_jvp(primals, tangents):
        (u,), (du,) = primals, tangents
        return spike(u), du / (1.0 + (jnp.pi * u) ** 2)

    class GruNet(brainstate.nn.Module):
        def __init__(self, n_in, n_rec, n_out):
            super().__init__()
            self.rnn = braintrace.nn.GRUCell(n_in, n_rec)
            self.out = braintrace.nn.Linear(n_rec, n_out)

        def update(self, x):
            return self.out(self.rnn(x))

    class LifNet(brainstate.nn.Module):
        def __init__(self, n_in, n_rec, n_out, beta=0.8, gamma=0.6, v_th=1.0,
                     tau_out=5.0):
            super().__init__()
            self.n_rec, self.beta, self.gamma, self.v_th = n_rec, beta, gamma, v_th
            self.rec = braintrace.nn.Linear(n_in + n_rec, n_rec)
            self.readout = braintrace.nn.LeakyRateReadout(n_rec, n_out, tau=tau_out)

        def init_state(self, batch_size=None, **kwargs):
            shape = (self.n_rec,) if batch_size is None else (batch_size, self.n_rec)
            self.i = brainstate.HiddenState(jnp.zeros(shape))
            self.v = brainstate.HiddenState(jnp.zeros(shape))

        def reset_state(self, batch_size=None, **kwargs):
            shape = (self.n_rec,) if batch_size is None else (batch_size, self.n_rec)
            self.i.value = jnp.zeros(shape)
            self.v.value = jnp.zeros(shape)

        def update(self, x):
            i, v = self.i.value, self.v.value
            s = spike(v - self.v_th)
            i_new = self.gamma * i + self.rec(jnp.concatenate([x, s], axis=-1))
            v_new = self.beta * (v - self.v_th * s) + i_new
            self.i.value = i_new
            self.v.value = v_new
            return self.readout(spike(v_new - self.v_th))

    class ZooNet(brainstate.nn.Module):
        def __init__(self, cell, n_in, n_rec, n_out):
            super().__init__()
            self.rnn = getattr(braintrace.nn, ZOO_CELLS[cell])(n_in, n_rec)
            # The LRU's output has the input's width.
            self.out = braintrace.nn.Linear(n_in if cell == "lru" else n_rec, n_out)

        def update(self, x):
            return self.out(self.rnn(x))

    class SnnNet(brainstate.nn.Module):
        def __init__(self, n_in, n_rec, n_out, adaptive):
            super().__init__()
            import brainpy
            import braintools
            c0 = braintools.init.Constant(0.)
            self.syn_in = braintrace.nn.Linear(n_in + n_rec, n_rec)
            if adaptive:
                self.syn = None
                self.neu = brainpy.state.ALIF(n_rec, R=1., tau=10., tau_a=100., beta=0.1,
                                              V_th=1., V_reset=0., V_rest=0.,
                                              V_initializer=c0, a_initializer=c0)
            else:
                self.syn = brainpy.state.Expon(n_rec, tau=5., g_initializer=c0)
                self.neu = brainpy.state.LIF(n_rec, R=1., tau=10., V_th=1., V_reset=0.,
                                             V_rest=0., V_initializer=c0)
            self.readout = braintrace.nn.LeakyRateReadout(n_rec, n_out, tau=5.)

        def update(self, x):
            i = self.syn_in(jnp.concatenate([x, self.neu.get_spike()], axis=-1))
            if self.syn is not None:
                i = self.syn(i)
            return self.readout(self.neu(i))

    cell = model_name.removesuffix("_ce")
    ce = cell in ZOO_CELLS and model_name.endswith("_ce")
    if cell in ZOO_CELLS:
        model = ZooNet(cell, N_IN, n_rec, N_OUT)
    elif model_name in ("lif_syn", "alif"):
        model = SnnNet(N_IN, n_rec, N_OUT, adaptive=model_name == "alif")
    else:
        model = (GruNet if model_name == "gru" else LifNet)(N_IN, n_rec, N_OUT)
    x0 = jnp.zeros((batch, N_IN), jnp.float32)
    t0 = time.perf_counter()
    if algo == "d_rtrl":
        learner = braintrace.compile(model, braintrace.D_RTRL, x0, batch_size=batch)
    elif algo in ALGO_OPTIONS:
        # By name with its defaults, as bench_learn's `Algorithm::by_name`.
        learner = braintrace.compile(model, algo, x0, batch_size=batch, **ALGO_OPTIONS[algo]())
    elif algo in ("snap1", "snap2"):
        learner = braintrace.compile(model, braintrace.SnAp, x0, batch_size=batch,
                                     n=1 if algo == "snap1" else 2)
    elif algo == "uoro":
        learner = braintrace.compile(model, braintrace.UORO, x0, batch_size=batch)
    elif algo == "random_projection":
        learner = braintrace.compile(model, braintrace.RandomProjectionVjpAlgorithm, x0,
                                     batch_size=batch)
    else:
        learner = braintrace.compile(model, braintrace.pp_prop, x0, batch_size=batch,
                                     decay_or_rank=PP_DECAY)
    if algo == "dni":
        learner.attach_synthesizer(braintrace.SyntheticGradient(learner.group_signal_shapes()))
    compile_ms = (time.perf_counter() - t0) * 1e3

    def mse(x, y):
        if model_name in ("lif_syn", "alif"):
            logp = jax.nn.log_softmax(learner(x), axis=-1)
            return -jnp.mean(jnp.sum(jax.nn.softmax(y, axis=-1) * logp, axis=-1))
        return jnp.mean((learner(x) - y) ** 2)

    def cross_entropy(x, y):
        logp = jax.nn.log_softmax(learner(x), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y.astype(jnp.int32)[..., None], axis=-1))

    @brainstate.transform.jit
    def run(xs, ys):
        return learner.etrace_grad(xs, ys, step_fn=cross_entropy if ce else mse,
                                   return_value=True)

    rng = np.random.default_rng(11)
    # Inputs in [0, 1) so the LIF net receives drive; targets in [-1, 1).
    xs = jnp.asarray(rng.random((t_len, batch, N_IN), dtype=np.float32))
    ys = jnp.asarray(rng.uniform(-1, 1, (t_len, batch, N_OUT)).astype(np.float32))
    if ce:
        ys = jnp.asarray(rng.integers(0, N_OUT, (t_len, batch)).astype(np.float32))

    t0 = time.perf_counter()
    jax.block_until_ready(run(xs, ys))
    first_call_ms = (time.perf_counter() - t0) * 1e3

    times, cpu_times = [], []
    spent = 0.0
    while len(times) < 3 and (not times or spent < a.budget_s):
        c0, t0 = time.process_time(), time.perf_counter()
        jax.block_until_ready(run(xs, ys))
        el = time.perf_counter() - t0
        cpu = time.process_time() - c0
        times.append(el)
        cpu_times.append(cpu)
        spent += cpu
    rss = peak_rss_mb()
    print(json.dumps({
        "impl": "braintrace-0.2.6",
        "model": model_name,
        "algo": algo,
        "n_in": N_IN,
        "n_rec": n_rec,
        "n_out": N_OUT,
        "batch": batch,
        "T": t_len,
        "ms_per_step": round(statistics.median(times) * 1e3 / t_len, 4),
        "cpu_ms_per_step": round(statistics.median(cpu_times) * 1e3 / t_len, 4),
        "compile_ms": round(compile_ms, 2),
        "peak_rss_mb": None if rss is None else round(rss, 1),
        "steps_timed": t_len,
        "runs": len(times),
        "first_call_ms": round(first_call_ms, 2),
        "jax": jax.__version__,
        "braintrace": braintrace.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpus": sorted(os.sched_getaffinity(0)),
    }), flush=True)


# ---------------------------------------------------------------------------
# parent: the grid, one child per configuration
# ---------------------------------------------------------------------------

def main():
    a = parse_args()
    if a.child:
        run_child(a)
        return
    cfgs = [(m, al, n, b, t) for m in a.model for al in a.algo
            for n in a.n_rec for b in a.batch for t in a.T]
    print(f"bench_learn_ref: {len(cfgs)} configuration(s), f32, "
          f"{'all cores' if a.all_cores else 'one core'}, budget {a.budget_s} s",
          file=sys.stderr)
    rows, failed = [], 0
    for m, al, n, b, t in cfgs:
        cmd = [sys.executable, os.path.abspath(__file__), "--child",
               "--model", m, "--algo", al, "--n-rec", str(n), "--batch", str(b),
               "--T", str(t), "--budget-s", str(a.budget_s)]
        if a.all_cores:
            cmd.append("--all-cores")
        if a.cpu is not None:
            cmd += ["--cpu", str(a.cpu)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        line = next((l for l in r.stdout.splitlines() if l.startswith("{")), None)
        if r.returncode != 0 or line is None:
            failed += 1
            tail = "\n".join(r.stderr.strip().splitlines()[-5:])
            print(f"{(m, al, n, b, t)}: child failed ({r.returncode}): {tail}",
                  file=sys.stderr)
            continue
        print(line, flush=True)
        rows.append(json.loads(line))
    print(file=sys.stderr)
    print(f"{'model':<5} {'algo':<8} {'n_rec':>6} {'batch':>6} {'T':>6} "
          f"{'ms/step':>10} {'cpu ms/step':>12} {'compile ms':>11} {'1st call ms':>12} "
          f"{'RSS MiB':>8}",
          file=sys.stderr)
    for r in rows:
        print(f"{r['model']:<5} {r['algo']:<8} {r['n_rec']:>6} {r['batch']:>6} "
              f"{r['T']:>6} {r['ms_per_step']:>10.4f} {r['cpu_ms_per_step']:>12.4f} "
              f"{r['compile_ms']:>11.1f} "
              f"{r['first_call_ms']:>12.1f} {r['peak_rss_mb']:>8.1f}",
              file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
