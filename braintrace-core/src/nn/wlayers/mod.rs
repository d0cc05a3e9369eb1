//! braintrace 0.2.6's layers with a weight structure, each on an ETP
//! primitive so the learning compiler finds their hidden–parameter
//! relations: [`SignedWLinear`] (Dale's law) and [`ScaledWsLinear`]
//! (weight standardisation) on `etp_mm` with a weight transform,
//! [`SparseLinear`] on `etp_sp_mm`, [`Lora`] on `etp_lora_mm`, and
//! [`Conv1d`], [`Conv2d`], [`Conv3d`] on `etp_conv`; [`Linear`]'s weight
//! mask is [`Linear::with_mask`]. Parameter keys are braintrace's.
//!
//! Every constructor checks its sizes and hyperparameters and returns an
//! [`Error`] naming the layer and the value.
//!
//! [`Linear`]: super::Linear
//! [`Linear::with_mask`]: super::Linear::with_mask

mod conv;
mod sparse_lora;
#[cfg(test)]
mod tests;

pub use conv::{Conv1d, Conv2d, Conv3d, ConvLayer};
pub use sparse_lora::{Lora, SparseLinear};

use super::init::Initializer;
use super::layers::{check_features, draw, layer_op};
pub(crate) use super::mask::{check_mask, content_name, masked};
use crate::error::{Error, Result};
use crate::etp::ElemFn;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::prims::{matmul, Transforms};
use crate::tensor::Tensor;

/// `<Layer>::new`: a layer size must be positive.
pub(crate) fn check_size(layer: &str, name: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            format!("{layer}::new"),
            format!("`{name}` = 0: a layer size must be positive"),
        ));
    }
    Ok(())
}

/// braintrace's `nn.SignedWLinear`: `y = x @ (|W| ⊙ sign)` without a bias
/// (`|W|` when there is no sign), through `etp_mm` with the transform
/// `w ↦ |w| ⊙ sign` (derivative `sign(w) ⊙ sign`). A bare parameter
/// `<path>/weight` `(n_in, n_out)`, Kaiming normal as braintrace's.
///
/// Dale's law: with [`SignedWLinear::dale`], the first `n_exc` inputs
/// (presynaptic units, rows) are excitatory (+1), the others inhibitory (−1).
#[derive(Clone, Debug)]
pub struct SignedWLinear {
    /// The layer's path.
    pub path: String,
    /// Input features.
    pub n_in: usize,
    /// Output features.
    pub n_out: usize,
    /// Weight initialiser (Kaiming normal).
    pub w_init: Initializer,
    /// braintrace's `w_sign`, broadcast to `(n_in, n_out)`.
    pub w_sign: Option<Tensor>,
}

impl SignedWLinear {
    /// A layer of `n_in → n_out` with all effective weights positive.
    pub fn new(path: &str, n_in: usize, n_out: usize) -> Result<Self> {
        check_size("SignedWLinear", "n_in", n_in)?;
        check_size("SignedWLinear", "n_out", n_out)?;
        Ok(SignedWLinear {
            path: path.to_string(),
            n_in,
            n_out,
            w_init: Initializer::kaiming_normal(),
            w_sign: None,
        })
    }
    /// With braintrace's `w_sign` (broadcasting to `(n_in, n_out)`, finite).
    pub fn with_sign(mut self, sign: &Tensor) -> Result<Self> {
        let op = layer_op("SignedWLinear", &self.path);
        check_mask(&op, "w_sign", sign, &[self.n_in, self.n_out])?;
        self.w_sign = Some(sign.clone());
        Ok(self)
    }
    /// Dale's law: inputs `0..n_exc` excitatory, `n_exc..n_in` inhibitory
    /// (`w_sign` of shape `(n_in, 1)`).
    pub fn dale(self, n_exc: usize) -> Result<Self> {
        if n_exc > self.n_in {
            return Err(Error::invalid(
                layer_op("SignedWLinear", &self.path),
                format!(
                    "n_exc = {n_exc} excitatory inputs, but there are only n_in = {}",
                    self.n_in
                ),
            ));
        }
        let s = (0..self.n_in)
            .map(|i| if i < n_exc { 1.0 } else { -1.0 })
            .collect();
        let sign = Tensor::from_vec(s, &[self.n_in, 1])?;
        self.with_sign(&sign)
    }
    /// With another weight initialiser.
    pub fn with_init(mut self, w_init: Initializer) -> Self {
        self.w_init = w_init;
        self
    }
    /// The weight's key (`<path>/weight`, a bare parameter).
    pub fn weight_key(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The transform `w ↦ |w| ⊙ sign` inside `etp_mm`.
    fn transform(&self) -> Result<ElemFn> {
        let abs = ElemFn::new("abs", Tensor::abs, Tensor::sign);
        match &self.w_sign {
            Some(s) => masked(Some(abs), s),
            None => Ok(abs),
        }
    }
}

impl Model for SignedWLinear {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("SignedWLinear", &self.path);
        let w = draw(init, &op, "weight", &self.w_init, &[self.n_in, self.n_out])?;
        init.param(&self.weight_key(), None, w)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        check_features(&layer_op("SignedWLinear", &self.path), x, self.n_in)?;
        let w = ctx.param(&self.weight_key())?;
        let t = Transforms {
            weight_fn: Some(self.transform()?),
            ..Transforms::default()
        };
        matmul(x, &w, None, &t)
    }
}

