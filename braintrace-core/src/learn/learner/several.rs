//! The learner's entry points of several inputs per step (braintrace's
//! `update(*args)`, `etrace_grad(*inputs)`, `etrace_evolve(*inputs)`): each
//! checks the inputs against the compiled examples — the count, each one's
//! shape and dtype, named in the error, before anything runs — packs them
//! ([`crate::learn::inputs`]) and runs the one-input path.

use super::opts::{EtraceOpts, EtraceOut, EvolveOpts, StepLoss};
use super::Learner;
use crate::error::Result;
use crate::learn::state::Model;
use crate::tensor::Tensor;

impl<M: Model> Learner<M> {
    /// How many inputs each step takes (the example inputs the learner
    /// was compiled with).
    pub fn num_inputs(&self) -> usize {
        self.inputs.count()
    }

    /// The control-flow policy the step was analysed with
    /// ([`CompileOpts::control_flow`](super::CompileOpts::control_flow)).
    pub fn control_flow(&self) -> &crate::learn::ControlFlowPolicy {
        &self.control_flow
    }

    /// One online step on several inputs (braintrace's `update(*args)`):
    /// `xs[i]` has the shape of example input `i`. As
    /// [`update`](Self::update) otherwise; a wrong count, shape or dtype is
    /// an error naming the input, with nothing changed. A learner of one
    /// input takes `&[&x]`.
    pub fn update_inputs(&mut self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = self
            .inputs
            .pack_step("update_inputs", xs, self.state.dtype())?;
        crate::threads::auto(self.work, || self.update_here(&x))
    }

    /// [`etrace_grad_with`](Self::etrace_grad_with) with several inputs per
    /// step (braintrace's `etrace_grad(*inputs)`): `xs[i]` is the
    /// time-major sequence `(T, *example_i.shape)` of input `i`, all of one
    /// length `T`; the loss, targets and options are as there. A wrong
    /// count, shape, dtype or length is an error naming the input, with
    /// nothing changed.
    pub fn etrace_grad_inputs<L, R>(
        &mut self,
        xs: &[&Tensor],
        ys: &[Tensor],
        loss: L,
        opts: &EtraceOpts,
    ) -> Result<EtraceOut>
    where
        L: Fn(&Tensor, &[Tensor]) -> Result<R>,
        R: StepLoss,
    {
        let x = self
            .inputs
            .pack_sequences("etrace_grad_inputs", xs, self.state.dtype())?;
        crate::threads::auto(self.work, || self.etrace_grad_here(&x, ys, loss, opts))
    }

    /// [`evolve`](Self::evolve) with several inputs per step: one
    /// time-major sequence per input.
    pub fn evolve_inputs(&mut self, xs: &[&Tensor], opts: &EvolveOpts) -> Result<Option<Tensor>> {
        let x = self
            .inputs
            .pack_sequences("evolve_inputs", xs, self.state.dtype())?;
        self.evolve_packed(&x, opts)
    }

    /// [`evaluate`](Self::evaluate) with several inputs per step: one
    /// time-major sequence per input; nothing of the learner changes.
    pub fn evaluate_inputs(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = self
            .inputs
            .pack_sequences("evaluate_inputs", xs, self.state.dtype())?;
        self.evaluate_packed(&x)
    }
}
