//! The sequence driver's options and results: [`EtraceOpts`] (builder
//! style) for [`Learner::etrace_grad_with`](super::Learner::etrace_grad_with),
//! [`EvolveOpts`] for [`Learner::evolve`](super::Learner::evolve), what a
//! step loss may return ([`StepLoss`]) and what a call returns
//! ([`EtraceOut`]).

use crate::error::{Error, Result};
use crate::learn::algorithm::Reduction;
use crate::learn::state::TensorDict;
use crate::tensor::{DType, Tensor};

/// Options of [`Learner::etrace_grad_with`](super::Learner::etrace_grad_with),
/// braintrace 0.2.6's `etrace_grad` keywords. The default is the plain
/// call: every step weighted 1, one step at a time, the mean over steps.
///
/// ```
/// use braintrace_core::learn::{EtraceOpts, Reduction};
/// use braintrace_core::{DType, Tensor};
///
/// let mask = Tensor::from_vec(vec![0.0, 1.0, 1.0, 1.0], &[4])?;
/// let opts = EtraceOpts::new().mask(&mask).reduction(Reduction::Sum).outputs(true);
/// assert_eq!(opts.get_reduction(), Reduction::Sum);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct EtraceOpts {
    pub(super) reduction: Reduction,
    pub(super) mask: Option<Tensor>,
    pub(super) weights: Option<Vec<f64>>,
    pub(super) chunk_size: Option<usize>,
    pub(super) outputs: bool,
}

impl EtraceOpts {
    /// The plain call (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }
    /// How the per-step gradients are reduced: [`Reduction::Mean`]
    /// divides the sum by the total weight `max(Σ_t w_t·m_t, 1)` (the
    /// number of steps without a mask or weights), [`Reduction::Sum`]
    /// leaves it.
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    /// A mask removing steps (or samples of a step) from the loss: `(T,)`
    /// weights one scalar loss per step (braintrace's `mask`); `(T, *s)`
    /// weights a loss of shape `s` (a per-sample loss `(B,)` with a
    /// `(T, B)` mask), the objective being `Σ mask·loss`. Values need not
    /// be 0 or 1. The mask gates the loss only: the model and its traces
    /// advance at every step.
    pub fn mask(mut self, mask: &Tensor) -> Self {
        self.mask = Some(mask.clone());
        self
    }
    /// A weight per step (length `T`), multiplying that step's loss (and
    /// its mask).
    pub fn weights(mut self, w: &[f64]) -> Self {
        self.weights = Some(w.to_vec());
        self
    }
    /// Windows of `k` steps (braintrace's `chunk_size`, its
    /// `MultiStepData`): the gradient of a window's losses is taken by
    /// reverse mode through its `k` steps, with the traces at the window's
    /// start carrying the earlier past. Needs the multi-step VJP method and
    /// a length that `k` divides; `1` is the plain path. The step counter
    /// advances once per window, as in braintrace (see the book).
    pub fn chunk_size(mut self, k: usize) -> Self {
        self.chunk_size = Some(k);
        self
    }
    /// Return the model's output of every step, `(T, *output)`.
    pub fn outputs(mut self, yes: bool) -> Self {
        self.outputs = yes;
        self
    }
    /// The reduction.
    pub fn get_reduction(&self) -> Reduction {
        self.reduction
    }

    /// The window length (`1`: step by step), checked.
    pub(super) fn window(&self, op: &str, t_len: usize) -> Result<usize> {
        window(op, self.chunk_size, t_len)
    }

    /// The per-step seeds of the reverse pass, `(T, *s)` of `dtype`
    /// (mask times weight), the loss shape `s` and the total weight; all
    /// ones `(T,)` without mask or weights (total `T`).
    pub(super) fn seeds(&self, t_len: usize, dtype: DType) -> Result<(Tensor, Vec<usize>, f64)> {
        const OP: &str = "etrace_grad";
        if let Some(w) = &self.weights {
            if w.len() != t_len {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "weights: {} values for a sequence of {t_len} steps (one per step)",
                        w.len()
                    ),
                ));
            }
            if let Some(i) = w.iter().position(|v| !v.is_finite()) {
                return Err(Error::invalid(
                    OP,
                    format!("weights: value {i} is {} (must be finite)", w[i]),
                ));
            }
        }
        let (mut vals, shape) = match &self.mask {
            Some(m) => {
                if m.is_symbolic() {
                    return Err(Error::invalid(OP, "mask: must be a concrete tensor"));
                }
                if m.ndim() == 0 || m.shape()[0] != t_len {
                    return Err(Error::shapes(
                        OP,
                        [m.shape().to_vec(), vec![t_len]],
                        format!(
                            "mask: must be (T, ...) with T = {t_len} steps: (T,) for a scalar loss, (T, B) for a per-sample loss"
                        ),
                    ));
                }
                let v = m.to_vec_f64()?;
                if let Some(i) = v.iter().position(|v| !v.is_finite()) {
                    return Err(Error::invalid(
                        OP,
                        format!("mask: element {i} is {} (must be finite)", v[i]),
                    ));
                }
                (v, m.shape().to_vec())
            }
            None => (vec![1.0; t_len], vec![t_len]),
        };
        if let Some(w) = &self.weights {
            let per = vals.len() / t_len.max(1);
            for (i, v) in vals.iter_mut().enumerate() {
                *v *= w[i / per.max(1)];
            }
        }
        let total = if self.mask.is_none() && self.weights.is_none() {
            t_len as f64
        } else {
            vals.iter().sum()
        };
        let seeds = Tensor::from_vec(vals, &shape)?.cast(dtype)?;
        Ok((seeds, shape[1..].to_vec(), total))
    }
}