/// braintrace's `nn.ScaledWSLinear`: weight standardisation per output
/// (column), with braintrace's `eps` (default `1e-4`), optional `w_mask`
/// `(n_in, 1)`, and the gain and bias applied after the product:
///
/// ```text
/// Ŵ[:, o] = (W[:, o] − mean(W[:, o])) / sqrt(max(n_in · var(W[:, o]), eps))
/// y = (x @ (Ŵ ⊙ mask)) ⊙ gain + b
/// ```
///
/// The standardisation is the weight transform of `etp_mm` (not
/// element-wise: [`ElemFn::mapping`], so the trace and gradient are the raw
/// weight's and the equation runs its rules). `gain` and `bias` act outside
/// the primitive, as in braintrace: they have no relation (non-temporal).
/// One parameter state `<path>/weight` with the leaves `weight` `(n_in,
/// n_out)` (Kaiming normal), `bias` `(n_out,)` (zeros) and `gain` `(1,
/// n_out)` (ones).
#[derive(Clone, Debug)]
pub struct ScaledWsLinear {
    /// The layer's path.
    pub path: String,
    /// Input features.
    pub n_in: usize,
    /// Output features.
    pub n_out: usize,
    /// Whether there is a bias leaf.
    pub bias: bool,
    /// Whether there is a gain leaf (braintrace's `ws_gain`).
    pub gain: bool,
    /// The variance floor (braintrace's `eps`).
    pub eps: f64,
    /// braintrace's `w_mask`, broadcasting to `(n_in, 1)`.
    pub w_mask: Option<Tensor>,
    /// Weight initialiser (Kaiming normal).
    pub w_init: Initializer,
}

impl ScaledWsLinear {
    /// A layer of `n_in → n_out` with bias and gain, `eps = 1e-4`.
    pub fn new(path: &str, n_in: usize, n_out: usize) -> Result<Self> {
        check_size("ScaledWsLinear", "n_in", n_in)?;
        check_size("ScaledWsLinear", "n_out", n_out)?;
        Ok(ScaledWsLinear {
            path: path.to_string(),
            n_in,
            n_out,
            bias: true,
            gain: true,
            eps: 1e-4,
            w_mask: None,
            w_init: Initializer::kaiming_normal(),
        })
    }
    /// With another `eps` (finite and > 0).
    pub fn with_eps(mut self, eps: f64) -> Result<Self> {
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid(
                layer_op("ScaledWsLinear", &self.path),
                format!("eps must be finite and > 0, got {eps}"),
            ));
        }
        self.eps = eps;
        Ok(self)
    }
    /// With braintrace's `w_mask` (broadcasting to `(n_in, 1)`, finite).
    pub fn with_mask(mut self, mask: &Tensor) -> Result<Self> {
        let op = layer_op("ScaledWsLinear", &self.path);
        check_mask(&op, "w_mask", mask, &[self.n_in, 1])?;
        self.w_mask = Some(mask.clone());
        Ok(self)
    }
    /// Without a bias leaf.
    pub fn without_bias(mut self) -> Self {
        self.bias = false;
        self
    }
    /// Without a gain leaf (braintrace's `ws_gain=False`).
    pub fn without_gain(mut self) -> Self {
        self.gain = false;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of leaf `leaf` (`weight`, `bias`, `gain`).
    pub fn key(&self, leaf: &str) -> String {
        join_path(&self.state_path(), leaf)
    }
    /// The standardisation (times the mask) as a transform of `etp_mm`.
    fn transform(&self) -> Result<ElemFn> {
        let eps = self.eps;
        let mask = self.w_mask.clone();
        let name = format!(
            "weight_standardization(eps={eps:e}{})",
            match &mask {
                Some(m) => format!(", mask{}", content_name(m)?),
                None => String::new(),
            }
        );
        let m2 = mask.clone();
        Ok(ElemFn::mapping(
            &name,
            move |w| {
                let s = standardize(w, eps)?;
                match &mask {
                    Some(m) => s.mul(&m.cast(w.dtype())?),
                    None => Ok(s),
                }
            },
            move |w, g| {
                let g = match &m2 {
                    Some(m) => g.mul(&m.cast(w.dtype())?)?,
                    None => g.clone(),
                };
                standardize_vjp(w, &g, eps)
            },
        ))
    }
}

