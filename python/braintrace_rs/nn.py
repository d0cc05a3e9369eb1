"""Network layers with braintrace's class names, each holding a native
layer of braintrace-rs (so a model made only of them never calls back into
Python), and ``Sequential``. A layer can be used inside a model written in
Python: call ``layer.init(init)`` from the model's ``init`` and
``layer(ctx, x)`` (or ``layer.step(ctx, x)``) from its ``step``.
"""

from typing import Any, Optional, Sequence, Tuple

from ._native import Init, Layer, StepCtx, Tensor


class Module:
    """A layer backed by a native one (``self._native``)."""

    _native: Layer

    def init(self, init: Init) -> None:
        """Declare the layer's parameters and hidden states."""
        self._native.init(init)

    def step(self, ctx: StepCtx, x: Any) -> Tensor:
        """One time step on ``x``."""
        return self._native.step(ctx, x)

    def __call__(self, ctx: StepCtx, x: Any) -> Tensor:
        return self.step(ctx, x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Linear(Module):
    """``x @ W + b`` through ``etp_mm``. Parameter keys ``name/weight/weight``
    ``(in_size, out_size)`` and ``name/weight/bias``. ``w_init`` is an
    initializer name (``"kaiming_normal"`` by default) or ``(name, scale)``;
    ``weight_fn`` a transform of the weight (``"softplus"``, ...)."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        name: str = "linear",
        bias: bool = True,
        w_init: Any = None,
        weight_fn: Optional[str] = None,
    ) -> None:
        if isinstance(w_init, str):
            w_init = (w_init, None)
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.linear(in_size, out_size, name, bias, w_init, weight_fn)


class GRUCell(Module):
    """braintrace's ``GRUCell``: hidden state ``name/h``, gates ``Wz``, ``Wr``,
    ``Wh`` (each a ``Linear`` of ``[x, h]``, orthogonal initialisation)."""

    def __init__(self, in_size: int, out_size: int, name: str = "rnn") -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.gru_cell(in_size, out_size, name)


class LIF(Module):
    """A leaky integrate-and-fire cell with a synaptic current: states
    ``name/i`` (decay ``gamma``) and ``name/v`` (decay ``beta``, threshold
    ``v_th``, reset by subtraction), recurrent weights ``name/rec`` on
    ``[x, spikes]``. Returns its spikes (surrogate gradient)."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        beta: float = 0.9,
        gamma: float = 0.8,
        v_th: float = 1.0,
        name: str = "lif",
    ) -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.lif(in_size, out_size, beta, gamma, v_th, name)


class LeakyRateReadout(Module):
    """braintrace's ``LeakyRateReadout``: ``r' = decay * r + x @ W`` with
    ``decay = exp(-dt / tau)`` (or ``decay`` given); weight key ``name/W``,
    hidden state ``name/r``."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        tau: float = 5.0,
        dt: float = 1.0,
        name: str = "readout",
        decay: Optional[float] = None,
    ) -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.leaky_rate_readout(in_size, out_size, name, tau, dt, decay)


class Expon(Module):
    """braintrace's ``Expon`` synapse: ``g' = exp(-dt / tau) * g + x``,
    hidden state ``name/g``, no parameters."""

    def __init__(self, size: int, tau: float = 5.0, dt: float = 1.0, name: str = "syn") -> None:
        self.name, self.size = name, size
        self._native = Layer.exp_synapse(size, name, tau, dt)


class ElementWiseParam(Module):
    """An element-wise trainable of ``shape`` (key ``name``), read through
    ``etp_elemwise`` as ``weight_fn(w)``: ``self.value(ctx)`` in a step.
    Initialised from N(0, 1)."""

    def __init__(self, shape: Sequence[int], name: str, weight_fn: Optional[str] = None) -> None:
        self.name, self.shape = name, tuple(shape)
        self._native = Layer.element_wise(list(shape), name, weight_fn)

    def value(self, ctx: StepCtx) -> Tensor:
        """``weight_fn(w)`` for this step."""
        return self._native.step(ctx, _NOTHING)


class Sequential(Module):
    """Layers (or Python models) applied one after another."""

    def __init__(self, *layers: Any) -> None:
        self.layers: Tuple[Any, ...] = layers
        self.name = "sequential"
        self._native = Layer.sequential(list(layers))

    def __repr__(self) -> str:
        return "Sequential(" + ", ".join(map(repr, self.layers)) + ")"


def _nothing() -> Tensor:
    import numpy as np

    return Tensor(np.zeros((), dtype=np.float64))


#: ElementWiseParam's step ignores its input.
_NOTHING = _nothing()

__all__ = [
    "Module",
    "Linear",
    "GRUCell",
    "LIF",
    "LeakyRateReadout",
    "Expon",
    "ElementWiseParam",
    "Sequential",
]
