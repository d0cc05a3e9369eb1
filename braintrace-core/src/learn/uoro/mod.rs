//! UORO (braintrace's `UORO`, Tallec & Ollivier 2018): each hidden
//! group's influence matrix `J = ∂h/∂θ` carried as one rank-1 product
//! `s̃ θ̃ᵀ`, re-randomised every step with a Rademacher draw `ν` so that
//! the product is right in expectation:
//!
//! ```text
//! p  = νᵀ J_f                      (the instantaneous term, projected)
//! ρ0 = √((‖θ̃‖ + ε) / (‖D s̃‖ + ε)),   ρ1 = √((‖p‖ + ε) / (‖ν‖ + ε))
//! s̃ ← ρ0 D s̃ + ρ1 ν,                 θ̃ ← θ̃ / ρ0 + p / ρ1
//! ∇θ += (g · s̃) θ̃
//! ```
//!
//! `D` is the group's full within-sample Jacobian (the recurrent mixing
//! included, SnAp's [`jacobian`](super::snap)). The configuration
//! [`Uoro`] here; the program's part (the Jacobian and the instantaneous
//! terms) in [`rule`]; the factors, the draws and the gradients, which
//! the learner owns, in [`state`].

mod rule;
mod state;

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, TraceRule, VjpMethod,
};
use super::boilerplate::{algorithm_methods, option_builders};
use super::compiler::EtraceGraph;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Given projection draws: `draws[t][g]` is step `t`'s `ν` for hidden
/// group `g`, shaped like the group's states with a trailing state axis
/// `(V.., S)` (checked when the learner is compiled).
#[derive(Clone)]
pub struct Draws(Arc<Vec<Vec<Tensor>>>);

impl fmt::Debug for Draws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Draws({} steps)", self.0.len())
    }
}

impl PartialEq for Draws {
    /// The same given table (by identity).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// UORO: the rank-1 unbiased estimate of RTRL within each hidden group.
#[derive(Clone, Debug, PartialEq)]
pub struct Uoro {
    /// Multi-step (default, as braintrace) or single-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// The guard `ε` added to every norm (braintrace's `projection_eps`).
    pub eps: f64,
    /// The seed of the projection stream (braintrace's `projection_key`);
    /// a reset re-derives the stream from it.
    pub seed: u64,
    /// Given draws instead of the seeded stream.
    pub draws: Option<Draws>,
}

impl Default for Uoro {
    fn default() -> Self {
        Uoro {
            vjp_method: VjpMethod::MultiStep,
            non_temporal: NonTemporal::InStep,
            eps: 1e-12,
            seed: 42,
            draws: None,
        }
    }
}

impl Uoro {
    /// With this norm guard (`eps > 0`, finite; an error names `eps`).
    pub fn eps(mut self, eps: f64) -> Result<Self> {
        check_eps(eps)?;
        self.eps = eps;
        Ok(self)
    }
    /// With this seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// With given draws `draws[t][g]` (see [`Draws`]).
    pub fn draws(mut self, draws: Vec<Vec<Tensor>>) -> Self {
        self.draws = Some(Draws(Arc::new(draws)));
        self
    }
    option_builders! {
        vjp_method: VjpMethod, "With this VJP method.";
        non_temporal: NonTemporal, "With this treatment of non-temporal parameters.";
    }
}

fn check_eps(eps: f64) -> Result<()> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::invalid(
            "Uoro::eps",
            format!("the norm guard `eps` must be positive and finite, got {eps}"),
        ));
    }
    Ok(())
}

impl OnlineAlgorithm for Uoro {
    algorithm_methods!(Uoro, "uoro", |s: &Self| s.vjp_method, |s: &Self| s
        .non_temporal);
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        check_eps(self.eps)?;
        Ok(Box::new(rule::UoroRule::plan(self, eg, layout)?))
    }
}

impl From<Uoro> for Algorithm {
    fn from(a: Uoro) -> Self {
        Algorithm::new(a)
    }
}

/// braintrace's `RandomProjectionVjpAlgorithm`: the engine [`Uoro`] is the
/// preset of (`trace_factorization='random_projection'` at
/// `recurrence_scope='coupled'`, its only coordinate in braintrace 0.2.6),
/// under its own name (`random_projection`); the same options and numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RandomProjection(pub Uoro);

impl OnlineAlgorithm for RandomProjection {
    algorithm_methods!(
        RandomProjection,
        "random_projection",
        |s: &Self| s.0.vjp_method,
        |s: &Self| s.0.non_temporal
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        self.0.plan(eg, layout)
    }
}

impl From<RandomProjection> for Algorithm {
    fn from(a: RandomProjection) -> Self {
        Algorithm::new(a)
    }
}

impl Named for Uoro {
    const NAMES: &'static [&'static str] = &["uoro"];
    fn named() -> Self {
        Self::default()
    }
}

impl Named for RandomProjection {
    /// braintrace's factorization name (`trace_factorization =
    /// 'random_projection'`).
    const NAMES: &'static [&'static str] = &["random_projection"];
    fn named() -> Self {
        RandomProjection(Uoro::default())
    }
}
