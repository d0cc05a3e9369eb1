"""Bad inputs raise the right exception (ValueError for shapes and values,
TypeError for dtypes, MemoryError for allocation, a callback's own
exception as it was raised) and leave the learner unchanged: a learner
that saw the bad call continues with the bits of one that did not."""

import numpy as np
import pytest

import braintrace_rs as bt
from braintrace_rs import nn
from conftest import same_bits

B, N_IN, N_OUT = 2, 3, 4


def make():
    model = nn.Sequential(nn.GRUCell(N_IN, 5), nn.Linear(5, N_OUT, name="out"))
    return bt.compile(model, bt.pp_prop(0.9), np.zeros((B, N_IN)), batch_size=B, seed=3)


def warm(learner):
    learner.update(np.full((B, N_IN), 0.5))
    return learner


def assert_same_continuation(a, b):
    """``a`` and ``b`` are in the same state: same parameters, hidden states,
    step counter, and the same results from here on (traces included)."""
    assert a.running_index == b.running_index
    for x, y in ((a.params(), b.params()), (a.hidden(), b.hidden())):
        assert sorted(x) == sorted(y) and all(same_bits(x[k], y[k]) for k in x)
    xs = np.random.default_rng(9).standard_normal((4, B, N_IN))
    ys = np.random.default_rng(8).standard_normal((4, B, N_OUT))
    assert same_bits(a.update(xs[0]), b.update(xs[0]))
    ga, la = a.etrace_grad(xs, ys)
    gb, lb = b.etrace_grad(xs, ys)
    assert same_bits(la, lb) and all(same_bits(ga[k], gb[k]) for k in ga)


class Boom(Exception):
    pass


def boom_loss(o, y):
    raise Boom("from the loss")


BAD_CALLS = {
    "update wrong shape": (ValueError, lambda l: l.update(np.ones((B, N_IN + 1)))),
    "update int array": (TypeError, lambda l: l.update(np.ones((B, N_IN), dtype=np.int64))),
    "update list": (TypeError, lambda l: l.update([[1.0] * N_IN] * B)),
    "etrace_grad T mismatch": (ValueError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((4, B, N_OUT)))),
    "etrace_grad target shape": (ValueError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT + 1)))),
    "etrace_grad unknown loss": (ValueError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT)), "hinge")),
    "etrace_grad bad reduction": (ValueError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT)), "mse", "max")),
    "loss raises": (Boom, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT)), boom_loss)),
    "loss returns a number": (TypeError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT)), lambda o, y: 1.0)),
    "loss not a scalar": (ValueError, lambda l: l.etrace_grad(np.ones((3, B, N_IN)), np.ones((3, B, N_OUT)), lambda o, y: o - y)),
    "reset_state batch 0": (ValueError, lambda l: l.reset_state(0)),
    "set_params wrong shape": (ValueError, lambda l: l.set_params({"out/weight/bias": np.ones(N_OUT + 1)})),
    "set_params unknown key": (ValueError, lambda l: l.set_params({"out/weight/bias": np.ones(N_OUT), "nope": np.ones(1)})),
    "set_hidden wrong shape": (ValueError, lambda l: l.set_hidden("rnn/h", np.ones((B, 6)))),
    "sgd unknown key": (ValueError, lambda l: bt.SGD(0.1).step(l, {"nope": np.ones(2)})),
    "adam wrong shape": (ValueError, lambda l: bt.Adam(0.1).step(l, {"out/weight/bias": np.ones(2)})),
    "sgd bad lr": (ValueError, lambda l: bt.SGD(-1.0).step(l, {"out/weight/bias": np.ones(N_OUT)})),
    "load missing file": (ValueError, lambda l: l.load("/nonexistent/params.safetensors")),
    "forward wrong shape": (ValueError, lambda l: l.forward(np.ones((3, B, N_IN + 2)))),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_call_raises_and_changes_nothing(name):
    exc, call = BAD_CALLS[name]
    a, b = warm(make()), warm(make())
    with pytest.raises(exc):
        call(a)
    assert_same_continuation(a, b)


