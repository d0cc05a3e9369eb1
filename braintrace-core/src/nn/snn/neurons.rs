//! brainpy.state's integrate-and-fire neurons: [`If`], [`Lif`], [`Alif`].
//! Each takes the step's input current and returns its spikes; the
//! previous step's spikes (for recurrent input) come from `spikes`.
//!
//! One step of a LIF (brainpy.state `LIF.update`, exponential Euler):
//!
//! ```text
//! s  = S((V − V_th)/(V_th − V_reset))          previous spikes
//! V₁ = V − (V_th − V_reset)·s                  soft reset
//!    = V − (sg(V) − V_reset)·s                 hard reset (sg: stop gradient)
//! V' = V₁ + (1 − e)·(V_rest + R·x − V₁)        e = exp(−dt/τ)
//! out = S((V' − V_th)/(V_th − V_reset))
//! ```
//!
//! `S` is the Heaviside spike with a surrogate derivative (default
//! brainpy.state's `ReluGrad(alpha = 0.3, width = 1)`).

use super::{check_finite, check_size, check_threshold, check_time, decay, SpikeReset};
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::ops::Surrogate;
use crate::tensor::Tensor;

/// The leaky integrate-and-fire neuron (brainpy.state `LIF`; equations in
/// the module docs). Hidden `<path>/V`. Defaults `R = 1`, `V_th = 1`,
/// `V_reset = 0`, `V_rest = 0`, soft reset, `ReluGrad` surrogate
/// (brainpy.state's `τ = 5` is the caller's to pass).
#[derive(Clone, Debug)]
pub struct Lif {
    /// The layer's path.
    pub path: String,
    /// Number of neurons.
    pub n: usize,
    /// Membrane resistance R.
    pub r: f64,
    /// Membrane time constant τ.
    pub tau: f64,
    /// Threshold.
    pub v_th: f64,
    /// Reset potential (sets the spike's scale `V_th − V_reset`).
    pub v_reset: f64,
    /// Resting potential.
    pub v_rest: f64,
    /// Time step.
    pub dt: f64,
    /// The spike's surrogate derivative.
    pub surrogate: Surrogate,
    /// Soft or hard reset.
    pub reset: SpikeReset,
}

