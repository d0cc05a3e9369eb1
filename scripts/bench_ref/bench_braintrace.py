#!/usr/bin/env python3
"""Reference baseline: the Python braintrace / JAX stack on this CPU.

Mirrors the workloads of ``examples/bench_core.rs`` and
``examples/bench_etp.rs`` so their numbers can be put side by side with
braintrace-rs:

1. GRU step (batch 16, input 16, hidden 128, f32), with exactly the
   equations of ``bench_core.rs::gru_step``::

       xh = [x, h];  z = sigmoid(xh @ Wz + bz);  r = sigmoid(xh @ Wr + br)
       hc = tanh([x, r * h] @ Wh + bh);          h' = (1 - z) * h + z * hc

   Forward, and ``value_and_grad`` of ``mean(h'^2)`` w.r.t. all 8 arguments;
   each under ``jax.jit`` and, for reference, eagerly (op-by-op dispatch).
2. ``jnp.dot`` f32 at 256^3 and 1024^3 (jit and eager), in ms and GFLOP/s.
3. braintrace's ``etp_mm`` primitive at B=16, I=O=256, f32: forward
   ``bind``; the registered ``dt_to_t`` rule (what braintrace-rs calls
   ``yw_to_w``) on a (16, 256, 256) weight trace with hidden (16, 256); the
   registered ``xy_to_dw`` rule; and all three in one function.
4. braintrace's ``etp_conv`` primitive forward at B=8, 16 -> 32 channels,
   32x32, 3x3 kernel, SAME padding, NCHW / OIHW, in ms and GFLOP/s.

Inputs are generated with the same 64-bit LCGs as the Rust examples, so the
data are bit-identical to theirs. Every timed call ends with
``jax.block_until_ready`` on its outputs; reported times are medians of
repeated runs after warm-up calls (run counts copied from the Rust examples,
or larger where the Rust count is very small).

Run (from the repository root)::

    /tmp/bt-venv/bin/python scripts/bench_ref/bench_braintrace.py
    # XLA restricted to one thread (the Rust numbers are single-threaded):
    /tmp/bt-venv/bin/python scripts/bench_ref/bench_braintrace.py --single-thread

``--single-thread`` sets ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`` (only if ``XLA_FLAGS`` is not already set)
and, because with jax/jaxlib 0.10.2 those flags alone were measured *not*
to stop XLA from using both cores for dot/conv (process CPU time / wall
time stayed ~1.9), it also pins the process to one CPU with
``os.sched_setaffinity`` -- both before JAX is imported. The equivalent from
the shell is ``taskset -c 0 python ...``. ``--xla-flags-only`` applies just
the flags, without pinning. Set ``BENCH_QUICK=1`` for a fast smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument(
    "--single-thread",
    action="store_true",
    help="restrict XLA's CPU backend to one thread (set before importing jax)",
)
parser.add_argument(
    "--xla-flags-only",
    action="store_true",
    help="like --single-thread but without pinning the process to one CPU",
)
ARGS = parser.parse_args()
if (ARGS.single_thread or ARGS.xla_flags_only) and "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = SINGLE_THREAD_FLAGS
if ARGS.single_thread:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

# jax must be imported only after XLA_FLAGS is final.
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import braintrace  # noqa: E402
from braintrace._op import (  # noqa: E402
    ETP_RULES_DT_TO_T,
    ETP_RULES_XY_TO_DW,
    etp_conv_p,
    etp_mm_p,
)

QUICK = os.environ.get("BENCH_QUICK") is not None
MASK64 = (1 << 64) - 1
LCG_A = 6364136223846793005
LCG_C = 1442695040888963407


# ---------------------------------------------------------------------------
# deterministic inputs, identical to the Rust examples
# ---------------------------------------------------------------------------

def det_f32(shape, seed, scale):
    """``bench_core.rs::det_f32``: values in [-scale, scale), f32."""
    s = (seed * LCG_A + LCG_C) & MASK64
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.float32)
    inv = np.float32(1.0) / np.float32(1 << 24)
    for k in range(n):
        s = (s * LCG_A + LCG_C) & MASK64
        # (s >> 40) < 2^24 is exact in f32; mirror the f32 arithmetic.
        v = np.float32(s >> 40) * inv * np.float32(2.0) - np.float32(1.0)
        out[k] = v * np.float32(scale)
    return jnp.asarray(out.reshape(shape))


def etp_rand(shape, seed):
    """``bench_etp.rs::rand``: f64 values in [-0.5, 0.5), cast to f32."""
    s = seed
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.float64)
    for k in range(n):
        s = (s * LCG_A + LCG_C) & MASK64
        out[k] = (s >> 11) / float(1 << 53) - 0.5
    return jnp.asarray(out.reshape(shape).astype(np.float32))


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------

def median_s(fn, args, warmup, runs):
    """Median wall time [s] of ``fn(*args)`` incl. ``block_until_ready``."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def reps(n):
    return max(1, min(n, 3)) if QUICK else n


