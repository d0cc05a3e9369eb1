"""numpy in and out: round trips keep dtype, shape and bits; other layouts
are converted; other dtypes and types are refused with a TypeError."""

import numpy as np
import pytest

import braintrace_rs as bt
from conftest import same_bits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 4)])
def test_round_trip_keeps_bits(dtype, shape):
    a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    t = bt.tensor(a)
    assert t.shape == shape and t.dtype == np.dtype(dtype).name
    assert same_bits(t.numpy(), a)
    assert same_bits(np.asarray(t), a)


def test_non_contiguous_arrays_are_converted():
    a = np.arange(12.0).reshape(3, 4)
    for view in (a.T, a[:, ::2], np.asfortranarray(a)):
        assert same_bits(bt.tensor(view).numpy(), np.ascontiguousarray(view))


@pytest.mark.parametrize(
    "bad", [np.arange(3), np.array([True, False]), np.arange(3, dtype=np.float16), [1.0, 2.0], 3.0, "x"]
)
def test_other_inputs_are_refused_with_type_error(bad):
    with pytest.raises(TypeError, match="`array`"):
        bt.tensor(bad)


def test_ops_compute_what_numpy_computes():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    ta, tb = bt.tensor(a), bt.tensor(b)
    np.testing.assert_allclose((ta * tb + 2.0 - tb / 3.0).numpy(), a * b + 2.0 - b / 3.0, rtol=1e-15)
    np.testing.assert_allclose(ta.tanh().sum(1).numpy(), np.tanh(a).sum(1), rtol=1e-14)
    np.testing.assert_allclose((ta @ tb.transpose()).numpy(), a @ b.T, rtol=1e-14)
    np.testing.assert_allclose(bt.ops.concat([ta, tb]).numpy(), np.concatenate([a, b], -1))
    np.testing.assert_allclose(bt.ops.stack([ta, tb]).numpy(), np.stack([a, b]))
    np.testing.assert_allclose((1.0 - ta).numpy(), 1.0 - a)
    assert ta.expand_dims(-1).shape == (2, 3, 1)


def test_shape_errors_are_value_errors():
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        bt.tensor(np.ones((2, 3))) + bt.tensor(np.ones((4, 5)))
    with pytest.raises(TypeError):
        bt.tensor(np.ones(2, np.float32)) + bt.tensor(np.ones(2))
