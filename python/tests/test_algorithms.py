"""The algorithm builders with braintrace's names and options: each maps to
the Rust algorithm with those options (the same numbers as the algorithm
it is a preset of, or as the name with the same options), ThreeFactor's
modulator set between calls, UORO's and e-prop's seeds, ETraceConfig's
axes, and bad options raising ``ValueError`` (``TypeError`` for a wrong
type) naming the argument."""

import math

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import same_bits

B, N_IN, N_REC, N_OUT, T = 2, 3, 4, 2, 5


def net():
    return nn.Sequential(nn.GRUCell(N_IN, N_REC, name="rnn"), nn.Linear(N_REC, N_OUT, name="out"))


def data():
    r = np.random.default_rng(11)
    return r.standard_normal((T, B, N_IN)), r.standard_normal((T, B, N_OUT))


def grads(algo, params=None):
    l = bt.compile(net(), algo, np.zeros((B, N_IN)), batch_size=B, seed=5, params=params)
    xs, ys = data()
    return l.etrace_grad(xs, ys, "mse")[0]


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k


def near(a, b, tol=1e-12):
    for k in a:
        assert np.allclose(a[k], b[k], rtol=tol, atol=tol), (k, np.max(np.abs(a[k] - b[k])))


def differ(a, b):
    assert any(not np.allclose(a[k], b[k], rtol=1e-9, atol=0) for k in a)


