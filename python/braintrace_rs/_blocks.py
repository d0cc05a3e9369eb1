"""The layers of issue 36 with braintrace's (brainstate's) class names,
re-exported by ``braintrace_rs.nn``: weight-structured layers, grouped
linear, embedding, activations, PReLU, norms, dropout, pooling, flatten and
unflatten. Each holds a native layer of braintrace-rs."""

from typing import Any, List, Optional, Sequence

import numpy as np

from ._module import Module
from ._native import Layer

# ---------------------------------------------------------------------------
# Weight-structured layers, GroupedLinear and Embedding (issue 36).


def _init(w: Any) -> Any:
    """An initializer argument: a name, ``(name, scale)`` or None."""
    return (w, None) if isinstance(w, str) else w


def _tuple(v: Any, d: int, what: str) -> List[int]:
    """``v`` (an int or ``d`` ints) as ``d`` ints."""
    if isinstance(v, (int, np.integer)):
        return [int(v)] * d
    v = [int(i) for i in v]
    if len(v) != d:
        raise ValueError(f"`{what}` must be an int or {d} ints, got {v}")
    return v


class SignedWLinear(Module):
    """braintrace's ``SignedWLinear``: ``y = x @ (|W| * w_sign)`` without a
    bias, through ``etp_mm``. Bare parameter ``name/weight``
    ``(in_size, out_size)``; ``w_sign`` an array broadcasting to it (None:
    all positive)."""

    def __init__(self, in_size: int, out_size: int, w_sign: Any = None, w_init: Any = None, name: str = "linear") -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.signed_w_linear(in_size, out_size, name, w_sign, _init(w_init))


