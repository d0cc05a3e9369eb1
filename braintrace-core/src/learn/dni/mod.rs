//! DNI — decoupled neural interfaces, synthetic gradients (Jaderberg et
//! al. 2017; braintrace's `DNI`, `SyntheticGradient` and
//! `train_synthetic_gradient`).
//!
//! A multi-step window `[a, b)` of D-RTRL gets, by reverse mode through
//! its steps, the gradient of its own losses; what the losses after `b`
//! would have sent back through `h^b` is cut off. For a parameter with a
//! relation the eligibility trace carries that credit into the later
//! windows; a parameter without one (the GRU's `Wr`, an input projection
//! reaching the state only through another weight) loses it. DNI puts an
//! estimate of it back: a synthesiser `M` ([`SyntheticGradient`]) maps the
//! exit hidden values `h^b` to `ĝ ≈ ∂L_{≥b}/∂h^b`, and the window's
//! reverse pass is run a second time from `ĝ` alone. What that pass gives
//! is added to the parameters *without* a relation (their traces would
//! count it a second time otherwise) and to the cotangent of the entering
//! hidden states; the learning signal of the traces is the first pass's
//! alone. So with a synthesiser attached the gradients of the relation
//! parameters are those of multi-step D-RTRL, bit for bit.
//!
//! `M` is fitted by [`train_synthetic_gradient`]: window after window, the
//! cotangent of the window's entering hidden states (its own losses and
//! `M`'s estimate at its exit, bootstrapped) is the regression target of
//! `M` at those states, fitted by one optimiser step each, the model's
//! parameters untouched; then the final state against zero (nothing
//! follows it).
//!
//! The synthesiser is shared by every clone of a [`Dni`] configuration
//! (the learner's included), as [`ThreeFactor`](super::ThreeFactor)'s
//! modulator is: attach it once the learner is compiled (its shapes come
//! from the learner's hidden groups), read it back, train it. A learner
//! checkpoint saves it with the algorithm's state.

mod synth;
mod train;

pub use synth::SyntheticGradient;
pub use train::{train_synthetic_gradient, train_synthetic_gradient_with, SgTrainOpts};

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, SolveIn, Solved, StepEval, TraceRule,
    TraceState, Update, VjpMethod,
};
use super::boilerplate::{algorithm_methods, delegate_trace_rule};
use super::compiler::EtraceGraph;
use super::drtrl::DrtrlRule;
use super::precision::TraceDType;
use super::shared::{last, stack_last};
use super::state::ModelState;
use super::DRtrl;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

/// DNI: multi-step D-RTRL with a learned estimate of the cotangent a
/// window's truncated future would have sent back (braintrace's `DNI`;
/// see the module docs).
///
/// ```
/// use braintrace_core::learn::{compile, Algorithm, Dni, ModelState, SyntheticGradient};
/// use braintrace_core::nn::GruCell;
/// use braintrace_core::{DType, Tensor};
///
/// let dni = Dni::new();
/// assert_eq!(Algorithm::from(dni.clone()).name(), "dni");
/// let model = GruCell::new("rnn", 3, 4);
/// let state = ModelState::new(&model, DType::F64, 0, Some(2))?;
/// let learner = compile(model, state, dni.clone(), &Tensor::zeros(&[2, 3], DType::F64), Some(2))?;
/// dni.attach_synthesizer(SyntheticGradient::for_graph(learner.graph(), DType::F64)?);
/// assert_eq!(dni.synthesizer().unwrap().shapes(), &[vec![2, 4, 1]]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Dni {
    synth: Arc<Mutex<Option<SyntheticGradient>>>,
    /// D-RTRL's fused trace kernels where a primitive has one
    /// (braintrace's `fast_solve`).
    pub fast_paths: bool,
    /// The precision the traces are kept in (braintrace's `trace_dtype`).
    pub trace_dtype: TraceDType,
}

impl Default for Dni {
    fn default() -> Self {
        Self::new()
    }
}

