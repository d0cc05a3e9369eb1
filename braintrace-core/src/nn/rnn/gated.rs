//! braintrace 0.2.6's LSTM family: `LSTMCell` and `URLSTMCell` (cell state
//! `c` and output `h`), and the minimal `MiniGRU` and `MiniLSTM`.

use super::{check_sizes, gate, sub_linear, xavier_normal, CellActivation};
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::nn::init::Initializer;
use crate::nn::layers::{cat_last, Linear};
use crate::prims::element_wise;
use crate::tensor::Tensor;

/// braintrace's `LSTMCell`: `Linear`s `Wi`, `Wg`, `Wf`, `Wo` over `[x, h]`
/// (Xavier-normal weights, zero biases); hidden `<path>/c` and `<path>/h`.
/// The forget gate's pre-activation gets `+1` (Jozefowicz et al., 2015).
///
/// ```text
/// i, g, f, o = [x, h] W{i,g,f,o} + b{i,g,f,o}
/// c' = σ(f + 1) ⊙ c + σ(i) ⊙ φ(g)
/// h' = σ(o) ⊙ φ(c')                     φ = tanh by default
/// ```
#[derive(Clone, Debug)]
pub struct LstmCell {
    /// The cell's path.
    pub path: String,
    /// Input gate `<path>/Wi`.
    pub wi: Linear,
    /// Candidate `<path>/Wg`.
    pub wg: Linear,
    /// Forget gate `<path>/Wf`.
    pub wf: Linear,
    /// Output gate `<path>/Wo`.
    pub wo: Linear,
    /// The activation `φ`.
    pub activation: CellActivation,
    /// Hidden size.
    pub n_rec: usize,
}

impl LstmCell {
    /// A cell of `n_in` inputs and `n_rec` units (tanh).
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("LstmCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let k = n_in + n_rec;
        let lin = |name| sub_linear(path, name, k, n_rec, xavier_normal(k, n_rec));
        Ok(LstmCell {
            path: path.to_string(),
            wi: lin("Wi"),
            wg: lin("Wg"),
            wf: lin("Wf"),
            wo: lin("Wo"),
            activation: CellActivation::Tanh,
            n_rec,
        })
    }
    /// With another activation.
    pub fn with_activation(mut self, activation: CellActivation) -> Self {
        self.activation = activation;
        self
    }
    /// The output state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
    /// The cell state's path (`<path>/c`).
    pub fn cell_path(&self) -> String {
        join_path(&self.path, "c")
    }
}

impl Model for LstmCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        for l in [&self.wi, &self.wg, &self.wf, &self.wo] {
            l.init(init)?;
        }
        // `h` first: the hidden group lists its states in declaration
        // order, and braintrace's group of this cell is `[h, c]`.
        init.hidden(&self.hidden_path(), &[self.n_rec])?;
        init.hidden(&self.cell_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let c = ctx.hidden(&self.cell_path())?;
        let xh = cat_last(x, &h)?;
        let i = gate(ctx, &self.wi, &xh, CellActivation::Sigmoid)?;
        let g = gate(ctx, &self.wg, &xh, self.activation)?;
        let f = self.wf.step(ctx, &xh)?;
        let o = gate(ctx, &self.wo, &xh, CellActivation::Sigmoid)?;
        let c_new = f.add_scalar(1.0)?.sigmoid()?.mul(&c)?.add(&i.mul(&g)?)?;
        let h_new = o.mul(&self.activation.apply(&c_new)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        ctx.set_hidden(&self.cell_path(), c_new)?;
        Ok(h_new)
    }
}

/// braintrace's `URLSTMCell` (update-reset LSTM): `Linear`s `Wu`, `Wf`,
/// `Wr`, `Wo` over `[x, h]` without biases (Xavier normal), a trainable
/// forget bias `<path>/bias` (`(n_rec,)`, read through `etp_elemwise`,
/// drawn as `−log(1/u − 1)`, `u ~ U(1/n, 1 − 1/n)`); hidden `<path>/c`,
/// `<path>/h`.
///
/// ```text
/// f̂ = σ(b + [x,h] Wf);  r̂ = σ(−(b − [x,h] Wr))
/// g = 2 r̂ f̂ + (1 − 2 r̂) f̂²
/// c' = g ⊙ c + (1 − g) ⊙ φ([x,h] Wu)
/// h' = σ([x,h] Wo) ⊙ φ(c')              φ = tanh by default
/// ```
#[derive(Clone, Debug)]
pub struct UrLstmCell {
    /// The cell's path.
    pub path: String,
    /// Candidate `<path>/Wu`.
    pub wu: Linear,
    /// Forget gate `<path>/Wf`.
    pub wf: Linear,
    /// Refine gate `<path>/Wr`.
    pub wr: Linear,
    /// Output gate `<path>/Wo`.
    pub wo: Linear,
    /// The activation `φ`.
    pub activation: CellActivation,
    /// Hidden size.
    pub n_rec: usize,
}

impl UrLstmCell {
    /// A cell of `n_in` inputs and `n_rec` units (tanh).
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("UrLstmCell", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let k = n_in + n_rec;
        let lin = |name| sub_linear(path, name, k, n_rec, xavier_normal(k, n_rec)).without_bias();
        Ok(UrLstmCell {
            path: path.to_string(),
            wu: lin("Wu"),
            wf: lin("Wf"),
            wr: lin("Wr"),
            wo: lin("Wo"),
            activation: CellActivation::Tanh,
            n_rec,
        })
    }
    /// With another activation.
    pub fn with_activation(mut self, activation: CellActivation) -> Self {
        self.activation = activation;
        self
    }
    /// The output state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
    /// The cell state's path (`<path>/c`).
    pub fn cell_path(&self) -> String {
        join_path(&self.path, "c")
    }
    /// The forget bias's key (`<path>/bias`).
    pub fn bias_key(&self) -> String {
        join_path(&self.path, "bias")
    }
}

