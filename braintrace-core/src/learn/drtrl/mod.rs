//! D-RTRL (braintrace's `D_RTRL` / `ParamDimVjpAlgorithm`): eligibility
//! traces with the dimension of the parameters, the hidden-to-hidden
//! Jacobian kept diagonal. The configuration [`DRtrl`] here; its trace
//! update and solve through the primitives' rules in [`rule`], the fused
//! kernels' learner-owned traces in [`fused`].

mod fused;
pub(super) mod rule;

pub(crate) use rule::DrtrlRule;

use super::algorithm::{
    Algorithm, InStepPaths, Layout, Named, NonTemporal, OnlineAlgorithm, TraceRule, VjpMethod,
};
use super::boilerplate::{algorithm_methods, common_option_builders, option_builders};
use super::compiler::EtraceGraph;
use super::precision::TraceDType;
use crate::error::Result;
use std::any::Any;
use std::sync::Arc;

/// D-RTRL: eligibility traces with the dimension of the parameters, the
/// hidden-to-hidden Jacobian kept diagonal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DRtrl {
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// How in-step paths between the states of a group are counted
    /// ([`InStepPaths`]; `Twice` by default, as braintrace 0.2.6).
    pub in_step_paths: InStepPaths,
    /// Use the fused in-place trace kernels where a primitive has one (the
    /// dense, element-wise, sparse, LoRA and channel-first conv built-ins,
    /// see [`TraceKernel`](crate::etp::TraceKernel)); `false` runs every relation
    /// through its registered rules. Default `true`; same numbers either way.
    pub fast_paths: bool,
    /// The precision the traces are kept in (default: the model's); see
    /// [`TraceDType`] for what is allowed and its accuracy.
    pub trace_dtype: TraceDType,
}

impl Default for DRtrl {
    fn default() -> Self {
        DRtrl {
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            in_step_paths: InStepPaths::default(),
            fast_paths: true,
            trace_dtype: TraceDType::Model,
        }
    }
}

impl DRtrl {
    common_option_builders!();
    option_builders! {
        /// With or without the fused trace kernels.
        fast_paths: bool;
        /// With the traces kept in this precision (braintrace's `trace_dtype`):
        /// `F32` for an f64 model, `BF16` for an f32 one halve the traces'
        /// memory and the fused kernels' traffic (see [`TraceDType`]).
        ///
        /// ```
        /// use braintrace_core::learn::{DRtrl, TraceDType};
        /// let algo = DRtrl::default().trace_dtype(TraceDType::BF16);
        /// assert_eq!(algo.trace_dtype, TraceDType::BF16);
        /// ```
        trace_dtype: TraceDType;
    }
}

impl OnlineAlgorithm for DRtrl {
    algorithm_methods!(DRtrl, "d_rtrl", |s: &Self| s.vjp_method, |s: &Self| s
        .non_temporal);
    fn in_step_paths(&self) -> InStepPaths {
        self.in_step_paths
    }
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        Ok(Box::new(rule::DrtrlRule::plan(self, eg, layout)?))
    }
}

impl Named for DRtrl {
    const NAMES: &'static [&'static str] = &["d_rtrl"];
    fn named() -> Self {
        Self::default()
    }
}

impl From<DRtrl> for Algorithm {
    fn from(a: DRtrl) -> Self {
        Algorithm::new(a)
    }
}
