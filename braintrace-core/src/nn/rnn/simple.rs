//! The one-state cells of braintrace 0.2.6 with a single hidden `h`:
//! `ValinaRNNCell`, `MGUCell`, `MinimalRNNCell` and `CFNCell`.

use super::{check_sizes, gate, sub_linear, xavier_normal, CellActivation};
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::nn::init::Initializer;
use crate::nn::layers::{cat_last, Linear};
use crate::tensor::Tensor;

/// braintrace's `ValinaRNNCell` (its spelling): one `Linear` `W` over
/// `[x, h]` (Xavier-normal weight, zero bias), hidden `<path>/h`.
///
/// ```text
/// h' = φ([x, h] W + b)        φ = relu by default
/// ```
#[derive(Clone, Debug)]
pub struct VanillaRnnCell {
    /// The cell's path.
    pub path: String,
    /// The recurrent layer `<path>/W`, `n_in + n_rec → n_rec`.
    pub w: Linear,
    /// The activation `φ`.
    pub activation: CellActivation,
    /// Hidden size.
    pub n_rec: usize,
}

impl VanillaRnnCell {
    /// A cell of `n_in` inputs and `n_rec` units with braintrace's default
    /// activation (relu).
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("VanillaRnnCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        Ok(VanillaRnnCell {
            path: path.to_string(),
            w: sub_linear(
                path,
                "W",
                n_in + n_rec,
                n_rec,
                xavier_normal(n_in + n_rec, n_rec),
            ),
            activation: CellActivation::Relu,
            n_rec,
        })
    }
    /// With another activation.
    pub fn with_activation(mut self, activation: CellActivation) -> Self {
        self.activation = activation;
        self
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for VanillaRnnCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let h_new = gate(ctx, &self.w, &cat_last(x, &h)?, self.activation)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}

/// braintrace's `MGUCell` (minimal gated unit): `Linear`s `Wf` and `Wh`
/// over `n_in + n_rec` (orthogonal weights, zero biases), hidden `<path>/h`.
///
/// ```text
/// f = σ([x, h] Wf + bf)
/// h̃ = φ([x, f ⊙ h] Wh + bh)          φ = tanh by default
/// h' = (1 − f) ⊙ h + f ⊙ h̃
/// ```
#[derive(Clone, Debug)]
pub struct MguCell {
    /// The cell's path.
    pub path: String,
    /// Forget gate `<path>/Wf`.
    pub wf: Linear,
    /// Candidate `<path>/Wh`.
    pub wh: Linear,
    /// The candidate's activation `φ`.
    pub activation: CellActivation,
    /// Hidden size.
    pub n_rec: usize,
}

impl MguCell {
    /// A cell of `n_in` inputs and `n_rec` units (tanh candidate).
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("MguCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let lin = |name| sub_linear(path, name, n_in + n_rec, n_rec, Initializer::orthogonal());
        Ok(MguCell {
            path: path.to_string(),
            wf: lin("Wf"),
            wh: lin("Wh"),
            activation: CellActivation::Tanh,
            n_rec,
        })
    }
    /// With another candidate activation.
    pub fn with_activation(mut self, activation: CellActivation) -> Self {
        self.activation = activation;
        self
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for MguCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.wf.init(init)?;
        self.wh.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let f = gate(ctx, &self.wf, &cat_last(x, &h)?, CellActivation::Sigmoid)?;
        let hc = gate(ctx, &self.wh, &cat_last(x, &f.mul(&h)?)?, self.activation)?;
        let h_new = f.rsub_scalar(1.0)?.mul(&h)?.add(&f.mul(&hc)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}

/// braintrace's `MinimalRNNCell` with its default `phi` (a `Linear`
/// `<path>/phi`, `n_in → n_rec`, no activation: braintrace's code applies
/// none although its docstring mentions tanh) and the gate `<path>/W_u`
/// over `[z, h]` (`2·n_rec → n_rec`); orthogonal weights, zero biases.
///
/// ```text
/// z = x Wφ + bφ
/// u = σ([z, h] W_u + b_u)
/// h' = u ⊙ h + (1 − u) ⊙ z
/// ```
#[derive(Clone, Debug)]
pub struct MinimalRnnCell {
    /// The cell's path.
    pub path: String,
    /// The input map `<path>/phi`.
    pub phi: Linear,
    /// The update gate `<path>/W_u`.
    pub w_u: Linear,
    /// Hidden size.
    pub n_rec: usize,
}

impl MinimalRnnCell {
    /// A cell of `n_in` inputs and `n_rec` units.
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("MinimalRnnCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        Ok(MinimalRnnCell {
            path: path.to_string(),
            phi: sub_linear(path, "phi", n_in, n_rec, Initializer::orthogonal()),
            w_u: sub_linear(path, "W_u", 2 * n_rec, n_rec, Initializer::orthogonal()),
            n_rec,
        })
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for MinimalRnnCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.phi.init(init)?;
        self.w_u.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let z = self.phi.step(ctx, x)?;
        let u = gate(ctx, &self.w_u, &cat_last(&z, &h)?, CellActivation::Sigmoid)?;
        let h_new = u.mul(&h)?.add(&u.rsub_scalar(1.0)?.mul(&z)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}

/// braintrace's `CFNCell` (chaos-free network): gates `Wf`, `Wi` over
/// `[x, h]` and the input map `Wh` over `x` alone (`n_in → n_rec`);
/// orthogonal weights, zero biases; hidden `<path>/h`.
///
/// ```text
/// f = σ([x, h] Wf + bf);  i = σ([x, h] Wi + bi)
/// h' = f ⊙ φ(h) + i ⊙ φ(x Wh + bh)        φ = tanh by default
/// ```
#[derive(Clone, Debug)]
pub struct CfnCell {
    /// The cell's path.
    pub path: String,
    /// Forget gate `<path>/Wf`.
    pub wf: Linear,
    /// Input gate `<path>/Wi`.
    pub wi: Linear,
    /// Input map `<path>/Wh`.
    pub wh: Linear,
    /// The activation `φ`.
    pub activation: CellActivation,
    /// Hidden size.
    pub n_rec: usize,
}

impl CfnCell {
    /// A cell of `n_in` inputs and `n_rec` units (tanh).
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("CfnCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let lin = |name, k| sub_linear(path, name, k, n_rec, Initializer::orthogonal());
        Ok(CfnCell {
            path: path.to_string(),
            wf: lin("Wf", n_in + n_rec),
            wi: lin("Wi", n_in + n_rec),
            wh: lin("Wh", n_in),
            activation: CellActivation::Tanh,
            n_rec,
        })
    }
    /// With another activation.
    pub fn with_activation(mut self, activation: CellActivation) -> Self {
        self.activation = activation;
        self
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for CfnCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.wf.init(init)?;
        self.wi.init(init)?;
        self.wh.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let xh = cat_last(x, &h)?;
        let f = gate(ctx, &self.wf, &xh, CellActivation::Sigmoid)?;
        let i = gate(ctx, &self.wi, &xh, CellActivation::Sigmoid)?;
        let u = gate(ctx, &self.wh, x, self.activation)?;
        let h_new = f.mul(&self.activation.apply(&h)?)?.add(&i.mul(&u)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}
