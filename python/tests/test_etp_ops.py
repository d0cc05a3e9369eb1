"""The sparse, LoRA and convolution ETP primitives from Python
(``ops.etp_sp_mm`` / ``sparse_matmul``, ``ops.etp_lora_mm`` /
``lora_matmul``, ``ops.etp_conv`` / ``conv``), the spike logic
``SpikeBitwise`` and braintrace's ``Expon``: values against numpy;
inside a Python model with a leaky hidden state ``h' = a h + op(x, θ)``
(where D-RTRL is exact) the eligibility-trace gradient against central
finite differences of the summed loss (f64); bad inputs refused."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn, ops

B, T, LEAK = 2, 5, 0.6
R = np.random.default_rng(3)

# A 4 x 3 pattern with 7 non-zeros, in CSR order.
DENSE_PATTERN = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 1, 1]], dtype=bool)
INDPTR = [0, 2, 3, 5, 7]
INDICES = [0, 2, 1, 0, 1, 1, 2]


class Csr:
    """Anything with indptr, indices and shape (as scipy's CSR matrix)."""

    indptr, indices, shape = np.array(INDPTR), np.array(INDICES), (4, 3)


def dense_of(values):
    m = np.zeros((4, 3))
    m[DENSE_PATTERN] = values
    return m


def conv1d(x, k, b):
    """SAME 1-D convolution (cross-correlation), channel-first, stride 1."""
    n, c, length = x.shape
    o, _, w = k.shape
    lo = (w - 1) // 2
    xp = np.pad(x, ((0, 0), (0, 0), (lo, w - 1 - lo)))
    y = np.zeros((n, o, length))
    for i in range(length):
        y[:, :, i] = np.einsum("ncw,ocw->no", xp[:, :, i : i + w], k)
    return y + b[None, :, None]


def test_values_against_numpy():
    x = R.standard_normal((B, 4))
    w, b = R.standard_normal(7), R.standard_normal(3)
    want = x @ dense_of(w) + b
    for s in (Csr(), (INDPTR, INDICES, (4, 3))):
        np.testing.assert_allclose(ops.sparse_matmul(x, w, s, bias=b).numpy(), want, rtol=1e-14)
    np.testing.assert_allclose(ops.etp_sp_mm(x[0], w, Csr()).numpy(), x[0] @ dense_of(w), rtol=1e-14)
    np.testing.assert_allclose(
        ops.etp_sp_mm(x, w, Csr(), weight_fn="softplus").numpy(), x @ dense_of(np.log1p(np.exp(w))), rtol=1e-13
    )
    bb, aa = R.standard_normal((4, 2)), R.standard_normal((2, 3))
    np.testing.assert_allclose(ops.lora_matmul(x, bb, aa, alpha=0.5, bias=b).numpy(), 0.5 * x @ bb @ aa + b, rtol=1e-13)
    np.testing.assert_allclose(ops.etp_lora_mm(x[1], bb, aa).numpy(), x[1] @ bb @ aa, rtol=1e-13)
    xc, k, kb = R.standard_normal((B, 2, 6)), R.standard_normal((3, 2, 3)), R.standard_normal(3)
    np.testing.assert_allclose(ops.conv(xc, k, kb).numpy(), conv1d(xc, k, kb), rtol=1e-12, atol=1e-14)
    valid = ops.etp_conv(xc, k, padding="VALID", strides=[2]).numpy()
    assert valid.shape == (B, 3, 2)
    np.testing.assert_allclose(valid, conv1d(xc, k, np.zeros(3))[:, :, 1:5:2], rtol=1e-12, atol=1e-14)
    explicit = ops.etp_conv(xc, k, padding=[(1, 1)]).numpy()
    np.testing.assert_allclose(explicit, conv1d(xc, k, np.zeros(3)), rtol=1e-12, atol=1e-14)
    # Channel-last layouts.
    nlc = ops.etp_conv(xc.transpose(0, 2, 1), k.transpose(2, 1, 0), dimension_numbers=("NWC", "WIO", "NWC")).numpy()
    np.testing.assert_allclose(nlc, conv1d(xc, k, np.zeros(3)).transpose(0, 2, 1), rtol=1e-12, atol=1e-14)


class Leaky:
    """``h' = LEAK h + op(x, θ)``, the output ``h'``; the op by kind."""

    def __init__(self, kind):
        self.kind = kind

    def init(self, init):
        k = self.kind
        if k == "sparse":
            init.param("w", R.standard_normal(7))
            init.param("b", R.standard_normal(3))
            init.hidden("h", [3])
        elif k == "lora":
            init.param("B", R.standard_normal((4, 2)))
            init.param("A", R.standard_normal((2, 3)))
            init.param("b", R.standard_normal(3))
            init.hidden("h", [3])
        else:
            init.param("k", R.standard_normal((3, 2, 3)) * 0.5)
            init.param("b", R.standard_normal(3))
            init.hidden("h", [3, 6])

    def step(self, ctx, x):
        k, p = self.kind, ctx.param
        if k == "sparse":
            y = ops.etp_sp_mm(x, p("w"), Csr(), bias=p("b"), weight_fn="tanh")
        elif k == "lora":
            y = ops.etp_lora_mm(x, p("B"), p("A"), alpha=0.7, bias=p("b"))
        else:
            y = ops.etp_conv(x, p("k"), p("b"))
        h = ctx.hidden("h") * LEAK + y
        ctx.set_hidden("h", h)
        return h


def sequence(kind):
    if kind == "conv":
        return R.standard_normal((T, B, 2, 6)), R.standard_normal((T, B, 3, 6))
    return R.standard_normal((T, B, 4)), R.standard_normal((T, B, 3))


def total_loss(learner, xs, ys):
    outs = learner.forward(xs)
    return sum(np.mean((outs[t] - ys[t]) ** 2) for t in range(T))


@pytest.mark.parametrize("kind", ["sparse", "lora", "conv"])
def test_gradients_against_finite_differences(kind):
    xs, ys = sequence(kind)
    learner = bt.compile(Leaky(kind), bt.D_RTRL(), np.zeros_like(xs[0]), batch_size=B)
    p0 = learner.params()
    grads, _ = learner.etrace_grad(xs, ys, "mse", "sum")
    assert sorted(grads) == sorted(p0)
    eps = 1e-6
    for key, v in p0.items():
        fd = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            for sign in (1, -1):
                p = {k: a.copy() for k, a in p0.items()}
                p[key][i] += sign * eps
                learner.set_params(p)
                fd[i] += sign * total_loss(learner, xs, ys) / (2 * eps)
        np.testing.assert_allclose(grads[key], fd, rtol=1e-6, atol=1e-8, err_msg=f"{kind}: {key}")
        # The comparison can fail: a gradient off by 0.1% misses.
        assert np.any(fd != 0) and not np.allclose(grads[key] * 1.001, fd, rtol=1e-6, atol=1e-8)


def test_bad_inputs_are_refused():
    x = np.ones((B, 4))
    with pytest.raises(ValueError, match="sparse_mat"):
        ops.etp_sp_mm(x, np.ones(7), ([0, 2, 3], INDICES, (4, 3)))
    with pytest.raises(ValueError, match="sparse_mat"):
        ops.etp_sp_mm(x, np.ones(7), (INDPTR, INDICES, (4, 3, 1)))
    with pytest.raises(TypeError, match="sparse_mat"):
        ops.etp_sp_mm(x, np.ones(7), "csr")
    with pytest.raises(TypeError, match="sparse_mat"):
        ops.etp_sp_mm(x, np.ones(7), (INDPTR, [0, -2, 1, 0, 1, 1, 2], (4, 3)))
    with pytest.raises(ValueError):
        ops.etp_sp_mm(x, np.ones(6), Csr())
    with pytest.raises(ValueError):
        ops.etp_sp_mm(np.ones((B, 5)), np.ones(7), Csr())
    with pytest.raises(ValueError, match="alpha"):
        ops.etp_lora_mm(x, np.ones((4, 2)), np.ones((2, 3)), alpha=float("nan"))
    with pytest.raises(ValueError):
        ops.etp_lora_mm(x, np.ones((4, 2)), np.ones((3, 3)))
    with pytest.raises(TypeError, match="B"):
        ops.etp_lora_mm(x, np.ones((4, 2), dtype=np.int64), np.ones((2, 3)))
    xc, k = np.ones((B, 2, 6)), np.ones((3, 2, 3))
    with pytest.raises(ValueError, match="x"):
        ops.etp_conv(np.ones((2, 6)), k)
    with pytest.raises(ValueError, match="strides"):
        ops.etp_conv(xc, k, strides=[1, 1])
    with pytest.raises(ValueError, match="padding"):
        ops.etp_conv(xc, k, padding="FULL")
    with pytest.raises(TypeError, match="padding"):
        ops.etp_conv(xc, k, padding=3)
    with pytest.raises(ValueError, match="feature_group_count"):
        ops.etp_conv(xc, k, feature_group_count=0)
    with pytest.raises(ValueError):
        ops.etp_conv(xc, np.ones((3, 5, 3)))
    with pytest.raises(ValueError, match="transform"):
        ops.etp_conv(xc, k, kernel_fn="cube")


OPS = {
    "add": lambda x, y: x + y,
    "and": lambda x, y: x * y,
    "iand": lambda x, y: (1 - x) * y,
    "or": lambda x, y: x + y - x * y,
    "xor": lambda x, y: x + y - 2 * x * y,
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_spike_bitwise_truth_tables(op):
    x = np.array([0.0, 0.0, 1.0, 1.0])
    y = np.array([0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(nn.SpikeBitwise(op)(x, y).numpy(), OPS[op](x, y))
    np.testing.assert_array_equal(ops.spike_bitwise(x, y, op).numpy(), OPS[op](x, y))
    if op in ("and", "or", "xor", "iand"):
        assert set(nn.SpikeBitwise(op)(x, y).numpy()) <= {0.0, 1.0}


class TwoTrains:
    """Two LIF neuron populations driven by two Linear maps of the input,
    their spikes combined by ``SpikeBitwise`` (or the same arithmetic
    written out), into a leaky readout."""

    def __init__(self, op, explicit=False):
        self.a, self.b = nn.Linear(3, 5, name="a"), nn.Linear(3, 5, name="b")
        self.na, self.nb = nn.LIFNeuron(5, tau=4.0, name="na"), nn.LIFNeuron(5, tau=3.0, name="nb")
        self.out = nn.LeakyRateReadout(5, 2, name="out")
        self.bitwise, self.op, self.explicit = nn.SpikeBitwise(op), op, explicit

    def init(self, init):
        for m in (self.a, self.b, self.na, self.nb, self.out):
            m.init(init)

    def step(self, ctx, x):
        sa = self.na(ctx, self.a(ctx, x))
        sb = self.nb(ctx, self.b(ctx, x))
        s = OPS[self.op](sa, sb) if self.explicit else self.bitwise(sa, sb)
        return self.out(ctx, s)


@pytest.mark.parametrize("op", ["xor", "iand"])
def test_spike_bitwise_in_a_model_is_its_arithmetic(op):
    xs = 3.0 * R.standard_normal((T, B, 3))
    ys = R.standard_normal((T, B, 2))
    g = []
    for explicit in (False, True):
        l = bt.compile(TwoTrains(op, explicit), bt.D_RTRL(), np.zeros((B, 3)), batch_size=B, seed=2)
        g.append(l.etrace_grad(xs, ys)[0])
    assert sorted(g[0]) == sorted(g[1])
    for k in g[0]:
        np.testing.assert_array_equal(g[0][k], g[1][k], err_msg=k)
    assert any(np.any(v != 0) for k, v in g[0].items() if k.startswith(("a/", "b/")))
    with pytest.raises(ValueError, match="op"):
        nn.SpikeBitwise("nand")
    with pytest.raises(ValueError, match="op"):
        ops.spike_bitwise(np.ones(2), np.ones(2), "nand")


def test_expon_is_brainpys_exponential_synapse():
    """``g' = exp(-dt/tau) g + x`` against an explicit loop (behind a
    ``Linear``, a learner needs a weight); tau 8 by default; hidden
    ``name/g``; bad time constants refused."""
    xs = R.standard_normal((T, B, 4))

    def compiled(syn):
        return bt.compile(nn.Sequential(nn.Linear(4, 4, name="inp"), syn), bt.D_RTRL(), np.zeros((B, 4)), batch_size=B)

    for syn, decay in ((nn.Expon(4, name="syn"), np.exp(-1 / 8)), (nn.Expon(4, tau=2.0, dt=0.5), np.exp(-0.25))):
        l = compiled(syn)
        assert list(l.hidden()) == ["syn/g"]
        p = l.params()
        g, want = np.zeros((B, 4)), []
        for x in xs:
            g = decay * g + x @ p["inp/weight/weight"] + p["inp/weight/bias"]
            want.append(g)
        np.testing.assert_allclose(np.stack([l.update(x) for x in xs]), np.stack(want), rtol=1e-13)
    for bad in (dict(tau=0.0), dict(tau=-1.0), dict(dt=0.0)):
        with pytest.raises(ValueError, match="Expon"):
            nn.Expon(4, **bad)
    with pytest.raises(ValueError):
        nn.Expon(0)
    # The library's ExpSynapse stays available under its own name.
    e, l = compiled(nn.ExpSynapse(4, tau=8.0, name="syn")), compiled(nn.Expon(4, name="syn"))
    np.testing.assert_array_equal(np.stack([e.update(x) for x in xs]), np.stack([l.update(x) for x in xs]))