# ---------------------------------------------------------------------------
# 1. GRU step
# ---------------------------------------------------------------------------

BATCH, INPUT, HIDDEN = 16, 16, 128


def gru_step(x, h, wz, bz, wr, br, wh, bh):
    xh = jnp.concatenate([x, h], axis=1)
    z = jax.nn.sigmoid(xh @ wz + bz)
    r = jax.nn.sigmoid(xh @ wr + br)
    hc = jnp.tanh(jnp.concatenate([x, r * h], axis=1) @ wh + bh)
    return (1.0 - z) * h + z * hc


def gru_loss(*a):
    return jnp.mean(jnp.square(gru_step(*a)))


gru_value_and_grad = jax.value_and_grad(gru_loss, argnums=tuple(range(8)))


def bench_gru(rows):
    k = INPUT + HIDDEN
    args = (
        det_f32((BATCH, INPUT), 1, 1.0),
        det_f32((BATCH, HIDDEN), 2, 0.5),
        det_f32((k, HIDDEN), 3, 0.1),
        det_f32((HIDDEN,), 4, 0.1),
        det_f32((k, HIDDEN), 5, 0.1),
        det_f32((HIDDEN,), 6, 0.1),
        det_f32((k, HIDDEN), 7, 0.1),
        det_f32((HIDDEN,), 8, 0.1),
    )
    jit_fwd = jax.jit(gru_step)
    jit_vg = jax.jit(gru_value_and_grad)

    # Results must agree before timing means anything.
    (ve, ge), (vj, gj) = gru_value_and_grad(*args), jit_vg(*args)
    worst = float(jnp.max(jnp.abs(gru_step(*args) - jit_fwd(*args))))
    worst = max(worst, abs(float(ve) - float(vj)))
    for a, b in zip(ge, gj):
        worst = max(worst, float(jnp.max(jnp.abs(a - b))))

    warm, runs = (1, 3) if QUICK else (10, 101)
    print(f"(1) GRU step, batch {BATCH}, input {INPUT}, hidden {HIDDEN}, f32 "
          f"(median of {runs} after {warm} warm-up)")
    print(f"{'':<28} {'eager [us]':>12} {'jit [us]':>12} {'speed-up':>9}")
    for name, eager, jitted, key in (
        ("forward", gru_step, jit_fwd, "GRU forward"),
        ("value_and_grad (fwd + bwd)", gru_value_and_grad, jit_vg, "GRU value_and_grad"),
    ):
        te = median_s(eager, args, warm, runs)
        tj = median_s(jitted, args, warm, runs)
        print(f"{name:<28} {te * 1e6:>12.1f} {tj * 1e6:>12.1f} {te / tj:>8.2f}x")
        rows.append((key, "us", tj * 1e6, te * 1e6))
    print(f"loss = {float(vj):.6f}; max |eager - jit| over all outputs: {worst:.1e}")
    print()


# ---------------------------------------------------------------------------
# 2. matmul
# ---------------------------------------------------------------------------

def bench_matmul(rows):
    print("(2) jnp.dot, f32, C = A @ B (n x n x n)")
    print(f"{'n':<14} {'jit [ms]':>10} {'GFLOP/s':>9} {'eager [ms]':>11} {'GFLOP/s':>9}")
    dot_jit = jax.jit(jnp.dot)
    for n, runs in ((256, 51), (1024, 21)):
        a = det_f32((n, n), 10, 1.0)
        b = det_f32((n, n), 11, 1.0)
        tj = median_s(dot_jit, (a, b), 0 if QUICK else 3, reps(runs))
        te = median_s(jnp.dot, (a, b), 0 if QUICK else 3, reps(runs))
        fl = 2.0 * n ** 3
        print(f"{f'{n}x{n}x{n}':<14} {tj * 1e3:>10.3f} {fl / tj / 1e9:>9.1f} "
              f"{te * 1e3:>11.3f} {fl / te / 1e9:>9.1f}")
        rows.append((f"matmul {n}^3", "ms", tj * 1e3, te * 1e3))
        rows.append((f"matmul {n}^3", "GFLOP/s", fl / tj / 1e9, fl / te / 1e9))
    print()


# ---------------------------------------------------------------------------
# 3. etp_mm rules
# ---------------------------------------------------------------------------

MM_PARAMS = dict(has_bias=False, weight_fn=None, bias_fn=None)


def mm_forward(x, w):
    return etp_mm_p.bind(x, w, **MM_PARAMS)