impl Dni {
    /// No synthesiser yet (a gradient call refuses to run until one is
    /// attached, as braintrace does), fused kernels on, traces in the
    /// model's precision.
    pub fn new() -> Self {
        Dni {
            synth: Arc::new(Mutex::new(None)),
            fast_paths: true,
            trace_dtype: TraceDType::Model,
        }
    }
    /// With this synthesiser attached.
    pub fn with_synthesizer(self, sg: SyntheticGradient) -> Self {
        self.attach_synthesizer(sg);
        self
    }
    /// Attach (or replace) the synthesiser, for this configuration and
    /// every clone of it (the learner's included). Its group shapes are
    /// checked against the learner's hidden groups when a gradient call
    /// runs.
    pub fn attach_synthesizer(&self, sg: SyntheticGradient) {
        *self.synth.lock().unwrap_or_else(|e| e.into_inner()) = Some(sg);
    }
    /// A copy of the attached synthesiser.
    pub fn synthesizer(&self) -> Option<SyntheticGradient> {
        self.synth.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Detach the synthesiser (the configuration as [`new`](Self::new) made it).
    pub fn detach_synthesizer(&self) -> Option<SyntheticGradient> {
        self.synth.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
    /// The VJP method: DNI is multi-step only (a window has an exit to
    /// estimate the future at); `SingleStep` is an error naming
    /// `vjp_method`.
    pub fn vjp_method(self, m: VjpMethod) -> Result<Self> {
        if m != VjpMethod::MultiStep {
            return Err(Error::invalid(
                "Dni",
                format!("vjp_method: DNI is multi-step only (got {m:?}; braintrace's DNI requires 'multi-step')"),
            ));
        }
        Ok(self)
    }
    /// With or without the fused trace kernels.
    pub fn fast_paths(mut self, on: bool) -> Self {
        self.fast_paths = on;
        self
    }
    /// With the traces kept in this precision.
    pub fn trace_dtype(mut self, t: TraceDType) -> Self {
        self.trace_dtype = t;
        self
    }
}

impl fmt::Debug for Dni {
    /// The options only: the synthesiser's values are state, not options
    /// (a checkpoint compares this text).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dni")
            .field("fast_paths", &self.fast_paths)
            .field("trace_dtype", &self.trace_dtype)
            .finish()
    }
}

impl PartialEq for Dni {
    /// The same options and the same (shared) synthesiser slot.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.synth, &other.synth)
            && self.fast_paths == other.fast_paths
            && self.trace_dtype == other.trace_dtype
    }
}

impl OnlineAlgorithm for Dni {
    algorithm_methods!(
        Dni,
        "dni",
        |_: &Self| VjpMethod::MultiStep,
        |_: &Self| NonTemporal::InStep
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        let d = DRtrl {
            vjp_method: VjpMethod::MultiStep,
            fast_paths: self.fast_paths,
            trace_dtype: self.trace_dtype,
            ..DRtrl::default()
        };
        let g = eg.graph();
        let dtype = (0..eg.num_hidden())
            .next()
            .map_or(DType::F64, |i| g.aval(eg.hidden_in_var(i)).dtype());
        Ok(Box::new(DniRule {
            inner: DrtrlRule::plan(&d, eg, layout)?,
            synth: self.synth.clone(),
            shapes: SyntheticGradient::group_shapes(eg),
            groups: eg.groups().iter().map(|g| g.states.clone()).collect(),
            nh: eg.num_hidden(),
            dtype,
        }))
    }
}

impl Named for Dni {
    const NAMES: &'static [&'static str] = &["dni"];
    /// No synthesiser until one is attached.
    fn named() -> Self {
        Dni::new()
    }
}

impl From<Dni> for Algorithm {
    fn from(a: Dni) -> Self {
        Algorithm::new(a)
    }
}

/// Multi-step D-RTRL's rule with the synthesiser's estimate at a window's
/// exit.
struct DniRule {
    inner: DrtrlRule,
    synth: Arc<Mutex<Option<SyntheticGradient>>>,
    /// Each group's `(*varshape, num_state)`.
    shapes: Vec<Vec<usize>>,
    /// Each group's hidden states (indices).
    groups: Vec<Vec<usize>>,
    nh: usize,
    dtype: DType,
}

impl DniRule {
    /// The attached synthesiser, checked against this graph.
    fn checked(&self) -> Result<SyntheticGradient> {
        const OP: &str = "etrace_grad (dni)";
        let sg = self
            .synth
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                Error::invalid(
                    OP,
                    "synthesizer: none attached, so the exit cotangent would silently stay zero \
                     (the plain truncated rule under DNI's name); attach one with \
                     Dni::attach_synthesizer(SyntheticGradient::for_graph(learner.graph(), dtype)?)",
                )
            })?;
        if !sg.fits(&self.shapes) {
            return Err(Error::invalid(
                OP,
                format!(
                    "synthesizer: made for group shapes {:?}, the learner's hidden groups are {:?} \
                     (one (*varshape, num_state) per group; the last two axes must agree)",
                    sg.shapes(),
                    self.shapes
                ),
            ));
        }
        if sg.dtype() != self.dtype {
            return Err(Error::dtype_with(
                OP,
                "synthesizer",
                [self.dtype],
                sg.dtype(),
                "the synthesiser's parameters must have the model's dtype",
            ));
        }
        Ok(sg)
    }
}

