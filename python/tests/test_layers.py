"""Every layer of ``braintrace_rs.nn`` compiles (alone or in a network
that has hidden states) and takes a step with each algorithm; the
optimisers, ``clip_grad_norm`` and safetensors files."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn

B, N_IN = 3, 4


class WithDecay:
    """An ElementWiseParam and an Expon synapse inside a Python model."""

    def __init__(self):
        self.decay = nn.ElementWiseParam([5], "tau", weight_fn="sigmoid")
        self.syn = nn.Expon(5, tau=4.0, name="syn")
        self.inp = nn.Linear(N_IN, 5, name="inp", bias=False, w_init=("normal", 0.5))

    def init(self, init):
        self.decay.init(init)
        self.syn.init(init)
        self.inp.init(init)
        init.hidden("v", [5])

    def step(self, ctx, x):
        v = ctx.hidden("v")
        g = self.syn(ctx, self.inp(ctx, x))
        v_new = self.decay.value(ctx) * v + g
        ctx.set_hidden("v", v_new)
        return v_new


NETS = {
    "GRUCell": lambda: nn.GRUCell(N_IN, 6),
    "GRUCell+Linear": lambda: nn.Sequential(nn.GRUCell(N_IN, 6), nn.Linear(6, 2, name="out")),
    "LIF+LeakyRateReadout": lambda: nn.Sequential(nn.LIF(N_IN, 6), nn.LeakyRateReadout(6, 2)),
    "Linear(weight_fn)+LeakyRateReadout": lambda: nn.Sequential(
        nn.Linear(N_IN, 6, weight_fn="softplus"), nn.LeakyRateReadout(6, 2, decay=0.5)
    ),
    "ElementWiseParam+Expon": WithDecay,
    "Sequential(Python model, Linear)": lambda: nn.Sequential(WithDecay(), nn.Linear(5, 2, name="out")),
}
ALGOS = {
    "d_rtrl": lambda: bt.D_RTRL(),
    "d_rtrl_multi": lambda: bt.D_RTRL(vjp_method="multi-step"),
    "pp_prop": lambda: bt.pp_prop(0.8),
    "pp_prop_rank": lambda: bt.ES_D_RTRL(4),
}


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("net", sorted(NETS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_compiles_and_steps(net, algo, dtype):
    learner = bt.compile(NETS[net](), ALGOS[algo](), np.zeros((B, N_IN), dtype), batch_size=B)
    out = learner.update(np.ones((B, N_IN), dtype))
    assert out.dtype == dtype and out.shape[0] == B and np.all(np.isfinite(out))
    assert learner.running_index == 1
    xs = np.random.default_rng(0).standard_normal((4, B, N_IN)).astype(dtype)
    grads, losses = learner.etrace_grad(xs, np.zeros((4,) + out.shape, dtype))
    assert losses.shape == (4,)
    assert sorted(grads) == sorted(learner.param_keys())
    assert all(g.dtype == dtype and np.all(np.isfinite(g)) for g in grads.values())
    assert "relation" in learner.explain()


def test_unbatched_learner():
    learner = bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros(N_IN))
    assert learner.batch_size is None
    assert learner.update(np.ones(N_IN)).shape == (5,)


@pytest.mark.parametrize("opt", [lambda: bt.SGD(0.1, momentum=0.5), lambda: bt.Adam(0.01)])
def test_optimisers_step_the_learner(opt):
    learner = bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
    before = learner.params()
    grads, _ = learner.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, 5)))
    clipped, norm = bt.clip_grad_norm(grads, 1e-3)
    total = np.sqrt(sum(float((g**2).sum()) for g in grads.values()))
    assert norm == pytest.approx(total, rel=1e-12)
    assert np.sqrt(sum(float((g**2).sum()) for g in clipped.values())) == pytest.approx(1e-3, rel=1e-9)
    opt().step(learner, grads)
    after = learner.params()
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_sgd_step_is_p_minus_lr_g():
    learner = bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
    p = learner.params()
    g = {k: np.full_like(v, 0.5) for k, v in p.items()}
    bt.SGD(0.1).step(learner, g)
    for k, v in learner.params().items():
        np.testing.assert_array_equal(v, p[k] - 0.1 * 0.5)


def test_save_and_load_through_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    a = bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B, seed=1)
    path = tmp_path / "params.safetensors"
    a.save(path)
    read = st.load_file(str(path))
    for k, v in a.params().items():
        np.testing.assert_array_equal(read[k], v)
    b = bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B, seed=2)
    b.load(path)
    for k, v in a.params().items():
        np.testing.assert_array_equal(b.params()[k], v)
    # A file written by the safetensors package loads too.
    other = {k: v * 2.0 for k, v in read.items()}
    st.save_file(other, str(tmp_path / "other.safetensors"))
    b.load(tmp_path / "other.safetensors")
    for k, v in other.items():
        np.testing.assert_array_equal(b.params()[k], v)
    assert sorted(bt.load_safetensors(tmp_path / "other.safetensors")) == sorted(other)


def test_the_gil_is_released_while_rust_computes():
    """Another Python thread runs while a long etrace_grad computes."""
    import threading

    learner = bt.compile(nn.GRUCell(N_IN, 64), bt.D_RTRL(), np.zeros((16, N_IN)), batch_size=16)
    xs, ys = np.ones((400, 16, N_IN)), np.zeros((400, 16, 64))
    learner.etrace_grad(xs[:2], ys[:2])  # staged once, outside the timing
    started, done = threading.Event(), threading.Event()

    def work():
        started.set()
        learner.etrace_grad(xs, ys)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    count = 0
    while not done.is_set():
        count += 1
    t.join()
    assert count > 10_000, f"the main thread ran only {count} loop turns during the call"
