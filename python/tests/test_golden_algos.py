"""The algorithms' golden cases (``tests/golden_algos/*.json``, made by the
real braintrace 0.2.6 with ``scripts/golden_gen/generate_algos_a.py`` and
``generate_algos_b.py``) reproduced through the Python builders: ``EProp``
(κ filter, random feedback with braintrace's matrices), ``OSTLRecurrent``,
``OSTLFeedforward``, ``ThreeFactor``, ``SnAp`` (n = 1, 2), ``UORO`` and
``RandomProjection`` (braintrace's projection draws), single- and
multi-step, on the GRU and LIF networks and zoo cells. The case's weights
and initial hidden states, one ``etrace_grad`` with the mean squared
error; gradients and losses within ``1e-9 * (1 + |want|)``. A last test
checks that the comparison can fail."""

import json

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import ROOT
from test_golden import arr, build, close

DIR = ROOT / "tests" / "golden_algos"
CASES = sorted(p for p in DIR.glob("*.json") if not p.name.startswith("MANIFEST"))

ZOO = {"zoo_lstm": nn.LSTMCell, "zoo_mgu": nn.MGUCell, "zoo_vanilla": nn.VanillaRNNCell}


def model(case):
    m = case["model"]
    if m in ZOO:
        d = case["dims"]
        return nn.Sequential(ZOO[m](d["n_in"], d["n_rec"], name="rnn"), nn.Linear(d["n_rec"], d["n_out"], name="out"))
    return build(case)


def algorithm(case):
    """The case's algorithm through the builders, braintrace's options as
    they were given (``non_temporal`` is the builders' braintrace zeros)."""
    o, vjp = dict(case["algorithm_options"]), case["vjp_method"]
    assert o.pop("vjp_method", vjp) == vjp
    name = case["algorithm"]
    if name == "EProp":
        kw = {}
        if o.pop("feedback", "symmetric") == "random":
            o.pop("random_feedback_seed")
            kw = dict(feedback="random", feedback_matrices={int(g): arr(b) for g, b in case["feedback_matrices"].items()})
        a = bt.EProp(kappa_filter_decay=o.pop("kappa_filter_decay", 0.0), vjp_method=vjp, **kw)
    elif name == "OSTLRecurrent":
        a = bt.OSTLRecurrent(vjp_method=vjp)
    elif name == "OSTLFeedforward":
        a = bt.OSTLFeedforward(o.pop("decay_or_rank", None), vjp_method=vjp)
    elif name == "ThreeFactor":
        a = bt.ThreeFactor(modulator=o.pop("modulator"))
    elif name == "SnAp":
        a = bt.SnAp(n=o.pop("n"), vjp_method=vjp)
    elif name in ("UORO", "RandomProjectionVjpAlgorithm"):
        draws = [[arr(t) for t in row] for row in case["projection_draws"]]
        make = bt.UORO if name == "UORO" else bt.RandomProjection
        a = make(vjp_method=vjp, draws=draws)
    else:
        raise AssertionError(f"unknown algorithm {name}")
    assert o == {}, f"options left: {o}"
    return a


def run(case, weights):
    b = case["dims"]["B"]
    xs, ys = arr(case["xs"]), arr(case["ys"])
    learner = bt.compile(model(case), algorithm(case), np.zeros_like(xs[0]), batch_size=b, params=weights)
    for k, v in case["initial_hidden"].items():
        learner.set_hidden(k, arr(v))
    return learner.etrace_grad(xs, ys, "mse", "mean")


def check(case, grads, losses):
    want = case["etrace"]["grads"]
    assert sorted(grads) == sorted(want)
    for k, v in want.items():
        close(f"grads[{k}]", grads[k], arr(v))
    close("losses", losses, arr(case["etrace"]["losses"]))


def test_there_are_cases_of_every_algorithm():
    names = {p.name.split("__")[0] for p in CASES}
    assert names == {"eprop", "ostl_recurrent", "ostl_feedforward", "three_factor", "snap", "uoro", "random_projection"}
    assert len(CASES) >= 54


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_algos_case(path):
    case = json.loads(path.read_text())
    weights = {k: arr(v) for k, v in case["weights"].items()}
    check(case, *run(case, weights))


@pytest.mark.parametrize(
    "name",
    ["eprop__gru__random_kappa.json", "three_factor__lif__modulator.json", "uoro__gru__multistep.json", "snap__zoo_lstm__n2.json"],
)
def test_the_comparison_can_fail(name):
    """A perturbed weight, another modulator or other draws miss."""
    case = json.loads((DIR / name).read_text())
    weights = {k: arr(v) for k, v in case["weights"].items()}
    if "modulator" in case["algorithm_options"]:
        case["algorithm_options"]["modulator"] *= 1.0 + 1e-6
    elif "projection_draws" in case:
        d = case["projection_draws"][1][0]
        d["data"] = (-np.asarray(d["data"])).tolist()
    else:
        k = sorted(k for k in weights if k.endswith("weight"))[-1]
        weights[k] = weights[k] + 1e-6
    with pytest.raises(AssertionError):
        check(case, *run(case, weights))
