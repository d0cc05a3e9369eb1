//! Normalisation layers with brainstate's definitions, defaults and
//! parameter keys: [`LayerNorm`], [`RmsNorm`], [`GroupNorm`].
//!
//! Statistics follow brainstate's `_compute_stats` with its default
//! `use_fast_variance`: `var = max(0, E[x²] − E[x]²)`, then
//! `y = (x − E[x]) / √(var + ε)` and the optional `scale`/`bias` (applied
//! with plain ops: they have no relation to a hidden state and learn by
//! their in-step gradient, see [`NonTemporal`](crate::learn::NonTemporal)).

use super::layers::{check_features, layer_op, size_at_least_one};
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::tensor::Tensor;

/// ε must be finite and > 0.
fn check_eps(op: &str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!("eps must be finite and > 0, got {eps}"),
    ))
}

/// `(x − μ) / √(var + ε)` over `axes` (kept as size-1 axes), with
/// `var = max(0, E[x²] − μ²)`; without the mean (`use_mean = false`, RMS
/// norm) `μ = 0` and `var = E[x²]`.
pub(crate) fn normalize(x: &Tensor, axes: &[usize], eps: f64, use_mean: bool) -> Result<Tensor> {
    let keep = |t: Tensor| -> Result<Tensor> {
        let mut t = t;
        for &a in axes {
            t = t.expand_dims(a)?;
        }
        Ok(t)
    };
    let mu2 = keep(x.square()?.mean(axes)?)?;
    if !use_mean {
        return x.mul(&mu2.add_scalar(eps)?.sqrt()?.reciprocal()?);
    }
    let mu = keep(x.mean(axes)?)?;
    let var = mu2.sub(&mu.square()?)?.max_scalar(0.0)?;
    x.sub(&mu)?.mul(&var.add_scalar(eps)?.sqrt()?.reciprocal()?)
}

/// Declare the `scale` (ones) and `bias` (zeros) leaves of `state` with
/// `features` entries, as chosen.
fn declare_affine(
    init: &mut Init,
    state: &str,
    features: usize,
    scale: bool,
    bias: bool,
) -> Result<()> {
    let dt = init.dtype();
    if scale {
        init.param(state, Some("scale"), Tensor::ones(&[features], dt))?;
    }
    if bias {
        init.param(state, Some("bias"), Tensor::zeros(&[features], dt))?;
    }
    Ok(())
}

/// Apply `scale` and `bias` leaves of `state`, when declared.
fn apply_affine(ctx: &StepCtx, y: Tensor, state: &str, scale: bool, bias: bool) -> Result<Tensor> {
    let mut y = y;
    if scale {
        y = y.mul(&ctx.param(&join_path(state, "scale"))?)?;
    }
    if bias {
        y = y.add(&ctx.param(&join_path(state, "bias"))?)?;
    }
    Ok(y)
}

/// brainstate's `LayerNorm` over the last (feature) axis: `eps = 1e-6`,
/// a parameter state `<path>/weight` with leaves `scale` (ones) and `bias`
/// (zeros) of shape `(features,)`.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// The layer's path.
    pub path: String,
    /// Features on the last axis.
    pub features: usize,
    /// Added to the variance (> 0).
    pub eps: f64,
    /// A trainable `scale`.
    pub use_scale: bool,
    /// A trainable `bias`.
    pub use_bias: bool,
}

impl LayerNorm {
    /// A layer norm over `features` with brainstate's defaults.
    pub fn new(path: &str, features: usize) -> Self {
        LayerNorm {
            path: path.to_string(),
            features,
            eps: 1e-6,
            use_scale: true,
            use_bias: true,
        }
    }
    /// With another ε.
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// With or without the `scale` and `bias` leaves.
    pub fn with_affine(mut self, scale: bool, bias: bool) -> Self {
        self.use_scale = scale;
        self.use_bias = bias;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    fn check(&self) -> Result<String> {
        let op = layer_op("LayerNorm", &self.path);
        size_at_least_one(&op, "features", self.features)?;
        check_eps(&op, self.eps)?;
        Ok(op)
    }
}

impl Model for LayerNorm {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.check()?;
        declare_affine(
            init,
            &self.state_path(),
            self.features,
            self.use_scale,
            self.use_bias,
        )
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let op = self.check()?;
        check_features(&op, x, self.features)?;
        let y = normalize(x, &[x.ndim() - 1], self.eps, true)?;
        apply_affine(ctx, y, &self.state_path(), self.use_scale, self.use_bias)
    }
}