class ScaledWSLinear(Module):
    """braintrace's ``ScaledWSLinear``: the weight standardised per output
    inside ``etp_mm`` (variance floor ``eps``, optional ``w_mask``
    ``(in_size, 1)``), then ``* gain + bias`` outside it. State
    ``name/weight`` with leaves ``weight``, ``bias`` and ``gain``
    (``ws_gain``)."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        w_mask: Any = None,
        ws_gain: bool = True,
        eps: float = 1e-4,
        bias: bool = True,
        w_init: Any = None,
        name: str = "linear",
    ) -> None:
        self.name, self.in_size, self.out_size = name, in_size, out_size
        self._native = Layer.scaled_ws_linear(in_size, out_size, name, bias, ws_gain, eps, w_mask, _init(w_init))


class SparseLinear(Module):
    """braintrace's ``SparseLinear``: ``y = x @ M(w) (+ b)`` through
    ``etp_sp_mm``. ``spar_mat`` is a dense ``(n_in, n_out)`` array whose
    non-zero entries are the fixed structure and the initial data (braintrace
    takes a sparse matrix). State ``name/weight`` with ``weight`` ``(nnz,)``
    and, when ``b_init`` is given, ``bias``."""

    def __init__(self, spar_mat: Any, b_init: Any = None, name: str = "linear") -> None:
        self.name = name
        self.in_size, self.out_size = np.shape(spar_mat)[:2] if np.ndim(spar_mat) == 2 else (None, None)
        self._native = Layer.sparse_linear(spar_mat, name, _init(b_init))


class LoRA(Module):
    """braintrace's ``LoRA`` without a base module: ``y = (1/r) x @ A @ B``
    through ``etp_lora_mm``; state ``name/weight`` with leaves ``lora_a``
    ``(in_features, lora_rank)`` and ``lora_b`` ``(lora_rank, out_features)``
    (LeCun normal). Add a ``Linear`` for the base."""

    def __init__(
        self, in_features: int, lora_rank: int, out_features: int, kernel_init: Any = None, name: str = "lora"
    ) -> None:
        self.name, self.in_size, self.out_size = name, in_features, out_features
        self._native = Layer.lora(in_features, lora_rank, out_features, name, _init(kernel_init))


class _Conv(Module):
    """A convolution on ``etp_conv`` in brainstate's channel-last layout
    (``in_size`` is a sample's ``(spatial.., C)``); state ``name/weight``
    with ``weight`` ``(k.., C/groups, out_channels)`` (Xavier normal) and,
    when ``b_init`` is given, ``bias``. ``padding``: ``"SAME"``,
    ``"VALID"``, an int or ``(lo, hi)`` pairs."""

    _DIMS = 0

    def __init__(
        self,
        in_size: Sequence[int],
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = "SAME",
        lhs_dilation: Any = 1,
        rhs_dilation: Any = 1,
        groups: int = 1,
        w_init: Any = None,
        b_init: Any = None,
        channel_first: bool = False,
        name: str = "conv",
    ) -> None:
        d = self._DIMS
        self.name, self.in_size, self.out_channels = name, tuple(in_size), out_channels
        self._native = Layer.conv(
            d,
            list(in_size),
            out_channels,
            _tuple(kernel_size, d, "kernel_size"),
            name,
            _tuple(stride, d, "stride"),
            padding,
            _tuple(lhs_dilation, d, "lhs_dilation"),
            _tuple(rhs_dilation, d, "rhs_dilation"),
            groups,
            _init(w_init),
            _init(b_init),
            channel_first,
        )


class Conv1d(_Conv):
    """braintrace's ``Conv1d``: input ``(B, L, C)``."""

    _DIMS = 1


class Conv2d(_Conv):
    """braintrace's ``Conv2d``: input ``(B, H, W, C)``."""

    _DIMS = 2


class Conv3d(_Conv):
    """braintrace's ``Conv3d``: input ``(B, D, H, W, C)``."""

    _DIMS = 3


class GroupedLinear(Module):
    """braintrace's ``GroupedLinear``: ``num_groups`` independent
    ``in_features -> out_features`` maps on inputs ``(..., G, K)``, through
    the grouped matmul primitive; state ``name/weight`` with ``weight``
    ``(G, K, N)`` and ``bias`` ``(G, N)``."""

    def __init__(
        self, num_groups: int, in_features: int, out_features: int, bias: bool = True, w_init: Any = None, name: str = "grouped"
    ) -> None:
        self.name, self.in_size, self.out_size = name, (num_groups, in_features), (num_groups, out_features)
        self._native = Layer.grouped_linear(num_groups, in_features, out_features, name, bias, _init(w_init))


class Embedding(Module):
    """braintrace's ``Embedding``: a trainable table ``name/weight``
    ``(num_embeddings, embedding_size)`` (LeCun uniform) through the
    embedding primitive. Its input holds token indices (a learner's float
    inputs holding integers); an index outside the table is an error."""

    def __init__(self, num_embeddings: int, embedding_size: int, name: str = "embedding") -> None:
        self.name, self.num_embeddings, self.embedding_size = name, num_embeddings, embedding_size
        self._native = Layer.embedding(num_embeddings, embedding_size, name)


# ---------------------------------------------------------------------------
# Activations, norms, dropout, pooling and reshaping (issue 36).


class _Activation(Module):
    """An activation (no parameters, no state); brainstate's defaults."""

    name = "activation"

    def __init__(self, **params: Any) -> None:
        self.params = params
        self._native = Layer.activation(type(self).__name__, **params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


class Identity(_Activation):
    """``x``."""


class ReLU(_Activation):
    """``max(x, 0)``."""


class ReLU6(_Activation):
    """``min(max(x, 0), 6)``."""


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``."""


class Tanh(_Activation):
    """``tanh(x)``."""


class Hardsigmoid(_Activation):
    """jax's ``hard_sigmoid``: ``relu6(x + 3) / 6``."""


class Hardswish(_Activation):
    """``x * hard_sigmoid(x)``."""


class SiLU(_Activation):
    """``x * sigmoid(x)``."""


class Mish(_Activation):
    """``x * tanh(softplus(x))``."""


class SELU(_Activation):
    """Scaled ELU."""


class LogSigmoid(_Activation):
    """``log(sigmoid(x))``."""


class Softplus(_Activation):
    """``log(1 + exp(x))``."""


class Softsign(_Activation):
    """``x / (1 + |x|)``."""


class Tanhshrink(_Activation):
    """``x - tanh(x)``."""


class ELU(_Activation):
    """``x`` for ``x > 0``, ``alpha (exp(x) - 1)`` otherwise."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=alpha)


class CELU(_Activation):
    """``max(x, 0) + min(0, alpha (exp(x / alpha) - 1))`` (``alpha != 0``)."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__(alpha=alpha)


class GELU(_Activation):
    """Gaussian error linear unit, exact (``erf``) unless ``approximate``."""

    def __init__(self, approximate: bool = False) -> None:
        super().__init__(approximate=approximate)


class LeakyReLU(_Activation):
    """``x`` for ``x >= 0``, ``negative_slope * x`` otherwise."""

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__(negative_slope=negative_slope)


class Hardtanh(_Activation):
    """``x`` clipped to ``[min_val, max_val]``."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0) -> None:
        super().__init__(min_val=min_val, max_val=max_val)


class Hardshrink(_Activation):
    """``x`` where ``|x| > lambd``, 0 elsewhere."""

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__(lambd=lambd)


class Softshrink(_Activation):
    """``x - lambd``, ``x + lambd`` or 0 (``|x| <= lambd``)."""

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__(lambd=lambd)


class Threshold(_Activation):
    """``x`` where ``x > threshold``, ``value`` elsewhere."""

    def __init__(self, threshold: float, value: float) -> None:
        super().__init__(threshold=threshold, value=value)


class Softmax(_Activation):
    """Softmax over ``dim`` (the last axis when None)."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__(dim=dim)


class LogSoftmax(_Activation):
    """Log-softmax over ``dim`` (the last axis when None)."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__(dim=dim)


class Softmin(_Activation):
    """Softmin over ``dim`` (the last axis when None)."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__(dim=dim)


class GLU(_Activation):
    """Gated linear unit: ``a * sigmoid(b)`` of the halves of ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__(dim=dim)


class PReLU(Module):
    """brainstate's ``PReLU``: ``x`` for ``x >= 0``, ``a * x`` otherwise, with
    ``num_parameters`` trainable slopes (1 shared, or one per feature of the
    last axis) starting at ``init``; bare parameter ``name/weight``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, name: str = "prelu") -> None:
        self.name, self.num_parameters = name, num_parameters
        self._native = Layer.prelu(num_parameters, name, init)


def _features(in_size: Any) -> int:
    """The feature count (the last entry) of ``in_size``."""
    return int(in_size) if isinstance(in_size, (int, np.integer)) else int(tuple(in_size)[-1])


class LayerNorm(Module):
    """brainstate's ``LayerNorm`` over the last axis (``in_size`` its
    features, or a sample's shape): state ``name/weight`` with ``scale``
    (ones) and ``bias`` (zeros)."""

    def __init__(
        self, in_size: Any, epsilon: float = 1e-6, use_bias: bool = True, use_scale: bool = True, name: str = "norm"
    ) -> None:
        self.name, self.in_size = name, in_size
        self._native = Layer.norm("LayerNorm", _features(in_size), name, epsilon, 1, use_scale, use_bias)


class RMSNorm(Module):
    """brainstate's ``RMSNorm`` over the last axis: ``x / sqrt(mean(x^2) +
    epsilon) * scale``, state ``name/scale`` with leaf ``scale``."""

    def __init__(self, in_size: Any, epsilon: float = 1e-6, use_scale: bool = True, name: str = "norm") -> None:
        self.name, self.in_size = name, in_size
        self._native = Layer.norm("RMSNorm", _features(in_size), name, epsilon, 1, use_scale, False)


class GroupNorm(Module):
    """brainstate's ``GroupNorm``: the features of the last axis in
    ``num_groups`` groups (it must divide them), each normalised over its
    channels and the axes between batch and features; state ``name/weight``
    with ``scale`` and ``bias``."""

    def __init__(
        self,
        in_size: Any,
        num_groups: int = 32,
        epsilon: float = 1e-6,
        use_bias: bool = True,
        use_scale: bool = True,
        name: str = "norm",
    ) -> None:
        self.name, self.in_size = name, in_size
        self._native = Layer.norm("GroupNorm", _features(in_size), name, epsilon, num_groups, use_scale, use_bias)


class Dropout(Module):
    """brainstate's ``Dropout``: keeps each element with probability
    ``prob`` (scaled by ``1 / prob``); the mask is a seeded hash of the
    values, so a traced learner draws a new one each step. ``training``
    (on by default) off makes it the identity; a learner keeps the mode the
    layer had when it was compiled (it traces the step then)."""

    name = "dropout"

    def __init__(self, prob: float = 0.5, seed: int = 0) -> None:
        self.prob, self.seed = prob, seed
        self._native = Layer.dropout(prob, seed)

    @property
    def training(self) -> bool:
        """Whether the layer drops (training) or is the identity."""
        return self._native.training

    @training.setter
    def training(self, on: bool) -> None:
        self._native.training = on

    def __repr__(self) -> str:
        return f"Dropout({self.prob!r})"


def _padding(padding: Any) -> int:
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return 0
        raise ValueError(f"pooling: padding {padding!r} is not supported (VALID or an int)")
    return int(padding)


class _Pool(Module):
    """Pooling over the spatial axes before the channel axis (input
    ``(B, spatial.., C)``); ``padding`` ``"VALID"`` or an int."""

    _DIMS = 0
    _STRIDE_IS_KERNEL = True

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = "VALID", name: str = "pool") -> None:
        d = self._DIMS
        self.name = name
        k = _tuple(kernel_size, d, "kernel_size")
        s = None if stride is None else _tuple(stride, d, "stride")
        self._native = Layer.pool(type(self).__name__, k, s, _padding(padding))


