"""Ops a model's ``step`` calls on the tensors it is given: the ETP
primitives (``etp_mm``, ``etp_elemwise``), through which trainable weights
must go for eligibility traces to reach them, and ops on several tensors.
Element-wise ops, reductions and reshapes are methods of ``Tensor``
(``x.tanh()``, ``x.sum(1)``, ``x + y``, ...)."""

from ._native import concat, etp_elemwise, etp_mm, stack, tensor

#: ``etp_mm`` also takes an unbatched ``x`` (then it is braintrace's ``etp_mv``).
matmul = etp_mm

__all__ = ["concat", "etp_elemwise", "etp_mm", "matmul", "stack", "tensor"]
