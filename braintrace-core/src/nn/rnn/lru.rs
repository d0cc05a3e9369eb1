//! braintrace 0.2.6's `LRUCell` (linear recurrent unit, Orvieto et al.
//! 2023): a diagonal complex recurrence kept, as braintrace keeps it, as a
//! pair of real hidden states `h_re`, `h_im`.

use super::check_sizes;
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::nn::init::Initializer;
use crate::nn::layers::Linear;
use crate::prims::element_wise;
use crate::tensor::Tensor;

/// braintrace's default largest phase: its literal `6.28`, not `2π`.
#[allow(clippy::approx_constant)]
const MAX_PHASE: f64 = 6.28;

/// braintrace's `LRUCell(d_model, d_hidden, r_min, r_max, max_phase)`.
///
/// Trainables: the per-unit `<path>/nu_log`, `<path>/theta_log`,
/// `<path>/gamma_log` (`(d_hidden,)`) and `<path>/D` (`(d_model,)`), each
/// read through `etp_elemwise`; the bias-free `Linear`s `B_re`, `B_im`
/// (`d_model → d_hidden`) and `C_re`, `C_im` (`d_hidden → d_model`), drawn
/// `N(0, 1/fan_in)`. Hidden `<path>/h_re`, `<path>/h_im`. The complex
/// product `λ h` is written out on the real pair:
///
/// ```text
/// a = exp(−exp(ν)),  θ = exp(θ_log),  c = exp(γ_log)
/// h_re' = a cos θ ⊙ h_re − a sin θ ⊙ h_im + c ⊙ (x B_re)
/// h_im' = a sin θ ⊙ h_re + a cos θ ⊙ h_im + c ⊙ (x B_im)
/// y = h_re' C_re − h_im' C_im + x ⊙ D
/// ```
///
/// The output has `d_model` features (the input's width).
#[derive(Clone, Debug)]
pub struct LruCell {
    /// The cell's path.
    pub path: String,
    /// Input (and output) width.
    pub d_model: usize,
    /// Hidden (complex) width.
    pub d_hidden: usize,
    /// Smallest `|λ|` drawn.
    pub r_min: f64,
    /// Largest `|λ|` drawn.
    pub r_max: f64,
    /// Largest phase drawn.
    pub max_phase: f64,
    /// `<path>/B_re`.
    pub b_re: Linear,
    /// `<path>/B_im`.
    pub b_im: Linear,
    /// `<path>/C_re`.
    pub c_re: Linear,
    /// `<path>/C_im`.
    pub c_im: Linear,
}

impl LruCell {
    /// A unit with braintrace's defaults `r_min = 0`, `r_max = 1`,
    /// `max_phase = 6.28`.
    pub fn new(path: &str, d_model: usize, d_hidden: usize) -> Result<Self> {
        Self::with_ring(path, d_model, d_hidden, 0.0, 1.0, MAX_PHASE)
    }
    /// A unit whose eigenvalues are drawn on the ring `r_min ≤ |λ| ≤ r_max`
    /// (`0 ≤ r_min < r_max ≤ 1`) with phases in `[0, max_phase)`
    /// (`max_phase > 0`).
    pub fn with_ring(
        path: &str,
        d_model: usize,
        d_hidden: usize,
        r_min: f64,
        r_max: f64,
        max_phase: f64,
    ) -> Result<Self> {
        check_sizes("LruCell", &[("d_model", d_model), ("d_hidden", d_hidden)])?;
        if !(0.0 <= r_min && r_min < r_max && r_max <= 1.0) {
            return Err(Error::invalid(
                "LruCell::new",
                format!("r_min = {r_min}, r_max = {r_max}: need 0 <= r_min < r_max <= 1"),
            ));
        }
        if !(max_phase > 0.0 && max_phase.is_finite()) {
            return Err(Error::invalid(
                "LruCell::new",
                format!("max_phase = {max_phase}: must be positive and finite"),
            ));
        }
        let lin = |name: &str, i: usize, o: usize| {
            Linear::new(&join_path(path, name), i, o)
                .without_bias()
                .with_init(Initializer::Normal {
                    std: 1.0 / (i as f64).sqrt(),
                })
        };
        Ok(LruCell {
            path: path.to_string(),
            d_model,
            d_hidden,
            r_min,
            r_max,
            max_phase,
            b_re: lin("B_re", d_model, d_hidden),
            b_im: lin("B_im", d_model, d_hidden),
            c_re: lin("C_re", d_hidden, d_model),
            c_im: lin("C_im", d_hidden, d_model),
        })
    }
    /// The key of a bare parameter (`nu_log`, `theta_log`, `gamma_log`, `D`).
    pub fn key(&self, name: &str) -> String {
        join_path(&self.path, name)
    }
}

impl Model for LruCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        let n = self.d_hidden;
        let (r2min, r2max) = (self.r_min * self.r_min, self.r_max * self.r_max);
        let rng = init.rng();
        let theta: Vec<f64> = (0..n)
            .map(|_| (self.max_phase * rng.uniform()).ln())
            .collect();
        let nu: Vec<f64> = (0..n)
            .map(|_| (-0.5 * (rng.uniform() * (r2max - r2min) + r2min).ln()).ln())
            .collect();
        // γ = sqrt(1 − |λ|²) normalises the input so that the state's
        // variance does not grow as |λ| → 1.
        let gamma: Vec<f64> = nu
            .iter()
            .map(|&v| {
                let mag = (-v.exp()).exp();
                (1.0 - mag * mag).sqrt().ln()
            })
            .collect();
        let d: Vec<f64> = (0..self.d_model).map(|_| rng.normal()).collect();
        let dt = init.dtype();
        for (name, v, len) in [
            ("theta_log", theta, n),
            ("nu_log", nu, n),
            ("gamma_log", gamma, n),
            ("D", d, self.d_model),
        ] {
            let t = Tensor::from_vec(v, &[len])?.cast(dt)?;
            init.param(&self.key(name), None, t)?;
        }
        for l in [&self.b_re, &self.b_im, &self.c_re, &self.c_im] {
            l.init(init)?;
        }
        init.hidden(&self.key("h_re"), &[n])?;
        init.hidden(&self.key("h_im"), &[n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let ew = |ctx: &StepCtx, name: &str| element_wise(&ctx.param(&self.key(name))?, None);
        let a = ew(ctx, "nu_log")?.exp()?.neg()?.exp()?;
        let th = ew(ctx, "theta_log")?.exp()?;
        let c = ew(ctx, "gamma_log")?.exp()?;
        let (a_cos, a_sin) = (a.mul(&th.cos()?)?, a.mul(&th.sin()?)?);
        let h_re = ctx.hidden(&self.key("h_re"))?;
        let h_im = ctx.hidden(&self.key("h_im"))?;
        let bx_re = self.b_re.step(ctx, x)?;
        let bx_im = self.b_im.step(ctx, x)?;
        let re = a_cos
            .mul(&h_re)?
            .sub(&a_sin.mul(&h_im)?)?
            .add(&c.mul(&bx_re)?)?;
        let im = a_sin
            .mul(&h_re)?
            .add(&a_cos.mul(&h_im)?)?
            .add(&c.mul(&bx_im)?)?;
        ctx.set_hidden(&self.key("h_re"), re.clone())?;
        ctx.set_hidden(&self.key("h_im"), im.clone())?;
        let d = ew(ctx, "D")?;
        self.c_re
            .step(ctx, &re)?
            .sub(&self.c_im.step(ctx, &im)?)?
            .add(&x.mul(&d)?)
    }
}
