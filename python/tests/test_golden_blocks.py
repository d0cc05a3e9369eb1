"""The non-temporal blocks' golden cases (``tests/golden_blocks/blocks.json``,
recorded from brainstate 0.5.4 / jax 0.10.2 — the layers braintrace
0.2.6's ``nn`` forwards to — by ``scripts/golden_gen/generate_blocks.py``)
reproduced through the Python classes: each activation (by brainstate's
class name and its hyperparameters), ``PReLU``, ``LayerNorm``,
``RMSNorm``, ``GroupNorm`` (with the case's parameters) and pooling
layer's output on the case's input, to ``1e-12 * (1 + |want|)``. The
output is read through a learner: the block, ``Flatten``, an identity
``Linear`` and an ``Expon`` synapse (which return their input on the first
step). A moved parameter must fail."""

import json

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import ROOT

TOL = 1e-12
CASES = json.loads((ROOT / "tests" / "golden_blocks" / "blocks.json").read_text())["cases"]
# Classes of brainstate's the Python package names (jax's functions are
# reachable through `nn.Layer.activation` only).
JAX = {"jax.nn.squareplus": "squareplus", "jax.nn.sparse_plus": "sparse_plus", "jax.nn.sparse_sigmoid": "sparse_sigmoid"}


def arr(v):
    return np.asarray(v["data"], dtype=np.float64).reshape(v["shape"])


def block(case):
    """The layer of a case and its parameters (keys as the learner's)."""
    cls, spec, kind = case["class"], case["spec"], case["kind"]
    if kind == "activation":
        if cls in JAX:
            return nn.Layer.activation(JAX[cls], **spec), {}
        return getattr(nn, cls)(**spec), {}
    if kind == "prelu":
        return nn.PReLU(spec["num_parameters"], name="prelu"), {"prelu/weight": arr(case["params"]["weight"])}
    if kind == "norm":
        eps = spec.get("eps", 1e-6)
        state = "blk/" + case["state"]
        params = {f"{state}/{k}": arr(v) for k, v in case["params"].items()}
        if cls == "GroupNorm":
            return nn.GroupNorm(spec["features"], num_groups=spec["num_groups"], epsilon=eps, name="blk"), params
        return getattr(nn, cls)(spec["features"], epsilon=eps, name="blk"), params
    if kind == "pool":
        return getattr(nn, cls)(spec["kernel"], stride=spec["stride"], padding=spec["padding"]), {}
    raise AssertionError(f"unknown block kind {kind}")


def output(case, params=None):
    layer, p = block(case)
    if params is not None:
        p = params
    x, y = arr(case["x"]), arr(case["y"])
    n = int(np.prod(y.shape[1:]))
    net = nn.Sequential(layer, nn.Flatten(in_size=y.shape[1:]),
                        nn.Linear(n, n, name="id", bias=False, w_init="identity"), nn.Expon(n))
    learner = bt.compile(net, bt.D_RTRL(non_temporal="in_step"), np.zeros_like(x), batch_size=x.shape[0])
    if p:
        learner.set_params(p)
    return learner.update(x).reshape(y.shape), y


def test_there_are_cases():
    assert len(CASES) >= 40 and {c["kind"] for c in CASES} == {"activation", "prelu", "norm", "pool"}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_block_case(case):
    got, want = output(case)
    err = np.abs(got - want) / (1.0 + np.abs(want))
    assert err.max() <= TOL, f"{case['name']}: worst relative error {err.max():e}"


@pytest.mark.parametrize("name", ["prelu", "layernorm", "groupnorm"])
def test_a_moved_parameter_fails(name):
    case = next(c for c in CASES if c["name"] == name)
    _, params = block(case)
    key = sorted(params)[0]
    params[key] = params[key] + 1e-3
    got, want = output(case, params)
    assert np.abs(got - want).max() > 1e-6
