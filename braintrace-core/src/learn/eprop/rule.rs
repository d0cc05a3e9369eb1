//! E-prop's trace rule: D-RTRL's ([`DrtrlRule`]) with, after its traces,
//! the κ-filtered traces `ē` (one per D-RTRL trace, same shape: the filter
//! is element-wise, states never mix), and the learning signal replaced by
//! its random-feedback projection when asked.
//!
//! The filter advances in the step program's trace update:
//! `ē ← κ ē + e` with `e` the trace the solve reads (after this step's
//! update for the single-step method, before it for the multi-step one),
//! so an `etrace_grad` step filters exactly as braintrace's solve does.
//! braintrace filters only when a gradient is solved; here a plain
//! [`Learner::update`](crate::learn::Learner::update) advances the filter
//! too (it advances the traces it filters).

use super::{EProp, Feedback};
use crate::error::{Error, Result};
use crate::learn::algorithm::{
    Layout, SolveIn, Solved, StepEval, TraceRule, TraceState, Update, VjpMethod,
};
use crate::learn::boilerplate::delegate_trace_rule;
use crate::learn::compiler::EtraceGraph;
use crate::learn::drtrl::DrtrlRule;
use crate::learn::state::ModelState;
use crate::learn::DRtrl;
use crate::random::Rng;
use crate::tensor::{DType, Tensor};
use std::sync::Arc;

/// The scale of braintrace's feedback draws (`FixedRandomFeedback`'s
/// `init_scale`).
const FEEDBACK_SCALE: f64 = 0.1;

/// E-prop planned for one compiled graph.
pub(super) struct EPropRule {
    eg: Arc<EtraceGraph>,
    inner: DrtrlRule,
    /// How many traces D-RTRL's rule carries (the filtered ones follow).
    n: usize,
    /// `κ` when the filter is on.
    kappa: Option<f64>,
    multi: bool,
    /// Per hidden group, its feedback matrix `B` (`(w, w)`), if any.
    feedback: Vec<Option<Tensor>>,
}

/// The hidden groups that have a relation, in first-use order (the order
/// braintrace draws their feedback matrices in).
fn related_groups(eg: &EtraceGraph) -> Vec<usize> {
    let mut v = Vec::new();
    for r in eg.relations() {
        for &g in &r.groups {
            if !v.contains(&g) {
                v.push(g);
            }
        }
    }
    v
}

