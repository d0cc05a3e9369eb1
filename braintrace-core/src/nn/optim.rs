//! Optimisers over path-keyed parameters: plain/momentum [`Sgd`] and
//! [`Adam`], plus [`clip_grad_norm`]. Parameters and gradients are
//! [`TensorDict`]s keyed like [`ModelState::params`](crate::learn::ModelState::params)
//! and [`EtraceGrads::grads`](crate::learn::EtraceGrads); an optimiser keeps
//! its per-parameter state (momentum, moments) under the same keys.
//!
//! ```
//! use braintrace_core::nn::optim::{Adam, Optimizer};
//! use braintrace_core::learn::TensorDict;
//! use braintrace_core::Tensor;
//!
//! let mut params = TensorDict::new();
//! params.insert("w".into(), Tensor::from_vec(vec![1.0, -1.0], &[2])?);
//! let mut grads = TensorDict::new();
//! grads.insert("w".into(), Tensor::from_vec(vec![0.5, -0.5], &[2])?);
//! let mut adam = Adam::new(0.1);
//! let new = adam.update(&params, &grads)?;
//! // The first Adam step moves every coordinate by about `lr` against the gradient's sign.
//! let w = new["w"].to_vec_f64()?;
//! assert!((w[0] - 0.9).abs() < 1e-6 && (w[1] + 0.9).abs() < 1e-6);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::learn::{ModelState, TensorDict};
use crate::tensor::Tensor;

/// An optimiser: turns parameters and their gradients into new parameters,
/// keeping whatever per-parameter state it needs between calls.
pub trait Optimizer {
    /// The updated values of the parameters that have a gradient in `grads`
    /// (parameters without one are returned unchanged). Every key of `grads`
    /// must name a parameter of the same shape; on error the optimiser's
    /// state is unchanged.
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict>;

    /// Apply one update to a model state's parameters in place.
    fn step(&mut self, state: &mut ModelState, grads: &TensorDict) -> Result<()> {
        let new = self.update(&state.params(), grads)?;
        state.set_params(&new)
    }
}

/// Check that every gradient names a parameter of the same shape.
fn check(op: &str, params: &TensorDict, grads: &TensorDict) -> Result<()> {
    for (k, g) in grads {
        let p = params.get(k).ok_or_else(|| {
            Error::invalid(
                op,
                format!(
                    "gradient `{k}` has no parameter (parameters: {})",
                    params.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        if p.shape() != g.shape() {
            return Err(Error::shape(
                op,
                format!("param {:?} vs grad {:?}", p.shape(), g.shape()),
                format!("the gradient of `{k}` must have its parameter's shape"),
            ));
        }
    }
    Ok(())
}

fn check_lr(op: &str, lr: f64) -> Result<()> {
    if !(lr.is_finite() && lr > 0.0) {
        return Err(Error::invalid(
            op,
            format!("the learning rate must be finite and > 0, got {lr}"),
        ));
    }
    Ok(())
}

/// Stochastic gradient descent, optionally with momentum and weight decay:
///
/// ```text
/// g ← g + wd·p;   v ← μ·v + g;   p ← p − lr·v      (μ = 0: p ← p − lr·g)
/// ```
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum `μ ∈ [0, 1)` (0: none).
    pub momentum: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
    velocity: TensorDict,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        Sgd {
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
            velocity: TensorDict::new(),
        }
    }
    /// With momentum `μ`.
    pub fn momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }
    /// With L2 weight decay.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Sgd {
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict> {
        check_lr("Sgd", self.lr)?;
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(Error::invalid(
                "Sgd",
                format!("momentum must be in [0, 1), got {}", self.momentum),
            ));
        }
        check("Sgd", params, grads)?;
        let mut out = params.clone();
        let mut velocity = self.velocity.clone();
        for (k, g) in grads {
            let p = &params[k];
            let g = g.cast(p.dtype())?;
            let g = if self.weight_decay != 0.0 {
                g.add(&p.mul_scalar(self.weight_decay)?)?
            } else {
                g
            };
            let d = if self.momentum != 0.0 {
                let v = match velocity.get(k) {
                    Some(v) => v.mul_scalar(self.momentum)?.add(&g)?,
                    None => g,
                };
                velocity.insert(k.clone(), v.clone());
                v
            } else {
                g
            };
            out.insert(k.clone(), p.sub(&d.mul_scalar(self.lr)?)?);
        }
        self.velocity = velocity;
        Ok(out)
    }
}

