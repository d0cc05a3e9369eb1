"""A model written in Python: traced once at compile (its ``step`` is not
called per time step), and the bits of the same model built from the
native layers (parameters drawn alike, outputs and gradients)."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn, ops
from conftest import same_bits

N_IN, N_REC, N_OUT, B = 3, 8, 2, 4


class PyGRU:
    """braintrace's GRUCell ``rnn`` and a Linear readout ``out``, written
    with the ops (the equations of the native ``GRUCell``)."""

    def __init__(self):
        self.step_calls = 0
        self.init_calls = 0

    def init(self, init):
        self.init_calls += 1
        for g in ("Wz", "Wr", "Wh"):
            init.param(f"rnn/{g}/weight", init.draw("orthogonal", [N_IN + N_REC, N_REC]), leaf="weight")
            init.param(f"rnn/{g}/weight", init.draw("zeros", [N_REC]), leaf="bias")
        init.hidden("rnn/h", [N_REC])
        init.param("out/weight", init.draw("kaiming_normal", [N_REC, N_OUT]), leaf="weight")
        init.param("out/weight", init.draw("zeros", [N_OUT]), leaf="bias")

    def step(self, ctx, x):
        self.step_calls += 1

        def lin(name, v):
            return ops.etp_mm(v, ctx.param(f"{name}/weight/weight"), ctx.param(f"{name}/weight/bias"))

        h = ctx.hidden("rnn/h")
        xh = ops.concat([x, h])
        z = lin("rnn/Wz", xh).sigmoid()
        r = lin("rnn/Wr", xh).sigmoid()
        hc = lin("rnn/Wh", ops.concat([x, r * h])).tanh()
        h_new = (1.0 - z) * h + z * hc
        ctx.set_hidden("rnn/h", h_new)
        return lin("out", h_new)


def native():
    return nn.Sequential(nn.GRUCell(N_IN, N_REC, name="rnn"), nn.Linear(N_REC, N_OUT, name="out"))


ALGOS = {
    "d_rtrl": lambda: bt.D_RTRL(non_temporal="in_step"),
    "pp_prop": lambda: bt.pp_prop(0.9, non_temporal="in_step"),
}


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_python_model_gives_the_bits_of_the_native_one(algo, dtype):
    rng = np.random.default_rng(3)
    x0 = np.zeros((B, N_IN), dtype)
    py_model = PyGRU()
    a = bt.compile(py_model, ALGOS[algo](), x0, batch_size=B, seed=7)
    b = bt.compile(native(), ALGOS[algo](), x0, batch_size=B, seed=7)
    pa, pb = a.params(), b.params()
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert same_bits(pa[k], pb[k]), k
    for _ in range(5):
        x = rng.standard_normal((B, N_IN)).astype(dtype)
        assert same_bits(a.update(x), b.update(x))
    xs = rng.standard_normal((7, B, N_IN)).astype(dtype)
    ys = rng.standard_normal((7, B, N_OUT)).astype(dtype)
    ga, la = a.etrace_grad(xs, ys, "mse")
    gb, lb = b.etrace_grad(xs, ys, "mse")
    assert same_bits(la, lb)
    for k in gb:
        assert same_bits(ga[k], gb[k]), k
    assert any(np.any(g != 0) for g in ga.values())
    # Traced once at compile; updates and etrace_grad never called it.
    assert py_model.step_calls == 1
    assert py_model.init_calls == 1


def test_step_is_not_called_per_time_step():
    m = PyGRU()
    learner = bt.compile(m, bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
    assert m.step_calls == 1
    for _ in range(20):
        learner.update(np.ones((B, N_IN)))
    learner.etrace_grad(np.ones((30, B, N_IN)), np.zeros((30, B, N_OUT)), "mse")
    learner.etrace_grad(np.ones((30, B, N_IN)), np.zeros((30, B, N_OUT)), lambda o, y: ((o - y) ** 2.0).mean())
    assert m.step_calls == 1
    # forward traces the step once per input shape, then reuses it.
    out = learner.forward(np.ones((25, B, N_IN)))
    assert out.shape == (25, B, N_OUT)
    learner.forward(np.ones((10, B, N_IN)))
    assert m.step_calls == 2


def test_forward_matches_updates():
    rng = np.random.default_rng(1)
    learner = bt.compile(native(), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B, seed=2)
    xs = rng.standard_normal((6, B, N_IN))
    out = learner.forward(xs)
    assert learner.running_index == 0
    for t in range(6):
        assert same_bits(learner.update(xs[t]), out[t])


def test_python_loss_gives_the_bits_of_the_builtin():
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((5, B, N_IN))
    ys = rng.standard_normal((5, B, N_OUT))
    a = bt.compile(native(), bt.D_RTRL(), xs[0], batch_size=B, seed=1)
    b = bt.compile(native(), bt.D_RTRL(), xs[0], batch_size=B, seed=1)
    ga, la = a.etrace_grad(xs, ys, "mse")
    gb, lb = b.etrace_grad(xs, ys, lambda o, y: (o - y).square().mean())
    assert same_bits(la, lb)
    for k in ga:
        assert same_bits(ga[k], gb[k]), k
