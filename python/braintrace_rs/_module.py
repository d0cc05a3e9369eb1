"""The base of ``braintrace_rs.nn``'s layers."""

from typing import Any

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
