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
//! let mut adam = Adam::new(0.1)?;
//! let new = adam.update(&params, &grads)?;
//! // The first Adam step moves every coordinate by about `lr` against the gradient's sign.
//! let w = new["w"].to_vec_f64()?;
//! assert!((w[0] - 0.9).abs() < 1e-6 && (w[1] + 0.9).abs() < 1e-6);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::learn::{check_finite, first_non_finite, ModelState, NonFinite, TensorDict};
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// An optimiser: turns parameters and their gradients into new parameters,
/// keeping whatever per-parameter state it needs between calls.
pub trait Optimizer {
    /// The updated values of the parameters that have a gradient in `grads`
    /// (parameters without one are returned unchanged). Every key of `grads`
    /// must name a parameter of the same shape, and every gradient must be
    /// a float tensor (cast to its parameter's dtype); on error the
    /// optimiser's state is unchanged.
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict>;

    /// Apply one update to a model state's parameters in place (nothing
    /// changes on error).
    fn step(&mut self, state: &mut ModelState, grads: &TensorDict) -> Result<()> {
        let new = self.update(&state.params(), grads)?;
        state.set_params(&new)
    }

    /// The optimiser's state (moments, velocities, step counters), for a
    /// checkpoint. An optimiser without state returns an empty one, which
    /// is the default.
    fn state(&self) -> OptimState {
        OptimState::default()
    }

    /// Restore a state returned by [`Optimizer::state`] (of an optimiser of
    /// the same kind); nothing changes on error. The default accepts only
    /// an empty state.
    fn load_state(&mut self, state: &OptimState) -> Result<()> {
        if state.tensors.is_empty() && state.counters.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(
                "Optimizer::load_state",
                format!(
                    "this optimiser keeps no state, the saved one is `{}`",
                    state.kind
                ),
            ))
        }
    }
}

/// What an optimiser keeps between updates, by name: `kind` (`sgd`,
/// `adam`), tensors keyed `<slot>/<parameter key>` (`m/rnn/Wz/weight/weight`)
/// and counters (`t/<parameter key>`, `skipped`).
#[derive(Clone, Debug, Default)]
pub struct OptimState {
    /// Which optimiser wrote it (empty for one without state).
    pub kind: String,
    /// Its tensors.
    pub tensors: TensorDict,
    /// Its counters.
    pub counters: BTreeMap<String, u64>,
}

/// Check that every gradient names a parameter of the same shape and is a
/// float tensor.
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
            return Err(Error::shapes(
                op,
                [p.shape(), g.shape()],
                format!("the gradient of `{k}` (second) must have its parameter's shape (first)"),
            ));
        }
        crate::learn::float_dtype(op, &format!("gradient `{k}`"), g.dtype())?;
    }
    Ok(())
}

/// Whether an update may go ahead under `policy`: `Ok(true)` when every
/// gradient is finite (or `Allow`), `Ok(false)` when one is not and the
/// update is to be skipped, an [`Error::NonFinite`] naming the first one
/// under `NonFinite::Error`.
fn admit(op: &str, policy: NonFinite, grads: &TensorDict) -> Result<bool> {
    if policy == NonFinite::Allow {
        return Ok(true);
    }
    for (k, g) in grads {
        if policy == NonFinite::Error {
            check_finite(op, "gradient", k, g)?;
        } else if first_non_finite(g)?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `value` if it is finite and inside `range` (written out in `expect`),
/// else an error from `op` naming the setting and the value.
fn setting(op: &str, name: &str, value: f64, ok: impl Fn(f64) -> bool, expect: &str) -> Result<()> {
    if value.is_finite() && ok(value) {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{name} must be {expect}, got {value}"),
        ))
    }
}

/// The moment (or velocity) of `key` in a restored state, which must be a
/// float tensor of the parameter's shape.
fn kept_for<'a>(op: &str, kept: &'a Tensor, p: &Tensor, key: &str) -> Result<&'a Tensor> {
    if kept.shape() != p.shape() {
        return Err(Error::shapes(
            op,
            [kept.shape(), p.shape()],
            format!(
                "the optimiser state of `{key}` (first) must have its parameter's shape (second)"
            ),
        ));
    }
    Ok(kept)
}