impl Lif {
    /// `n` neurons with membrane time constant `tau` and step `dt`.
    pub fn new(path: &str, n: usize, tau: f64, dt: f64) -> Result<Self> {
        let l = Lif::unchecked(path, n, tau, dt);
        l.check("Lif")?;
        Ok(l)
    }
    /// brainpy.state's defaults, not yet checked (the caller names the layer).
    fn unchecked(path: &str, n: usize, tau: f64, dt: f64) -> Self {
        Lif {
            path: path.to_string(),
            n,
            r: 1.0,
            tau,
            v_th: 1.0,
            v_reset: 0.0,
            v_rest: 0.0,
            dt,
            surrogate: Surrogate::relu_grad(),
            reset: SpikeReset::Soft,
        }
    }
    /// With threshold `v_th` and reset potential `v_reset`.
    pub fn with_threshold(mut self, v_th: f64, v_reset: f64) -> Self {
        self.v_th = v_th;
        self.v_reset = v_reset;
        self
    }
    /// With resting potential `v_rest`.
    pub fn with_rest(mut self, v_rest: f64) -> Self {
        self.v_rest = v_rest;
        self
    }
    /// With membrane resistance `r`.
    pub fn with_resistance(mut self, r: f64) -> Self {
        self.r = r;
        self
    }
    /// With another surrogate derivative.
    pub fn with_surrogate(mut self, s: Surrogate) -> Self {
        self.surrogate = s;
        self
    }
    /// With another reset mode.
    pub fn with_reset(mut self, reset: SpikeReset) -> Self {
        self.reset = reset;
        self
    }
    fn check(&self, layer: &str) -> Result<()> {
        check_size(layer, self.n)?;
        check_time(layer, "tau", self.tau)?;
        check_time(layer, "dt", self.dt)?;
        check_finite(layer, "R", self.r)?;
        check_finite(layer, "V_rest", self.v_rest)?;
        check_threshold(layer, self.v_th, self.v_reset)?;
        self.surrogate.validate(layer)
    }
    /// Check every hyperparameter.
    pub fn validate(&self) -> Result<()> {
        self.check("Lif")
    }
    /// The membrane potential's path (`<path>/V`).
    pub fn voltage_path(&self) -> String {
        join_path(&self.path, "V")
    }
    /// `S((V − V_th − θ)/(V_th − V_reset))`, θ an extra threshold (ALIF's).
    fn fire(&self, v: &Tensor, extra: Option<&Tensor>) -> Result<Tensor> {
        let mut u = v.sub_scalar(self.v_th)?;
        if let Some(th) = extra {
            u = u.sub(th)?;
        }
        u.div_scalar(self.v_th - self.v_reset)?
            .spike(self.surrogate)
    }
    /// The reset and the integration of one step from `v` with spikes `s`.
    fn integrate(&self, v: &Tensor, s: &Tensor, x: &Tensor) -> Result<Tensor> {
        let drop = match self.reset {
            SpikeReset::Soft => s.mul_scalar(self.v_th - self.v_reset)?,
            SpikeReset::Hard => v.stop_gradient()?.sub_scalar(self.v_reset)?.mul(s)?,
        };
        let v1 = v.sub(&drop)?;
        let e = decay(self.dt, self.tau);
        // V₁ + (1 − e)(V_rest + R x − V₁) = e V₁ + (1 − e) R x + (1 − e) V_rest.
        let mut v_new = v1.mul_scalar(e)?.add(&x.mul_scalar((1.0 - e) * self.r)?)?;
        if self.v_rest != 0.0 {
            v_new = v_new.add_scalar((1.0 - e) * self.v_rest)?;
        }
        Ok(v_new)
    }
    /// The spikes of the current membrane potential (the previous step's
    /// output), for recurrent input; brainpy.state's `get_spike()`.
    pub fn spikes(&self, ctx: &StepCtx) -> Result<Tensor> {
        self.fire(&ctx.hidden(&self.voltage_path())?, None)
    }
}

impl Model for Lif {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden(&self.voltage_path(), &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let v = ctx.hidden(&self.voltage_path())?;
        let s = self.fire(&v, None)?;
        let v_new = self.integrate(&v, &s, x)?;
        ctx.set_hidden(&self.voltage_path(), v_new.clone())?;
        self.fire(&v_new, None)
    }
}

/// The integrate-and-fire neuron (brainpy.state `IF`): a [`Lif`] with
/// `V_reset = V_rest = 0`, so the spike is `S((V − V_th)/V_th)` and the
/// soft reset subtracts `V_th`. Hidden `<path>/V`.
#[derive(Clone, Debug)]
pub struct If(pub Lif);

impl If {
    /// `n` neurons with time constant `tau` and step `dt`; `V_th = 1`.
    pub fn new(path: &str, n: usize, tau: f64, dt: f64) -> Result<Self> {
        let l = Lif::unchecked(path, n, tau, dt);
        l.check("If")?;
        Ok(If(l))
    }
    /// With threshold `v_th` (positive).
    pub fn with_threshold(self, v_th: f64) -> Self {
        If(self.0.with_threshold(v_th, 0.0))
    }
    /// With membrane resistance `r`.
    pub fn with_resistance(self, r: f64) -> Self {
        If(self.0.with_resistance(r))
    }
    /// With another surrogate derivative.
    pub fn with_surrogate(self, s: Surrogate) -> Self {
        If(self.0.with_surrogate(s))
    }
    /// With another reset mode.
    pub fn with_reset(self, reset: SpikeReset) -> Self {
        If(self.0.with_reset(reset))
    }
    /// Check every hyperparameter (`V_reset` and `V_rest` must be 0).
    pub fn validate(&self) -> Result<()> {
        self.0.check("If")?;
        if self.0.v_reset != 0.0 || self.0.v_rest != 0.0 {
            return Err(super::bad(
                "If",
                "V_reset",
                format!(
                    "an IF neuron resets and rests at 0, got V_reset = {}, V_rest = {}",
                    self.0.v_reset, self.0.v_rest
                ),
            ));
        }
        Ok(())
    }
    /// The membrane potential's path (`<path>/V`).
    pub fn voltage_path(&self) -> String {
        self.0.voltage_path()
    }
    /// The previous step's spikes (see [`Lif::spikes`]).
    pub fn spikes(&self, ctx: &StepCtx) -> Result<Tensor> {
        self.0.spikes(ctx)
    }
}

