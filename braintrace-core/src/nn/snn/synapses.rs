//! brainpy.state's current synapses: [`Expon`], [`Alpha`], [`DualExpon`].
//! Each takes the step's input (a presynaptic drive, e.g. `Linear` of the
//! spikes) and returns its conductance.

use super::{check_size, check_time, decay};
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::tensor::Tensor;

/// The exponential synapse (brainpy.state `Expon`): `g' = e^(−dt/τ)·g + x`,
/// returns `g'`; hidden `<path>/g`. Default `τ = 8`.
#[derive(Clone, Debug)]
pub struct Expon {
    /// The synapse's path.
    pub path: String,
    /// Number of units.
    pub n: usize,
    /// Time constant τ.
    pub tau: f64,
    /// Time step.
    pub dt: f64,
}

impl Expon {
    /// `n` units with time constant `tau` and step `dt` (same unit).
    pub fn new(path: &str, n: usize, tau: f64, dt: f64) -> Result<Self> {
        let s = Expon {
            path: path.to_string(),
            n,
            tau,
            dt,
        };
        s.validate()?;
        Ok(s)
    }
    /// Check size and time constants.
    pub fn validate(&self) -> Result<()> {
        check_size("Expon", self.n)?;
        check_time("Expon", "tau", self.tau)?;
        check_time("Expon", "dt", self.dt)
    }
    /// The decay per step, `exp(−dt/τ)`.
    pub fn decay(&self) -> f64 {
        decay(self.dt, self.tau)
    }
    /// The hidden state's path (`<path>/g`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "g")
    }
}

impl Model for Expon {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden(&self.hidden_path(), &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let g = ctx.hidden(&self.hidden_path())?;
        let g_new = g.mul_scalar(self.decay())?.add(x)?;
        ctx.set_hidden(&self.hidden_path(), g_new.clone())?;
        Ok(g_new)
    }
}

/// The alpha synapse (brainpy.state `Alpha`): a second-order filter,
///
/// ```text
/// g' = g + (1 − e)·(h − g)        (e = exp(−dt/τ); the old h)
/// h' = e·h + x
/// ```
///
/// returns `g'`; hidden `<path>/g` and `<path>/h`. Default `τ = 8`.
#[derive(Clone, Debug)]
pub struct Alpha {
    /// The synapse's path.
    pub path: String,
    /// Number of units.
    pub n: usize,
    /// Time constant τ.
    pub tau: f64,
    /// Time step.
    pub dt: f64,
}

impl Alpha {
    /// `n` units with time constant `tau` and step `dt`.
    pub fn new(path: &str, n: usize, tau: f64, dt: f64) -> Result<Self> {
        let s = Alpha {
            path: path.to_string(),
            n,
            tau,
            dt,
        };
        s.validate()?;
        Ok(s)
    }
    /// Check size and time constants.
    pub fn validate(&self) -> Result<()> {
        check_size("Alpha", self.n)?;
        check_time("Alpha", "tau", self.tau)?;
        check_time("Alpha", "dt", self.dt)
    }
    /// The conductance's path (`<path>/g`).
    pub fn g_path(&self) -> String {
        join_path(&self.path, "g")
    }
    /// The rise variable's path (`<path>/h`).
    pub fn h_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for Alpha {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        // `h` first: the step reads it first, and a hidden group lists its
        // states in that order (as braintrace's compiler does).
        init.hidden(&self.h_path(), &[self.n])?;
        init.hidden(&self.g_path(), &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let (g, h) = (ctx.hidden(&self.g_path())?, ctx.hidden(&self.h_path())?);
        let e = decay(self.dt, self.tau);
        let g_new = g.add(&h.sub(&g)?.mul_scalar(1.0 - e)?)?;
        let h_new = h.mul_scalar(e)?.add(x)?;
        ctx.set_hidden(&self.g_path(), g_new.clone())?;
        ctx.set_hidden(&self.h_path(), h_new)?;
        Ok(g_new)
    }
}

/// The dual-exponential synapse (brainpy.state `DualExpon`, normalised):
///
/// ```text
/// g_rise'  = e_r·g_rise + x,   g_decay' = e_d·g_decay + x
/// out = A·n·(g_decay' − g_rise'),  n = τ_d/(τ_d − τ_r)·(τ_r/τ_d)^(τ_r/(τ_r − τ_d))
/// ```
///
/// (`n` makes the peak of a unit impulse's response `A`). Hidden
/// `<path>/g_rise` and `<path>/g_decay`. Defaults `τ_decay = 10`,
/// `τ_rise = 1`, `A = 1`; the two time constants must differ.
#[derive(Clone, Debug)]
pub struct DualExpon {
    /// The synapse's path.
    pub path: String,
    /// Number of units.
    pub n: usize,
    /// Decay time constant τ_d.
    pub tau_decay: f64,
    /// Rise time constant τ_r.
    pub tau_rise: f64,
    /// Amplitude A.
    pub amplitude: f64,
    /// Time step.
    pub dt: f64,
}

impl DualExpon {
    /// `n` units with decay and rise time constants, amplitude 1, step `dt`.
    pub fn new(path: &str, n: usize, tau_decay: f64, tau_rise: f64, dt: f64) -> Result<Self> {
        let s = DualExpon {
            path: path.to_string(),
            n,
            tau_decay,
            tau_rise,
            amplitude: 1.0,
            dt,
        };
        s.validate()?;
        Ok(s)
    }
    /// With amplitude `a`.
    pub fn with_amplitude(mut self, a: f64) -> Self {
        self.amplitude = a;
        self
    }
    /// Check size, time constants (distinct) and amplitude.
    pub fn validate(&self) -> Result<()> {
        const L: &str = "DualExpon";
        check_size(L, self.n)?;
        check_time(L, "tau_decay", self.tau_decay)?;
        check_time(L, "tau_rise", self.tau_rise)?;
        check_time(L, "dt", self.dt)?;
        super::check_finite(L, "amplitude", self.amplitude)?;
        if self.tau_decay == self.tau_rise {
            return Err(super::bad(
                L,
                "tau_rise",
                format!(
                    "must differ from tau_decay = {} for the normalisation (use Alpha)",
                    self.tau_decay
                ),
            ));
        }
        Ok(())
    }
    /// The output's factor `A·n`.
    pub fn scale(&self) -> f64 {
        let (td, tr) = (self.tau_decay, self.tau_rise);
        self.amplitude * td / (td - tr) * (tr / td).powf(tr / (tr - td))
    }
    /// The rise variable's path.
    pub fn rise_path(&self) -> String {
        join_path(&self.path, "g_rise")
    }
    /// The decay variable's path.
    pub fn decay_path(&self) -> String {
        join_path(&self.path, "g_decay")
    }
}

impl Model for DualExpon {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.validate()?;
        init.hidden(&self.rise_path(), &[self.n])?;
        init.hidden(&self.decay_path(), &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let r = ctx.hidden(&self.rise_path())?;
        let d = ctx.hidden(&self.decay_path())?;
        let r_new = r.mul_scalar(decay(self.dt, self.tau_rise))?.add(x)?;
        let d_new = d.mul_scalar(decay(self.dt, self.tau_decay))?.add(x)?;
        ctx.set_hidden(&self.rise_path(), r_new.clone())?;
        ctx.set_hidden(&self.decay_path(), d_new.clone())?;
        d_new.sub(&r_new)?.mul_scalar(self.scale())
    }
}
