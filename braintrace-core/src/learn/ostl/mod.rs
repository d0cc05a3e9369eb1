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
    /// With this VJP method.
    pub fn vjp_method(mut self, m: VjpMethod) -> Self {
        self.vjp_method = m;
        self
    }
    /// With this treatment of non-temporal parameters.
    pub fn non_temporal(mut self, n: NonTemporal) -> Self {
        self.non_temporal = n;
        self
    }
    /// With or without the fused trace kernels.
    pub fn fast_paths(mut self, on: bool) -> Self {
        self.fast_paths = on;
        self
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

/// Boilerplate of the two configurations' [`OnlineAlgorithm`] impls.
macro_rules! config {
    ($t:ty, $name:literal, $vjp:expr, $nt:expr) => {
        fn name(&self) -> &'static str {
            $name
        }
        fn type_name(&self) -> &'static str {
            stringify!($t)
        }
        fn vjp_method(&self) -> VjpMethod {
            $vjp(self)
        }
        fn non_temporal(&self) -> NonTemporal {
            $nt(self)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn same(&self, other: &dyn Any) -> bool {
            other.downcast_ref::<Self>() == Some(self)
        }
    };
}

impl OnlineAlgorithm for OstlRecurrent {
    config!(
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
        };
        Ok(Box::new(CoupledRule {
            eg: eg.clone(),
            inner: DrtrlRule::plan(&d, eg, layout)?,
        }))
    }
}

impl OnlineAlgorithm for OstlFeedforward {
    config!(
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
    fn zeros(&self) -> Vec<Tensor> {
        self.inner.zeros()
    }
    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        self.inner.state(state)
    }
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
    fn in_program(&self, pair: usize) -> bool {
        self.inner.in_program(pair)
    }
    fn stacked(&self) -> bool {
        self.inner.stacked()
    }
    fn forward_extra(&self) -> usize {
        self.inner.forward_extra()
    }
    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        self.inner.public(traces, state)
    }
    fn explain(&self) -> Vec<String> {
        let mut v = self.inner.explain();
        v.push("OSTL: coupled hidden-to-hidden Jacobian (recurrent weights included)".into());
        v
    }
}
