//! Forward-only drivers: [`Learner::evolve`] (braintrace's
//! `etrace_evolve`: hidden states and traces advance, no gradient) and
//! [`Learner::evaluate`] (outputs only; nothing of the learner changes).

use super::driver::stack_or_empty;
use super::opts::{window, EvolveOpts};
use super::Learner;
use crate::error::{Error, Result};
use crate::learn::hooked::{eval_hooked, Hooks};
use crate::learn::rows::fill;
use crate::learn::state::Model;
use crate::tensor::Tensor;
use crate::transform::Jit;

impl<M: Model> Learner<M> {
    /// Drive the model and its eligibility traces over `xs` `(T, *input)`
    /// without computing a gradient (braintrace's `etrace_evolve`, a
    /// warm-up before [`etrace_grad`](Self::etrace_grad)): hidden states
    /// and traces end where [`update`](Self::update) on every row would
    /// leave them. The step counter advances by `T`, or by `T / k` with
    /// [`EvolveOpts::chunk_size`] `k` (braintrace counts a window as one
    /// call). Returns the outputs `(T, *output)` when
    /// [`EvolveOpts::outputs`] is set.
    ///
    /// Errors: a bad `xs` or `chunk_size` changes nothing, nor does a NaN
    /// or an infinity in `xs` under the default
    /// [`NonFinite::Error`](crate::learn::NonFinite) (see
    /// [`set_non_finite`](Self::set_non_finite)); an error in a later step
    /// keeps the completed steps (as `update` would).
    pub fn evolve(&mut self, xs: &Tensor, opts: &EvolveOpts) -> Result<Option<Tensor>> {
        self.inputs.require_one("evolve", "evolve_inputs")?;
        self.evolve_packed(xs, opts)
    }

    /// [`evolve`](Self::evolve) on the (packed) inputs of every step.
    pub(super) fn evolve_packed(
        &mut self,
        xs: &Tensor,
        opts: &EvolveOpts,
    ) -> Result<Option<Tensor>> {
        let t_len = self.check_sequence("evolve", xs)?;
        let k = window("evolve", opts.chunk_size, t_len)?;
        self.refuse_non_finite_inputs("evolve", &[("xs", xs)])?;
        let xs = xs.cast(self.state.dtype())?;
        let start = self.running_index;
        let mut outs = Vec::new();
        let mut x = Tensor::scalar_of(0.0, self.state.dtype());
        for t in 0..t_len {
            fill(&mut x, &xs, t)?;
            let out = crate::threads::auto(self.work, || self.update_here(&x))?;
            if opts.outputs {
                outs.push(out);
            }
        }
        self.running_index = start + t_len / k;
        Ok(if opts.outputs {
            Some(stack_or_empty(&outs)?)
        } else {
            None
        })
    }

    /// The model's outputs over `xs` `(T, *input)` from the current hidden
    /// states, `(T, *output)`: an evaluation that leaves the learner as it
    /// was (hidden states, traces, step counter; it takes `&self`). The
    /// traces are not computed.
    pub fn evaluate(&self, xs: &Tensor) -> Result<Tensor> {
        self.inputs.require_one("evaluate", "evaluate_inputs")?;
        self.evaluate_packed(xs)
    }

    /// [`evaluate`](Self::evaluate) on the (packed) inputs of every step.
    pub(super) fn evaluate_packed(&self, xs: &Tensor) -> Result<Tensor> {
        let t_len = self.check_sequence("evaluate", xs)?;
        let xs = xs.cast(self.state.dtype())?;
        let g = self.program.eg.graph().clone();
        let step = Jit::new(move |a: &[Tensor]| Ok(eval_hooked(&g, a, &Hooks::default())?.0));
        let mut hidden = self.state.hidden_values().to_vec();
        let mut outs = Vec::with_capacity(t_len);
        let mut x = Tensor::scalar_of(0.0, self.state.dtype());
        for t in 0..t_len {
            fill(&mut x, &xs, t)?;
            let mut args = self.state.param_values().to_vec();
            args.extend(hidden);
            args.push(x.clone());
            let mut o = step.call_owned(args)?;
            hidden = o.split_off(1);
            outs.push(o.pop().expect("the step's output"));
        }
        stack_or_empty(&outs)
    }

    /// `xs` is `(T, *input)`, concrete; its length.
    fn check_sequence(&self, op: &str, xs: &Tensor) -> Result<usize> {
        if xs.is_symbolic() {
            return Err(Error::invalid(op, "xs must be a concrete tensor"));
        }
        if xs.ndim() == 0 || &xs.shape()[1..] != self.input_aval.shape() {
            return Err(Error::shapes(
                op,
                [xs.shape().to_vec(), self.input_aval.shape().to_vec()],
                "xs must be (T, *example_input.shape)",
            ));
        }
        if !xs.dtype().is_float() && xs.dtype() != self.state.dtype() {
            return Err(Error::dtype_with(
                op,
                "xs",
                crate::tensor::DType::FLOATS,
                xs.dtype(),
                format!("shape {:?}", xs.shape()),
            ));
        }
        Ok(xs.shape()[0])
    }
}
