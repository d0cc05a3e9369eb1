//! E-prop (braintrace's `EProp`, Bellec et al. 2020): D-RTRL's
//! per-parameter eligibility trace, optionally low-pass filtered
//! (`ē ← κ ē + e`, braintrace's `kappa_filter_decay`), contracted with a
//! learning signal that is either the true `∂L/∂h` (symmetric feedback)
//! or its direction projected through a fixed random matrix (random
//! feedback, braintrace's `FixedRandomFeedback`). The configuration
//! [`EProp`] and its [`Feedback`] here; the trace rule, which runs D-RTRL's
//! ([`DrtrlRule`](super::drtrl::DrtrlRule)) and adds the filter and the
//! projection, in [`rule`].

mod rule;

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, TraceRule, VjpMethod,
};
use super::boilerplate::{algorithm_methods, option_builders};
use super::compiler::EtraceGraph;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::any::Any;
use std::sync::Arc;

/// Where e-prop's learning signal comes from.
#[derive(Clone, Debug, Default)]
pub enum Feedback {
    /// The true `∂L_t/∂h_t` (braintrace's `feedback='symmetric'`).
    #[default]
    Symmetric,
    /// Per hidden group with relations, a fixed matrix `B` of shape
    /// `(w, w)` (`w` the group's last varshape axis, its width) drawn from
    /// `N(0, 0.1²)` with this seed at compile; the signal of each state is
    /// `ŝ B` with `ŝ = s / (‖s‖ + 1e−8)` (the norm over the width axis),
    /// as braintrace's `feedback='random'`.
    Random {
        /// The seed of the draws (braintrace's `random_feedback_key`).
        seed: u64,
    },
    /// As [`Random`](Feedback::Random), with the matrices given: `(group
    /// index, B)` for every hidden group that has a relation (braintrace's
    /// own draws, exported, reproduce its numbers).
    Matrices(Vec<(usize, Tensor)>),
}

impl PartialEq for Feedback {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Feedback::Symmetric, Feedback::Symmetric) => true,
            (Feedback::Random { seed: a }, Feedback::Random { seed: b }) => a == b,
            (Feedback::Matrices(a), Feedback::Matrices(b)) => {
                a.len() == b.len()
                    && a.iter().zip(b).all(|((ga, ta), (gb, tb))| {
                        ga == gb
                            && ta.shape() == tb.shape()
                            && ta.to_vec_f64().ok() == tb.to_vec_f64().ok()
                    })
            }
            _ => false,
        }
    }
}

/// E-prop: D-RTRL's per-parameter trace with an optional κ filter and
/// symmetric or random feedback (braintrace's `EProp`).
///
/// ```
/// use braintrace_core::learn::{Algorithm, EProp, Feedback};
///
/// let e = EProp::new().kappa(0.9)?.feedback(Feedback::Random { seed: 7 });
/// let a: Algorithm = e.into();
/// assert_eq!(a.name(), "eprop");
/// assert!(EProp::new().kappa(1.0).is_err()); // κ must be in [0, 1)
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct EProp {
    /// The filter's decay `κ ∈ [0, 1)` (`kappa_filter_decay`; 0: no filter,
    /// and e-prop with symmetric feedback is D-RTRL).
    pub kappa: f64,
    /// Symmetric or random feedback.
    pub feedback: Feedback,
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// D-RTRL's fused trace kernels where a primitive has one (see
    /// [`DRtrl::fast_paths`](super::DRtrl::fast_paths)); unused with a κ
    /// filter, whose filtered traces live in the step program.
    pub fast_paths: bool,
}

impl Default for EProp {
    fn default() -> Self {
        EProp {
            kappa: 0.0,
            feedback: Feedback::Symmetric,
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            fast_paths: true,
        }
    }
}

impl EProp {
    /// Symmetric feedback, no filter (braintrace's defaults).
    pub fn new() -> Self {
        Self::default()
    }
    /// With the filter's decay `κ` (`kappa_filter_decay`): an error unless
    /// `0 ≤ κ < 1`.
    pub fn kappa(mut self, kappa: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&kappa) {
            return Err(Error::invalid(
                "EProp::kappa",
                format!("kappa_filter_decay must be in [0, 1), got {kappa}"),
            ));
        }
        self.kappa = kappa;
        Ok(self)
    }
    /// With this feedback.
    pub fn feedback(mut self, f: Feedback) -> Self {
        self.feedback = f;
        self
    }
    option_builders! {
        vjp_method: VjpMethod, "With this VJP method.";
        non_temporal: NonTemporal, "With this treatment of non-temporal parameters.";
        fast_paths: bool, "With or without D-RTRL's fused trace kernels.";
    }
}

impl OnlineAlgorithm for EProp {
    algorithm_methods!(EProp, "eprop", |s: &Self| s.vjp_method, |s: &Self| s.non_temporal);
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        Ok(Box::new(rule::EPropRule::plan(self, eg, layout)?))
    }
}

impl Named for EProp {
    const NAMES: &'static [&'static str] = &["eprop", "e_prop"];
    fn named() -> Self {
        Self::default()
    }
}

impl From<EProp> for Algorithm {
    fn from(a: EProp) -> Self {
        Algorithm::new(a)
    }
}
