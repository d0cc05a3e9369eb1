//! OSTL (braintrace's `OSTLRecurrent` and `OSTLFeedforward`, Bohnstingl et
//! al. 2023), its two regimes:
//!
//! * [`OstlRecurrent`] ("with H"): D-RTRL's per-parameter trace with the
//!   *coupled* hidden-to-hidden Jacobian — the per-position block of the
//!   whole step's Jacobian, the recurrent weight operations included
//!   ([`coupled`]) — where D-RTRL cuts the paths through them;
//! * [`OstlFeedforward`] ("without H"): pp_prop with a negligible decay
//!   (`1e−6` by default), so the traces hold the current step only.

mod coupled;

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, SolveIn, Solved, StepEval, TraceRule,
    TraceState, Update, VjpMethod,
};
use super::boilerplate::{algorithm_methods, delegate_trace_rule, option_builders};
use super::compiler::EtraceGraph;
use super::drtrl::DrtrlRule;
use super::pp_prop::PpRule;
use super::state::ModelState;
use super::{DRtrl, PpProp};
use crate::error::Result;
use crate::tensor::Tensor;
use std::any::Any;
use std::sync::Arc;

/// OSTL's "with H" regime: D-RTRL with the coupled per-position
/// hidden-to-hidden Jacobian (braintrace's `OSTLRecurrent`,
/// `recurrence_scope='coupled'`). Exact RTRL for one recurrent layer whose
/// only coupling between units is its traced recurrent weight.
///
/// ```
/// use braintrace_core::learn::{Algorithm, OstlRecurrent};
/// let a: Algorithm = OstlRecurrent::default().into();
/// assert_eq!(a.name(), "ostl_recurrent");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OstlRecurrent {
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// D-RTRL's fused trace kernels where a primitive has one.
    pub fast_paths: bool,
}

impl Default for OstlRecurrent {
    fn default() -> Self {
        OstlRecurrent {
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            fast_paths: true,
        }
    }
}

impl OstlRecurrent {
    option_builders! {
        vjp_method: VjpMethod, "With this VJP method.";
        non_temporal: NonTemporal, "With this treatment of non-temporal parameters.";
        fast_paths: bool, "With or without the fused trace kernels.";
    }
}

/// OSTL's "without H" regime: pp_prop with a negligible decay (braintrace's
/// `OSTLFeedforward`, `decay_or_rank=1e-6` by default).
///
/// ```
/// use braintrace_core::learn::{Algorithm, OstlFeedforward};
/// let f = OstlFeedforward::default();
/// assert_eq!(f.pp_prop().decay_f, 1e-6);
/// assert_eq!(Algorithm::from(f).name(), "ostl_feedforward");
/// assert!(OstlFeedforward::decay(1.0).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OstlFeedforward(PpProp);

impl Default for OstlFeedforward {
    fn default() -> Self {
        OstlFeedforward(PpProp::new(1e-6).expect("1e-6 is a decay"))
    }
}

impl OstlFeedforward {
    /// With this decay `α ∈ [0, 1)` for both traces (`decay_or_rank`).
    pub fn decay(d: f64) -> Result<Self> {
        Ok(OstlFeedforward(PpProp::new(d)?))
    }
    /// The pp_prop configuration it runs.
    pub fn pp_prop(&self) -> PpProp {
        self.0
    }
    /// With this VJP method.
    pub fn vjp_method(self, m: VjpMethod) -> Self {
        OstlFeedforward(self.0.vjp_method(m))
    }
    /// With this treatment of non-temporal parameters.
    pub fn non_temporal(self, n: NonTemporal) -> Self {
        OstlFeedforward(self.0.non_temporal(n))
    }
}

impl OnlineAlgorithm for OstlRecurrent {
    algorithm_methods!(
        OstlRecurrent,
        "ostl_recurrent",
        |s: &Self| s.vjp_method,
        |s: &Self| s.non_temporal
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        let d = DRtrl {
            vjp_method: self.vjp_method,
            non_temporal: self.non_temporal,
            fast_paths: self.fast_paths,
            ..DRtrl::default()
        };
        Ok(Box::new(CoupledRule {
            eg: eg.clone(),
            inner: DrtrlRule::plan(&d, eg, layout)?,
        }))
    }
}

impl OnlineAlgorithm for OstlFeedforward {
    algorithm_methods!(
        OstlFeedforward,
        "ostl_feedforward",
        |s: &Self| s.0.vjp_method,
        |s: &Self| s.0.non_temporal
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        Ok(Box::new(PpRule::plan(&self.0, eg, layout)?))
    }
}

impl Named for OstlRecurrent {
    const NAMES: &'static [&'static str] = &["ostl_recurrent"];
    fn named() -> Self {
        Self::default()
    }
}

impl Named for OstlFeedforward {
    const NAMES: &'static [&'static str] = &["ostl_feedforward"];
    fn named() -> Self {
        Self::default()
    }
}

impl From<OstlRecurrent> for Algorithm {
    fn from(a: OstlRecurrent) -> Self {
        Algorithm::new(a)
    }
}

impl From<OstlFeedforward> for Algorithm {
    fn from(a: OstlFeedforward) -> Self {
        Algorithm::new(a)
    }
}

/// D-RTRL's rule fed the coupled Jacobian.
struct CoupledRule {
    eg: Arc<EtraceGraph>,
    inner: DrtrlRule,
}

impl TraceRule for CoupledRule {
    delegate_trace_rule!(inner: zeros, state, in_program, stacked, forward_extra, public);
    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        let d = coupled::coupled_jacobians(&self.eg, step.inputs)?;
        let coupled = StepEval {
            params: step.params,
            inputs: step.inputs,
            xs: step.xs.clone(),
            d_cols: step.d_cols.clone(),
            df: step.df.clone(),
            d,
            df_stacked: step.df_stacked.clone(),
        };
        self.inner.update(&coupled, traces)
    }
    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        self.inner.solve(s)
    }
    fn explain(&self) -> Vec<String> {
        let mut v = self.inner.explain();
        v.push("OSTL: coupled hidden-to-hidden Jacobian (recurrent weights included)".into());
        v
    }
}
