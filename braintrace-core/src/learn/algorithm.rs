//! What an online learning algorithm is to the learner: the public
//! [`Algorithm`] value a user passes to [`compile`](super::compile), the
//! options every algorithm shares ([`VjpMethod`], [`NonTemporal`]), and the
//! three crate-internal traits an algorithm implements, one module each
//! (`learn/drtrl/`, `learn/pp_prop/`):
//!
//! * [`OnlineAlgorithm`] — the configuration (`DRtrl`, `PpProp`): its name,
//!   options, and [`plan`](OnlineAlgorithm::plan), which lays out its traces
//!   for a compiled graph;
//! * [`TraceRule`] — the algorithm planned for one graph, immutable, read
//!   by the staged step programs: its traces at zero, the per-step trace
//!   update (`forward`) and the gradient solve, both traced into the step
//!   program from the shared values of [`StepEval`] and [`SolveIn`];
//! * [`TraceState`] — what the learner itself owns and advances between
//!   staged steps (D-RTRL's fused-kernel traces, pp_prop's chunked weight
//!   gradients).
//!
//! The learner runs the staged program, reads its results by name
//! (`learn/learner/driver.rs`), hands the algorithm's own
//! outputs ([`Update::extra`], [`Solved::extra`]) to its [`TraceState`] —
//! one dynamic call per step (a few nanoseconds against a step of at least
//! ~4 µs) — and adds the gradients.
//!
//! # Adding an algorithm
//!
//! 1. A module `learn/my_algo/` with its configuration type (public, with
//!    builder methods), an `impl OnlineAlgorithm` for it, an
//!    `impl From<MyAlgo> for Algorithm` (`Algorithm::new(a)`), its
//!    [`TraceRule`] (traces, update, solve) and its [`TraceState`] (a unit
//!    struct with the default methods when all its traces live in the
//!    program).
//! 2. One registration line in `learn/mod.rs`, in the `algorithms!` list:
//!
//! ```text
//! algorithms! {
//!     drtrl::{DRtrl};
//!     pp_prop::{rank_decay, PpProp};
//!     my_algo::{MyAlgo};          // <- the one line
//! }
//! ```
//!
//! Nothing else changes: `compile(model, state, MyAlgo::new(..), x0, batch)`
//! accepts it through `From`, and the learner's programs, `explain`,
//! `traces` and `reset_state` go through the traits.
//!
//! Why a boxed `dyn` and not a type parameter: `Learner<M>` stays one type
//! whatever the algorithm (a generic `Learner<M, A>` would change every
//! signature that names a learner), an algorithm chosen at run time (a
//! name, a command-line flag) needs no match over every algorithm, and the
//! dynamic calls happen once per step, not per element: the per-element
//! work is inside the staged program and the algorithm's kernels.

use super::compiler::EtraceGraph;
use super::state::ModelState;
use crate::error::Result;
use crate::graph::VarId;
use crate::tensor::Tensor;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// How the learning signal of a step is obtained (braintrace's `vjp_method`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VjpMethod {
    /// `∂L_t/∂h_t` by perturbing each hidden state where it is produced;
    /// the gradient is `solve(ε_t, ∂L_t/∂h_t)` (braintrace's default).
    #[default]
    SingleStep,
    /// The reverse-mode gradient through the step with respect to every
    /// parameter and the entering hidden state `h_{t-1}`; the gradient is the
    /// in-step gradient plus `solve(ε_{t-1}, ∂L_t/∂h_{t-1})`.
    MultiStep,
}

/// What single-step learners give parameters that have no relation to a
/// hidden state (a readout, the GRU's `Wr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonTemporal {
    /// Exactly zero, as braintrace 0.2.6 does (which lists it as a known
    /// limitation): such parameters never learn. Set it explicitly to
    /// compare numbers with braintrace.
    Zero,
    /// Their in-step gradient `∂L_t/∂θ` with `h_{t-1}` held fixed (the
    /// default). For a readout this is its exact gradient; for a weight that
    /// reaches the hidden state only through another weight (the GRU's
    /// `Wr`) it is the instantaneous part of it. The default because a
    /// readout that never learns caps what the network can do (a vanilla
    /// RNN on a recall task: 85% with `Zero`, 100% with `InStep`).
    #[default]
    InStep,
}

