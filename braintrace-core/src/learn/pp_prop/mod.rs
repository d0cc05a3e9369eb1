//! ES-D-RTRL / pp_prop (braintrace's `pp_prop` / `ES_D_RTRL` /
//! `IODimVjpAlgorithm`): a decaying input trace `x̄` per relation input and
//! a decaying output trace `f̄` per relation and group. The configuration
//! [`PpProp`] here; its traces, update and solve in [`rule`], the
//! learner's chunked weight gradients of dense relations in [`dense`].

mod dense;
mod rule;

pub(crate) use rule::PpRule;

use super::algorithm::{
    Algorithm, InStepPaths, Layout, Named, NonTemporal, OnlineAlgorithm, TraceRule, VjpMethod,
};
use super::boilerplate::{algorithm_methods, common_option_builders, option_builders};
use super::compiler::EtraceGraph;
use super::precision::TraceDType;
use crate::error::{Error, Result};
use std::any::Any;
use std::sync::Arc;

/// ES-D-RTRL / pp_prop: a decaying input trace `x̄` per relation input and a
/// decaying output trace `f̄` per relation and group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PpProp {
    /// Decay of the input trace `x̄`.
    pub decay_x: f64,
    /// Decay of the output trace `f̄`.
    pub decay_f: f64,
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// How in-step paths between the states of a group are counted
    /// ([`InStepPaths`]; `Twice` by default, as braintrace 0.2.6).
    pub in_step_paths: InStepPaths,
    /// Accumulate the weight gradients of relations with a registered
    /// [`TraceKernel::Dense`](crate::etp::TraceKernel::Dense) kernel in the learner,
    /// as one matrix product per chunk of steps (`Σ_t x̄_tᵀ g_t` with the
    /// steps stacked along the batch axis) instead of one `xy_to_dw` per
    /// step (on by default; the same sums, added in another order).
    pub fast_paths: bool,
    /// The precision the traces are kept in (default: the model's; `F32`
    /// for an f64 model; `BF16` is refused, see [`TraceDType`]).
    pub trace_dtype: TraceDType,
}

impl PpProp {
    /// One decay `α ∈ [0, 1)` for both traces (`decay_or_rank` as a float).
    pub fn new(decay: f64) -> Result<Self> {
        Self::decays(decay, decay)
    }
    /// The decay of a rank `r ≥ 1`: `α = (r − 1)/(r + 1)` (`decay_or_rank` as an int).
    pub fn rank(r: usize) -> Result<Self> {
        let a = rank_decay(r)?;
        Self::decays(a, a)
    }
    /// Separate decays for the input and output traces (`decay_or_rank` as a pair).
    pub fn decays(decay_x: f64, decay_f: f64) -> Result<Self> {
        for (name, d) in [("decay_x", decay_x), ("decay_f", decay_f)] {
            if !(0.0..1.0).contains(&d) {
                return Err(Error::invalid(
                    "PpProp",
                    format!("{name} must be in [0, 1), got {d}"),
                ));
            }
        }
        Ok(PpProp {
            decay_x,
            decay_f,
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            in_step_paths: InStepPaths::default(),
            fast_paths: true,
            trace_dtype: TraceDType::Model,
        })
    }
    common_option_builders!();
    option_builders! {
        /// With the fused weight-gradient accumulation on or off (see
        /// [`fast_paths`](Self::fast_paths)).
        fast_paths: bool;
        /// With the traces kept in this precision (braintrace's `trace_dtype`;
        /// see [`TraceDType`]: pp_prop honours `F32` and refuses `BF16`).
        trace_dtype: TraceDType;
    }
    /// The bias correction of call `n` (counted from 0): `max(1 − α_f^{n+1}, 1e−8)`
    /// for `n < 1000`, else 1 (as braintrace 0.2.6).
    pub fn correction(&self, n: usize) -> f64 {
        if n < 1000 {
            (1.0 - self.decay_f.powi(n as i32 + 1)).max(1e-8)
        } else {
            1.0
        }
    }
}

/// `α = (r − 1)/(r + 1)` for a rank `r ≥ 1`.
pub fn rank_decay(r: usize) -> Result<f64> {
    if r == 0 {
        return Err(Error::invalid(
            "PpProp::rank",
            "the rank must be at least 1",
        ));
    }
    Ok((r as f64 - 1.0) / (r as f64 + 1.0))
}

impl OnlineAlgorithm for PpProp {
    algorithm_methods!(PpProp, "pp_prop", |s: &Self| s.vjp_method, |s: &Self| s
        .non_temporal);
    fn in_step_paths(&self) -> InStepPaths {
        self.in_step_paths
    }
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        Ok(Box::new(rule::PpRule::plan(self, eg, layout)?))
    }
}

impl Named for PpProp {
    const NAMES: &'static [&'static str] = &["pp_prop", "es_d_rtrl", "esd_rtrl"];
    /// Decay 0.95 (braintrace requires `decay_or_rank`; set another with
    /// [`PpProp::new`]).
    fn named() -> Self {
        PpProp::new(0.95).expect("0.95 is a decay")
    }
}

impl From<PpProp> for Algorithm {
    fn from(a: PpProp) -> Self {
        Algorithm::new(a)
    }
}