def test_messages_name_the_op_and_the_shapes():
    with pytest.raises(ValueError, match=r"update.*\[2, 4\].*\[2, 3\]"):
        make().update(np.ones((B, N_IN + 1)))
    with pytest.raises(TypeError, match="`x`.*int64"):
        make().update(np.ones((B, N_IN), dtype=np.int64))


@pytest.mark.parametrize(
    "call",
    [
        lambda: bt.pp_prop(1.5),
        lambda: bt.pp_prop(0),
        lambda: bt.pp_prop((0.5, 0.5, 0.5)),
        lambda: bt.D_RTRL(vjp_method="sideways"),
        lambda: bt.D_RTRL(non_temporal="sometimes"),
        lambda: bt.D_RTRL(in_step_paths="thrice"),
        lambda: bt.pp_prop(0.9, in_step_paths="never"),
        lambda: bt.compile(nn.GRUCell(N_IN, 5), "pp_prop", np.zeros((B, N_IN)), batch_size=B),
        lambda: bt.compile(nn.GRUCell(N_IN, 5), "nope", np.zeros((B, N_IN)), batch_size=B),
        lambda: bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B + 1),
        lambda: bt.compile(nn.Linear(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B),
        lambda: bt.nn.Linear(2, 3, weight_fn="cube"),
        lambda: bt.clip_grad_norm({"a": np.ones(2)}, 0.0),
    ],
)
def test_bad_values_are_value_errors(call):
    with pytest.raises(ValueError):
        call()


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError):
        bt.compile(object(), bt.D_RTRL(), np.zeros((B, N_IN)))
    with pytest.raises(TypeError):
        bt.compile(nn.GRUCell(N_IN, 5), 3.5, np.zeros((B, N_IN)))
    with pytest.raises(TypeError):
        bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN), dtype=np.int32))
    with pytest.raises(TypeError):
        bt.compile(nn.GRUCell(N_IN, 5), bt.D_RTRL(), np.zeros((B, N_IN)), dtype="float16")


class Model:
    """A Python model whose step misbehaves in the way ``how`` says."""

    def __init__(self, how):
        self.how = how
        self.cell = nn.GRUCell(N_IN, 5)

    def init(self, init):
        if self.how == "init raises":
            raise Boom("from init")
        if self.how == "huge param":
            init.param("w", init.draw("normal", [1 << 20, 1 << 20]))
        self.cell.init(init)

    def step(self, ctx, x):
        if self.how == "step raises":
            raise Boom("from step")
        h = self.cell(ctx, x)
        if self.how == "returns a number":
            return 1.0
        if self.how == "wrong hidden shape":
            ctx.set_hidden("rnn/h", h.sum(1))
        if self.how == "unknown param":
            ctx.param("nope")
        return h


@pytest.mark.parametrize(
    "how, exc",
    [
        ("init raises", Boom),
        ("step raises", Boom),
        ("returns a number", TypeError),
        ("wrong hidden shape", ValueError),
        ("unknown param", ValueError),
        ("huge param", MemoryError),
    ],
)
def test_python_model_errors(how, exc):
    with pytest.raises(exc):
        bt.compile(Model(how), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)


def test_init_and_ctx_are_only_valid_during_the_call():
    kept = {}

    class Keeper:
        def __init__(self):
            self.cell = nn.GRUCell(N_IN, 5)

        def init(self, init):
            kept["init"] = init
            self.cell.init(init)

        def step(self, ctx, x):
            return self.cell(ctx, x)

    bt.compile(Keeper(), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
    with pytest.raises(ValueError, match="only valid during"):
        kept["init"].hidden("late", [1])


def test_huge_layer_is_a_memory_error_not_a_crash():
    with pytest.raises(MemoryError, match="cannot allocate"):
        bt.compile(nn.GRUCell(N_IN, 1 << 20), bt.D_RTRL(), np.zeros((B, N_IN)), batch_size=B)