/// How the single-step learning signal treats a path inside one step from
/// one hidden state of a group to another of the same group (an LSTM's
/// `c → h`, a synaptic current feeding a membrane potential).
///
/// The trace of the second state already carries the path (its `Df` is the
/// total derivative through the first state), so a learning signal that
/// also runs through it counts the path twice. braintrace 0.2.6 does: with
/// the recurrent weights at zero, where D-RTRL is exact, its LSTM's `Wi`,
/// `Wg`, `Wf` gradients are 2× BPTT's. See the book's "In-step paths
/// between the states of a group".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InStepPaths {
    /// As braintrace 0.2.6 (the default): the learning signal of each
    /// state is the total derivative of the loss, through the other states
    /// of its group, and the in-step path is counted twice.
    #[default]
    Twice,
    /// The learning signal of a state leaves out the paths through the
    /// other states of its group (which their traces carry): each path is
    /// counted once, and D-RTRL equals BPTT wherever the diagonal
    /// approximation is exact. Costs one extra reverse pass over such a
    /// group's in-step part per step; groups without in-step paths
    /// between their states are unchanged (and cost nothing).
    ///
    /// Not the default: on the evidence-accumulation task of the training
    /// examples (LSTM: five seeds; LIF with D-RTRL and pp_prop: six) both learn
    /// equally well within the seeds' spread, so braintrace's numbers are
    /// kept unless asked otherwise.
    Once,
}

/// How `etrace_grad` reduces the per-step gradients over time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// Divide the sum by the number of steps (braintrace's default).
    #[default]
    Mean,
    /// The sum over steps.
    Sum,
}

/// An online learning algorithm with its options: what
/// [`compile`](super::compile) takes (any algorithm's configuration,
/// [`DRtrl`](super::DRtrl) or [`PpProp`](super::PpProp), converts into it)
/// and [`Learner::algorithm`](super::Learner::algorithm) returns. Cheap to
/// clone (shared).
///
/// ```
/// use braintrace_core::learn::{Algorithm, DRtrl, PpProp, VjpMethod};
///
/// let a: Algorithm = DRtrl::default().vjp_method(VjpMethod::MultiStep).into();
/// assert_eq!(a.name(), "d_rtrl");
/// assert_eq!(a.vjp_method(), VjpMethod::MultiStep);
/// assert!(a.get::<DRtrl>().is_some_and(|d| d.fast_paths));
/// assert!(a.get::<PpProp>().is_none());
/// ```
#[derive(Clone)]
pub struct Algorithm(Arc<dyn OnlineAlgorithm>);

impl Algorithm {
    /// Wrap an algorithm's configuration (each algorithm's `From` impl).
    pub(crate) fn new(a: impl OnlineAlgorithm) -> Self {
        Algorithm(Arc::new(a))
    }
    /// A short name (`d_rtrl`, `pp_prop`).
    pub fn name(&self) -> &'static str {
        self.0.name()
    }
    /// The VJP method.
    pub fn vjp_method(&self) -> VjpMethod {
        self.0.vjp_method()
    }
    /// The treatment of non-temporal parameters.
    pub fn non_temporal(&self) -> NonTemporal {
        self.0.non_temporal()
    }
    /// How in-step paths between the states of a group are counted.
    pub fn in_step_paths(&self) -> InStepPaths {
        self.0.in_step_paths()
    }
    /// The configuration, when it is a `T` (e.g. `get::<DRtrl>()`).
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
    /// The configuration behind the value.
    pub(crate) fn config(&self) -> &dyn OnlineAlgorithm {
        &*self.0
    }
}

impl fmt::Debug for Algorithm {
    /// `DRtrl(DRtrl { vjp_method: .. })`: the configuration's type, then
    /// its fields (as the enum this type replaces printed it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple(self.0.type_name()).field(&self.0).finish()
    }
}

impl PartialEq for Algorithm {
    /// The same algorithm with the same options.
    fn eq(&self, other: &Self) -> bool {
        self.0.same(other.0.as_any())
    }
}

/// An algorithm's configuration (see the module docs).
pub(crate) trait OnlineAlgorithm: fmt::Debug + Send + Sync + 'static {
    /// A short name (`d_rtrl`), as braintrace names it.
    fn name(&self) -> &'static str;
    /// The configuration type's name (`DRtrl`), for `Debug`.
    fn type_name(&self) -> &'static str;
    /// The VJP method.
    fn vjp_method(&self) -> VjpMethod;
    /// The treatment of non-temporal parameters.
    fn non_temporal(&self) -> NonTemporal;
    /// How in-step paths between the states of a group are counted (an
    /// algorithm without a single-step learning signal ignores it).
    fn in_step_paths(&self) -> InStepPaths {
        InStepPaths::Twice
    }
    /// For [`Algorithm::get`].
    fn as_any(&self) -> &dyn Any;
    /// Whether `other` is the same configuration (`other.downcast_ref() == Some(self)`).
    fn same(&self, other: &dyn Any) -> bool;
    /// Lay out the traces of every (relation, group) pair of `eg` (`pairs`,
    /// in the order of the relations; `x_vars` their distinct inputs): an
    /// error names the relation the algorithm cannot handle.
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>>;
}