impl Model for If {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden(&self.voltage_path(), &[self.0.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.0.step(ctx, x)
    }
}

/// The adaptive LIF neuron (brainpy.state `ALIF`): a [`Lif`] whose
/// threshold rises by `β·a` with an adaptation variable `a` that counts
/// spikes and decays with `τ_a`:
///
/// ```text
/// s  = S((V − V_th − β a)/(V_th − V_reset))
/// V' = LIF step of V with s;   a' = e_a·(a + s),  e_a = exp(−dt/τ_a)
/// out = S((V' − V_th − β a')/(V_th − V_reset))
/// ```
///
/// Hidden `<path>/V` and `<path>/a`. Defaults `τ_a = 100`, `β = 0.1` and
/// the LIF's.
#[derive(Clone, Debug)]
pub struct Alif {
    /// The membrane part (its path, size, τ, thresholds, surrogate, reset).
    pub lif: Lif,
    /// Adaptation time constant τ_a.
    pub tau_a: f64,
    /// Threshold increase per unit of adaptation β.
    pub beta: f64,
}

impl Alif {
    /// `n` neurons with time constants `tau` and `tau_a`, step `dt`.
    pub fn new(path: &str, n: usize, tau: f64, tau_a: f64, dt: f64) -> Result<Self> {
        let lif = Lif::unchecked(path, n, tau, dt);
        let a = Alif {
            lif,
            tau_a,
            beta: 0.1,
        };
        a.validate()?;
        Ok(a)
    }
    /// With adaptation strength `beta`.
    pub fn with_beta(mut self, beta: f64) -> Self {
        self.beta = beta;
        self
    }
    /// Change the membrane part (`|l| l.with_threshold(..)`).
    pub fn with_lif(mut self, f: impl FnOnce(Lif) -> Lif) -> Self {
        self.lif = f(self.lif);
        self
    }
    /// Check every hyperparameter.
    pub fn validate(&self) -> Result<()> {
        self.lif.check("Alif")?;
        check_time("Alif", "tau_a", self.tau_a)?;
        check_finite("Alif", "beta", self.beta)
    }
    /// The membrane potential's path (`<path>/V`).
    pub fn voltage_path(&self) -> String {
        self.lif.voltage_path()
    }
    /// The adaptation's path (`<path>/a`).
    pub fn adaptation_path(&self) -> String {
        join_path(&self.lif.path, "a")
    }
    /// The previous step's spikes, for recurrent input.
    pub fn spikes(&self, ctx: &StepCtx) -> Result<Tensor> {
        let v = ctx.hidden(&self.voltage_path())?;
        let a = ctx.hidden(&self.adaptation_path())?;
        self.lif.fire(&v, Some(&a.mul_scalar(self.beta)?))
    }
}

impl Model for Alif {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden(&self.voltage_path(), &[self.lif.n])?;
        init.hidden(&self.adaptation_path(), &[self.lif.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let v = ctx.hidden(&self.voltage_path())?;
        let a = ctx.hidden(&self.adaptation_path())?;
        let s = self.lif.fire(&v, Some(&a.mul_scalar(self.beta)?))?;
        let v_new = self.lif.integrate(&v, &s, x)?;
        let a_new = a.add(&s)?.mul_scalar(decay(self.lif.dt, self.tau_a))?;
        ctx.set_hidden(&self.voltage_path(), v_new.clone())?;
        ctx.set_hidden(&self.adaptation_path(), a_new.clone())?;
        self.lif.fire(&v_new, Some(&a_new.mul_scalar(self.beta)?))
    }
}