BUILDERS = {
    "eprop": lambda: bt.EProp(),
    "ostl_recurrent": lambda: bt.OSTLRecurrent(),
    "ostl_feedforward": lambda: bt.OSTLFeedforward(),
    "three_factor": lambda: bt.ThreeFactor(),
    "snap": lambda: bt.SnAp(),
    "uoro": lambda: bt.UORO(),
    "random_projection": lambda: bt.RandomProjection(),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_builder_with_in_step_is_the_name(name):
    """The name compiles the library's defaults (``non_temporal="in_step"``);
    the builder with that option gives the same bits, its default
    (braintrace's zeros) zero gradients for the readout."""
    a = BUILDERS[name]()
    assert a.name == name and a.non_temporal == "zero"
    by_name = grads(name)
    builder = {
        "eprop": lambda: bt.EProp(non_temporal="in_step"),
        "ostl_recurrent": lambda: bt.OSTLRecurrent(non_temporal="in_step"),
        "ostl_feedforward": lambda: bt.OSTLFeedforward(non_temporal="in_step"),
        "three_factor": lambda: bt.ThreeFactor(non_temporal="in_step"),
        "snap": lambda: bt.SnAp(non_temporal="in_step"),
        "uoro": lambda: bt.UORO(non_temporal="in_step"),
        "random_projection": lambda: bt.RandomProjection(non_temporal="in_step"),
    }[name]()
    same(grads(builder), by_name)
    g = grads(a)
    if a.vjp_method == "single-step":
        assert np.all(g["out/weight/weight"] == 0) and np.any(by_name["out/weight/weight"] != 0)


def test_presets_give_the_numbers_of_what_they_preset():
    base = grads(bt.D_RTRL())
    # e-prop without a filter and with symmetric feedback is D-RTRL.
    near(grads(bt.EProp()), base)
    differ(grads(bt.EProp(kappa_filter_decay=0.5)), base)
    # OSTLFeedforward is pp_prop with its decay.
    same(grads(bt.OSTLFeedforward(decay_or_rank=0.5)), grads(bt.pp_prop(0.5)))
    same(grads(bt.OSTLFeedforward(decay_or_rank=3)), grads(bt.pp_prop(3)))
    near(grads(bt.OSTLFeedforward()), grads(bt.pp_prop(1e-6)))
    # SnAp-1 is OSTLRecurrent's rule (braintrace: one spelling).
    near(grads(bt.SnAp(n=1)), grads(bt.OSTLRecurrent()))
    # RandomProjection is the engine UORO presets.
    same(grads(bt.RandomProjection(seed=3)), grads(bt.UORO(seed=3)))


def test_options_reach_the_algorithm():
    assert bt.EProp(vjp_method="multi-step").vjp_method == "multi-step"
    assert bt.UORO().vjp_method == "multi-step" and bt.UORO(vjp_method="single-step").vjp_method == "single-step"
    assert "kappa: 0.25" in repr(bt.EProp(kappa_filter_decay=0.25))
    assert "Random { seed: 9 }" in repr(bt.EProp(feedback="random", random_feedback_key=9))
    assert "n: 1" in repr(bt.SnAp(n=1)) and "n: 2" in repr(bt.SnAp())
    assert "seed: 7" in repr(bt.UORO(seed=7)) and "eps: 0.001" in repr(bt.UORO(projection_eps=1e-3))
    assert "fast_paths: false" in repr(bt.OSTLRecurrent(fast_paths=False))
    assert bt.eprop is bt.EProp
    # Seeds: the same seed the same numbers, another seed others.
    same(grads(bt.UORO(seed=1)), grads(bt.UORO(seed=1)))
    differ(grads(bt.UORO(seed=1)), grads(bt.UORO(seed=2)))
    same(grads(bt.EProp(feedback="random", random_feedback_key=4)), grads(bt.EProp(feedback="random", random_feedback_key=4)))
    differ(grads(bt.EProp(feedback="random", random_feedback_key=4)), grads(bt.EProp(feedback="random", random_feedback_key=5)))
    differ(grads(bt.EProp(feedback="random")), grads(bt.EProp()))
    # The fused kernels and the step program agree.
    near(grads(bt.OSTLRecurrent(fast_paths=False)), grads(bt.OSTLRecurrent()))


def test_uoro_with_given_draws():
    """Given draws replace the seeded stream: the same draws the same
    numbers whatever the seed, other draws others; draws of the wrong shape
    are refused at compile, of the wrong dtype at once."""
    # One hidden group (the GRU's h): a draw (B, n_rec, 1) per step.
    draws = [[np.ones((B, N_REC, 1))] for _ in range(T)]
    g1 = grads(bt.UORO(draws=draws))
    same(g1, grads(bt.UORO(seed=9, draws=[[np.ones((B, N_REC, 1))] for _ in range(T)])))
    differ(g1, grads(bt.UORO(draws=[[-np.ones((B, N_REC, 1)) * 2] for _ in range(T)])))
    differ(g1, grads(bt.UORO()))
    with pytest.raises(ValueError):
        bt.compile(net(), bt.UORO(draws=[[np.ones((B, N_REC + 1, 1))]] * T), np.zeros((B, N_IN)), batch_size=B)
    with pytest.raises(TypeError, match=r"draws\[0\]\[0\]"):
        bt.UORO(draws=[[np.ones((2, 2), dtype=np.int32)]])


def test_three_factor_modulator_is_set_between_calls():
    xs, ys = data()
    algo = bt.ThreeFactor(modulator=1.0)
    l = bt.compile(net(), algo, np.zeros((B, N_IN)), batch_size=B, seed=5)
    p = l.params()
    g1 = l.etrace_grad(xs, ys)[0]
    assert l.modulator == 1.0
    # Set on the algorithm: the learner reads it (it shares the value).
    algo.set_modulator(-2.0)
    assert l.modulator == -2.0 and algo.modulator == -2.0
    l.reset_state()
    g2 = l.etrace_grad(xs, ys)[0]
    # The modulator replaces the learning signal: the traced weights'
    # gradients scale with it.
    for k in g1:
        if k.startswith("rnn/Wz") or k.startswith("rnn/Wh"):
            assert np.any(g1[k] != 0), k
            assert np.allclose(g2[k], -2.0 * g1[k], rtol=1e-12, atol=1e-15), k
    # Set on the learner.
    l.set_modulator(0.0)
    assert algo.modulator == 0.0
    l.reset_state()
    g0 = l.etrace_grad(xs, ys)[0]
    assert all(np.all(g0[k] == 0) for k in g0 if k.startswith("rnn/Wz"))
    # Not finite: refused, the old value kept.
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="modulator"):
            l.set_modulator(bad)
        with pytest.raises(ValueError, match="modulator"):
            algo.set_modulator(bad)
    assert l.modulator == 0.0
    # The modulator of a learner compiled by name.
    m = bt.compile(net(), "three_factor", np.zeros((B, N_IN)), batch_size=B, params=p)
    assert m.modulator == 1.0
    m.set_modulator(0.5)
    assert m.modulator == 0.5
    # Another algorithm has none.
    d = bt.compile(net(), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
    with pytest.raises(ValueError, match="modulator"):
        d.modulator
    with pytest.raises(ValueError, match="modulator"):
        d.set_modulator(1.0)
    with pytest.raises(ValueError, match="modulator"):
        bt.D_RTRL().set_modulator(1.0)


CONFIGS = [
    (dict(), "d_rtrl"),
    (dict(trace_factorization="io_factorized", decay=0.9), "pp_prop"),
    (dict(trace_factorization="io_factorized", decay=(0.5, 0.9)), "pp_prop"),
    (dict(recurrence_scope="coupled"), "ostl_recurrent"),
    (dict(recurrence_scope="sparse_n", sparse_n=1), "ostl_recurrent"),
    (dict(recurrence_scope="sparse_n", sparse_n=2), "snap"),
    (dict(trace_filter="kappa", kappa=0.5), "eprop"),
    (dict(trace_filter="kappa", kappa=0.0), "d_rtrl"),
    (dict(learning_signal="random_feedback", random_feedback_key=3), "eprop"),
    (dict(learning_signal="modulatory"), "three_factor"),
    (dict(trace_factorization="random_projection", recurrence_scope="coupled"), "random_projection"),
]


@pytest.mark.parametrize("kw,name", CONFIGS, ids=[n + str(i) for i, (_, n) in enumerate(CONFIGS)])
def test_etrace_config_maps_to_braintraces_algorithm(kw, name):
    c = bt.ETraceConfig(**kw)
    assert c.algorithm().name == name
    assert c.algorithm().non_temporal == "zero"
    assert bt.ETraceConfig(non_temporal="in_step", **kw).algorithm().non_temporal == "in_step"
    g = grads(c)
    assert all(np.all(np.isfinite(v)) for v in g.values())


def test_etrace_config_is_canonical_and_gives_the_builders_numbers():
    c = bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=1, trace_filter="kappa", kappa=0.0)
    assert (c.recurrence_scope, c.sparse_n, c.trace_filter, c.kappa) == ("coupled", None, "none", None)
    assert bt.ETraceConfig(trace_factorization="io_factorized", decay=0.8).decay == (0.8, 0.8)
    s = bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=2)
    assert (s.recurrence_scope, s.sparse_n) == ("sparse_n", 2)
    same(grads(bt.ETraceConfig(trace_factorization="io_factorized", decay=0.9)), grads(bt.pp_prop(0.9)))
    same(grads(bt.ETraceConfig(trace_filter="kappa", kappa=0.5)), grads(bt.EProp(kappa_filter_decay=0.5)))
    same(grads(bt.ETraceConfig(recurrence_scope="coupled")), grads(bt.OSTLRecurrent()))
    # braintrace's SnAp(n) is this config (its constructor builds it).
    same(grads(bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=2)), grads(bt.SnAp(n=2)))
    differ(grads(bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=2)), grads(bt.SnAp(n=1)))