/// An algorithm [`Algorithm::by_name`] finds: braintrace's names for it
/// and the configuration the name stands for (every algorithm of the
/// `algorithms!` list in `learn/mod.rs` implements it).
pub(crate) trait Named: OnlineAlgorithm + Sized {
    /// braintrace's names (`compile(model, "d_rtrl")`), the first canonical.
    const NAMES: &'static [&'static str];
    /// The configuration a name gives: braintrace's defaults.
    fn named() -> Self;
}

/// One (relation, group) pair that carries traces.
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    /// The relation's index.
    pub rel: usize,
    /// The hidden group's index.
    pub group: usize,
}

/// The (relation, group) pairs of a compiled graph and their inputs:
/// what every algorithm's traces are laid out over.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// Every (relation, group) pair, relation by relation.
    pub pairs: Vec<Pair>,
    /// The relations' distinct inputs `x`, in first-use order.
    pub x_vars: Vec<VarId>,
}

/// One step's values every trace update reads, computed once by the
/// forward program (all traced: symbolic while the step is staged).
pub(crate) struct StepEval<'a> {
    /// The parameter values, in [`ModelState`] order.
    pub params: &'a [Tensor],
    /// The step graph's inputs (`params ++ hidden ++ [x]`), for a rule
    /// that differentiates the transition itself (OSTL's coupled Jacobian,
    /// SnAp's Jacobians).
    pub inputs: &'a [Tensor],
    /// Each relation input's value (`Layout::x_vars`).
    pub xs: HashMap<VarId, Tensor>,
    /// Hidden-to-hidden Jacobian columns per group, `d_cols[group][b][a]`
    /// = `D[.., a, b]`, each shaped like the group's states `(V..)`.
    pub d_cols: Vec<Vec<Vec<Tensor>>>,
    /// `∂h_a/∂y` of each pair's relation output per state: `df[pair][a]`, `(V..)`.
    pub df: Vec<Vec<Tensor>>,
    /// `D` stacked per group, `(V.., S, S)`, when [`TraceRule::stacked`]
    /// (else empty).
    pub d: Vec<Tensor>,
    /// `Df` stacked per pair, `(V.., S)`, when [`TraceRule::stacked`]
    /// (else empty).
    pub df_stacked: Vec<Tensor>,
}

/// A trace update's results.
pub(crate) struct Update {
    /// The traces the step program carries, in [`TraceRule::zeros`] order.
    pub traces: Vec<Tensor>,
    /// What the algorithm's [`TraceState`] reads after the step.
    pub extra: Vec<Tensor>,
}

/// What the gradient solve reads (traced).
pub(crate) struct SolveIn<'a> {
    /// The parameter values.
    pub params: &'a [Tensor],
    /// The traces to solve with: after this step's update (single-step) or
    /// before it (multi-step).
    pub traces: &'a [Tensor],
    /// The learning signal per hidden state (`∂L_t/∂h_t` or
    /// `∂L_t/∂h_{t−1}`), in the model's hidden order.
    pub signal: &'a [Tensor],
    /// The step's scalar input ([`TraceRule::scalar`]).
    pub scalar: &'a Tensor,
}

/// A solve's results.
pub(crate) struct Solved {
    /// Gradients by parameter index (summed when an index repeats); only
    /// parameters of pairs for which [`TraceRule::in_program`] holds.
    pub grads: Vec<(usize, Tensor)>,
    /// What the algorithm's [`TraceState`] reads after the step.
    pub extra: Vec<Tensor>,
}