/// `chunk_size` checked against a length of `t_len` (`1` when not given).
pub(super) fn window(op: &str, chunk: Option<usize>, t_len: usize) -> Result<usize> {
    match chunk {
        None => Ok(1),
        Some(0) => Err(Error::invalid(
            op,
            "chunk_size: must be at least 1 (1 runs step by step)",
        )),
        Some(k) if !t_len.is_multiple_of(k) => Err(Error::invalid(
            op,
            format!(
                "chunk_size: {k} does not divide the sequence length {t_len} (ragged windows are refused; trim to {} steps)",
                t_len - t_len % k
            ),
        )),
        Some(k) => Ok(k),
    }
}

/// Options of [`Learner::evolve`](super::Learner::evolve) (braintrace's
/// `etrace_evolve`).
#[derive(Clone, Copy, Debug, Default)]
pub struct EvolveOpts {
    pub(super) chunk_size: Option<usize>,
    pub(super) outputs: bool,
}

impl EvolveOpts {
    /// Step by step, no outputs kept.
    pub fn new() -> Self {
        Self::default()
    }
    /// Windows of `k` steps: the same hidden states and traces, the step
    /// counter advanced once per window (as braintrace does).
    pub fn chunk_size(mut self, k: usize) -> Self {
        self.chunk_size = Some(k);
        self
    }
    /// Keep and return every step's output, `(T, *output)`.
    pub fn outputs(mut self, yes: bool) -> Self {
        self.outputs = yes;
        self
    }
}

/// What a step loss returns: the loss alone (a [`Tensor`]), or the loss
/// and auxiliary values (`(Tensor, Vec<Tensor>)`, braintrace's
/// `has_aux`), stacked over the steps into [`EtraceOut::aux`].
pub trait StepLoss {
    /// Whether auxiliary values come with the loss.
    const AUX: bool;
    /// The loss and the auxiliary values.
    fn split(self) -> (Tensor, Vec<Tensor>);
}

impl StepLoss for Tensor {
    const AUX: bool = false;
    fn split(self) -> (Tensor, Vec<Tensor>) {
        (self, Vec::new())
    }
}

impl StepLoss for (Tensor, Vec<Tensor>) {
    const AUX: bool = true;
    fn split(self) -> (Tensor, Vec<Tensor>) {
        self
    }
}

/// The results of [`Learner::etrace_grad_with`](super::Learner::etrace_grad_with).
#[derive(Clone, Debug)]
pub struct EtraceOut {
    /// One gradient per parameter leaf, reduced as the options say.
    pub grads: TensorDict,
    /// Every step's loss as the loss function returned it, before mask
    /// and weights: `(T,)`, or `(T, *s)` for a loss of shape `s`.
    pub losses: Tensor,
    /// The losses weighted by mask and weights (braintrace's
    /// `loss_output='masked'`), shaped like `losses`.
    pub masked: Tensor,
    /// The reduced objective (braintrace's `loss_output='scalar'`): the
    /// sum of `masked`, divided by the total weight for the mean.
    pub objective: f64,
    /// Every step's model output `(T, *output)`, when asked for.
    pub outputs: Option<Tensor>,
    /// The auxiliary values of the loss, each stacked over the steps.
    pub aux: Vec<Tensor>,
    /// The steps [`NonFinite::Skip`](crate::learn::NonFinite::Skip)
    /// dropped in this call (rows of the sequence; a window's first row).
    /// Their losses are reported in `losses` as computed; their rows of
    /// `masked` are zero and they add nothing to `objective` or the
    /// gradients.
    pub skipped: Vec<usize>,
}

/// Options of [`compile_with`](super::compile_with) (braintrace's
/// `compile` keywords beside the algorithm's): the control-flow policy the
/// step is analysed with. The default is what [`compile`](super::compile)
/// does.
///
/// ```
/// use braintrace_core::learn::{CompileOpts, CondPolicy, ControlFlowPolicy};
///
/// let policy = ControlFlowPolicy { cond: CondPolicy::Opaque, scan_unroll_limit: 4 };
/// let opts = CompileOpts::new().control_flow(policy.clone());
/// assert_eq!(opts.get_control_flow(), &policy);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompileOpts {
    pub(super) control_flow: crate::learn::ControlFlowPolicy,
}

impl CompileOpts {
    /// The defaults (the default [`ControlFlowPolicy`](crate::learn::ControlFlowPolicy)).
    pub fn new() -> Self {
        Self::default()
    }
    /// How control flow inside the step is handled (braintrace's
    /// `ControlFlowPolicy`): fixed-count scans unrolled up to a limit,
    /// conds if-converted or kept opaque. A reset to another batch size
    /// analyses the step again with the same policy.
    pub fn control_flow(mut self, policy: crate::learn::ControlFlowPolicy) -> Self {
        self.control_flow = policy;
        self
    }
    /// The control-flow policy.
    pub fn get_control_flow(&self) -> &crate::learn::ControlFlowPolicy {
        &self.control_flow
    }
}