BAD = [
    (ValueError, "feedback", lambda: bt.EProp(feedback="mirror")),
    (ValueError, "kappa_filter_decay", lambda: bt.EProp(kappa_filter_decay=1.0)),
    (ValueError, "kappa_filter_decay", lambda: bt.EProp(kappa_filter_decay=-0.1)),
    (ValueError, "random_feedback_key", lambda: bt.EProp(random_feedback_key=3)),
    (ValueError, "vjp_method", lambda: bt.EProp(vjp_method="both")),
    (ValueError, "non_temporal", lambda: bt.OSTLRecurrent(non_temporal="some")),
    (ValueError, "decay_or_rank", lambda: bt.OSTLFeedforward(decay_or_rank=1.5)),
    (ValueError, "decay_or_rank", lambda: bt.OSTLFeedforward(decay_or_rank=0)),
    (TypeError, "decay_or_rank", lambda: bt.OSTLFeedforward(decay_or_rank="small")),
    (TypeError, "decay_or_rank", lambda: bt.pp_prop(True)),
    (ValueError, "modulator", lambda: bt.ThreeFactor(modulator=math.nan)),
    (ValueError, "vjp_method", lambda: bt.ThreeFactor(vjp_method="multi-step")),
    (ValueError, "`n`", lambda: bt.SnAp(n=3)),
    (ValueError, "`n`", lambda: bt.SnAp(n=0)),
    (ValueError, "`n`", lambda: bt.SnAp(n=-1)),
    (TypeError, "`n`", lambda: bt.SnAp(n=True)),
    (TypeError, "`n`", lambda: bt.SnAp(n=1.0)),
    (ValueError, "projection_eps", lambda: bt.UORO(projection_eps=0.0)),
    (ValueError, "projection_eps", lambda: bt.RandomProjection(projection_eps=math.inf)),
    (ValueError, "trace_factorization", lambda: bt.ETraceConfig(trace_factorization="dense")),
    (ValueError, "recurrence_scope", lambda: bt.ETraceConfig(recurrence_scope="full")),
    (ValueError, "sparse_n", lambda: bt.ETraceConfig(recurrence_scope="sparse_n")),
    (ValueError, "sparse_n", lambda: bt.ETraceConfig(sparse_n=2)),
    (ValueError, "sparse_n", lambda: bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=0)),
    (ValueError, "learning_signal", lambda: bt.ETraceConfig(learning_signal="global")),
    (ValueError, "random_feedback_key", lambda: bt.ETraceConfig(random_feedback_key=1)),
    (ValueError, "kappa", lambda: bt.ETraceConfig(kappa=0.5)),
    (ValueError, "kappa", lambda: bt.ETraceConfig(trace_filter="kappa")),
    (ValueError, "kappa", lambda: bt.ETraceConfig(trace_filter="kappa", kappa=1.0)),
    (ValueError, "trace_filter", lambda: bt.ETraceConfig(trace_filter="lowpass", kappa=0.5)),
    (ValueError, "decay", lambda: bt.ETraceConfig(trace_factorization="io_factorized")),
    (ValueError, "decay", lambda: bt.ETraceConfig(decay=0.5)),
    (ValueError, "decay", lambda: bt.ETraceConfig(trace_factorization="io_factorized", decay=1.0)),
    (ValueError, "RandomProjection", lambda: bt.ETraceConfig(trace_factorization="random_projection")),
    (ValueError, "non_temporal", lambda: bt.ETraceConfig(non_temporal="x")),
]


