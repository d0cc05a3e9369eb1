"""The public end-to-end golden cases (``tests/golden/e2e__*.json``, made by
the real braintrace 0.2.6) reproduced through the Python API: the model
built from the case's dims and hyperparameters with ``braintrace_rs.nn``
layers (``leaky`` and ``diag`` written in Python), the case's weights and
initial hidden states, one ``etrace_grad`` with the mean squared error;
gradients and losses within ``1e-9 * (1 + |want|)``. Non-temporal
parameters get braintrace's exact zeros (the algorithms' default)."""

import json

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn, ops
from conftest import golden_dir

TOL = 1e-9
CASES = sorted(golden_dir().glob("e2e__*.json"))


def arr(v):
    assert v["dtype"] == "float64"
    return np.asarray(v["data"], dtype=np.float64).reshape(v["shape"])


class LeakyNet:
    """``v' = a v + (1 - a)([x, tanh v] @ rec)``, leaky readout of ``tanh v'``."""

    def __init__(self, n_in, n_rec, n_out, alpha, readout_decay):
        self.rec = nn.Linear(n_in + n_rec, n_rec, name="rec")
        self.readout = nn.LeakyRateReadout(n_rec, n_out, name="readout", decay=readout_decay)
        self.alpha, self.n_rec = alpha, n_rec

    def init(self, init):
        self.rec.init(init)
        init.hidden("v", [self.n_rec])
        self.readout.init(init)

    def step(self, ctx, x):
        v = ctx.hidden("v")
        y = self.rec(ctx, ops.concat([x, v.tanh()]))
        v_new = v * self.alpha + y * (1.0 - self.alpha)
        ctx.set_hidden("v", v_new)
        return self.readout(ctx, v_new.tanh())


class DiagNet:
    """``v' = s(d) v + (1 - s(d)) (x @ inp)`` with ``s`` the sigmoid through
    ``etp_elemwise``."""

    def __init__(self, n_in, n_rec):
        self.inp = nn.Linear(n_in, n_rec, name="inp")
        self.decay = nn.ElementWiseParam([n_rec], "decay_raw", weight_fn="sigmoid")
        self.n_rec = n_rec

    def init(self, init):
        self.decay.init(init)
        self.inp.init(init)
        init.hidden("v", [self.n_rec])

    def step(self, ctx, x):
        v = ctx.hidden("v")
        d = self.decay.value(ctx)
        u = self.inp(ctx, x)
        v_new = d * v + (1.0 - d) * u
        ctx.set_hidden("v", v_new)
        return v_new


def build(case):
    d, h = case["dims"], case["hyperparams"]
    n_in, n_rec, n_out = d["n_in"], d["n_rec"], d["n_out"]
    m = case["model"]
    if m == "gru":
        return nn.Sequential(nn.GRUCell(n_in, n_rec, name="rnn"), nn.Linear(n_rec, n_out, name="out"))
    if m == "lif":
        return nn.Sequential(
            nn.LIF(n_in, n_rec, h["beta"], h["gamma"], h["v_th"], name=""),
            nn.LeakyRateReadout(n_rec, n_out, name="readout", decay=h["readout_decay"]),
        )
    if m == "leaky":
        return LeakyNet(n_in, n_rec, n_out, h["alpha"], h["readout_decay"])
    if m == "diag":
        return DiagNet(n_in, n_rec)
    raise AssertionError(f"unknown model {m}")


def algorithm(case):
    vjp = case["vjp_method"]
    if case["algorithm"] == "D_RTRL":
        return bt.D_RTRL(vjp_method=vjp)
    dor = case["algorithm_options"]["decay_or_rank"]
    if isinstance(dor, list):
        dor = tuple(dor)
    return bt.pp_prop(dor, vjp_method=vjp)


def close(what, got, want):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want) / (1.0 + np.abs(want))
    assert got.dtype == np.float64, f"{what}: dtype {got.dtype}"
    assert np.all(err <= TOL), f"{what}: worst relative error {err.max():e}"


def test_there_are_cases():
    assert len(CASES) >= 16, f"found {len(CASES)} e2e cases in {golden_dir()}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_e2e_case(path):
    case = json.loads(path.read_text())
    b = case["dims"]["B"]
    weights = {k: arr(v) for k, v in case["weights"].items()}
    xs, ys = arr(case["xs"]), arr(case["ys"])
    learner = bt.compile(build(case), algorithm(case), np.zeros_like(xs[0]), batch_size=b, params=weights)
    assert sorted(learner.param_keys()) == sorted(weights)
    for k, v in case["initial_hidden"].items():
        learner.set_hidden(k, arr(v))
    grads, losses = learner.etrace_grad(xs, ys, "mse", "mean")
    want = case["etrace"]["grads"]
    assert sorted(grads) == sorted(want)
    for k, v in want.items():
        close(f"grads[{k}]", grads[k], arr(v))
    close("losses", losses, arr(case["etrace"]["losses"]))