/// The tensors of `state` under `slot/` (`m/`, `velocity/`), keyed by
/// parameter key, each a finite float tensor.
fn slot(op: &str, state: &OptimState, slot: &str) -> Result<TensorDict> {
    let prefix = format!("{slot}/");
    let mut out = TensorDict::new();
    for (k, t) in &state.tensors {
        let Some(key) = k.strip_prefix(&prefix) else {
            continue;
        };
        crate::learn::float_dtype(op, &format!("state tensor `{k}`"), t.dtype())?;
        check_finite(op, "state tensor", k, t)?;
        out.insert(key.to_string(), t.clone());
    }
    Ok(out)
}

/// The slots a state may hold; anything else is refused (a typo'd or
/// foreign state must not load as an empty one).
fn only_slots(op: &str, state: &OptimState, kind: &str, slots: &[&str]) -> Result<()> {
    if state.kind != kind {
        return Err(Error::invalid(
            op,
            format!(
                "the saved optimiser state is `{}`, this optimiser is `{kind}`",
                state.kind
            ),
        ));
    }
    for k in state.tensors.keys() {
        if !slots.iter().any(|s| k.starts_with(&format!("{s}/"))) {
            return Err(Error::invalid(
                op,
                format!(
                    "unexpected state tensor `{k}` (expected {})",
                    slots.join("/, ") + "/"
                ),
            ));
        }
    }
    Ok(())
}

