"""Shared by the distributed tests and their subprocess driver: the model,
the data of update ``i`` (a function of ``i`` alone, so that a replayed
update sees the same data) and the undisturbed reference run."""

import os

import numpy as np

import braintrace_rs as bt
from braintrace_rs import nn

N_IN, N_OUT, HIDDEN, T = 3, 2, 6, 4

#: Quick mode (CI): fewer updates.
QUICK = os.environ.get("BRAINTRACE_QUICK", "") not in ("", "0")


def make_learner(batch, dtype="float64", algo="d_rtrl"):
    model = nn.Sequential(nn.GRUCell(N_IN, HIDDEN), nn.Linear(HIDDEN, N_OUT, name="out"))
    a = bt.D_RTRL(non_temporal="in_step") if algo == "d_rtrl" else bt.pp_prop(0.9, non_temporal="in_step")
    return bt.compile(model, a, np.zeros((batch, N_IN), dtype=dtype), batch_size=batch, seed=7)


def make_adam():
    return bt.Adam(0.02)


def data(i, batch, dtype="float64"):
    r = np.random.default_rng(1000 + i)
    xs = r.standard_normal((T, batch, N_IN)).astype(dtype)
    ys = r.standard_normal((T, batch, N_OUT)).astype(dtype)
    return xs, ys


def reference(batch, n, params, dtype="float64", algo="d_rtrl"):
    """One learner on the whole batch, ``n`` updates from ``params``."""
    learner, opt = make_learner(batch, dtype, algo), make_adam()
    learner.set_params(params)
    for i in range(n):
        grads, _ = learner.etrace_grad(*data(i, batch, dtype))
        opt.step(learner, grads)
    return learner.params()
