//! The learner's [`NonFinite`] policy: what [`Learner::update`],
//! [`Learner::etrace_grad_with`] and [`Learner::evolve`] do when a step
//! writes a NaN or an infinity.
//!
//! The scan reads what one step wrote before the learner takes it: the
//! hidden states, the output, the loss, the traces carried by the step
//! program, the values the algorithm's own (in-place) traces are advanced
//! with, and the step's gradient terms. The in-place traces are advanced
//! only after that scan, from values it found finite, so a step refused
//! or skipped leaves them as they were. (The one thing the scan cannot see
//! coming is an overflow inside that in-place update itself: finite
//! factors whose product exceeds the dtype's range. The next step's
//! gradient terms then hold the infinity and are refused.)

use super::Learner;
use crate::error::{Error, Result};
use crate::learn::nonfinite::{first_non_finite, NonFinite};
use crate::learn::state::Model;
use crate::tensor::Tensor;

/// What one step (or window) wrote, read by name for the scan.
pub(super) struct Written<'a> {
    pub out: &'a [Tensor],
    pub loss: Option<&'a Tensor>,
    pub hidden: &'a [Tensor],
    pub traces: &'a [Tensor],
    pub extra: &'a [Tensor],
    /// Gradient terms and the parameter index each belongs to.
    pub grads: &'a [Tensor],
    pub grad_params: &'a [usize],
    pub grad_extra: &'a [Tensor],
}

/// What a scanned tensor is, named only when it holds a non-finite value.
#[derive(Clone, Copy)]
enum Key {
    Hidden(usize),
    Out,
    Loss,
    Grad(usize),
    Trace(usize),
    Term(usize),
}

impl<M: Model> Learner<M> {
    /// What `key` names and its name (a hidden state's path, a parameter key).
    fn name(&self, key: Key) -> (&'static str, String) {
        match key {
            Key::Hidden(i) => (
                "hidden state",
                self.state
                    .hidden_infos()
                    .get(i)
                    .map_or_else(|| format!("#{i}"), |h| h.path.clone()),
            ),
            Key::Out => ("output", "out".to_string()),
            Key::Loss => ("loss", "loss".to_string()),
            Key::Grad(p) => (
                "gradient",
                self.state
                    .param_infos()
                    .get(p)
                    .map_or_else(|| format!("#{p}"), |i| i.key.clone()),
            ),
            Key::Trace(i) => ("trace", format!("#{i}")),
            Key::Term(i) => ("trace update term", format!("#{i}")),
        }
    }

    /// What a non-finite value written by a step does (default
    /// [`NonFinite::Error`]):
    ///
    /// * `Error`: the call returns [`Error::NonFinite`] naming the first
    ///   one (what it is — hidden state, output, loss, trace, gradient —,
    ///   its key, its index, whose first axis is the sample for a batched
    ///   value, and the step). A non-finite value in the inputs (`xs`, the
    ///   targets, the mask) is refused before anything runs, and so is one
    ///   written by the first step: the learner is then exactly as before
    ///   the call. One that first appears at a later step of a sequence
    ///   (a loss that overflows on finite inputs) stops the call there:
    ///   the completed steps, all finite, are kept, as for any error in a
    ///   later step, and the call's gradients are dropped.
    /// * `Skip`: the step is dropped — hidden states and traces stay where
    ///   the previous step left them, its gradient and loss are not added
    ///   (its row of `masked` is zero) — and counted
    ///   ([`Learner::skipped`]); the call goes on with the next step.
    /// * `Allow`: no scan (braintrace's behaviour).
    ///
    /// The scan is one pass over what the step wrote; its cost is measured
    /// in the book's online-learning chapter.
    pub fn set_non_finite(&mut self, policy: NonFinite) {
        self.non_finite = policy;
    }
    /// [`set_non_finite`](Self::set_non_finite), builder style.
    pub fn with_non_finite(mut self, policy: NonFinite) -> Self {
        self.non_finite = policy;
        self
    }
    /// The non-finite policy.
    pub fn non_finite(&self) -> NonFinite {
        self.non_finite
    }
    /// How many steps [`NonFinite::Skip`] has dropped since compile.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Under [`NonFinite::Error`], an error naming the first non-finite
    /// element of the named input sequences (`xs`, `ys[0]`, `mask`): their
    /// first axis is the step.
    pub(super) fn refuse_non_finite_inputs(
        &self,
        op: &str,
        inputs: &[(&str, &Tensor)],
    ) -> Result<()> {
        if self.non_finite != NonFinite::Error {
            return Ok(());
        }
        for (key, t) in inputs {
            if let Some((index, value)) = first_non_finite(t)? {
                return Err(Error::NonFinite {
                    op: op.to_string(),
                    what: "input".to_string(),
                    key: key.to_string(),
                    step: index.first().copied(),
                    index,
                    value,
                });
            }
        }
        Ok(())
    }

    /// Under [`NonFinite::Error`], an error naming the first non-finite
    /// element of one step's input `x` (its first axis is the sample).
    pub(super) fn refuse_non_finite_input(&self, op: &str, x: &Tensor) -> Result<()> {
        if self.non_finite != NonFinite::Error {
            return Ok(());
        }
        match first_non_finite(x)? {
            None => Ok(()),
            Some((index, value)) => Err(Error::NonFinite {
                op: op.to_string(),
                what: "input".to_string(),
                key: "x".to_string(),
                index,
                value,
                step: Some(self.running_index),
            }),
        }
    }

    /// The first non-finite value of what step `step` wrote, as the error
    /// to return; `None` when all is finite or the policy is `Allow`.
    pub(super) fn scan_written(
        &self,
        op: &str,
        step: usize,
        w: &Written<'_>,
    ) -> Result<Option<Error>> {
        if self.non_finite == NonFinite::Allow {
            return Ok(None);
        }
        // Names are made only for what is found (the scan allocates nothing).
        let named = (w
            .hidden
            .iter()
            .enumerate()
            .map(|(i, t)| (Key::Hidden(i), t)))
        .chain(w.out.iter().map(|t| (Key::Out, t)))
        .chain(w.loss.map(|t| (Key::Loss, t)))
        .chain(
            w.grads
                .iter()
                .zip(w.grad_params)
                .map(|(t, &p)| (Key::Grad(p), t)),
        )
        .chain(w.traces.iter().enumerate().map(|(i, t)| (Key::Trace(i), t)))
        .chain(
            w.extra
                .iter()
                .chain(w.grad_extra)
                .enumerate()
                .map(|(i, t)| (Key::Term(i), t)),
        );
        for (key, t) in named {
            if let Some((index, value)) = first_non_finite(t)? {
                let (what, key) = self.name(key);
                return Ok(Some(Error::NonFinite {
                    op: op.to_string(),
                    what: what.to_string(),
                    key,
                    index,
                    value,
                    step: Some(step),
                }));
            }
        }
        Ok(None)
    }
}