/// brainstate's `RMSNorm` over the last axis: `y = x / √(E[x²] + ε) · scale`,
/// `eps = 1e-6`, a parameter state `<path>/scale` with the leaf `scale`
/// (ones, `(features,)`).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// The layer's path.
    pub path: String,
    /// Features on the last axis.
    pub features: usize,
    /// Added to the mean square (> 0).
    pub eps: f64,
    /// A trainable `scale`.
    pub use_scale: bool,
}

impl RmsNorm {
    /// An RMS norm over `features` with brainstate's defaults.
    pub fn new(path: &str, features: usize) -> Self {
        RmsNorm {
            path: path.to_string(),
            features,
            eps: 1e-6,
            use_scale: true,
        }
    }
    /// With another ε.
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// The parameter state's path (`<path>/scale`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "scale")
    }
    fn check(&self) -> Result<String> {
        let op = layer_op("RmsNorm", &self.path);
        size_at_least_one(&op, "features", self.features)?;
        check_eps(&op, self.eps)?;
        Ok(op)
    }
}

impl Model for RmsNorm {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.check()?;
        declare_affine(
            init,
            &self.state_path(),
            self.features,
            self.use_scale,
            false,
        )
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let op = self.check()?;
        check_features(&op, x, self.features)?;
        let y = normalize(x, &[x.ndim() - 1], self.eps, false)?;
        apply_affine(ctx, y, &self.state_path(), self.use_scale, false)
    }
}

/// brainstate's `GroupNorm`: the `features` of the last axis in
/// `num_groups` groups of equal size, each normalised over its channels
/// and, as brainstate's default reduction axes, every axis between the
/// first (the batch) and the last; `eps = 1e-6`, `num_groups = 32` by
/// default in brainstate (pass it: it must divide `features`), a parameter
/// state `<path>/weight` with leaves `scale` and `bias` of `(features,)`.
#[derive(Clone, Debug)]
pub struct GroupNorm {
    /// The layer's path.
    pub path: String,
    /// Features (channels) on the last axis.
    pub features: usize,
    /// Number of groups (divides `features`).
    pub num_groups: usize,
    /// Added to the variance (> 0).
    pub eps: f64,
    /// A trainable `scale`.
    pub use_scale: bool,
    /// A trainable `bias`.
    pub use_bias: bool,
}

impl GroupNorm {
    /// A group norm of `features` channels in `num_groups` groups.
    pub fn new(path: &str, features: usize, num_groups: usize) -> Self {
        GroupNorm {
            path: path.to_string(),
            features,
            num_groups,
            eps: 1e-6,
            use_scale: true,
            use_bias: true,
        }
    }
    /// With another ε.
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    fn check(&self) -> Result<String> {
        let op = layer_op("GroupNorm", &self.path);
        size_at_least_one(&op, "features", self.features)?;
        size_at_least_one(&op, "num_groups", self.num_groups)?;
        if !self.features.is_multiple_of(self.num_groups) {
            return Err(Error::invalid(
                &op,
                format!(
                    "num_groups {} does not divide the {} features",
                    self.num_groups, self.features
                ),
            ));
        }
        check_eps(&op, self.eps)?;
        Ok(op)
    }
}

impl Model for GroupNorm {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.check()?;
        declare_affine(
            init,
            &self.state_path(),
            self.features,
            self.use_scale,
            self.use_bias,
        )
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let op = self.check()?;
        check_features(&op, x, self.features)?;
        let n = x.ndim();
        let mut grouped = x.shape()[..n - 1].to_vec();
        grouped.extend([self.num_groups, self.features / self.num_groups]);
        let g = x.reshape(&grouped)?;
        // brainstate: axes 1 .. n-1 of x, and the channels of the group.
        let mut axes: Vec<usize> = (1..n.saturating_sub(1)).collect();
        axes.push(n);
        let y = normalize(&g, &axes, self.eps, true)?.reshape(x.shape())?;
        apply_affine(ctx, y, &self.state_path(), self.use_scale, self.use_bias)
    }
}
