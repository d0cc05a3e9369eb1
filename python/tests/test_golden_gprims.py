"""The grouped-linear and embedding golden cases (``tests/golden_gprims``,
``e2e__gp_*``, recorded from the real braintrace 0.2.6) reproduced through
``nn.GroupedLinear`` and ``nn.Embedding``: ``gp_grouped`` is
``h' = tanh(inp(x) + rec(h))`` with two groups and a ``Linear`` readout of
the flattened ``h'``, ``gp_emb`` is ``h' = tanh(emb(tokens) + rec(h))``
with ``Linear`` ``rec`` and ``out``; the case's weights and initial hidden
state, one ``etrace_grad`` with the mean squared error, within
``1e-9 * (1 + |want|)``. A perturbed recurrent weight must fail."""

import json

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import ROOT
from test_golden import algorithm, arr, close

DIR = ROOT / "tests" / "golden_gprims"
CASES = sorted(DIR.glob("e2e__gp_*.json"))
GROUPS = 2


class GroupedNet:
    def __init__(self, n_in, n_rec, n_out):
        self.inp = nn.GroupedLinear(GROUPS, n_in, n_rec, name="inp")
        self.rec = nn.GroupedLinear(GROUPS, n_rec, n_rec, name="rec")
        self.flat = nn.Flatten(in_size=(GROUPS, n_rec))
        self.out = nn.Linear(GROUPS * n_rec, n_out, name="out")
        self.n_rec = n_rec

    def init(self, init):
        self.inp.init(init)
        self.rec.init(init)
        self.out.init(init)
        init.hidden("h", [GROUPS, self.n_rec])

    def step(self, ctx, x):
        h = (self.inp(ctx, x) + self.rec(ctx, ctx.hidden("h"))).tanh()
        ctx.set_hidden("h", h)
        return self.out(ctx, self.flat(ctx, h))


class EmbNet:
    def __init__(self, vocab, n_rec, n_out):
        self.emb = nn.Embedding(vocab, n_rec, name="emb")
        self.rec = nn.Linear(n_rec, n_rec, name="rec")
        self.out = nn.Linear(n_rec, n_out, name="out")
        self.n_rec = n_rec

    def init(self, init):
        self.emb.init(init)
        self.rec.init(init)
        self.out.init(init)
        init.hidden("h", [self.n_rec])

    def step(self, ctx, x):
        h = (self.emb(ctx, x) + self.rec(ctx, ctx.hidden("h"))).tanh()
        ctx.set_hidden("h", h)
        return self.out(ctx, h)


def run(case):
    d = case["dims"]
    net = {"gp_grouped": GroupedNet, "gp_emb": EmbNet}[case["model"]](d["n_in"], d["n_rec"], d["n_out"])
    weights = {k: arr(v) for k, v in case["weights"].items()}
    xs, ys = arr(case["xs"]), arr(case["ys"])
    learner = bt.compile(net, algorithm(case), np.zeros_like(xs[0]), batch_size=d["B"], params=weights)
    assert sorted(learner.param_keys()) == sorted(weights)
    for k, v in case["initial_hidden"].items():
        learner.set_hidden(k, arr(v))
    return learner.etrace_grad(xs, ys, "mse", "mean")


def test_there_are_cases_of_both_layers():
    assert {p.stem.split("__")[1] for p in CASES} == {"gp_grouped", "gp_emb"}


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_gprims_case(path):
    case = json.loads(path.read_text())
    grads, losses = run(case)
    want = case["etrace"]["grads"]
    assert sorted(grads) == sorted(want)
    for k, v in want.items():
        close(f"grads[{k}]", grads[k], arr(v))
    close("losses", losses, arr(case["etrace"]["losses"]))


@pytest.mark.parametrize("name", ["e2e__gp_grouped__d_rtrl", "e2e__gp_emb__pp_prop"])
def test_a_perturbed_recurrent_weight_fails(name):
    case = json.loads((DIR / f"{name}.json").read_text())
    w = np.array(case["weights"]["rec/weight/weight"]["data"], dtype=np.float64)
    w.reshape(-1)[0] += 1e-6
    case["weights"]["rec/weight/weight"]["data"] = w.tolist()
    grads, _ = run(case)
    with pytest.raises(AssertionError, match="worst relative error"):
        for k, v in case["etrace"]["grads"].items():
            close(f"grads[{k}]", grads[k], arr(v))