class MaxPool1d(_Pool):
    """brainstate's ``MaxPool1d`` (stride defaults to the kernel)."""

    _DIMS = 1


class MaxPool2d(_Pool):
    """brainstate's ``MaxPool2d`` (stride defaults to the kernel)."""

    _DIMS = 2


class AvgPool1d(_Pool):
    """brainstate's ``AvgPool1d`` (stride 1 by default, as brainstate's)."""

    _DIMS = 1

    def __init__(self, kernel_size: Any, stride: Any = 1, padding: Any = "VALID", name: str = "pool") -> None:
        super().__init__(kernel_size, stride, padding, name)


class AvgPool2d(_Pool):
    """brainstate's ``AvgPool2d`` (stride 1 by default, as brainstate's)."""

    _DIMS = 2

    def __init__(self, kernel_size: Any, stride: Any = 1, padding: Any = "VALID", name: str = "pool") -> None:
        super().__init__(kernel_size, stride, padding, name)


class Flatten(Module):
    """brainstate's ``Flatten``: a sample's axes ``start_axis ..= end_axis``
    merged into one; ``in_size`` (a sample's shape, without the batch) is
    required, as the batch axes are not part of it."""

    name = "flatten"

    def __init__(self, start_axis: int = 0, end_axis: int = -1, in_size: Optional[Sequence[int]] = None) -> None:
        if in_size is None:
            raise ValueError("Flatten: give `in_size`, a sample's shape without the batch axis")
        self.in_size = tuple(in_size)
        self._native = Layer.flatten(len(self.in_size), start_axis, end_axis)


