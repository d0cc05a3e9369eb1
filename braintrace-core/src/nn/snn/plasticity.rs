//! brainpy.state's short-term plasticity: [`Std`] (depression) and [`Stp`]
//! (facilitation and depression, Tsodyks–Markram). Each takes presynaptic
//! spikes `s` and returns the released amount `released·s`; the resources
//! `x` start at 1 (and STP's use `u` at `U`) on every reset.

use super::{check_fraction, check_size, check_time, decay};
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::tensor::Tensor;

/// Short-term depression (brainpy.state `STD`):
///
/// ```text
/// x₁ = x + (1 − e)(1 − x)          recovery, e = exp(−dt/τ)
/// out = x₁·s;   x' = x₁ − U·x·s    (the old x)
/// ```
///
/// Hidden `<path>/x` (starts at 1). Defaults `τ = 200`, `U = 0.07`.
#[derive(Clone, Debug)]
pub struct Std {
    /// The layer's path.
    pub path: String,
    /// Number of synapses.
    pub n: usize,
    /// Recovery time constant τ.
    pub tau: f64,
    /// Fraction of resources used by a spike.
    pub u: f64,
    /// Time step.
    pub dt: f64,
}

impl Std {
    /// `n` synapses with recovery time constant `tau`, use `u`, step `dt`.
    pub fn new(path: &str, n: usize, tau: f64, u: f64, dt: f64) -> Result<Self> {
        let s = Std {
            path: path.to_string(),
            n,
            tau,
            u,
            dt,
        };
        s.validate()?;
        Ok(s)
    }
    /// Check size, time constants and `U`.
    pub fn validate(&self) -> Result<()> {
        check_size("Std", self.n)?;
        check_time("Std", "tau", self.tau)?;
        check_time("Std", "dt", self.dt)?;
        check_fraction("Std", "U", self.u)
    }
    /// The resources' path (`<path>/x`).
    pub fn x_path(&self) -> String {
        join_path(&self.path, "x")
    }
}

/// `x + (1 − e)(1 − x) = e·x + (1 − e)`.
fn recover(x: &Tensor, e: f64) -> Result<Tensor> {
    x.mul_scalar(e)?.add_scalar(1.0 - e)
}

impl Model for Std {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden_filled(&self.x_path(), &[self.n], 1.0)
    }
    fn step(&self, ctx: &mut StepCtx, s: &Tensor) -> Result<Tensor> {
        let x = ctx.hidden(&self.x_path())?;
        let x1 = recover(&x, decay(self.dt, self.tau))?;
        let x_new = x1.sub(&x.mul(s)?.mul_scalar(self.u)?)?;
        ctx.set_hidden(&self.x_path(), x_new)?;
        x1.mul(s)
    }
}

/// Short-term plasticity (brainpy.state `STP`):
///
/// ```text
/// u' = e_f·u + U·(1 − u)·s              facilitation, e_f = exp(−dt/τ_f)
/// x₁ = x + (1 − e_d)(1 − x)             recovery,     e_d = exp(−dt/τ_d)
/// out = u'·x₁·s;   x' = x₁ − u'·x·s     (the old u and x)
/// ```
///
/// Hidden `<path>/u` (starts at `U`) and `<path>/x` (starts at 1).
/// Defaults `U = 0.15`, `τ_f = 1500`, `τ_d = 200`.
#[derive(Clone, Debug)]
pub struct Stp {
    /// The layer's path.
    pub path: String,
    /// Number of synapses.
    pub n: usize,
    /// Baseline use U.
    pub u: f64,
    /// Facilitation time constant τ_f.
    pub tau_f: f64,
    /// Recovery time constant τ_d.
    pub tau_d: f64,
    /// Time step.
    pub dt: f64,
}

impl Stp {
    /// `n` synapses with baseline use `u`, time constants `tau_f` and
    /// `tau_d`, step `dt`.
    pub fn new(path: &str, n: usize, u: f64, tau_f: f64, tau_d: f64, dt: f64) -> Result<Self> {
        let s = Stp {
            path: path.to_string(),
            n,
            u,
            tau_f,
            tau_d,
            dt,
        };
        s.validate()?;
        Ok(s)
    }
    /// Check size, time constants and `U`.
    pub fn validate(&self) -> Result<()> {
        check_size("Stp", self.n)?;
        check_time("Stp", "tau_f", self.tau_f)?;
        check_time("Stp", "tau_d", self.tau_d)?;
        check_time("Stp", "dt", self.dt)?;
        check_fraction("Stp", "U", self.u)
    }
    /// The use's path (`<path>/u`).
    pub fn u_path(&self) -> String {
        join_path(&self.path, "u")
    }
    /// The resources' path (`<path>/x`).
    pub fn x_path(&self) -> String {
        join_path(&self.path, "x")
    }
}

impl Model for Stp {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden_filled(&self.u_path(), &[self.n], self.u)?;
        init.hidden_filled(&self.x_path(), &[self.n], 1.0)
    }
    fn step(&self, ctx: &mut StepCtx, s: &Tensor) -> Result<Tensor> {
        let u = ctx.hidden(&self.u_path())?;
        let x = ctx.hidden(&self.x_path())?;
        let facil = u.rsub_scalar(1.0)?.mul(s)?.mul_scalar(self.u)?;
        let u_new = u.mul_scalar(decay(self.dt, self.tau_f))?.add(&facil)?;
        let x1 = recover(&x, decay(self.dt, self.tau_d))?;
        let x_new = x1.sub(&u_new.mul(&x)?.mul(s)?)?;
        ctx.set_hidden(&self.u_path(), u_new.clone())?;
        ctx.set_hidden(&self.x_path(), x_new)?;
        u_new.mul(&x1)?.mul(s)
    }
}
