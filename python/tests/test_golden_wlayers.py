"""The weight-structured layers' golden cases (``tests/golden_wlayers``,
recorded from the real braintrace 0.2.6 by
``scripts/golden_gen/generate_zoo_wlayers.py``) reproduced through the
Python classes: the layer under test (``nn.Linear(w_mask=...)``,
``nn.SignedWLinear``, ``nn.ScaledWSLinear``, ``nn.SparseLinear``,
``nn.LoRA``, ``nn.Conv1d/2d/3d``) is the recurrent weight ``rnn/W`` of
``h' = tanh(W([x, h]))``, read out by ``nn.Linear`` ``out`` over the
flattened ``h'``; the case's weights and initial hidden state, one
``etrace_grad`` with the mean squared error; gradients and losses within
``1e-9 * (1 + |want|)``. A perturbed layer weight must fail."""

import json

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn, ops
from conftest import ROOT
from test_golden import algorithm, arr, close

DIR = ROOT / "tests" / "golden_wlayers"
CASES = sorted(DIR.glob("e2e__wl_*.json"))


class LayerRnn:
    """``h' = tanh(W([x, h]))`` with the hidden state ``rnn/h`` of
    per-sample shape ``shape``."""

    def __init__(self, w, shape):
        self.w, self.shape = w, list(shape)

    def init(self, init):
        self.w.init(init)
        init.hidden("rnn/h", self.shape)

    def step(self, ctx, x):
        h = ctx.hidden("rnn/h")
        h_new = self.w(ctx, ops.concat([x, h], x.ndim - 1)).tanh()
        ctx.set_hidden("rnn/h", h_new)
        return h_new


def build(case):
    d, lay = case["dims"], case["layer"]
    n_in, n_rec, n_out = d["n_in"], d["n_rec"], d["n_out"]
    k = n_in + n_rec
    kind = case["model"][len("wl_"):]
    spatial = []
    if kind == "linear_mask":
        w = nn.Linear(k, n_rec, name="rnn/W", w_mask=arr(lay["w_mask"]))
    elif kind == "signed":
        w = nn.SignedWLinear(k, n_rec, w_sign=arr(lay["w_sign"]), name="rnn/W")
    elif kind == "scaledws":
        w = nn.ScaledWSLinear(k, n_rec, w_mask=arr(lay["w_mask"]), ws_gain=lay["gain"], eps=lay["eps"],
                              bias=lay["bias"], name="rnn/W")
    elif kind == "sparse":
        dense = np.zeros(lay["shape"])
        for r in range(lay["shape"][0]):
            dense[r, lay["indices"][lay["indptr"][r]:lay["indptr"][r + 1]]] = 1.0
        w = nn.SparseLinear(dense, b_init="zeros", name="rnn/W")
    elif kind == "lora":
        w = nn.LoRA(k, lay["rank"], n_rec, name="rnn/W")
    elif kind in ("conv1d", "conv2d", "conv3d"):
        assert lay["bias"] is False
        spatial = list(lay["spatial"])
        conv = {"conv1d": nn.Conv1d, "conv2d": nn.Conv2d, "conv3d": nn.Conv3d}[kind]
        w = conv(spatial + [k], n_rec, lay["kernel_size"], name="rnn/W")
    else:
        raise AssertionError(f"unknown weight-layer model {kind}")
    shape = spatial + [n_rec]
    flat = int(np.prod(shape))
    return nn.Sequential(LayerRnn(w, shape), nn.Flatten(in_size=shape), nn.Linear(flat, n_out, name="out"))


def run(case):
    b = case["dims"]["B"]
    weights = {k: arr(v) for k, v in case["weights"].items()}
    xs, ys = arr(case["xs"]), arr(case["ys"])
    learner = bt.compile(build(case), algorithm(case), np.zeros_like(xs[0]), batch_size=b, params=weights)
    assert sorted(learner.param_keys()) == sorted(weights)
    for k, v in case["initial_hidden"].items():
        learner.set_hidden(k, arr(v))
    return learner.etrace_grad(xs, ys, "mse", "mean")


def test_there_are_cases_of_every_layer():
    layers = {p.stem.split("__")[1] for p in CASES}
    want = {f"wl_{n}" for n in ["linear_mask", "signed", "scaledws", "sparse", "lora", "conv1d", "conv2d", "conv3d"]}
    assert layers == want, f"found {sorted(layers)} in {DIR}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_wlayers_case(path):
    case = json.loads(path.read_text())
    grads, losses = run(case)
    want = case["etrace"]["grads"]
    assert sorted(grads) == sorted(want)
    for k, v in want.items():
        close(f"grads[{k}]", grads[k], arr(v))
    close("losses", losses, arr(case["etrace"]["losses"]))


@pytest.mark.parametrize("layer", ["linear_mask", "signed", "scaledws", "sparse", "lora", "conv1d"])
def test_a_perturbed_layer_weight_fails(layer):
    case = json.loads((DIR / f"e2e__wl_{layer}__d_rtrl.json").read_text())
    key = next(k for k in case["weights"] if k.startswith("rnn/W/"))
    w = np.array(case["weights"][key]["data"], dtype=np.float64)
    w.reshape(-1)[0] += 1e-6
    case["weights"][key]["data"] = w.tolist()
    grads, _ = run(case)
    with pytest.raises(AssertionError, match="worst relative error"):
        for k, v in case["etrace"]["grads"].items():
            close(f"grads[{k}]", grads[k], arr(v))
