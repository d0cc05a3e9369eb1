"""The sequence driver's options through the Python API, each against an
explicit loop of single steps through the same API: ``mask`` and per-step
``weights`` with both reductions (and ``loss_output``), ``return_outputs``,
several target sequences with auxiliary values, ``chunk_size``,
``evolve``, ``evaluate``, ``etrace_of`` and ``reset_state(batch_size=)``;
then bad options, each a ``ValueError``/``TypeError`` naming the argument
that leaves the learner as it was."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import same_bits

B, N_IN, N_REC, N_OUT, T = 2, 3, 4, 2, 6
TOL = 1e-12


def net():
    return nn.Sequential(nn.GRUCell(N_IN, N_REC, name="rnn"), nn.Linear(N_REC, N_OUT, name="out"))


def learner(algo=None, params=None):
    algo = algo or bt.D_RTRL(non_temporal="in_step")
    return bt.compile(net(), algo, np.zeros((B, N_IN)), batch_size=B, seed=3, params=params)


@pytest.fixture
def data():
    r = np.random.default_rng(7)
    return r.standard_normal((T, B, N_IN)), r.standard_normal((T, B, N_OUT)), r.standard_normal((T, B, N_OUT))


def near(a, b, tol=TOL):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.all(np.abs(a - b) <= tol * (1 + np.abs(b))), np.max(np.abs(a - b))


def per_step(l, xs, ys, loss="mse", **kw):
    """One single-step ``etrace_grad`` call per step (``reduction="sum"``):
    the gradients and the first result after them, per step."""
    gs, rest = [], []
    for t in range(len(xs)):
        y = tuple(v[t : t + 1] for v in ys) if isinstance(ys, tuple) else ys[t : t + 1]
        r = l.etrace_grad(xs[t : t + 1], y, loss, "sum", **kw)
        gs.append(r[0])
        rest.append(r[1:])
    return gs, rest


def weighted_sum(gs, c):
    return {k: sum(ci * g[k] for ci, g in zip(c, gs)) for k in gs[0]}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mask_and_weights_are_a_weighted_sum_of_single_steps(data, reduction):
    xs, ys, _ = data
    mask = np.array([1.0, 0.0, 0.5, 2.0, 1.0, 0.0])
    w = [0.5, 1.0, 1.0, 3.0, 0.25, 1.0]
    a = learner()
    grads, losses = a.etrace_grad(xs, ys, "mse", reduction, mask=mask, weights=w)
    b = learner(params=a.params())
    gs, rest = per_step(b, xs, ys)
    c = mask * np.array(w)
    want = weighted_sum(gs, c)
    if reduction == "mean":
        want = {k: v / c.sum() for k, v in want.items()}
    for k in want:
        near(grads[k], want[k])
    near(losses, np.concatenate([r[0] for r in rest]))
    # The masked losses and the scalar objective of the same call.
    m = learner(params=a.params()).etrace_grad(xs, ys, "mse", reduction, mask=mask, weights=w, loss_output="masked")[1]
    near(m, losses * c)
    s = learner(params=a.params()).etrace_grad(xs, ys, "mse", reduction, mask=mask, weights=np.array(w), loss_output="scalar")[1]
    assert isinstance(s, float)
    near(s, (losses * c).sum() / (c.sum() if reduction == "mean" else 1.0))
    assert a.running_index == b.running_index == T


def test_a_per_sample_mask(data):
    """A ``(T, B)`` mask weights a per-sample loss ``(B,)``."""
    xs, ys, _ = data
    mask = np.random.default_rng(1).uniform(0, 1, (T, B))

    def per_sample(o, y):
        return (o - y).square().mean(1)

    a = learner()
    grads, losses = a.etrace_grad(xs, ys, per_sample, "sum", mask=mask)
    assert losses.shape == (T, B)
    b = learner(params=a.params())
    want = None
    for t in range(T):
        g, _ = b.etrace_grad(xs[t : t + 1], ys[t : t + 1], per_sample, "sum", mask=mask[t : t + 1])
        want = g if want is None else {k: want[k] + g[k] for k in g}
    for k in want:
        near(grads[k], want[k])


def test_outputs_are_the_updates_outputs(data):
    xs, ys, _ = data
    a = learner()
    grads, losses, outs = a.etrace_grad(xs, ys, return_outputs=True)
    b = learner(params=a.params())
    near(outs, np.stack([b.update(x) for x in xs]))
    assert outs.shape == (T, B, N_OUT)


def test_several_targets_and_aux_against_single_steps(data):
    xs, ys, zs = data

    def loss(o, y, z):
        return (o - y).square().mean_all() + (o * z).mean_all(), (o.mean_all(), z.sum_all())

    a = learner()
    grads, losses, aux, outs = a.etrace_grad(xs, (ys, zs), loss, "sum", has_aux=True, return_outputs=True)
    assert isinstance(aux, list) and len(aux) == 2
    near(aux[0], outs.mean(axis=(1, 2)))
    near(aux[1], zs.sum(axis=(1, 2)))
    b = learner(params=a.params())
    gs, rest = per_step(b, xs, (ys, zs), loss, has_aux=True)
    want = weighted_sum(gs, np.ones(T))
    for k in want:
        near(grads[k], want[k])
    near(losses, np.concatenate([r[0] for r in rest]))
    near(aux[0], np.concatenate([r[1][0] for r in rest]))
    # One aux value may be returned bare; a list works as well as a tuple.
    _, _, aux1 = learner(params=a.params()).etrace_grad(xs, ys, lambda o, y: ((o - y).square().mean_all(), o.sum_all()), has_aux=True)
    near(aux1[0], outs.sum(axis=(1, 2)))
    _, _, aux2 = learner(params=a.params()).etrace_grad(xs, ys, lambda o, y: ((o - y).square().mean_all(), [o.sum_all(), y.sum_all()]), has_aux=True)
    near(aux2[1], ys.sum(axis=(1, 2)))


@pytest.mark.parametrize("algo", [lambda: bt.D_RTRL(vjp_method="multi-step"), lambda: bt.pp_prop(0.9, vjp_method="multi-step")])
def test_windows_are_the_sum_of_their_calls(data, algo):
    xs, ys, _ = data
    a = learner(algo())
    grads, losses = a.etrace_grad(xs, ys, "mse", "sum", chunk_size=2)
    assert a.running_index == T // 2
    b = learner(algo(), params=a.params())
    want, ls = None, []
    for t in range(0, T, 2):
        g, l = b.etrace_grad(xs[t : t + 2], ys[t : t + 2], "mse", "sum", chunk_size=2)
        want = g if want is None else {k: want[k] + g[k] for k in g}
        ls.append(l)
    for k in want:
        near(grads[k], want[k])
    near(losses, np.concatenate(ls))
    # Windows differ from single steps (the gradient runs back through the window).
    c = learner(algo(), params=a.params())
    g1, _ = c.etrace_grad(xs, ys, "mse", "sum")
    assert any(not np.allclose(g1[k], grads[k], rtol=1e-9, atol=0) for k in g1)


@pytest.mark.parametrize("chunk", [None, 2])
def test_evolve_is_a_loop_of_updates(data, chunk):
    xs, _, _ = data
    a = learner()
    outs = a.evolve(xs, chunk_size=chunk, return_outputs=True)
    assert a.evolve(xs[:2], chunk_size=chunk) is None
    b = learner(params=a.params())
    want = np.stack([b.update(x) for x in xs])
    for x in xs[:2]:
        b.update(x)
    near(outs, want)
    assert a.running_index == (T + 2) // (chunk or 1)
    ha, hb = a.hidden(), b.hidden()
    for k in hb:
        near(ha[k], hb[k])
    for key in a.param_keys():
        ta, tb = a.etrace_of(key), b.etrace_of(key)
        assert len(ta) == len(tb)
        for u, v in zip(ta, tb):
            near(u, v)


def test_evaluate_leaves_the_learner_as_it_was(data):
    xs, ys, _ = data
    a = learner()
    a.evolve(xs[:3])
    before = (a.hidden(), [a.etrace_of(k) for k in a.param_keys()], a.running_index)
    outs = a.evaluate(xs)
    after = (a.hidden(), [a.etrace_of(k) for k in a.param_keys()], a.running_index)
    assert before[2] == after[2]
    for k in before[0]:
        assert same_bits(before[0][k], after[0][k])
    for u, v in zip(before[1], after[1]):
        assert all(same_bits(p, q) for p, q in zip(u, v))
    # The outputs of updates from the same hidden states.
    near(outs, np.stack([a.update(x) for x in xs]))


def test_etrace_of_shapes_and_unknown_keys():
    a = learner(bt.D_RTRL())
    a.update(np.ones((B, N_IN)))
    t = a.etrace_of("rnn/Wz/weight/weight")
    # One trace, shaped like the leaf with the batch first and the group's
    # states (one, h) last; finite and, after a step, not all zero.
    assert [v.shape for v in t] == [(B, N_IN + N_REC, N_REC, 1)]
    assert np.all(np.isfinite(t[0])) and np.any(t[0] != 0)
    # The parameter state's path gives every leaf's traces (bias, weight).
    assert [v.shape for v in a.etrace_of("rnn/Wz/weight")] == [(B, N_REC, 1), (B, N_IN + N_REC, N_REC, 1)]
    # A readout has no trace.
    assert a.etrace_of("out/weight/weight") == []
    with pytest.raises(ValueError, match="rnn/Wz/weight/weight"):
        a.etrace_of("no/such/key")


def test_reset_state_to_another_batch_size(data):
    xs, ys, _ = data
    a = learner()
    a.etrace_grad(xs, ys)
    a.reset_state(batch_size=3)
    assert a.batch_size == 3 and a.running_index == 0
    assert all(np.all(h == 0) and h.shape[0] == 3 for h in a.hidden().values())
    assert a.update(np.ones((3, N_IN))).shape == (3, N_OUT)
    grads, _ = a.etrace_grad(np.ones((T, 3, N_IN)), np.zeros((T, 3, N_OUT)))
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    with pytest.raises(ValueError, match="batch"):
        a.reset_state(batch_size=0)
    assert a.batch_size == 3


def snapshot(l):
    return (l.running_index, l.hidden(), [l.etrace_of(k) for k in l.param_keys()])


def unchanged(l, before):
    now = snapshot(l)
    assert now[0] == before[0]
    assert all(same_bits(now[1][k], before[1][k]) for k in before[1])
    assert all(all(same_bits(p, q) for p, q in zip(u, v)) for u, v in zip(now[2], before[2]))


def test_bad_options_name_the_argument_and_change_nothing(data):
    xs, ys, zs = data
    a = learner()
    a.etrace_grad(xs[:2], ys[:2])
    before = snapshot(a)
    bad = [
        (ValueError, "mask", dict(mask=np.ones(T - 1))),
        (ValueError, "mask", dict(mask=np.array([1.0, np.nan, 1, 1, 1, 1]))),
        (ValueError, "weights", dict(weights=[1.0] * (T + 1))),
        (ValueError, "weights", dict(weights=np.ones((T, 2)))),
        (TypeError, "weights", dict(weights="abc")),
        (ValueError, "chunk_size", dict(chunk_size=4)),
        (ValueError, "chunk_size", dict(chunk_size=0)),
        (ValueError, "chunk_size", dict(chunk_size=2)),  # a single-step learner
        (ValueError, "loss_output", dict(loss_output="all")),
        (ValueError, "reduction", dict(reduction="max")),
        (ValueError, "has_aux", dict(has_aux=True)),
        (TypeError, "mask", dict(mask=np.ones(T, dtype=np.int64))),
    ]
    for exc, word, kw in bad:
        with pytest.raises(exc, match=word):
            a.etrace_grad(xs, ys, "mse", **kw)
        unchanged(a, before)
    with pytest.raises(ValueError, match="ys"):
        a.etrace_grad(xs, (ys, zs), "mse")
    with pytest.raises(ValueError, match="ys"):
        a.etrace_grad(xs, (), lambda o: o)
    with pytest.raises(ValueError):
        a.etrace_grad(xs, ys[:-1])
    # A loss that does not return (loss, aux) under has_aux.
    with pytest.raises(TypeError, match="aux"):
        a.etrace_grad(xs, ys, lambda o, y: (o - y).square().mean_all(), has_aux=True)
    with pytest.raises(TypeError, match="aux"):
        a.etrace_grad(xs, ys, lambda o, y: ((o - y).square().mean_all(), 3.0), has_aux=True)
    # A loss raising its own exception: the exception comes out.
    def boom(o, y):
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        a.etrace_grad(xs, ys, boom)
    with pytest.raises(ValueError, match="chunk_size"):
        a.evolve(xs, chunk_size=4)
    with pytest.raises(ValueError):
        a.evolve(xs[:, :, :2])
    with pytest.raises(ValueError):
        a.evaluate(xs[:, :, :2])
    unchanged(a, before)