@pytest.mark.parametrize("exc,word,make", BAD, ids=[f"{i}-{w.strip('`')}" for i, (_, w, _) in enumerate(BAD)])
def test_bad_options_name_the_argument(exc, word, make):
    with pytest.raises(exc, match=word):
        make()


def test_a_legal_config_no_algorithm_implements_is_refused_at_compile():
    c = bt.ETraceConfig(recurrence_scope="sparse_n", sparse_n=3)
    with pytest.raises(ValueError, match="SnAp"):
        c.algorithm()
    with pytest.raises(ValueError, match="algorithm"):
        bt.compile(net(), c, np.zeros((B, N_IN)), batch_size=B)
    with pytest.raises(TypeError, match="algorithm"):
        bt.compile(net(), 3, np.zeros((B, N_IN)), batch_size=B)


def test_eprop_feedback_matrices():
    """Given matrices (braintrace's own draws, exported) replace the seeded
    ones: the same matrices the same numbers, a matrix of the wrong shape
    refused at compile, conflicting options at once."""
    m = np.random.default_rng(0).normal(0, 0.1, (N_REC, N_REC))
    a = bt.EProp(feedback="random", feedback_matrices={0: m})
    assert "Matrices" in repr(a)
    same(grads(a), grads(bt.EProp(feedback="random", feedback_matrices={0: m.copy()})))
    differ(grads(a), grads(bt.EProp(feedback="random", feedback_matrices={0: 2 * m})))
    with pytest.raises(ValueError):
        bt.compile(net(), bt.EProp(feedback="random", feedback_matrices={0: m[:2]}), np.zeros((B, N_IN)), batch_size=B)
    with pytest.raises(ValueError, match="feedback_matrices"):
        bt.EProp(feedback_matrices={0: m})
    with pytest.raises(ValueError, match="feedback_matrices"):
        bt.EProp(feedback="random", random_feedback_key=1, feedback_matrices={0: m})
    with pytest.raises(TypeError, match="feedback_matrices"):
        bt.EProp(feedback="random", feedback_matrices={"rnn": m})
