"""The recurrent-cell zoo and the spiking layers from Python: each compiles
in a network, takes steps under D-RTRL and pp_prop (f32 and f64), and gives
finite gradients for every parameter, some of them non-zero; unknown kinds
are refused by name."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn

B, N_IN = 3, 4

CELLS = ["VanillaRNNCell", "MGUCell", "LSTMCell", "URLSTMCell", "MinimalRNNCell", "MiniGRU", "MiniLSTM", "CFNCell"]


def rnn_net(kind):
    return nn.Sequential(getattr(nn, kind)(N_IN, 6), nn.Linear(6, 2, name="out"))


NETS = {kind: (lambda k=kind: rnn_net(k)) for kind in CELLS}
NETS["LRUCell"] = lambda: nn.Sequential(nn.LRUCell(N_IN, 5), nn.Linear(N_IN, 2, name="out"))
NETS["IF"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.IF(6, tau=4.0))
NETS["LIFNeuron"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.LIFNeuron(6))
NETS["ALIF"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.ALIF(6))
NETS["Expon"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.Expon(6), nn.LIFNeuron(6))
NETS["Alpha"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.Alpha(6), nn.LIFNeuron(6))
NETS["DualExpon"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.DualExpon(6), nn.LIFNeuron(6))
NETS["STD"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.IF(6), nn.STD(6), nn.Linear(6, 2, name="out"))
NETS["STP"] = lambda: nn.Sequential(nn.Linear(N_IN, 6, name="inp"), nn.IF(6), nn.STP(6), nn.Linear(6, 2, name="out"))

ALGOS = {"d_rtrl": lambda: bt.D_RTRL(non_temporal="in_step"), "pp_prop": lambda: bt.pp_prop(0.8, non_temporal="in_step")}


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("net", sorted(NETS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zoo_layer_compiles_steps_and_learns(net, algo, dtype):
    learner = bt.compile(NETS[net](), ALGOS[algo](), np.zeros((B, N_IN), dtype), batch_size=B)
    out = learner.update(np.ones((B, N_IN), dtype))
    assert out.dtype == dtype and out.shape[0] == B and np.all(np.isfinite(out))
    xs = 2.0 * np.random.default_rng(0).standard_normal((6, B, N_IN)).astype(dtype)
    grads, losses = learner.etrace_grad(xs, np.ones((6,) + out.shape, dtype))
    assert losses.shape == (6,) and np.all(np.isfinite(losses))
    assert sorted(grads) == sorted(learner.param_keys())
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    assert any(np.any(g != 0) for g in grads.values()), "some gradient is non-zero"


def test_unknown_kinds_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="kind"):
        nn.Layer.rnn_cell("GRU9", 3, 4, "x")
    with pytest.raises(ValueError, match="kind"):
        nn.Layer.spiking("HH", 3, "x", 5.0)
    with pytest.raises(ValueError):
        nn.VanillaRNNCell(0, 4)
    with pytest.raises(ValueError):
        nn.IF(3, tau=-1.0)
