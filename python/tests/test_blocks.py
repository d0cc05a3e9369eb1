"""The layers of issue 36 from Python (weight-structured layers, grouped
linear, embedding, activations, PReLU, norms, dropout, pooling, flatten and
unflatten): each compiles inside a small recurrent net (``nn.Sequential``
with a ``GRUCell``), takes a step under D-RTRL and pp_prop (f32 and f64)
and gives finite gradients for every parameter, non-zero for the layer's
own; the weight-structured ones declare braintrace's parameter keys; bad
arguments are refused by name."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn

B = 3


def gru_net(*front, width, name="rnn"):
    """``front`` layers, then a GRU cell of ``width`` inputs and a readout."""
    return nn.Sequential(*front, nn.GRUCell(width, 5, name=name), nn.Linear(5, 2, name="out"))


DALE = np.array([[1.0], [1.0], [-1.0], [-1.0]])
SPARSE = np.array([[0.5, 0.0, -0.3, 0.0, 0.0, 0.2], [0.0, 0.4, 0.0, 0.0, 0.1, 0.0],
                   [0.3, 0.0, 0.0, -0.6, 0.0, 0.0], [0.0, 0.0, 0.7, 0.0, 0.0, -0.2]])
MASK = (np.arange(24).reshape(4, 6) % 3 != 0).astype(np.float64)

# name -> (net factory, per-sample input shape, the layer's own keys (braintrace's), input kind)
NETS = {
    "Linear(w_mask)": (lambda: gru_net(nn.Linear(4, 6, name="lin", w_mask=MASK), width=6), (4,),
                       ["lin/weight/weight", "lin/weight/bias"]),
    "SignedWLinear": (lambda: gru_net(nn.SignedWLinear(4, 6, w_sign=DALE, name="sw"), width=6), (4,), ["sw/weight"]),
    "ScaledWSLinear": (lambda: gru_net(nn.ScaledWSLinear(4, 6, name="ws"), width=6), (4,),
                       ["ws/weight/weight", "ws/weight/bias", "ws/weight/gain"]),
    "SparseLinear": (lambda: gru_net(nn.SparseLinear(SPARSE, b_init="zeros", name="sp"), width=6), (4,),
                     ["sp/weight/weight", "sp/weight/bias"]),
    "LoRA": (lambda: gru_net(nn.LoRA(4, 2, 6, name="lora"), width=6), (4,), ["lora/weight/lora_a", "lora/weight/lora_b"]),
    "Conv1d": (lambda: gru_net(nn.Conv1d((8, 2), 3, 3, b_init="zeros", name="conv"), nn.Flatten(in_size=(8, 3)), width=24),
               (8, 2), ["conv/weight/weight", "conv/weight/bias"]),
    "Conv2d": (lambda: gru_net(nn.Conv2d((4, 4, 2), 3, (3, 3), name="conv"), nn.Flatten(in_size=(4, 4, 3)), width=48),
               (4, 4, 2), ["conv/weight/weight"]),
    "Conv3d": (lambda: gru_net(nn.Conv3d((2, 3, 3, 1), 2, 2, padding="VALID", name="conv"),
                               nn.Flatten(in_size=(1, 2, 2, 2)), width=8), (2, 3, 3, 1), ["conv/weight/weight"]),
    "GroupedLinear": (lambda: gru_net(nn.Unflatten(-1, (2, 3)), nn.GroupedLinear(2, 3, 4, name="gl"),
                                      nn.Flatten(in_size=(2, 4)), width=8), (6,), ["gl/weight/weight", "gl/weight/bias"]),
    "Embedding": (lambda: gru_net(nn.Embedding(10, 4, name="emb"), width=4), (), ["emb/weight"]),
    "PReLU": (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.PReLU(6, name="prelu"), width=6), (4,), ["prelu/weight"]),
    "LayerNorm": (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.LayerNorm(6, name="ln"), width=6), (4,),
                  ["ln/weight/scale", "ln/weight/bias"]),
    "RMSNorm": (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.RMSNorm(6, name="rms"), width=6), (4,), ["rms/scale/scale"]),
    "GroupNorm": (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.GroupNorm(6, num_groups=2, name="gn"), width=6), (4,),
                  ["gn/weight/scale", "gn/weight/bias"]),
    "Dropout": (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.Dropout(0.8, seed=3), width=6), (4,), []),
    "MaxPool1d": (lambda: gru_net(nn.MaxPool1d(2), nn.Flatten(in_size=(4, 2)), width=8), (8, 2), []),
    "AvgPool1d": (lambda: gru_net(nn.AvgPool1d(2, stride=2), nn.Flatten(in_size=(4, 2)), width=8), (8, 2), []),
    "MaxPool2d": (lambda: gru_net(nn.MaxPool2d(2), nn.Flatten(in_size=(2, 2, 2)), width=8), (4, 4, 2), []),
    "AvgPool2d": (lambda: gru_net(nn.AvgPool2d((2, 2), stride=2, padding=1), nn.Flatten(in_size=(3, 3, 2)), width=18),
                  (4, 4, 2), []),
}

ACTIVATIONS = {
    "Identity": nn.Identity, "ReLU": nn.ReLU, "ReLU6": nn.ReLU6, "Sigmoid": nn.Sigmoid, "Tanh": nn.Tanh,
    "Hardsigmoid": nn.Hardsigmoid, "Hardswish": nn.Hardswish, "SiLU": nn.SiLU, "Mish": nn.Mish, "SELU": nn.SELU,
    "LogSigmoid": nn.LogSigmoid, "Softplus": nn.Softplus, "Softsign": nn.Softsign, "Tanhshrink": nn.Tanhshrink,
    "ELU": lambda: nn.ELU(0.5), "CELU": lambda: nn.CELU(2.0), "GELU": lambda: nn.GELU(approximate=True),
    "LeakyReLU": lambda: nn.LeakyReLU(0.1), "Hardtanh": lambda: nn.Hardtanh(-0.5, 0.5),
    "Hardshrink": lambda: nn.Hardshrink(0.1), "Softshrink": lambda: nn.Softshrink(0.1),
    "Threshold": lambda: nn.Threshold(0.1, -1.0), "Softmax": nn.Softmax, "LogSoftmax": nn.LogSoftmax,
    "Softmin": nn.Softmin,
}
for _n, _a in ACTIVATIONS.items():
    NETS[_n] = ((lambda a=_a: gru_net(nn.Linear(4, 6, name="inp"), a(), width=6)), (4,), [])
NETS["GLU"] = (lambda: gru_net(nn.Linear(4, 6, name="inp"), nn.GLU(), width=3), (4,), [])

ALGOS = {"d_rtrl": lambda: bt.D_RTRL(non_temporal="in_step"), "pp_prop": lambda: bt.pp_prop(0.8, non_temporal="in_step")}


def inputs(net, shape, n, dtype):
    """``n`` inputs of a sample shape (token indices for the embedding)."""
    rng = np.random.default_rng(1)
    if net == "Embedding":
        return rng.integers(0, 10, (n, B)).astype(dtype)
    return (1.5 * rng.standard_normal((n, B) + shape)).astype(dtype)


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("net", sorted(NETS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_compiles_in_a_recurrent_net_steps_and_learns(net, algo, dtype):
    make, shape, own = NETS[net]
    xs = inputs(net, shape, 7, dtype)
    learner = bt.compile(make(), ALGOS[algo](), np.zeros((B,) + shape, dtype), batch_size=B)
    keys = learner.param_keys()
    assert set(own) <= set(keys), f"{net}: keys {keys}"
    out = learner.update(xs[0])
    assert out.dtype == dtype and out.shape == (B, 2) and np.all(np.isfinite(out))
    grads, losses = learner.etrace_grad(xs[1:], np.ones((6, B, 2), dtype))
    assert losses.shape == (6,) and np.all(np.isfinite(losses))
    assert sorted(grads) == sorted(keys)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    assert np.any(grads["rnn/Wz/weight/weight"] != 0), "the gradient reaches the cell"
    for k in own:
        assert np.any(grads[k] != 0), f"{net}: the gradient of {k} is zero"


# braintrace's parameter keys and shapes of the weight-structured layers
# (with the layer's name as the path), as braintrace 0.2.6 declares them
# (read from its ParamStates: e.g. ScaledWSLinear(4, 6) has one state
# `weight` holding {weight (4, 6), bias (6,), gain (1, 6)}, SignedWLinear a
# bare `weight`).
BRAINTRACE_KEYS = {
    "SignedWLinear": ["sw/weight"],
    "ScaledWSLinear": ["ws/weight/bias", "ws/weight/gain", "ws/weight/weight"],
    "SparseLinear": ["sp/weight/bias", "sp/weight/weight"],
    "LoRA": ["lora/weight/lora_a", "lora/weight/lora_b"],
    "Conv1d": ["conv/weight/bias", "conv/weight/weight"],
    "GroupedLinear": ["gl/weight/bias", "gl/weight/weight"],
    "Embedding": ["emb/weight"],
}


@pytest.mark.parametrize("net", sorted(BRAINTRACE_KEYS))
def test_weight_structured_layers_have_braintraces_keys_and_shapes(net):
    make, shape, _ = NETS[net]
    learner = bt.compile(make(), bt.D_RTRL(non_temporal="in_step"), np.zeros((B,) + shape), batch_size=B)
    params = learner.params()
    mine = sorted(k for k in params if not k.startswith(("rnn/", "out/")))
    assert mine == BRAINTRACE_KEYS[net]
    shapes = {k: params[k].shape for k in mine}
    expected = {
        "SignedWLinear": {"sw/weight": (4, 6)},
        "ScaledWSLinear": {"ws/weight/weight": (4, 6), "ws/weight/bias": (6,), "ws/weight/gain": (1, 6)},
        "SparseLinear": {"sp/weight/weight": (int(np.count_nonzero(SPARSE)),), "sp/weight/bias": (6,)},
        "LoRA": {"lora/weight/lora_a": (4, 2), "lora/weight/lora_b": (2, 6)},
        "Conv1d": {"conv/weight/weight": (3, 2, 3), "conv/weight/bias": (1, 3)},
        "GroupedLinear": {"gl/weight/weight": (2, 3, 4), "gl/weight/bias": (2, 4)},
        "Embedding": {"emb/weight": (10, 4)},
    }[net]
    assert shapes == expected


def test_signed_w_linear_follows_its_sign_and_sparse_keeps_its_data():
    """The effective weight is |W| * sign (a step against an explicit
    product), and the sparse layer starts from the given non-zeros."""
    x = np.random.default_rng(2).standard_normal((B, 4))
    layer = nn.SignedWLinear(4, 6, w_sign=DALE, name="sw")
    learner = bt.compile(nn.Sequential(layer, nn.Expon(6)), bt.D_RTRL(non_temporal="in_step"), np.zeros((B, 4)),
                         batch_size=B)
    w = learner.params()["sw/weight"]
    np.testing.assert_allclose(learner.update(x), x @ (np.abs(w) * DALE), rtol=1e-12, atol=1e-12)
    # The same weight without the sign gives another output: the check can fail.
    learner.reset_state()
    assert not np.allclose(learner.update(x), x @ np.abs(w))
    sp = bt.compile(nn.Sequential(nn.SparseLinear(SPARSE, name="sp"), nn.Expon(6)), bt.D_RTRL(non_temporal="in_step"),
                    np.zeros((B, 4)), batch_size=B)
    np.testing.assert_array_equal(sp.params()["sp/weight/weight"], SPARSE[SPARSE != 0])
    np.testing.assert_allclose(sp.update(x), x @ SPARSE, rtol=1e-12, atol=1e-12)


def test_stateless_blocks_compute_what_they_say():
    x = np.random.default_rng(3).standard_normal((B, 8, 2))
    algo = bt.D_RTRL(non_temporal="in_step")

    def run(*layers, out=(8, 2)):
        """The layers' output (a sample of shape ``out``) on ``x``: an
        identity ``Linear`` and an ``Expon`` synapse after them (the ETP
        operation and hidden state a learner needs) return their input on
        the first step."""
        n = int(np.prod(out))
        ident = nn.Linear(n, n, name="id", bias=False, w_init="identity")
        net = nn.Sequential(*layers, nn.Flatten(in_size=out), ident, nn.Expon(n))
        return bt.compile(net, algo, np.zeros_like(x), batch_size=B).update(x).reshape((B,) + tuple(out))

    np.testing.assert_allclose(run(nn.MaxPool1d(2), out=(4, 2)), x.reshape(B, 4, 2, 2).max(axis=2))
    np.testing.assert_allclose(run(nn.AvgPool1d(2, stride=2), out=(4, 2)), x.reshape(B, 4, 2, 2).mean(axis=2))
    np.testing.assert_allclose(run(nn.Flatten(in_size=(8, 2)), out=(16,)), x.reshape(B, 16))
    np.testing.assert_allclose(run(nn.Flatten(in_size=(8, 2)), nn.Unflatten(-1, (8, 2))), x)
    np.testing.assert_allclose(run(nn.ReLU()), np.maximum(x, 0))
    np.testing.assert_allclose(run(nn.LeakyReLU(0.2)), np.where(x >= 0, x, 0.2 * x))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(run(nn.Softmax()), e / e.sum(-1, keepdims=True), rtol=1e-12)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(run(nn.LayerNorm(2)), ln, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(run(nn.PReLU(2)), np.where(x >= 0, x, 0.25 * x))
    np.testing.assert_allclose(run(nn.Dropout(1.0)), x)
    # Dropout keeping half: about half the entries dropped, the others doubled.
    wide = np.random.default_rng(4).standard_normal((B, 400, 2))
    y = bt.compile(
        nn.Sequential(nn.Dropout(0.5, seed=1), nn.Flatten(in_size=(400, 2)),
                      nn.Linear(800, 800, name="id", bias=False, w_init="identity"), nn.Expon(800)),
        algo, np.zeros_like(wide), batch_size=B).update(wide).reshape(wide.shape)
    kept = y != 0
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_allclose(y[kept], 2.0 * wide[kept], rtol=1e-12)
    # Evaluating: the identity, in a learner compiled with the mode off; one
    # compiled while training keeps dropping.
    drop = nn.Dropout(0.5, seed=1)
    training = bt.compile(nn.Sequential(drop, nn.Flatten(in_size=(8, 2)), *_probe(16)), algo, np.zeros_like(x),
                          batch_size=B)
    assert drop.training
    drop.training = False
    assert not drop.training
    evaluating = bt.compile(nn.Sequential(drop, nn.Flatten(in_size=(8, 2)), *_probe(16)), algo, np.zeros_like(x),
                            batch_size=B)
    np.testing.assert_allclose(evaluating.update(x), x.reshape(B, 16), rtol=1e-12)
    assert np.any(training.update(x) == 0)
    with pytest.raises(ValueError, match="training"):
        nn.ReLU()._native.training = False


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="kind"):
        nn.Layer.activation("NotAnActivation")
    with pytest.raises(ValueError, match="unknown parameter"):
        nn.Layer.activation("ReLU", alpha=2.0)
    with pytest.raises(ValueError, match="alpha"):
        nn.CELU(0.0)
    with pytest.raises(ValueError, match="min_val"):
        nn.Hardtanh(1.0, -1.0)
    with pytest.raises(ValueError, match="SignedWLinear"):
        nn.SignedWLinear(0, 3)
    with pytest.raises(ValueError, match="w_sign"):
        nn.SignedWLinear(4, 3, w_sign=np.ones((3, 3)))
    with pytest.raises(ValueError, match="eps"):
        nn.ScaledWSLinear(4, 3, eps=0.0)
    with pytest.raises(ValueError, match="LoRA|Lora|lora_rank"):
        nn.LoRA(4, 0, 3)
    with pytest.raises(ValueError, match="kernel_size"):
        nn.Conv2d((4, 4, 2), 3, (3, 3, 3))
    with pytest.raises(ValueError, match="padding"):
        nn.Conv1d((8, 2), 3, 3, padding="FULL")
    with pytest.raises(ValueError, match="GroupedLinear"):
        nn.GroupedLinear(0, 3, 4)
    with pytest.raises(ValueError, match="Embedding"):
        nn.Embedding(0, 4)
    with pytest.raises(ValueError, match="Dropout|probability"):
        nn.Dropout(0.0)
    with pytest.raises(ValueError, match="MaxPool1d"):
        nn.MaxPool1d(0)
    with pytest.raises(ValueError, match="padding"):
        nn.MaxPool1d(2, padding="SAME")
    with pytest.raises(ValueError, match="in_size"):
        nn.Flatten()
    with pytest.raises(ValueError, match="Flatten"):
        nn.Flatten(2, 1, in_size=(4, 4))
    with pytest.raises(ValueError, match="kind"):
        nn.Layer.norm("BatchNorm", 4, "bn")
    # GroupNorm's groups must divide the features (refused at compile).
    with pytest.raises(ValueError, match="GroupNorm|num_groups"):
        bt.compile(gru_net(nn.GroupNorm(6, num_groups=4), width=6), bt.D_RTRL(), np.zeros((B, 6)), batch_size=B)
    # An index outside the embedding's table.
    learner = bt.compile(gru_net(nn.Embedding(10, 4, name="emb"), width=4), bt.D_RTRL(non_temporal="in_step"),
                         np.zeros((B,)), batch_size=B)
    with pytest.raises(ValueError, match="Embedding"):
        learner.update(np.array([0.0, 10.0, 3.0]))


NEW_INITIALIZERS = ["xavier_normal", "xavier_uniform", "kaiming_uniform", "kaiming_truncated_normal", "lecun_normal",
                    "lecun_uniform", "truncated_normal", "uniform", "identity"]


@pytest.mark.parametrize("name", NEW_INITIALIZERS)
def test_new_initializers_draw_with_their_variance(name):
    """Each name draws from the generator; the variance-scaling ones with
    brainstate's variance (``scale / fan``) and the others by their law."""
    fan_in, fan_out = 400, 300
    shape = (fan_in, fan_out)
    got = {}

    class M:
        net = gru_net(width=1)

        def init(self, init):
            got["w"] = init.draw(name, list(shape)).numpy()
            self.net.init(init)

        def step(self, ctx, x):
            return self.net(ctx, x)

    bt.compile(M(), bt.D_RTRL(non_temporal="in_step"), np.zeros((1, 1)), batch_size=1)
    w = got["w"]
    assert w.shape == shape and np.all(np.isfinite(w))
    var = {
        "xavier_normal": 2.0 / (fan_in + fan_out),
        "xavier_uniform": 2.0 / (fan_in + fan_out),
        "kaiming_uniform": 2.0 / fan_in,
        "kaiming_truncated_normal": 2.0 / fan_in,
        "lecun_normal": 1.0 / fan_in,
        "lecun_uniform": 1.0 / fan_in,
    }
    if name in var:
        assert abs(w.mean()) < 0.05 * np.sqrt(var[name])
        assert w.var() == pytest.approx(var[name], rel=0.03)
    elif name == "truncated_normal":
        assert np.all(np.abs(w) <= 2.0) and w.std() == pytest.approx(0.88, rel=0.03)
    elif name == "uniform":
        assert np.all((w >= 0) & (w < 1)) and w.mean() == pytest.approx(0.5, rel=0.03)
    else:
        np.testing.assert_array_equal(w, np.eye(fan_in, fan_out))
    with pytest.raises(ValueError, match="unknown initializer"):
        nn.Linear(3, 4, w_init="glorot")


