"""The sequence driver's golden cases (``tests/golden_driver/driver__*.json``,
made by the real braintrace 0.2.6 with ``scripts/golden_gen/
generate_driver.py``) reproduced through the Python API: a mask with
reduction ``mean`` or ``sum`` (the masked losses and the scalar objective
too), a warm-up with ``evolve(return_outputs=True)`` before the gradient,
windows of two steps (``chunk_size=2`` on a multi-step learner), and two
target sequences with auxiliary values (``has_aux=True``). Every recorded
value within ``1e-9 * (1 + |want|)``; the step counter exactly. A last test
checks that the comparison can fail: a perturbed weight misses."""

import json
from pathlib import Path

import numpy as np
import pytest

import braintrace_rs as bt
from conftest import ROOT
from test_golden import arr, build, close

DIR = ROOT / "tests" / "golden_driver"
CASES = sorted(DIR.glob("driver__*.json"))


def algorithm(case):
    o = case["algorithm_options"]
    assert set(o) <= {"decay_or_rank", "vjp_method"}, o
    vjp = o.get("vjp_method", "single-step")
    if case["algorithm"] == "D_RTRL":
        return bt.D_RTRL(vjp_method=vjp)
    assert case["algorithm"] == "pp_prop"
    return bt.pp_prop(o["decay_or_rank"], vjp_method=vjp)


def aux2_loss(o, y, z):
    """braintrace's step of the ``aux2`` cases: two targets, two aux values."""
    return ((o - y).square().mean_all() + (o * z).mean_all(), (o.mean_all(), z.sum_all()))


def run(case, weights):
    """The case's driver call through the Python API: its results."""
    b = case["dims"]["B"]
    xs, ys, zs = arr(case["xs"]), arr(case["ys"]), arr(case["zs"])
    learner = bt.compile(build(case), algorithm(case), np.zeros_like(xs[0]), batch_size=b, params=weights)
    drv = case["driver"]
    assert set(drv) <= {"mask", "reduction", "evolve", "chunk", "aux2"}, drv
    got = {}
    if "evolve" in drv:
        n = drv["evolve"]
        got["evolve_outputs"] = learner.evolve(xs[:n], return_outputs=True)
        xs, ys = xs[n:], ys[n:]
    kw = dict(reduction=drv.get("reduction", "mean"))
    if "mask" in drv:
        kw["mask"] = np.asarray(drv["mask"], dtype=np.float64)
    if "chunk" in drv:
        kw["chunk_size"] = drv["chunk"]
    if drv.get("aux2"):
        grads, losses, aux = learner.etrace_grad(xs, (ys, zs), aux2_loss, has_aux=True, **kw)
        got["aux"] = aux
    else:
        grads, losses = learner.etrace_grad(xs, ys, "mse", **kw)
    got["grads"], got["losses"] = grads, losses
    if "mask" in drv:
        got["masked"] = learner_masked(learner, case, xs, ys, kw)
    got["running_index"] = learner.running_index
    return got


def learner_masked(learner, case, xs, ys, kw):
    """The masked losses and the scalar objective of the same call, from a
    fresh learner (``loss_output="masked"`` and ``"scalar"``)."""
    b = case["dims"]["B"]
    out = {}
    for what in ("masked", "scalar"):
        fresh = bt.compile(build(case), algorithm(case), np.zeros_like(xs[0]), batch_size=b, params=learner.params())
        out[what] = fresh.etrace_grad(xs, ys, "mse", loss_output=what, **kw)[1]
    return out


def check(case, got):
    ex = case["expect"]
    assert set(ex) <= {"grads", "losses", "running_index", "masked", "scalar", "evolve_outputs", "aux"}, ex
    assert sorted(got["grads"]) == sorted(ex["grads"])
    for k, v in ex["grads"].items():
        close(f"grads[{k}]", got["grads"][k], arr(v))
    close("losses", got["losses"], arr(ex["losses"]))
    if "evolve_outputs" in ex:
        close("evolve_outputs", got["evolve_outputs"], arr(ex["evolve_outputs"]))
    if "aux" in ex:
        assert len(got["aux"]) == len(ex["aux"])
        for i, (g, w) in enumerate(zip(got["aux"], ex["aux"])):
            close(f"aux[{i}]", g, arr(w))
    if "masked" in ex:
        close("masked", got["masked"]["masked"], arr(ex["masked"]))
        s, want = got["masked"]["scalar"], ex["scalar"]
        assert isinstance(s, float)
        assert abs(s - want) <= 1e-9 * (1 + abs(want)), f"scalar {s} vs {want}"
    assert got["running_index"] == ex["running_index"]


def test_there_are_cases():
    assert len(CASES) == 14, f"found {len(CASES)} driver cases in {DIR}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_driver_case(path: Path):
    case = json.loads(path.read_text())
    weights = {k: arr(v) for k, v in case["weights"].items()}
    check(case, run(case, weights))


@pytest.mark.parametrize("name", ["driver__gru__mask.json", "driver__lif__aux2.json", "driver__gru__chunk2_pp.json"])
def test_a_perturbed_weight_misses(name):
    case = json.loads((DIR / name).read_text())
    weights = {k: arr(v) for k, v in case["weights"].items()}
    k = sorted(k for k in weights if k.endswith("weight"))[-1]
    weights[k] = weights[k] + 1e-6
    with pytest.raises(AssertionError):
        check(case, run(case, weights))