/// `(w − mean₀ w) / sqrt(max(n · var₀ w, eps))` over the input axis 0 of a
/// `(n, o)` weight, as brainstate's `weight_standardization`.
fn standardize(w: &Tensor, eps: f64) -> Result<Tensor> {
    let n = w.shape().first().copied().unwrap_or(1) as f64;
    let c = w.sub(&w.mean(&[0])?.expand_dims(0)?)?;
    let var = c.square()?.mean(&[0])?.expand_dims(0)?;
    c.div(&var.mul_scalar(n)?.max_scalar(eps)?.sqrt()?)
}

/// The pullback of [`standardize`] (per column, `r = max(n·v, eps)^(−1/2)`,
/// `c = w − mean w`): `r (g − mean g) − [n·v > eps] r³ c Σᵢ gᵢ cᵢ`. Written
/// with batchable ops, so the D-RTRL per-sample terms can map it.
fn standardize_vjp(w: &Tensor, g: &Tensor, eps: f64) -> Result<Tensor> {
    let n = w.shape().first().copied().unwrap_or(1) as f64;
    let c = w.sub(&w.mean(&[0])?.expand_dims(0)?)?;
    let nv = c.square()?.mean(&[0])?.expand_dims(0)?.mul_scalar(n)?;
    let r = nv.max_scalar(eps)?.sqrt()?.reciprocal()?;
    let active = nv.gt(&nv.scalar_like(eps))?.cast(w.dtype())?;
    let ga = g.ndim() - w.ndim();
    let gc = g.sub(&g.mean(&[ga])?.expand_dims(ga)?)?.mul(&r)?;
    let sgc = g.mul(&c)?.sum(&[ga])?.expand_dims(ga)?;
    gc.sub(&c.mul(&r.mul(&r)?.mul(&r)?.mul(&active)?)?.mul(&sgc)?)
}

impl Model for ScaledWsLinear {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("ScaledWsLinear", &self.path);
        let w = draw(init, &op, "weight", &self.w_init, &[self.n_in, self.n_out])?;
        init.param(&self.state_path(), Some("weight"), w)?;
        if self.bias {
            let b = Tensor::zeros(&[self.n_out], init.dtype());
            init.param(&self.state_path(), Some("bias"), b)?;
        }
        if self.gain {
            let g = Tensor::ones(&[1, self.n_out], init.dtype());
            init.param(&self.state_path(), Some("gain"), g)?;
        }
        Ok(())
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        check_features(&layer_op("ScaledWsLinear", &self.path), x, self.n_in)?;
        let w = ctx.param(&self.key("weight"))?;
        let t = Transforms {
            weight_fn: Some(self.transform()?),
            ..Transforms::default()
        };
        let mut y = matmul(x, &w, None, &t)?;
        if self.gain {
            y = y.mul(&ctx.param(&self.key("gain"))?.reshape(&[self.n_out])?)?;
        }
        if self.bias {
            y = y.add(&ctx.param(&self.key("bias"))?)?;
        }
        Ok(y)
    }
}
