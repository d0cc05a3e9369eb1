//! Hand-written trace kernels: a primitive whose trace update is none of
//! the computations the learner has a loop for ([`TraceKernel`]'s dense,
//! sparse, LoRA and convolution kinds) can bring its own, as an
//! implementation of [`CustomTraceKernel`] declared through
//! [`TraceKernel::custom`].
//!
//! The learner then keeps each trainable's D-RTRL trace itself — one
//! buffer, in the layout the primitive's `init_drtrl` rule gives it and in
//! the model's dtype, allocated once — and hands it to the kernel every
//! step to be advanced **in place**, and again with the learning signal
//! to accumulate the gradient. Nothing is allocated per step unless the
//! kernel does. Like every declared kernel, it is a claim: the learner
//! checks it against the primitive's own rules on random inputs at the
//! first compile and refuses it, naming the primitive, when they differ
//! (`learn::kernel_check`).
//!
//! [`TraceKernel`]: super::TraceKernel
//! [`TraceKernel::custom`]: super::TraceKernel::custom

use super::params::Params;
use super::rules::TensorMap;
use crate::error::Result;
use crate::tensor::{Aval, Tensor};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// One step's operands of a relation, as a [`CustomTraceKernel`] sees them.
/// `V..` is the hidden group's shape (the batch first for a batched
/// primitive) and `S` its number of states.
#[derive(Clone, Copy, Debug)]
pub struct TraceStep<'a> {
    /// The relation's input `x`, `(B?, I..)`; `None` for a primitive without one.
    pub x: Option<&'a Tensor>,
    /// The hidden group's Jacobian `D`, `(V.., S, S)`: `D[.., a, c]` is
    /// `∂h_a / ∂h_c` of the previous step.
    pub d: &'a Tensor,
    /// The relation's `Df`, `(V.., S)`: `∂h_a / ∂y`.
    pub df: &'a Tensor,
    /// The relation's trainables by name (the current parameters).
    pub weights: &'a TensorMap,
    /// The equation's params.
    pub params: &'a Params,
}

/// A D-RTRL trace kernel written by hand for a primitive. The learner owns
/// the buffers; the kernel computes, for trainable `key`, what the
/// primitive's rules compute:
///
/// ```text
/// update: ε[.., a] ← Σ_c yw_to_w(D[.., a, c], ε[.., c]) + instant_drtrl(x, Df[.., a])
/// solve:  ∇ += Σ_a solve_drtrl(g[.., a], ε[.., a])   (reduced to the parameter's shape)
/// ```
///
/// The trace has the shape `init_drtrl` gives `key` (its last axis the
/// states `S`) and the model's dtype; the gradient the parameter's shape
/// and dtype. Both are contiguous and uniquely owned: write them through
/// [`Tensor::array_mut`]. A kernel keeps traces in the model's dtype only
/// (`trace_dtype` other than the model's is refused for it, naming the
/// primitive).
pub trait CustomTraceKernel: Send + Sync + 'static {
    /// The kernel's name, for messages and `Learner::explain`.
    fn name(&self) -> &str;

    /// Whether the kernel is written for these shapes: the relation's input
    /// (`None` without one), the traces by trainable (`init_drtrl`'s
    /// layout) and the parameters. Where it answers `false`, the rules
    /// run. The default takes every shape.
    fn fits(
        &self,
        x: Option<&Aval>,
        traces: &[(String, Aval)],
        weights: &[(String, Aval)],
    ) -> bool {
        let _ = (x, traces, weights);
        true
    }

    /// Advance trainable `key`'s trace by one step, in place.
    ///
    /// Check what can fail (shapes, dtypes) before writing: the learner
    /// keeps no copy of the trace, so an error returned after some values
    /// were written leaves them written (the learner's call fails and says
    /// which kernel and trace; reset the learner's traces to start over).
    fn update(&self, key: &str, step: &TraceStep<'_>, trace: &mut Tensor) -> Result<()>;

    /// Add trainable `key`'s gradient for learning signal `g` `(V.., S)` to
    /// `grad` (the parameter's shape), reading the trace.
    fn solve(
        &self,
        key: &str,
        g: &Tensor,
        weights: &TensorMap,
        params: &Params,
        trace: &Tensor,
        grad: &mut Tensor,
    ) -> Result<()>;
}

/// A [`CustomTraceKernel`] as a [`TraceKernel`](super::TraceKernel) holds
/// it: shared, compared and hashed by identity (two declarations are the
/// same kernel when they hold the same object).
#[derive(Clone)]
pub struct CustomKernel(pub Arc<dyn CustomTraceKernel>);

impl CustomKernel {
    fn addr(&self) -> *const () {
        Arc::as_ptr(&self.0) as *const ()
    }
}

impl fmt::Debug for CustomKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustomKernel({})", self.0.name())
    }
}

impl PartialEq for CustomKernel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.addr(), other.addr())
    }
}

impl Eq for CustomKernel {}

impl Hash for CustomKernel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.addr().hash(state);
    }
}