def test_initializer_names_reach_the_layers():
    """A layer's ``w_init`` by name: the identity gives the identity weight."""
    learner = bt.compile(gru_net(nn.Linear(4, 4, name="lin", w_init="identity"), width=4), bt.D_RTRL(non_temporal="in_step"),
                         np.zeros((B, 4)), batch_size=B)
    np.testing.assert_array_equal(learner.params()["lin/weight/weight"], np.eye(4))
    other = bt.compile(gru_net(nn.Linear(4, 4, name="lin", w_init=("identity", 2.0)), width=4), bt.D_RTRL(non_temporal="in_step"),
                       np.zeros((B, 4)), batch_size=B)
    np.testing.assert_array_equal(other.params()["lin/weight/weight"], 2.0 * np.eye(4))


def _probe(n):
    """An identity ``Linear`` and an ``Expon`` synapse of ``n``: on the
    first step they return their input (the ETP operation and hidden state
    a learner needs)."""
    return nn.Linear(n, n, name="id", bias=False, w_init="identity"), nn.Expon(n)


def _first_step(layer, x, n_out):
    """One step of ``layer`` on ``x`` (then an identity ``Linear`` and an
    ``Expon`` synapse of ``n_out``, which return their input on the first
    step) and the learner's parameters."""
    ident = nn.Linear(n_out, n_out, name="id", bias=False, w_init="identity")
    learner = bt.compile(nn.Sequential(layer, ident, nn.Expon(n_out)), bt.D_RTRL(non_temporal="in_step"),
                         np.zeros_like(x), batch_size=x.shape[0])
    return learner.update(x), learner.params()


