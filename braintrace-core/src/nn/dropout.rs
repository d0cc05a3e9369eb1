//! `Dropout`: seeded, and the identity when evaluating.
//!
//! **Training or evaluating** is a flag on the layer, shared by its clones
//! ([`Dropout::set_training`]; brainstate reads `environ.get('fit')`
//! instead). A learner traces its step once, when it is compiled, so its
//! programs keep the mode the layer had then: compile with the layer
//! training, then evaluate eagerly (`ModelState::step` reads the flag at
//! every call) or through a learner compiled with the flag off.
//!
//! **The mask** is computed inside the step from the values it sees, so a
//! traced step draws a new mask every time step without a random state: each
//! element's keep decision is a hash of its value, its position and the
//! layer's seed (`u = sin(43758.5453 · sin(a·x + b·i + c·seed))`, kept when
//! `u < sin(π (q − ½))`, which holds with probability `q` for a well-mixed
//! phase). The mask is cut from the derivative; kept elements are scaled by
//! `1/q` (`q = 1 − p` the keep probability, brainstate's `prob`). Two equal
//! values at the same position get the same decision; an element of the
//! input that repeats step after step keeps its decision.

use crate::error::{Error, Result};
use crate::learn::{Init, Model, StepCtx};
use crate::ops::where_;
use crate::tensor::{DType, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Inverted dropout with drop probability `p` in `[0, 1)` (keep
/// probability `1 − p`, brainstate's `prob`).
#[derive(Clone, Debug)]
pub struct Dropout {
    /// Probability of dropping an element, in `[0, 1)`.
    pub p: f64,
    /// Seed of the mask's hash.
    pub seed: u64,
    training: Arc<AtomicBool>,
}

impl Dropout {
    /// Dropout of probability `p` (training), or an error when `p` is not
    /// in `[0, 1)`.
    pub fn new(p: f64, seed: u64) -> Result<Self> {
        check_p(p)?;
        Ok(Dropout {
            p,
            seed,
            training: Arc::new(AtomicBool::new(true)),
        })
    }
    /// brainstate's form: the probability `prob` of keeping an element, in
    /// `(0, 1]`.
    pub fn keep(prob: f64, seed: u64) -> Result<Self> {
        Self::new(1.0 - prob, seed).map_err(|_| {
            Error::invalid(
                "Dropout",
                format!("the keep probability must be in (0, 1], got {prob}"),
            )
        })
    }
    /// Whether the layer drops (training) or is the identity (evaluating).
    pub fn training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }
    /// Switch between training and evaluating (for this layer and its
    /// clones).
    pub fn set_training(&self, on: bool) {
        self.training.store(on, Ordering::Relaxed)
    }
    /// Apply: the identity when evaluating or `p = 0`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        check_p(self.p)?;
        if !self.training() || self.p == 0.0 {
            return Ok(x.clone());
        }
        let q = 1.0 - self.p;
        let n = x.size();
        let pos: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let pos = Tensor::from_vec(pos, x.shape())?;
        let salt = (self.seed % 1_000_003) as f64 * 0.618_033_988_749_894_9 + 0.5;
        let phase = x
            .stop_gradient()?
            .cast(DType::F64)?
            .mul_scalar(12_345.678_9)?
            .add(&pos.mul_scalar(78.233)?)?
            .add_scalar(salt * 101.0)?;
        let u = phase.sin()?.mul_scalar(43_758.545_3)?.sin()?;
        let limit = (std::f64::consts::PI * (q - 0.5)).sin();
        let keep = u.lt(&Tensor::scalar(limit))?;
        let scaled = x.div_scalar(q)?;
        where_(&keep, &scaled, &x.scalar_like(0.0))
    }
}

fn check_p(p: f64) -> Result<()> {
    if (0.0..1.0).contains(&p) {
        return Ok(());
    }
    Err(Error::invalid(
        "Dropout",
        format!("the drop probability p must be in [0, 1), got {p}"),
    ))
}

impl Model for Dropout {
    fn init(&self, _init: &mut Init) -> Result<()> {
        check_p(self.p)
    }
    fn step(&self, _ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}