/// Stochastic gradient descent, optionally with momentum and weight decay:
///
/// ```text
/// g ← g + wd·p;   v ← μ·v + g;   p ← p − lr·v      (μ = 0: p ← p − lr·g)
/// ```
///
/// Settings are checked when they are given (`Sgd::new(f64::NAN)` is an
/// error), and again at each update, since the fields are public.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum `μ ∈ [0, 1)` (0: none).
    pub momentum: f64,
    /// L2 weight decay added to the gradient (`≥ 0`).
    pub weight_decay: f64,
    /// What a non-finite gradient does (default [`NonFinite::Error`]).
    pub non_finite: NonFinite,
    velocity: TensorDict,
    skipped: u64,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` (finite, `> 0`).
    pub fn new(lr: f64) -> Result<Self> {
        let s = Sgd {
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
            non_finite: NonFinite::Error,
            velocity: TensorDict::new(),
            skipped: 0,
        };
        s.validate()?;
        Ok(s)
    }
    /// With momentum `μ ∈ [0, 1)`.
    pub fn momentum(mut self, momentum: f64) -> Result<Self> {
        self.momentum = momentum;
        self.validate()?;
        Ok(self)
    }
    /// With L2 weight decay `wd ≥ 0`.
    pub fn weight_decay(mut self, wd: f64) -> Result<Self> {
        self.weight_decay = wd;
        self.validate()?;
        Ok(self)
    }
    /// With this treatment of non-finite gradients.
    pub fn non_finite(mut self, policy: NonFinite) -> Self {
        self.non_finite = policy;
        self
    }
    /// How many updates [`NonFinite::Skip`] has dropped.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    fn validate(&self) -> Result<()> {
        setting(
            "Sgd",
            "the learning rate",
            self.lr,
            |v| v > 0.0,
            "finite and > 0",
        )?;
        setting(
            "Sgd",
            "momentum",
            self.momentum,
            |v| (0.0..1.0).contains(&v),
            "in [0, 1)",
        )?;
        setting(
            "Sgd",
            "weight_decay",
            self.weight_decay,
            |v| v >= 0.0,
            "finite and >= 0",
        )
    }
}

impl Optimizer for Sgd {
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict> {
        self.validate()?;
        check("Sgd", params, grads)?;
        if !admit("Sgd", self.non_finite, grads)? {
            self.skipped += 1;
            return Ok(params.clone());
        }
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
                    Some(v) => kept_for("Sgd", v, p, k)?
                        .cast(p.dtype())?
                        .mul_scalar(self.momentum)?
                        .add(&g)?,
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
    fn state(&self) -> OptimState {
        OptimState {
            kind: "sgd".into(),
            tensors: self
                .velocity
                .iter()
                .map(|(k, v)| (format!("velocity/{k}"), v.clone()))
                .collect(),
            counters: [("skipped".to_string(), self.skipped)].into(),
        }
    }
    fn load_state(&mut self, state: &OptimState) -> Result<()> {
        const OP: &str = "Sgd::load_state";
        only_slots(OP, state, "sgd", &["velocity"])?;
        let velocity = slot(OP, state, "velocity")?;
        self.skipped = state.counters.get("skipped").copied().unwrap_or(0);
        self.velocity = velocity;
        Ok(())
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
/// gradient late starts with its own bias correction. Settings are checked
/// when they are given, and again at each update.
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
    /// What a non-finite gradient does (default [`NonFinite::Error`]).
    pub non_finite: NonFinite,
    moments: BTreeMap<String, (u64, Tensor, Tensor)>,
    skipped: u64,
}

impl Adam {
    /// Adam with learning rate `lr` (finite, `> 0`) and the usual
    /// `β₁ = 0.9`, `β₂ = 0.999`, `ε = 1e-8`.
    pub fn new(lr: f64) -> Result<Self> {
        let a = Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            non_finite: NonFinite::Error,
            moments: Default::default(),
            skipped: 0,
        };
        a.validate()?;
        Ok(a)
    }
    /// With these moment decays (each in `[0, 1)`).
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self.validate()?;
        Ok(self)
    }
    /// With this `ε` (finite, `> 0`).
    pub fn eps(mut self, eps: f64) -> Result<Self> {
        self.eps = eps;
        self.validate()?;
        Ok(self)
    }
    /// With this treatment of non-finite gradients.
    pub fn non_finite(mut self, policy: NonFinite) -> Self {
        self.non_finite = policy;
        self
    }
    /// How many updates parameter `key` has had.
    pub fn steps(&self, key: &str) -> u64 {
        self.moments.get(key).map_or(0, |m| m.0)
    }
    /// How many updates [`NonFinite::Skip`] has dropped.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    fn validate(&self) -> Result<()> {
        let in01 = |v: f64| (0.0..1.0).contains(&v);
        setting(
            "Adam",
            "the learning rate",
            self.lr,
            |v| v > 0.0,
            "finite and > 0",
        )?;
        setting("Adam", "beta1", self.beta1, in01, "in [0, 1)")?;
        setting("Adam", "beta2", self.beta2, in01, "in [0, 1)")?;
        setting("Adam", "eps", self.eps, |v| v > 0.0, "finite and > 0")
    }
}

impl Optimizer for Adam {
    fn update(&mut self, params: &TensorDict, grads: &TensorDict) -> Result<TensorDict> {
        self.validate()?;
        check("Adam", params, grads)?;
        if !admit("Adam", self.non_finite, grads)? {
            self.skipped += 1;
            return Ok(params.clone());
        }
        let mut out = params.clone();
        let mut moments = self.moments.clone();
        for (k, g) in grads {
            let p = &params[k];
            let g = g.cast(p.dtype())?;
            let (t, m, v) = match moments.get(k) {
                Some((t, m, v)) => (
                    *t,
                    kept_for("Adam", m, p, k)?.cast(p.dtype())?,
                    kept_for("Adam", v, p, k)?.cast(p.dtype())?,
                ),
                None => {
                    let op = format!("Adam: moments of `{k}`");
                    let z = Tensor::try_zeros(&op, p.shape(), p.dtype())?;
                    (0, z.clone(), z)
                }
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
    fn state(&self) -> OptimState {
        let mut s = OptimState {
            kind: "adam".into(),
            ..OptimState::default()
        };
        for (k, (t, m, v)) in &self.moments {
            s.tensors.insert(format!("m/{k}"), m.clone());
            s.tensors.insert(format!("v/{k}"), v.clone());
            s.counters.insert(format!("t/{k}"), *t);
        }
        s.counters.insert("skipped".into(), self.skipped);
        s
    }
    fn load_state(&mut self, state: &OptimState) -> Result<()> {
        const OP: &str = "Adam::load_state";
        only_slots(OP, state, "adam", &["m", "v"])?;
        let (m, mut v) = (slot(OP, state, "m")?, slot(OP, state, "v")?);
        let mut moments = BTreeMap::new();
        for (k, m) in m {
            let v = v.remove(&k).ok_or_else(|| {
                Error::invalid(OP, format!("`m/{k}` has no second moment `v/{k}`"))
            })?;
            let t = state.counters.get(&format!("t/{k}")).copied();
            let t = t.filter(|&t| t > 0).ok_or_else(|| {
                Error::invalid(OP, format!("`m/{k}` has no step count `t/{k}` >= 1"))
            })?;
            if m.shape() != v.shape() {
                return Err(Error::shapes(
                    OP,
                    [m.shape(), v.shape()],
                    format!("the moments `m/{k}` and `v/{k}` must have one shape"),
                ));
            }
            moments.insert(k, (t, m, v));
        }
        if let Some(k) = v.keys().next() {
            return Err(Error::invalid(
                OP,
                format!("`v/{k}` has no first moment `m/{k}`"),
            ));
        }
        self.skipped = state.counters.get("skipped").copied().unwrap_or(0);
        self.moments = moments;
        Ok(())
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