def test_weight_structured_steps_match_numpy():
    """Each layer's step against the equation written out in numpy, from
    the parameters the learner holds."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, 4))
    y, p = _first_step(nn.ScaledWSLinear(4, 6, eps=1e-4, name="ws"), x, 6)
    w = p["ws/weight/weight"]
    w_hat = (w - w.mean(0)) / np.sqrt(np.maximum(4 * w.var(0), 1e-4))
    np.testing.assert_allclose(y, (x @ w_hat) * p["ws/weight/gain"] + p["ws/weight/bias"], rtol=1e-10, atol=1e-12)
    y, p = _first_step(nn.LoRA(4, 2, 6, name="lora"), x, 6)
    np.testing.assert_allclose(y, x @ p["lora/weight/lora_a"] @ p["lora/weight/lora_b"] / 2, rtol=1e-10, atol=1e-12)
    y, p = _first_step(nn.Linear(4, 6, name="lin", w_mask=MASK), x, 6)
    np.testing.assert_allclose(y, x @ (p["lin/weight/weight"] * MASK) + p["lin/weight/bias"], rtol=1e-10, atol=1e-12)
    g = rng.standard_normal((B, 2, 3))
    y, p = _first_step(nn.Sequential(nn.GroupedLinear(2, 3, 4, name="gl"), nn.Flatten(in_size=(2, 4))), g, 8)
    ref = np.einsum("bgk,gkn->bgn", g, p["gl/weight/weight"]) + p["gl/weight/bias"]
    np.testing.assert_allclose(y, ref.reshape(B, 8), rtol=1e-10, atol=1e-12)
    tokens = np.array([3.0, 0.0, 9.0])
    y, p = _first_step(nn.Embedding(10, 4, name="emb"), tokens, 4)
    np.testing.assert_array_equal(y, p["emb/weight"][[3, 0, 9]])
    # Conv1d, SAME padding, stride 1, against an explicit loop.
    s = rng.standard_normal((B, 8, 2))
    y, p = _first_step(nn.Sequential(nn.Conv1d((8, 2), 3, 3, b_init="zeros", name="conv"), nn.Flatten(in_size=(8, 3))),
                       s, 24)
    k = p["conv/weight/weight"]  # (3, 2, 3)
    pad = np.pad(s, ((0, 0), (1, 1), (0, 0)))
    ref = np.stack([np.einsum("bkc,kco->bo", pad[:, t:t + 3], k) for t in range(8)], axis=1) + p["conv/weight/bias"]
    np.testing.assert_allclose(y, ref.reshape(B, 24), rtol=1e-10, atol=1e-12)
    # The check can fail: the same kernel flipped gives another output.
    flipped = np.stack([np.einsum("bkc,kco->bo", pad[:, t:t + 3], k[::-1]) for t in range(8)], axis=1)
    assert not np.allclose(y, flipped.reshape(B, 24))