/// An algorithm planned for one compiled graph (see the module docs).
pub(crate) trait TraceRule: Send + Sync {
    /// The traces the step programs carry, at zero.
    fn zeros(&self) -> Vec<Tensor>;
    /// The learner-owned part of the traces, at zero.
    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>>;
    /// The step's trace update (traced into the forward program).
    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update>;
    /// The step's gradient solve (traced into the gradient program).
    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved>;
    /// Whether pair `pair`'s weight gradients come from the step program
    /// (`false`: from the learner's [`TraceState`] alone, or they are zero).
    fn in_program(&self, pair: usize) -> bool;
    /// Whether [`update`](Self::update) reads `D` and `Df` stacked
    /// ([`StepEval::d`], [`StepEval::df_stacked`]).
    fn stacked(&self) -> bool {
        false
    }
    /// How many tensors [`Update::extra`] holds.
    fn forward_extra(&self) -> usize;
    /// The scalar input of the step after `n` earlier steps (pp_prop's bias
    /// correction; 1 when unused).
    fn scalar(&self, _n: usize) -> f64 {
        1.0
    }
    /// The traces in their public layout, program-carried ones first
    /// (`traces` in [`zeros`](Self::zeros) order), then `state`'s.
    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>>;
    /// Lines for [`Learner::explain`](super::Learner::explain), after the
    /// algorithm's own line.
    fn explain(&self) -> Vec<String>;
    /// For each trace of [`public`](Self::public)'s list, in that order,
    /// the parameters (indices) it belongs to — what
    /// [`Learner::etrace_of`](super::Learner::etrace_of) reads. Empty
    /// when the algorithm does not say (then `etrace_of` is an error).
    fn public_params(&self) -> Vec<Vec<usize>> {
        Vec::new()
    }
    /// Whether the rule adds a bootstrapped cotangent at the exit of every
    /// multi-step window ([`exit_cotangent`](Self::exit_cotangent), DNI's
    /// synthetic gradient). Then the sequence driver runs every call as
    /// windows (one step each for `chunk_size` 1), pushes the estimate
    /// back through the window and adds what it gives to the parameters
    /// without a relation only; the gradient's [`Solved::extra`] it hands
    /// to the [`TraceState`] ends with the cotangent of each entering
    /// hidden state (the window's own loss and the estimate), in the
    /// model's hidden order.
    fn bootstrapped(&self) -> bool {
        false
    }
    /// Values the step programs take as inputs beside the traces (read
    /// before a call's first step; concrete): a bootstrapped rule's
    /// estimator. An error (e.g. no estimator) stops the call before
    /// anything runs.
    fn program_inputs(&self) -> Result<Vec<Tensor>> {
        Ok(Vec::new())
    }
    /// The cotangent to add at the window-exit hidden states `exit` (one
    /// per hidden state, shaped like it; traced), from the
    /// [`program_inputs`](Self::program_inputs) `inputs`. Only called when
    /// [`bootstrapped`](Self::bootstrapped).
    fn exit_cotangent(&self, _exit: &[Tensor], _inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Err(crate::error::Error::invalid(
            "etrace_grad",
            "this algorithm adds no cotangent at a window's exit",
        ))
    }
}

/// The traces and accumulators a learner owns for its algorithm, advanced
/// between staged steps (see the module docs).
pub(crate) trait TraceState: Send + Sync {
    /// Before [`Learner::update`](super::Learner::update)'s step (after its
    /// program ran): values derived from the current parameters.
    fn begin_update(&mut self, _params: &[Tensor]) -> Result<()> {
        Ok(())
    }
    /// Before an `etrace_grad` call's steps: derived values, gradients
    /// from zero.
    fn begin_grad(&mut self, _params: &[Tensor]) -> Result<()> {
        Ok(())
    }
    /// After a staged step: `fwd` its [`Update::extra`], `grad` its
    /// [`Solved::extra`] (`None` for a plain update).
    fn step(&mut self, _fwd: &[Tensor], _grad: Option<&[Tensor]>) -> Result<()> {
        Ok(())
    }
    /// The gradients accumulated since [`begin_grad`](Self::begin_grad),
    /// by parameter index.
    fn take_grads(&mut self, _params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        Ok(Vec::new())
    }
    /// Drop this call's gradients (a step failed).
    fn drop_grads(&mut self) -> Result<()> {
        Ok(())
    }
    /// Traces to zero.
    fn reset(&mut self) -> Result<()> {
        Ok(())
    }
    /// Copies of the owned traces, in the public layout.
    fn tensors(&self) -> Vec<Tensor> {
        Vec::new()
    }
    /// Copies of the state that carries over from one call to the next,
    /// in the algorithm's own layout (what [`load_raw`](Self::load_raw)
    /// takes back): a checkpoint of a learner saves these.
    fn raw(&self) -> Vec<Tensor> {
        Vec::new()
    }
    /// Put back what [`raw`](Self::raw) gave. Checks every tensor's
    /// count, shape and dtype first; nothing changes on error.
    fn load_raw(&mut self, raw: &[Tensor]) -> Result<()> {
        if raw.is_empty() {
            Ok(())
        } else {
            Err(crate::error::Error::invalid(
                "Learner::resume",
                format!(
                    "the saved algorithm state has {} tensor(s); this learner's algorithm keeps none",
                    raw.len()
                ),
            ))
        }
    }
    /// Bytes of the owned traces (a step streams each once): part of the
    /// learner's work estimate ([`crate::threads::Work`]).
    fn trace_bytes(&self) -> usize {
        0
    }
    /// The state itself, for an algorithm that reads its own state back
    /// from the learner (DNI's synthetic-gradient training).
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}