def mm_dt_to_t(h, trace):
    return ETP_RULES_DT_TO_T[etp_mm_p](h, {"weight": trace}, **MM_PARAMS)


def mm_xy_to_dw(x, h, w):
    return ETP_RULES_XY_TO_DW[etp_mm_p](x, h, {"weight": w}, **MM_PARAMS)


def mm_all(x, w, h, trace):
    return (mm_forward(x, w), mm_dt_to_t(h, trace), mm_xy_to_dw(x, h, w))


def bench_etp_mm(rows):
    b, i, o = 16, 256, 256
    x = etp_rand((b, i), 1)
    w = etp_rand((i, o), 2)
    h = etp_rand((b, o), 3)
    trace = etp_rand((b, i, o), 4)

    # sanity: the rules compute what their Rust counterparts compute
    np.testing.assert_allclose(mm_forward(x, w), x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mm_dt_to_t(h, trace)["weight"],
                               trace * h[:, None, :], rtol=1e-6)
    np.testing.assert_allclose(mm_xy_to_dw(x, h, w)["weight"], x.T @ h,
                               rtol=1e-5, atol=1e-5)

    cases = (
        ("forward", mm_forward, (x, w)),
        ("yw_to_w (B,I,O)", mm_dt_to_t, (h, trace)),
        ("xy_to_dw", mm_xy_to_dw, (x, h, w)),
        ("all three", mm_all, (x, w, h, trace)),
    )
    warm, runs = (1, 3) if QUICK else (3, 51)
    print(f"(3) etp_mm  f32  B={b} I=O={i} (median of {runs}; "
          "yw_to_w = registered dt_to_t rule)")
    print(f"{'':<20} {'jit [ms]':>10} {'eager [ms]':>11}")
    for name, fn, args in cases:
        tj = median_s(jax.jit(fn), args, warm, runs)
        te = median_s(fn, args, warm, runs)
        print(f"  {name:<18} {tj * 1e3:>10.3f} {te * 1e3:>11.3f}")
        rows.append((f"etp_mm {name}", "ms", tj * 1e3, te * 1e3))
    print()


# ---------------------------------------------------------------------------
# 4. etp_conv forward
# ---------------------------------------------------------------------------

def conv_forward(x, k):
    return etp_conv_p.bind(
        x, k, has_bias=False, strides=(1, 1), padding="SAME",
        lhs_dilation=None, rhs_dilation=None, feature_group_count=1,
        batch_group_count=1, dimension_numbers=None, kernel_fn=None,
        bias_fn=None,
    )


def bench_etp_conv(rows):
    x = etp_rand((8, 16, 32, 32), 5)
    k = etp_rand((32, 16, 3, 3), 6)
    y = conv_forward(x, k)
    assert y.shape == (8, 32, 32, 32), y.shape
    ref = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # also the public wrapper gives the same numbers
    np.testing.assert_allclose(
        braintrace.conv(x, k, strides=(1, 1), padding="SAME"), ref,
        rtol=1e-5, atol=1e-5)

    flops = 2.0 * 8 * 32 * 32 * 32 * 16 * 9
    warm, runs = (1, 3) if QUICK else (3, 31)
    tj = median_s(jax.jit(conv_forward), (x, k), warm, runs)
    te = median_s(conv_forward, (x, k), warm, runs)
    print("(4) etp_conv f32  B=8 16->32 ch 32x32 3x3 SAME (NCHW/OIHW)")
    print(f"  forward jit    {tj * 1e3:8.3f} ms  ({flops / tj / 1e9:.1f} GFLOP/s)")
    print(f"  forward eager  {te * 1e3:8.3f} ms  ({flops / te / 1e9:.1f} GFLOP/s)")
    rows.append(("etp_conv forward", "ms", tj * 1e3, te * 1e3))
    rows.append(("etp_conv forward", "GFLOP/s", flops / tj / 1e9, flops / te / 1e9))
    print()


def main():
    print("braintrace (Python reference) benchmarks")
    print(f"  python {sys.version.split()[0]}, jax {jax.__version__}, "
          f"braintrace {braintrace.__version__}, numpy {np.__version__}, "
          f"devices {jax.devices()}")
    print(f"  XLA_FLAGS={os.environ.get('XLA_FLAGS', '<unset>')!r}  "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')!r}  "
          f"os.cpu_count()={os.cpu_count()}  "
          f"affinity={sorted(os.sched_getaffinity(0))}")
    print()
    rows = []
    bench_gru(rows)
    bench_matmul(rows)
    bench_etp_mm(rows)
    bench_etp_conv(rows)
    print("summary (workload, unit, jit, eager)")
    for name, unit, tj, te in rows:
        print(f"  {name:<26} {unit:<8} {tj:>10.3f} {te:>10.3f}")


if __name__ == "__main__":
    main()