class Unflatten(Module):
    """brainstate's ``Unflatten``: axis ``axis`` (negative from the end) split
    into ``sizes``."""

    def __init__(self, axis: int, sizes: Sequence[int], name: str = "unflatten") -> None:
        self.name, self.axis, self.sizes = name, axis, tuple(sizes)
        self._native = Layer.unflatten(axis, list(sizes))


__all__ = [
    # Weight-structured layers, GroupedLinear, Embedding.
    "SignedWLinear",
    "ScaledWSLinear",
    "SparseLinear",
    "LoRA",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "GroupedLinear",
    "Embedding",
    # Activations, norms, dropout, pooling, reshaping.
    "Identity",
    "ReLU",
    "ReLU6",
    "Sigmoid",
    "Tanh",
    "Hardsigmoid",
    "Hardswish",
    "SiLU",
    "Mish",
    "SELU",
    "LogSigmoid",
    "Softplus",
    "Softsign",
    "Tanhshrink",
    "ELU",
    "CELU",
    "GELU",
    "LeakyReLU",
    "Hardtanh",
    "Hardshrink",
    "Softshrink",
    "Threshold",
    "Softmax",
    "LogSoftmax",
    "Softmin",
    "GLU",
    "PReLU",
    "LayerNorm",
    "RMSNorm",
    "GroupNorm",
    "Dropout",
    "MaxPool1d",
    "MaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "Flatten",
    "Unflatten",
]

# They are `braintrace_rs.nn`'s classes (reprs, pickling).
for _name in __all__:
    globals()[_name].__module__ = "braintrace_rs.nn"
