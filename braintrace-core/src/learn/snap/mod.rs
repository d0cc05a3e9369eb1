//! SnAp-n (braintrace's `SnAp`, Menick et al. 2021): RTRL's influence
//! matrix `J = ∂h/∂θ` kept on the positions a parameter reaches in fewer
//! than `n` steps, rolled with the transition's Jacobian *including* the
//! recurrent mixing (the weight operations D-RTRL holds fixed).
//!
//! * `n = 1` (braintrace's `recurrence_scope='coupled'`): the D-RTRL trace
//!   layout, rolled with the per-position `S × S` blocks of the full
//!   Jacobian ([`one`]: D-RTRL's rule and fused kernels, another `D`).
//! * `n = 2`: for a dense recurrence every position reaches every other in
//!   one step, so the neighbourhood is the whole group and SnAp-2 is RTRL
//!   within the group ([`full`]): each trace row widened from `S` to
//!   `Q·S` entries, rolled with the full within-sample Jacobian. This is
//!   also what braintrace computes whenever its position analysis falls
//!   back to all-to-all (a concatenation or a surrogate spike on the
//!   hidden path: every GRU, LIF and zoo cell).
//!
//! The Jacobians come from [`jacobian`]: one tangent per (state,
//! position), batched into a few vmapped JVPs.

mod full;
pub(super) mod jacobian;
mod one;

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, TraceRule, VjpMethod,
};
use super::boilerplate::{algorithm_methods, option_builders};
use super::compiler::EtraceGraph;
use crate::error::{Error, Result};
use std::any::Any;
use std::sync::Arc;

/// SnAp-n, `n ∈ {1, 2}` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SnAp {
    /// The order: 1 (per-position blocks) or 2 (the whole group).
    pub n: usize,
    /// Single-step (default, as braintrace) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
}

impl SnAp {
    /// SnAp of order `n` (1 or 2); any other order is an error naming `n`.
    pub fn new(n: usize) -> Result<Self> {
        if !(1..=2).contains(&n) {
            return Err(Error::invalid(
                "SnAp::new",
                format!("the order `n` must be 1 or 2, got {n}"),
            ));
        }
        Ok(SnAp {
            n,
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
        })
    }
    option_builders! {
        vjp_method: VjpMethod, "With this VJP method.";
        non_temporal: NonTemporal, "With this treatment of non-temporal parameters.";
    }
}

impl Default for SnAp {
    /// SnAp-2, braintrace's default order.
    fn default() -> Self {
        SnAp::new(2).expect("2 is a valid order")
    }
}

impl OnlineAlgorithm for SnAp {
    algorithm_methods!(
        SnAp,
        "snap",
        |s: &Self| s.vjp_method,
        |s: &Self| s.non_temporal
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        // A configuration built by hand (the fields are public) is checked too.
        SnAp::new(self.n)?;
        Ok(match self.n {
            1 => Box::new(one::CoupledRule::plan(self, eg, layout)?),
            _ => Box::new(full::FullRule::plan(self, eg, layout)?),
        })
    }
}

impl From<SnAp> for Algorithm {
    fn from(a: SnAp) -> Self {
        Algorithm::new(a)
    }
}

impl Named for SnAp {
    /// braintrace 0.2.6's `compile` has no name for SnAp; `"snap"` is
    /// this library's (its default order, 2). `"snap1"` / `"snap2"` pick
    /// the order.
    const NAMES: &'static [&'static str] = &["snap", "snap_n"];
    fn named() -> Self {
        Self::default()
    }
}
