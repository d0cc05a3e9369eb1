//! Rate layers: `Linear`, `GruCell`, `LeakyRateReadout`, `ElementWiseParam`.

use super::init::Initializer;
use crate::error::{Error, Result};
use crate::etp::ElemFn;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::prims::{element_wise, matmul, Transforms};
use crate::tensor::Tensor;

/// `y = x @ W + b` through the ETP matmul (`etp_mm` for a batched `x`).
/// One parameter state `<path>/weight` holding the leaves `weight` `(in, out)`
/// and `bias` `(out,)`, as braintrace's `nn.Linear`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// The layer's path (`rnn/Wz`).
    pub path: String,
    /// Input features.
    pub n_in: usize,
    /// Output features.
    pub n_out: usize,
    /// Whether there is a bias leaf.
    pub bias: bool,
    /// Weight initialiser (default Kaiming normal).
    pub w_init: Initializer,
    /// Bias initialiser (default zeros).
    pub b_init: Initializer,
    /// Optional element-wise transform of the weight inside the primitive.
    pub weight_fn: Option<ElemFn>,
    /// braintrace's `w_mask`: the weight is multiplied element-wise by it
    /// inside the primitive (`x @ (f(W) ⊙ mask)`); set by
    /// [`Linear::with_mask`], which checks it.
    pub w_mask: Option<Tensor>,
}

impl Linear {
    /// A linear layer with bias, Kaiming-normal weights and zero bias.
    pub fn new(path: &str, n_in: usize, n_out: usize) -> Self {
        Linear {
            path: path.to_string(),
            n_in,
            n_out,
            bias: true,
            w_init: Initializer::kaiming_normal(),
            b_init: Initializer::Zeros,
            weight_fn: None,
            w_mask: None,
        }
    }
    /// With braintrace's weight mask `w_mask` (`y = x @ (W ⊙ mask) + b`,
    /// the product inside `etp_mm`, so the trace and gradient are the raw
    /// weight's). The mask must broadcast to `(n_in, n_out)` and be finite.
    pub fn with_mask(mut self, mask: &Tensor) -> Result<Self> {
        let op = layer_op("Linear", &self.path);
        super::mask::check_mask(&op, "w_mask", mask, &[self.n_in, self.n_out])?;
        self.w_mask = Some(mask.clone());
        Ok(self)
    }
    /// Without a bias.
    pub fn without_bias(mut self) -> Self {
        self.bias = false;
        self
    }
    /// With another weight initialiser.
    pub fn with_init(mut self, w_init: Initializer) -> Self {
        self.w_init = w_init;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of the weight leaf (`<path>/weight/weight`).
    pub fn weight_key(&self) -> String {
        join_path(&self.state_path(), "weight")
    }
    /// The key of the bias leaf (`<path>/weight/bias`).
    pub fn bias_key(&self) -> String {
        join_path(&self.state_path(), "bias")
    }
}

impl Model for Linear {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("Linear", &self.path);
        size_at_least_one(&op, "n_in", self.n_in)?;
        size_at_least_one(&op, "n_out", self.n_out)?;
        let w = draw(init, &op, "weight", &self.w_init, &[self.n_in, self.n_out])?;
        init.param(&self.state_path(), Some("weight"), w)?;
        if self.bias {
            let b = draw(init, &op, "bias", &self.b_init, &[self.n_out])?;
            init.param(&self.state_path(), Some("bias"), b)?;
        }
        Ok(())
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        check_features(&layer_op("Linear", &self.path), x, self.n_in)?;
        let w = ctx.param(&self.weight_key())?;
        let b = if self.bias {
            Some(ctx.param(&self.bias_key())?)
        } else {
            None
        };
        let weight_fn = match &self.w_mask {
            Some(m) => Some(super::mask::masked(self.weight_fn.clone(), m)?),
            None => self.weight_fn.clone(),
        };
        let t = Transforms {
            weight_fn,
            ..Transforms::default()
        };
        matmul(x, &w, b.as_ref(), &t)
    }
}

/// `Layer `path``: how a layer's errors name it.
pub(crate) fn layer_op(layer: &str, path: &str) -> String {
    format!("{layer} `{path}`")
}

/// A layer's input must have `n` features on its last axis: an error
/// naming the layer (`op`), the input's shape and the features expected,
/// before the layer's product would fail with the operands' shapes only
/// (typically a model compiled with an example input of the wrong width).
pub(crate) fn check_features(op: &str, x: &Tensor, n: usize) -> Result<()> {
    if x.shape().last() == Some(&n) {
        return Ok(());
    }
    Err(Error::shapes(
        op,
        [x.shape()],
        format!(
            "the input must have {n} features on its last axis, got shape {:?}",
            x.shape()
        ),
    ))
}

