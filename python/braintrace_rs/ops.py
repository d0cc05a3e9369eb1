"""Ops a model's ``step`` calls on the tensors it is given: the ETP
primitives, through which trainable weights must go for eligibility traces
to reach them — dense (``etp_mm``, braintrace's ``matmul``), element-wise
(``etp_elemwise``, ``element_wise``), sparse (``etp_sp_mm``,
``sparse_matmul``), LoRA (``etp_lora_mm``, ``lora_matmul``) and
convolution (``etp_conv``, ``conv``) — the spike logic ``spike_bitwise``,
and ops on several tensors. Element-wise ops, reductions and reshapes are
methods of ``Tensor`` (``x.tanh()``, ``x.sum(1)``, ``x + y``, ...)."""

from ._native import (
    concat,
    etp_conv,
    etp_elemwise,
    etp_lora_mm,
    etp_mm,
    etp_sp_mm,
    spike_bitwise,
    stack,
    tensor,
)

#: ``etp_mm`` also takes an unbatched ``x`` (then it is braintrace's ``etp_mv``).
matmul = etp_mm

#: braintrace's name of ``etp_elemwise``.
element_wise = etp_elemwise

#: braintrace's name of ``etp_sp_mm`` (``etp_sp_mv`` for an unbatched ``x``).
sparse_matmul = etp_sp_mm

#: braintrace's name of ``etp_lora_mm`` (``etp_lora_mv`` for an unbatched ``x``).
lora_matmul = etp_lora_mm

#: braintrace's name of ``etp_conv``.
conv = etp_conv

__all__ = [
    "concat",
    "conv",
    "element_wise",
    "etp_conv",
    "etp_elemwise",
    "etp_lora_mm",
    "etp_mm",
    "etp_sp_mm",
    "lora_matmul",
    "matmul",
    "sparse_matmul",
    "spike_bitwise",
    "stack",
    "tensor",
]
