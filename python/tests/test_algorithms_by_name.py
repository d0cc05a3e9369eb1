"""Every online algorithm of the library is reachable from Python by
braintrace's name (``compile(model, "eprop", ...)``): it compiles, its
gradients are finite and shaped like the parameters, and an unknown name
is a ValueError that lists the known ones."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn

B, N_IN, N_OUT, T = 2, 3, 2, 4

NAMES = ["d_rtrl", "eprop", "e_prop", "ostl_recurrent", "ostl_feedforward",
         "three_factor", "snap", "uoro", "random_projection"]


@pytest.mark.parametrize("name", NAMES)
def test_an_algorithm_by_name_gives_finite_gradients(name):
    model = nn.Sequential(nn.GRUCell(N_IN, 4), nn.Linear(4, N_OUT, name="out"))
    learner = bt.compile(model, name, np.zeros((B, N_IN)), batch_size=B, seed=1)
    r = np.random.default_rng(0)
    xs = r.standard_normal((T, B, N_IN))
    ys = r.standard_normal((T, B, N_OUT))
    grads = learner.etrace_grad(xs, ys, "mse")
    grads = grads[0] if isinstance(grads, tuple) else grads
    params = learner.params()
    assert set(grads) == set(params)
    for k, g in grads.items():
        assert g.shape == params[k].shape, k
        assert np.all(np.isfinite(g)), k


def test_an_unknown_name_lists_the_known_ones():
    model = nn.Sequential(nn.GRUCell(N_IN, 4), nn.Linear(4, N_OUT))
    with pytest.raises(ValueError, match="eprop"):
        bt.compile(model, "no_such_algorithm", np.zeros((B, N_IN)), batch_size=B)