/// Per hidden group, the feedback matrix of `f` (checked), or none.
fn feedback_matrices(eg: &EtraceGraph, f: &Feedback) -> Result<Vec<Option<Tensor>>> {
    let groups = related_groups(eg);
    let width = |g: usize| eg.groups()[g].varshape.last().copied().unwrap_or(1);
    let mut out = vec![None; eg.groups().len()];
    match f {
        Feedback::Symmetric => {}
        Feedback::Random { seed } => {
            let mut rng = Rng::seed(*seed);
            for &g in &groups {
                let w = width(g);
                let data = (0..w * w).map(|_| FEEDBACK_SCALE * rng.normal()).collect();
                out[g] = Some(Tensor::from_vec(data, &[w, w])?);
            }
        }
        Feedback::Matrices(ms) => {
            for (g, b) in ms {
                if !groups.contains(g) {
                    return Err(Error::invalid(
                        "EProp feedback",
                        format!(
                            "feedback_matrix: hidden group {g} has no relation (groups with relations: {groups:?})"
                        ),
                    ));
                }
                if out[*g].is_some() {
                    return Err(Error::invalid(
                        "EProp feedback",
                        format!("feedback_matrix: hidden group {g} is given twice"),
                    ));
                }
                let w = width(*g);
                if b.shape() != [w, w] {
                    return Err(Error::shapes(
                        "EProp feedback",
                        [b.shape(), &[w, w][..]],
                        format!(
                            "feedback_matrix of hidden group {g} must be (width, width) = ({w}, {w})"
                        ),
                    ));
                }
                if b.is_symbolic() || !b.dtype().is_float() {
                    return Err(Error::invalid(
                        "EProp feedback",
                        format!("feedback_matrix of hidden group {g} must be a concrete float tensor"),
                    ));
                }
                out[*g] = Some(b.cast(DType::F64)?);
            }
            if let Some(g) = groups.iter().find(|&&g| out[g].is_none()) {
                return Err(Error::invalid(
                    "EProp feedback",
                    format!(
                        "feedback_matrix: none given for hidden group {g} (every group with a relation needs one: {groups:?})"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// `ŝ B` with `ŝ = s / (‖s‖ + 1e−8)`, the norm over the trailing (width) axis.
fn project(s: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = s.shape().to_vec();
    let w = *shape.last().unwrap_or(&1);
    let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
    let s2 = s.reshape(&[rows, w])?;
    let norm = s2.square()?.sum(&[1])?.sqrt()?.add_scalar(1e-8)?;
    let unit = s2.div(&norm.expand_dims(1)?)?;
    unit.matmul(&b.cast(s.dtype())?)?.reshape(&shape)
}

impl EPropRule {
    pub(super) fn plan(algo: &EProp, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let kappa = (algo.kappa > 0.0).then_some(algo.kappa);
        let d = DRtrl {
            vjp_method: algo.vjp_method,
            non_temporal: algo.non_temporal,
            // The filtered traces are the program's: so are the raw ones.
            fast_paths: algo.fast_paths && kappa.is_none(),
            ..DRtrl::default()
        };
        let inner = DrtrlRule::plan(&d, eg, layout)?;
        let feedback = feedback_matrices(eg, &algo.feedback)?;
        Ok(EPropRule {
            eg: eg.clone(),
            n: inner.zeros().len(),
            inner,
            kappa,
            multi: algo.vjp_method == VjpMethod::MultiStep,
            feedback,
        })
    }

    /// `κ ē + e`, trace by trace.
    fn filtered(&self, kappa: f64, filt: &[Tensor], e: &[Tensor]) -> Result<Vec<Tensor>> {
        filt.iter()
            .zip(e)
            .map(|(f, e)| f.mul_scalar(kappa)?.add(e))
            .collect()
    }
}

impl TraceRule for EPropRule {
    fn zeros(&self) -> Vec<Tensor> {
        let mut z = self.inner.zeros();
        if self.kappa.is_some() {
            z.extend(self.inner.zeros());
        }
        z
    }

    delegate_trace_rule!(inner: state, in_program, stacked, forward_extra);

    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        let (raw, filt) = traces.split_at(self.n);
        let mut up = self.inner.update(step, raw)?;
        if let Some(k) = self.kappa {
            let e = if self.multi { raw } else { &up.traces[..] };
            let f = self.filtered(k, filt, e)?;
            up.traces.extend(f);
        }
        Ok(up)
    }

    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        let mut signal = s.signal.to_vec();
        for (grp, b) in self.eg.groups().iter().zip(&self.feedback) {
            if let Some(b) = b {
                for &i in &grp.states {
                    signal[i] = project(&signal[i], b)?;
                }
            }
        }
        let traces = match self.kappa {
            None => s.traces.to_vec(),
            // Single-step: the filter after this step's update, as given;
            // multi-step: the update's filter from the traces before it.
            Some(_) if !self.multi => s.traces[self.n..].to_vec(),
            Some(k) => self.filtered(k, &s.traces[self.n..], &s.traces[..self.n])?,
        };
        self.inner.solve(&SolveIn {
            params: s.params,
            traces: &traces,
            signal: &signal,
            scalar: s.scalar,
        })
    }

    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        let mut v = self.inner.public(&traces[..self.n], state)?;
        v.extend_from_slice(&traces[self.n..]);
        Ok(v)
    }

    fn explain(&self) -> Vec<String> {
        let mut v = self.inner.explain();
        v.push(match self.kappa {
            Some(k) => format!("e-prop: kappa filter {k} on {} traces", self.n),
            None => "e-prop: no kappa filter".into(),
        });
        let fb = self.feedback.iter().filter(|b| b.is_some()).count();
        v.push(if fb > 0 {
            format!("e-prop: random feedback on {fb} hidden group(s)")
        } else {
            "e-prop: symmetric feedback".into()
        });
        v
    }
}