impl Model for UrLstmCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        for l in [&self.wu, &self.wf, &self.wr, &self.wo] {
            l.init(init)?;
        }
        let n = self.n_rec as f64;
        let (lo, hi) = (1.0 / n, 1.0 - 1.0 / n);
        let rng = init.rng();
        let b: Vec<f64> = (0..self.n_rec)
            .map(|_| {
                let u = lo + (hi - lo) * rng.uniform();
                -(1.0 / u - 1.0).ln()
            })
            .collect();
        let b = Tensor::from_vec(b, &[self.n_rec])?.cast(init.dtype())?;
        init.param(&self.bias_key(), None, b)?;
        // `h` first, as braintrace's hidden group `[h, c]`.
        init.hidden(&self.hidden_path(), &[self.n_rec])?;
        init.hidden(&self.cell_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let c = ctx.hidden(&self.cell_path())?;
        let xh = cat_last(x, &h)?;
        let f = self.wf.step(ctx, &xh)?;
        let r = self.wr.step(ctx, &xh)?;
        let u = gate(ctx, &self.wu, &xh, self.activation)?;
        let o = gate(ctx, &self.wo, &xh, CellActivation::Sigmoid)?;
        // braintrace reads the bias through two `etp_elemwise` equations (one
        // per gate), so its compiler reports two relations; so does ours.
        let bias = || element_wise(&ctx.param(&self.bias_key())?, None);
        let f_ = bias()?.add(&f)?.sigmoid()?;
        let r_ = bias()?.add(&r.neg()?)?.neg()?.sigmoid()?;
        // g = 2 r̂ f̂ + (1 − 2 r̂) f̂²
        let two_r = r_.mul_scalar(2.0)?;
        let g = two_r
            .mul(&f_)?
            .add(&two_r.rsub_scalar(1.0)?.mul(&f_.square()?)?)?;
        let c_new = g.mul(&c)?.add(&g.rsub_scalar(1.0)?.mul(&u)?)?;
        let h_new = o.mul(&self.activation.apply(&c_new)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        ctx.set_hidden(&self.cell_path(), c_new)?;
        Ok(h_new)
    }
}

/// braintrace's `MiniGRU`: the gate `W_z` over `[x, h]` and the input map
/// `W_x` over `x` (orthogonal weights, zero biases); hidden `<path>/h`.
///
/// ```text
/// z = σ([x, h] W_z + b_z)
/// h' = (1 − z) ⊙ h + z ⊙ (x W_x + b_x)
/// ```
#[derive(Clone, Debug)]
pub struct MiniGru {
    /// The cell's path.
    pub path: String,
    /// Input map `<path>/W_x`.
    pub w_x: Linear,
    /// Update gate `<path>/W_z`.
    pub w_z: Linear,
    /// Hidden size.
    pub n_rec: usize,
}

impl MiniGru {
    /// A cell of `n_in` inputs and `n_rec` units.
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("MiniGru", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let lin = |name, k| sub_linear(path, name, k, n_rec, Initializer::orthogonal());
        Ok(MiniGru {
            path: path.to_string(),
            w_x: lin("W_x", n_in),
            w_z: lin("W_z", n_in + n_rec),
            n_rec,
        })
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for MiniGru {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w_x.init(init)?;
        self.w_z.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let z = gate(ctx, &self.w_z, &cat_last(x, &h)?, CellActivation::Sigmoid)?;
        let hx = self.w_x.step(ctx, x)?;
        let h_new = z.rsub_scalar(1.0)?.mul(&h)?.add(&z.mul(&hx)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}

/// braintrace's `MiniLSTM`: gates `W_f`, `W_i` over `[x, h]` and the input
/// map `W_x` over `x` (orthogonal weights, zero biases); hidden `<path>/h`.
///
/// ```text
/// f = σ([x, h] W_f + b_f);  i = σ([x, h] W_i + b_i)
/// h' = f ⊙ h + i ⊙ (x W_x + b_x)
/// ```
#[derive(Clone, Debug)]
pub struct MiniLstm {
    /// The cell's path.
    pub path: String,
    /// Input map `<path>/W_x`.
    pub w_x: Linear,
    /// Forget gate `<path>/W_f`.
    pub w_f: Linear,
    /// Input gate `<path>/W_i`.
    pub w_i: Linear,
    /// Hidden size.
    pub n_rec: usize,
}

impl MiniLstm {
    /// A cell of `n_in` inputs and `n_rec` units.
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Result<Self> {
        check_sizes("MiniLstm", &[("n_in", n_in), ("n_rec", n_rec)])?;
        let lin = |name, k| sub_linear(path, name, k, n_rec, Initializer::orthogonal());
        Ok(MiniLstm {
            path: path.to_string(),
            w_x: lin("W_x", n_in),
            w_f: lin("W_f", n_in + n_rec),
            w_i: lin("W_i", n_in + n_rec),
            n_rec,
        })
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for MiniLstm {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w_x.init(init)?;
        self.w_f.init(init)?;
        self.w_i.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden(&self.hidden_path())?;
        let xh = cat_last(x, &h)?;
        let f = gate(ctx, &self.w_f, &xh, CellActivation::Sigmoid)?;
        let i = gate(ctx, &self.w_i, &xh, CellActivation::Sigmoid)?;
        let hx = self.w_x.step(ctx, x)?;
        let h_new = f.mul(&h)?.add(&i.mul(&hx)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}
