"""A learner's checkpoint from Python: a run that never resets its streams,
stopped after K updates, saved and restored into a learner compiled afresh
(another seed), ends with the bits of the run uninterrupted (D-RTRL and
pp_prop, f64 and f32; a file and bytes); a checkpoint of another learner is
refused with a ValueError naming what differs, and nothing changes."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import same_bits

B, N_IN, N_OUT = 3, 3, 2


def make(algo, dtype="float64", batch=B, hidden=5, seed=1):
    model = nn.Sequential(nn.GRUCell(N_IN, hidden), nn.Linear(hidden, N_OUT, name="out"))
    x0 = np.zeros((batch, N_IN), dtype=dtype)
    return bt.compile(model, algo, x0, batch_size=batch, seed=seed)


ALGOS = {"d_rtrl": lambda: bt.D_RTRL(), "pp_prop": lambda: bt.pp_prop(0.9)}


def data(i, dtype, batch=B):
    r = np.random.default_rng(100 + i)
    x = r.standard_normal((batch, N_IN)).astype(dtype)
    xs = r.standard_normal((3, batch, N_IN)).astype(dtype)
    ys = r.standard_normal((3, batch, N_OUT)).astype(dtype)
    return x, xs, ys


def train(learner, opt, i):
    x, xs, ys = data(i, learner.dtype, learner.batch_size)
    learner.update(x)
    grads, _ = learner.etrace_grad(xs, ys)
    opt.step(learner, grads)


def everything(learner):
    v = [learner.running_index]
    v += [learner.params()[k].tobytes() for k in sorted(learner.params())]
    v += [learner.hidden()[k].tobytes() for k in sorted(learner.hidden())]
    return v


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("medium", ["file", "bytes"])
def test_a_resumed_run_has_the_bits_of_an_uninterrupted_one(algo, dtype, medium, tmp_path):
    n, k = 5, 2
    whole, opt = make(ALGOS[algo](), dtype), bt.Adam(0.05)
    for i in range(n):
        train(whole, opt, i)

    first, opt1 = make(ALGOS[algo](), dtype), bt.Adam(0.05)
    for i in range(k):
        train(first, opt1, i)
    path = tmp_path / "run.ckpt"
    if medium == "file":
        bt.save_checkpoint(first, path, opt1, counters={"iteration": k})
    else:
        blob = bt.checkpoint_bytes(first, opt1, counters={"iteration": k})
    del first, opt1

    second, opt2 = make(ALGOS[algo](), dtype, seed=99), bt.Adam(0.05)
    if medium == "file":
        counters = bt.restore_checkpoint(second, path, opt2)
    else:
        counters = bt.restore_checkpoint_bytes(second, blob, opt2)
    assert counters == {"iteration": k}
    for i in range(counters["iteration"], n):
        train(second, opt2, i)
    assert everything(second) == everything(whole)

    # Parameters and the optimiser alone do not resume it: the traces and
    # hidden states matter (the test can fail).
    third, opt3 = make(ALGOS[algo](), dtype, seed=99), bt.Adam(0.05)
    again, opt4 = make(ALGOS[algo](), dtype), bt.Adam(0.05)
    for i in range(k):
        train(again, opt4, i)
    third.set_params(again.params())
    for i in range(k, n):
        train(third, opt3, i)
    assert everything(third)[1:] != everything(whole)[1:]


def test_load_checkpoint_shows_what_a_file_holds(tmp_path):
    learner, opt = make(bt.D_RTRL()), bt.Adam(0.05)
    train(learner, opt, 0)
    bt.save_checkpoint(learner, tmp_path / "a.ckpt", opt, counters={"epoch": 7})
    c = bt.load_checkpoint(tmp_path / "a.ckpt")
    assert c["optimizer"] == "adam"
    assert c["counters"]["user/epoch"] == 7
    assert c["counters"]["learner/running_index"] == learner.running_index == 4
    assert c["labels"]["learner/batch"] == str(B)
    assert all(same_bits(c["params"][k], v) for k, v in learner.params().items())
    assert any(k.startswith("learner/trace/") or k.startswith("learner/owned/") for k in c["extra"])


def test_a_checkpoint_without_an_optimizer_restores_without_one(tmp_path):
    a = make(bt.D_RTRL())
    a.update(np.ones((B, N_IN)))
    b = make(bt.D_RTRL(), seed=4)
    bt.restore_checkpoint_bytes(b, bt.checkpoint_bytes(a))
    assert everything(a) == everything(b)
    # An Adam state needs an Adam to go into.
    opt = bt.Adam(0.1)
    train(a, opt, 0)
    with pytest.raises(ValueError, match="adam"):
        bt.restore_checkpoint_bytes(b, bt.checkpoint_bytes(a, opt))


@pytest.mark.parametrize(
    "other, what, exc",
    [
        (lambda: make(bt.D_RTRL(), batch=2), "batch size", ValueError),
        (lambda: make(bt.D_RTRL(), hidden=6), "parameter", ValueError),
        (lambda: make(bt.pp_prop(0.9)), "algorithm", ValueError),
        (lambda: make(bt.D_RTRL(), dtype="float32"), "checkpoint is f64, expected f32", TypeError),
    ],
)
def test_a_checkpoint_of_another_learner_is_refused_and_changes_nothing(other, what, exc):
    saved, opt = make(bt.D_RTRL()), bt.Adam(0.05)
    train(saved, opt, 0)
    blob = bt.checkpoint_bytes(saved, opt)
    target, topt = other(), bt.Adam(0.05)
    train(target, topt, 1)
    before = everything(target)
    with pytest.raises(exc, match=what):
        bt.restore_checkpoint_bytes(target, blob, topt)
    assert everything(target) == before
    # The optimiser too: the next step is the one it would have taken.
    twin, topt2 = other(), bt.Adam(0.05)
    train(twin, topt2, 1)
    train(target, topt, 2)
    train(twin, topt2, 2)
    assert everything(target) == everything(twin)


def test_bad_files_and_optimizers():
    learner = make(bt.D_RTRL())
    with pytest.raises(ValueError, match="cannot read"):
        bt.restore_checkpoint(learner, "/nonexistent/x.ckpt")
    with pytest.raises(ValueError, match="Checkpoint::from_bytes"):
        bt.restore_checkpoint_bytes(learner, b"not a checkpoint")
    with pytest.raises(TypeError, match="optimizer"):
        bt.checkpoint_bytes(learner, "adam")