/// A size of a layer, which must be at least 1 (a layer of 0 units traces
/// and trains, but learns nothing).
pub(crate) fn size_at_least_one(op: &str, name: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::invalid(
            op,
            format!("{name} must be at least 1, got 0"),
        ));
    }
    Ok(())
}

/// A decay per step `exp(−dt/τ)`, which must lie in (0, 1): 1 or more means
/// a negative or infinite time constant (or a step of 0 or less), 0 a time
/// constant of 0, NaN one that is not a number.
pub(crate) fn decay_open(op: &str, name: &str, decay: f64) -> Result<()> {
    if decay > 0.0 && decay < 1.0 {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "{name} = exp(-dt/tau) must be in (0, 1), got {decay} (tau and dt must be finite and > 0)"
        ),
    ))
}

/// Draw the parameter `what` of the layer `op` (allocation errors name both).
pub(crate) fn draw(
    init: &mut Init,
    op: &str,
    what: &str,
    how: &Initializer,
    shape: &[usize],
) -> Result<Tensor> {
    let dt = init.dtype();
    how.try_draw(&format!("{op}: {what}"), shape, dt, init.rng())
}

/// Concatenate on the last axis.
pub(crate) fn cat_last(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::ops::concat(&[a.clone(), b.clone()], a.ndim().saturating_sub(1))
}

/// braintrace's `nn.GRUCell`: three `Linear`s `Wz`, `Wr`, `Wh` over
/// `[x, h]` (orthogonal weights, zero biases) and the hidden state `<path>/h`.
///
/// ```text
/// z = σ([x, h] Wz + bz);  r = σ([x, h] Wr + br)
/// h̃ = tanh([x, r ⊙ h] Wh + bh);  h' = (1 − z) ⊙ h + z ⊙ h̃
/// ```
#[derive(Clone, Debug)]
pub struct GruCell {
    /// The cell's path (`rnn`).
    pub path: String,
    /// Update gate.
    pub wz: Linear,
    /// Reset gate.
    pub wr: Linear,
    /// Candidate.
    pub wh: Linear,
    /// Hidden size.
    pub n_rec: usize,
}

impl GruCell {
    /// A GRU cell with `n_in` inputs and `n_rec` hidden units.
    pub fn new(path: &str, n_in: usize, n_rec: usize) -> Self {
        let lin = |name: &str| {
            Linear::new(&join_path(path, name), n_in.saturating_add(n_rec), n_rec)
                .with_init(Initializer::orthogonal())
        };
        GruCell {
            path: path.to_string(),
            wz: lin("Wz"),
            wr: lin("Wr"),
            wh: lin("Wh"),
            n_rec,
        }
    }
    /// The hidden state's path (`<path>/h`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "h")
    }
}

impl Model for GruCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        size_at_least_one(&layer_op("GruCell", &self.path), "n_rec", self.n_rec)?;
        self.wz.init(init)?;
        self.wr.init(init)?;
        self.wh.init(init)?;
        init.hidden(&self.hidden_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let n_in = self.wz.n_in.saturating_sub(self.n_rec);
        check_features(&layer_op("GruCell", &self.path), x, n_in)?;
        let h = ctx.hidden(&self.hidden_path())?;
        let xh = cat_last(x, &h)?;
        let z = self.wz.step(ctx, &xh)?.sigmoid()?;
        let r = self.wr.step(ctx, &xh)?.sigmoid()?;
        let xrh = cat_last(x, &r.mul(&h)?)?;
        let hc = self.wh.step(ctx, &xrh)?.tanh()?;
        // (1 - z) h + z hc. `1 - z` rounds as `-z + 1` does, and is the
        // form the sigmoid's derivative `z (1 - z)` uses, so a staged step
        // computes it once.
        let one_minus_z = z.rsub_scalar(1.0)?;
        let h_new = one_minus_z.mul(&h)?.add(&z.mul(&hc)?)?;
        ctx.set_hidden(&self.hidden_path(), h_new.clone())?;
        Ok(h_new)
    }
}

