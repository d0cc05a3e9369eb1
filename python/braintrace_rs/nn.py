"""Network layers with braintrace's class names, each holding a native
layer of braintrace-rs (so a model made only of them never calls back into
Python), and ``Sequential``. A layer can be used inside a model written in
Python: call ``layer.init(init)`` from the model's ``init`` and
``layer(ctx, x)`` (or ``layer.step(ctx, x)``) from its ``step``.
"""

from typing import Any, Optional, Sequence, Tuple

from ._blocks import *  # noqa: F401,F403  (the layers of issue 36)
from ._blocks import _init
from . import _blocks
from ._module import Module
from ._native import Layer, StepCtx, Tensor, spike_bitwise


class Linear(Module):
    """``x @ W + b`` through ``etp_mm``. Parameter keys ``name/weight/weight``
    ``(in_size, out_size)`` and ``name/weight/bias``. ``w_init`` is an
    initializer name (``"kaiming_normal"`` by default) or ``(name, scale)``;
    ``weight_fn`` a transform of the weight (``"softplus"``, ...);
    ``w_mask`` (braintrace's) an array broadcasting to the weight, multiplied
    with it inside ``etp_mm``."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        name: str = "linear",
        bias: bool = True,
        w_init: Any = None,
        weight_fn: Optional[str] = None,
        w_mask: Any = None,
    ) -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.linear(in_size, out_size, name, bias, _init(w_init), weight_fn, w_mask)


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
    """braintrace's ``Expon`` (brainpy.state's exponential synapse):
    ``g' = exp(-dt / tau) * g + x``, returns ``g'``; hidden state
    ``name/g``, no parameters. ``tau`` and ``dt`` must be positive."""

    def __init__(self, size: int, tau: float = 8.0, dt: float = 1.0, name: str = "syn") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("Expon", size, name, tau, dt=dt)


class ExpSynapse(Module):
    """The library's ``ExpSynapse`` (what ``nn.Expon`` was before it became
    braintrace's ``Expon``): the same ``g' = exp(-dt / tau) * g + x`` with
    hidden state ``name/g``, checked at compile rather than here."""

    def __init__(self, size: int, tau: float = 5.0, dt: float = 1.0, name: str = "syn") -> None:
        self.name, self.size = name, size
        self._native = Layer.exp_synapse(size, name, tau, dt)


class SpikeBitwise:
    """brainstate's ``SpikeBitwise``: two spike trains combined element-wise
    in arithmetic so that surrogate gradients flow — ``op`` ``"add"``
    (``x + y``), ``"and"`` (``x * y``), ``"iand"`` (``(1 - x) * y``),
    ``"or"`` (``x + y - x * y``) or ``"xor"`` (``x + y - 2 * x * y``).
    Stateless and without parameters; it takes two inputs, so it is called
    from a Python model's ``step`` as ``self.bitwise(x, y)`` rather than
    placed in a ``Sequential``."""

    _OPS = ("add", "and", "iand", "or", "xor")

    def __init__(self, op: str = "add") -> None:
        if op not in self._OPS:
            raise ValueError(f"SpikeBitwise: `op` {op!r} is not one of {', '.join(self._OPS)}")
        self.op = op

    def __call__(self, x: Any, y: Any) -> Tensor:
        """``op(x, y)`` on Tensors or float arrays."""
        return spike_bitwise(x, y, self.op)

    def __repr__(self) -> str:
        return f"SpikeBitwise({self.op!r})"


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


class _RnnCell(Module):
    """A recurrent cell of the zoo (``braintrace-core``'s ``nn::rnn``)."""

    def __init__(self, in_size: int, out_size: int, name: str = "rnn") -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.rnn_cell(type(self).__name__, in_size, out_size, name)


class VanillaRNNCell(_RnnCell):
    """braintrace's ``VanillaRNNCell``: ``h' = tanh([x, h] W + b)``, hidden ``name/h``."""


class MGUCell(_RnnCell):
    """braintrace's ``MGUCell`` (minimal gated unit), hidden ``name/h``."""


class LSTMCell(_RnnCell):
    """braintrace's ``LSTMCell``: hidden ``name/h`` and ``name/c``."""


class URLSTMCell(_RnnCell):
    """braintrace's ``URLSTMCell`` (LSTM with uniform gate refinement)."""


class MinimalRNNCell(_RnnCell):
    """braintrace's ``MinimalRNNCell``."""


class MiniGRU(_RnnCell):
    """braintrace's ``MiniGRU`` (gates from the input alone)."""


class MiniLSTM(_RnnCell):
    """braintrace's ``MiniLSTM`` (gates from the input alone)."""


class CFNCell(_RnnCell):
    """braintrace's ``CFNCell`` (chaos-free network)."""


class LRUCell(_RnnCell):
    """braintrace's ``LRUCell`` (linear recurrent unit): ``in_size`` is
    ``d_model`` (the output has the input's width), ``out_size`` the complex
    hidden width."""


class IF(Module):
    """brainpy.state's integrate-and-fire neuron: hidden ``name/V``,
    threshold 1, soft reset; returns spikes (surrogate gradient)."""

    def __init__(self, size: int, tau: float = 5.0, dt: float = 1.0, name: str = "if") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("IF", size, name, tau, dt=dt)


class LIFNeuron(Module):
    """brainpy.state's ``LIF`` neuron (``braintrace_rs.nn.LIF`` is the
    recurrent LIF cell): hidden ``name/V``, returns spikes."""

    def __init__(self, size: int, tau: float = 5.0, dt: float = 1.0, name: str = "lif") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("LIFNeuron", size, name, tau, dt=dt)


class ALIF(Module):
    """brainpy.state's adaptive LIF: hidden ``name/V`` and ``name/a``
    (adaptation time constant ``tau_a``)."""

    def __init__(self, size: int, tau: float = 5.0, tau_a: float = 100.0, dt: float = 1.0, name: str = "alif") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("ALIF", size, name, tau, tau2=tau_a, dt=dt)


class Alpha(Module):
    """brainpy.state's ``Alpha`` synapse (no parameters)."""

    def __init__(self, size: int, tau: float = 8.0, dt: float = 1.0, name: str = "syn") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("Alpha", size, name, tau, dt=dt)


class DualExpon(Module):
    """brainpy.state's ``DualExpon`` synapse: hidden ``name/g_rise`` and
    ``name/g_decay``."""

    def __init__(
        self, size: int, tau_decay: float = 10.0, tau_rise: float = 1.0, dt: float = 1.0, name: str = "syn"
    ) -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("DualExpon", size, name, tau_decay, tau2=tau_rise, dt=dt)


class STD(Module):
    """brainpy.state's short-term depression: hidden ``name/x`` (starts at 1)."""

    def __init__(self, size: int, tau: float = 200.0, U: float = 0.07, dt: float = 1.0, name: str = "std") -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("STD", size, name, tau, u=U, dt=dt)


class STP(Module):
    """brainpy.state's short-term plasticity: hidden ``name/u`` and ``name/x``."""

    def __init__(
        self, size: int, U: float = 0.15, tau_f: float = 1500.0, tau_d: float = 200.0, dt: float = 1.0, name: str = "stp"
    ) -> None:
        self.name, self.size = name, size
        self._native = Layer.spiking("STP", size, name, tau_f, tau2=tau_d, u=U, dt=dt)


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
    "ExpSynapse",
    "SpikeBitwise",
    "ElementWiseParam",
    "Sequential",
    # The recurrent-cell zoo.
    "VanillaRNNCell",
    "MGUCell",
    "LSTMCell",
    "URLSTMCell",
    "MinimalRNNCell",
    "MiniGRU",
    "MiniLSTM",
    "CFNCell",
    "LRUCell",
    # Spiking neurons, synapses, short-term plasticity.
    "IF",
    "LIFNeuron",
    "ALIF",
    "Alpha",
    "DualExpon",
    "STD",
    "STP",
    # Weight-structured layers, activations, norms, dropout, pooling.
    *_blocks.__all__,
]
