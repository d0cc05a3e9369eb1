"""The learner's non-finite policy from Python: a NaN in an input is a
ValueError naming it, with the learner unchanged; "skip" drops the step
and counts it; "allow" lets it through."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn


def learner():
    model = nn.Sequential(nn.GRUCell(3, 4, name="rnn"), nn.Linear(4, 1, name="out"))
    return bt.compile(model, bt.D_RTRL(), np.zeros((2, 3)), batch_size=2)


def test_nan_input_is_refused_and_changes_nothing():
    lr = learner()
    lr.update(np.ones((2, 3)))
    hidden = {k: v.copy() for k, v in lr.hidden().items()}
    x = np.ones((2, 3))
    x[1, 2] = np.nan
    assert lr.non_finite == "error"
    with pytest.raises(ValueError, match=r"update: input `x` holds NaN at index \[1, 2\] at step 1"):
        lr.update(x)
    assert lr.running_index == 1
    for k, v in lr.hidden().items():
        np.testing.assert_array_equal(v, hidden[k])
    xs = np.ones((3, 2, 3))
    xs[2, 0, 0] = np.inf
    with pytest.raises(ValueError, match="input `xs` holds inf"):
        lr.etrace_grad(xs, np.zeros((3, 2, 1)))
    assert lr.running_index == 1


def test_skip_counts_and_allow_lets_through():
    lr = learner()
    lr.non_finite = "skip"
    x = np.full((2, 3), np.nan)
    lr.update(x)
    assert (lr.skipped, lr.running_index) == (1, 0)
    lr.non_finite = "allow"
    lr.update(x)
    assert lr.running_index == 1
    assert np.isnan(next(iter(lr.hidden().values()))).any()
    with pytest.raises(ValueError, match="non_finite"):
        lr.non_finite = "sometimes"