/// braintrace's `nn.LeakyRateReadout`: `r' = exp(−dt/τ)·r + x @ W` (no bias),
/// a bare parameter `<path>/W` (Kaiming normal) and the hidden state
/// `<path>/r`, which is also the output.
#[derive(Clone, Debug)]
pub struct LeakyRateReadout {
    /// The layer's path (`readout`).
    pub path: String,
    /// Input features.
    pub n_in: usize,
    /// Output features.
    pub n_out: usize,
    /// The decay per step, `exp(−dt/τ)`.
    pub decay: f64,
    /// Weight initialiser.
    pub w_init: Initializer,
}

impl LeakyRateReadout {
    /// A readout with time constant `tau` and step `dt` (same unit).
    pub fn new(path: &str, n_in: usize, n_out: usize, tau: f64, dt: f64) -> Self {
        LeakyRateReadout {
            path: path.to_string(),
            n_in,
            n_out,
            decay: (-dt / tau).exp(),
            w_init: Initializer::kaiming_normal(),
        }
    }
    /// The weight key (`<path>/W`).
    pub fn weight_key(&self) -> String {
        join_path(&self.path, "W")
    }
    /// The hidden state's path (`<path>/r`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "r")
    }
}

impl Model for LeakyRateReadout {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("LeakyRateReadout", &self.path);
        size_at_least_one(&op, "n_in", self.n_in)?;
        size_at_least_one(&op, "n_out", self.n_out)?;
        decay_open(&op, "decay", self.decay)?;
        let w = draw(init, &op, "W", &self.w_init, &[self.n_in, self.n_out])?;
        init.param(&self.weight_key(), None, w)?;
        init.hidden(&self.hidden_path(), &[self.n_out])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let r = ctx.hidden(&self.hidden_path())?;
        let w = ctx.param(&self.weight_key())?;
        let y = matmul(x, &w, None, &Transforms::default())?;
        let r_new = r.mul_scalar(self.decay)?.add(&y)?;
        ctx.set_hidden(&self.hidden_path(), r_new.clone())?;
        Ok(r_new)
    }
}

/// A trainable element-wise parameter seen through `etp_elemwise`:
/// `step` ignores its input and returns `weight_fn(w)` (for example a
/// per-unit decay `σ(raw)`). A bare parameter at `path`.
#[derive(Clone, Debug)]
pub struct ElementWiseParam {
    /// The parameter's key.
    pub path: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// The transform applied inside the primitive.
    pub weight_fn: Option<ElemFn>,
    /// Initialiser.
    pub init: Initializer,
}

impl ElementWiseParam {
    /// A parameter of `shape` at `path`, transformed by `weight_fn`.
    pub fn new(path: &str, shape: &[usize], weight_fn: Option<ElemFn>) -> Self {
        ElementWiseParam {
            path: path.to_string(),
            shape: shape.to_vec(),
            weight_fn,
            init: Initializer::Normal { std: 1.0 },
        }
    }
    /// `weight_fn(w)` as one `etp_elemwise` equation.
    pub fn value(&self, ctx: &StepCtx) -> Result<Tensor> {
        element_wise(&ctx.param(&self.path)?, self.weight_fn.clone())
    }
}

impl Model for ElementWiseParam {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("ElementWiseParam", &self.path);
        for (i, &d) in self.shape.iter().enumerate() {
            size_at_least_one(&op, &format!("dimension {i} of {:?}", self.shape), d)?;
        }
        let w = draw(init, &op, "weight", &self.init, &self.shape)?;
        init.param(&self.path, None, w)
    }
    fn step(&self, ctx: &mut StepCtx, _x: &Tensor) -> Result<Tensor> {
        self.value(ctx)
    }
}

/// Two models in sequence: `second` reads what `first` returns (a recurrent
/// cell followed by its readout). Parameters and hidden states are declared
/// in that order.
#[derive(Clone, Debug)]
pub struct Chain<A, B> {
    /// The first model (a cell).
    pub first: A,
    /// The second model (a readout of the first's output).
    pub second: B,
}

impl<A, B> Chain<A, B> {
    /// `first`, then `second`.
    pub fn new(first: A, second: B) -> Self {
        Chain { first, second }
    }
}

impl<A: Model, B: Model> Model for Chain<A, B> {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.first.init(init)?;
        self.second.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = self.first.step(ctx, x)?;
        self.second.step(ctx, &h)
    }
    /// The inputs go to `first` (a cell of several inputs), its output to
    /// `second`.
    fn step_inputs(&self, ctx: &mut StepCtx, xs: &[Tensor]) -> Result<Tensor> {
        let h = self.first.step_inputs(ctx, xs)?;
        self.second.step(ctx, &h)
    }
}