impl TraceRule for DniRule {
    delegate_trace_rule!(inner: zeros, in_program, stacked, forward_extra, public);
    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        Ok(Box::new(DniState {
            inner: self.inner.state(state)?,
            synth: self.synth.clone(),
            shapes: self.shapes.clone(),
            dtype: self.dtype,
            nh: self.nh,
            entry: Vec::new(),
        }))
    }
    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        self.inner.update(step, traces)
    }
    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        self.inner.solve(s)
    }
    fn public_params(&self) -> Vec<Vec<usize>> {
        self.inner.public_params()
    }
    fn explain(&self) -> Vec<String> {
        let mut v = self.inner.explain();
        v.push(format!(
            "dni: a synthetic cotangent at each window's exit, {} group(s) {:?}",
            self.shapes.len(),
            self.shapes
        ));
        v
    }
    fn bootstrapped(&self) -> bool {
        true
    }
    fn program_inputs(&self) -> Result<Vec<Tensor>> {
        Ok(self.checked()?.tensors())
    }
    fn exit_cotangent(&self, exit: &[Tensor], inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut out: Vec<Option<Tensor>> = vec![None; exit.len()];
        for (g, states) in self.groups.iter().enumerate() {
            let slab = stack_last(&states.iter().map(|&i| exit[i].clone()).collect::<Vec<_>>())?;
            let est = synth::estimate(&inputs[2 * g], &inputs[2 * g + 1], &slab)?;
            for (k, &i) in states.iter().enumerate() {
                out[i] = Some(last(&est, k)?);
            }
        }
        Ok(out
            .into_iter()
            .zip(exit)
            .map(|(o, h)| o.unwrap_or_else(|| h.zeros_like()))
            .collect())
    }
}

/// D-RTRL's learner-side state, the cotangent of the last window's
/// entering hidden states (the synthesiser's regression target) and, for
/// a checkpoint, the synthesiser.
struct DniState {
    inner: Box<dyn TraceState>,
    synth: Arc<Mutex<Option<SyntheticGradient>>>,
    /// The learner's group shapes and dtype (a synthesiser loaded from a
    /// checkpoint is made for them).
    shapes: Vec<Vec<usize>>,
    dtype: DType,
    nh: usize,
    entry: Vec<Tensor>,
}

impl DniState {
    /// The cotangents of the last window's entering hidden states.
    pub(crate) fn entry(&self) -> &[Tensor] {
        &self.entry
    }
}

impl TraceState for DniState {
    fn begin_update(&mut self, params: &[Tensor]) -> Result<()> {
        self.inner.begin_update(params)
    }
    fn begin_grad(&mut self, params: &[Tensor]) -> Result<()> {
        self.inner.begin_grad(params)
    }
    fn step(&mut self, fwd: &[Tensor], grad: Option<&[Tensor]>) -> Result<()> {
        match grad {
            Some(g) if g.len() >= self.nh => {
                let (own, entry) = g.split_at(g.len() - self.nh);
                self.inner.step(fwd, Some(own))?;
                self.entry = entry.to_vec();
                Ok(())
            }
            other => self.inner.step(fwd, other),
        }
    }
    fn take_grads(&mut self, params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        self.inner.take_grads(params)
    }
    fn drop_grads(&mut self) -> Result<()> {
        self.inner.drop_grads()
    }
    fn reset(&mut self) -> Result<()> {
        self.entry.clear();
        self.inner.reset()
    }
    fn tensors(&self) -> Vec<Tensor> {
        self.inner.tensors()
    }
    /// D-RTRL's, then the synthesiser's `W_0, b_0, ..` (none when none is
    /// attached).
    fn raw(&self) -> Vec<Tensor> {
        let mut v = self.inner.raw();
        if let Some(sg) = &*self.synth.lock().unwrap_or_else(|e| e.into_inner()) {
            v.extend(sg.tensors());
        }
        v
    }
    fn load_raw(&mut self, raw: &[Tensor]) -> Result<()> {
        const OP: &str = "Learner::resume";
        let n = self.inner.raw().len();
        if raw.len() < n {
            return Err(Error::invalid(
                OP,
                format!(
                    "the saved algorithm state has {} tensor(s); DNI's traces alone are {n}",
                    raw.len()
                ),
            ));
        }
        let (own, saved) = raw.split_at(n);
        let sg = if saved.is_empty() {
            None
        } else {
            Some(SyntheticGradient::zeros(&self.shapes, self.dtype)?.with_tensors(OP, saved)?)
        };
        let mut slot = self.synth.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.load_raw(own)?;
        *slot = sg;
        Ok(())
    }
    fn trace_bytes(&self) -> usize {
        self.inner.trace_bytes()
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

/// The cotangents of the entering hidden states of the last window `state`
/// ran (a DNI learner's), or an error.
pub(crate) fn last_entry(state: &dyn TraceState) -> Result<Vec<Tensor>> {
    let s = state
        .as_any()
        .and_then(|a| a.downcast_ref::<DniState>())
        .ok_or_else(|| {
            Error::invalid(
                "train_synthetic_gradient",
                "learner: its algorithm is not DNI (compile with Dni::new())",
            )
        })?;
    Ok(s.entry().to_vec())
}