/// Adam (Kingma & Ba), with bias-corrected moments:
///
/// ```text
/// t ← t + 1;  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²
/// m̂ = m/(1−β₁ᵗ);  v̂ = v/(1−β₂ᵗ);  p ← p − lr·m̂/(√v̂ + ε)
/// ```
///
/// The step counter `t` is per parameter, so a parameter that first gets a
/// gradient late starts with its own bias correction.
#[derive(Clone, Debug)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to `√v̂`.
    pub eps: f64,
    moments: std::collections::BTreeMap<String, (u64, Tensor, Tensor)>,
}

impl Adam {
    /// Adam with learning rate `lr` and the usual `β₁ = 0.9`, `β₂ = 0.999`,
    /// `ε = 1e-8`.
    pub fn new(lr: f64) -> Self {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            moments: Default::default(),
        }
    }
    /// With these moment decays.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }
    /// With this `ε`.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// How many updates parameter `key` has had.
    pub fn steps(&self, key: &str) -> u64 {
        self.moments.get(key).map_or(0, |m| m.0)
    }
}

impl Optimizer for Adam {
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict> {
        check_lr("Adam", self.lr)?;
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::invalid(
                    "Adam",
                    format!("{name} must be in [0, 1), got {b}"),
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::invalid(
                "Adam",
                format!("eps must be finite and > 0, got {}", self.eps),
            ));
        }
        check("Adam", params, grads)?;
        let mut out = params.clone();
        let mut moments = self.moments.clone();
        for (k, g) in grads {
            let p = &params[k];
            let g = g.cast(p.dtype())?;
            let (t, m, v) = match moments.get(k) {
                Some((t, m, v)) => (*t, m.clone(), v.clone()),
                None => (0, p.zeros_like(), p.zeros_like()),
            };
            let t = t + 1;
            let m = m
                .mul_scalar(self.beta1)?
                .add(&g.mul_scalar(1.0 - self.beta1)?)?;
            let v = v
                .mul_scalar(self.beta2)?
                .add(&g.square()?.mul_scalar(1.0 - self.beta2)?)?;
            let m_hat = m.mul_scalar(1.0 / (1.0 - self.beta1.powi(t as i32)))?;
            let v_hat = v.mul_scalar(1.0 / (1.0 - self.beta2.powi(t as i32)))?;
            let d = m_hat.div(&v_hat.sqrt()?.add_scalar(self.eps)?)?;
            out.insert(k.clone(), p.sub(&d.mul_scalar(self.lr)?)?);
            moments.insert(k.clone(), (t, m, v));
        }
        self.moments = moments;
        Ok(out)
    }
}

/// Scale all gradients together so that their global L2 norm is at most
/// `max_norm`; returns the scaled gradients and the norm before scaling.
/// A NaN or infinite gradient is an error (it would poison every parameter).
pub fn clip_grad_norm(grads: &TensorDict, max_norm: f64) -> Result<(TensorDict, f64)> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::invalid(
            "clip_grad_norm",
            format!("max_norm must be finite and > 0, got {max_norm}"),
        ));
    }
    let mut sq = 0.0;
    for g in grads.values() {
        sq += g.square()?.sum_all()?.item()?;
    }
    let norm = sq.sqrt();
    if !norm.is_finite() {
        return Err(Error::invalid(
            "clip_grad_norm",
            format!("the gradients' global norm is {norm} (a gradient holds NaN or infinity)"),
        ));
    }
    if norm <= max_norm {
        return Ok((grads.clone(), norm));
    }
    let s = max_norm / norm;
    let scaled = grads
        .iter()
        .map(|(k, g)| Ok((k.clone(), g.mul_scalar(s)?)))
        .collect::<Result<TensorDict>>()?;
    Ok((scaled, norm))
}
