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

/// The op name of a norm layer's errors, after the checks every norm
/// layer makes (`features` >= 1, then the layer's own, then ε).
fn checked(
    kind: &str,
    path: &str,
    features: usize,
    eps: f64,
    more: impl FnOnce(&str) -> Result<()>,
) -> Result<String> {
    let op = layer_op(kind, path);
    size_at_least_one(&op, "features", features)?;
    more(&op)?;
    check_eps(&op, eps)?;
    Ok(op)
}

/// A norm layer's parameter state: its path, the `features` entries of
/// its leaves, and which of `scale` (ones) and `bias` (zeros) it has.
struct Affine {
    state: String,
    features: usize,
    scale: bool,
    bias: bool,
}

impl Affine {
    /// Declare the chosen leaves.
    fn declare(&self, init: &mut Init) -> Result<()> {
        let dt = init.dtype();
        if self.scale {
            init.param(
                &self.state,
                Some("scale"),
                Tensor::ones(&[self.features], dt),
            )?;
        }
        if self.bias {
            init.param(
                &self.state,
                Some("bias"),
                Tensor::zeros(&[self.features], dt),
            )?;
        }
        Ok(())
    }

    /// Apply the chosen leaves to `y`.
    fn apply(&self, ctx: &StepCtx, y: Tensor) -> Result<Tensor> {
        let mut y = y;
        if self.scale {
            y = y.mul(&ctx.param(&join_path(&self.state, "scale"))?)?;
        }
        if self.bias {
            y = y.add(&ctx.param(&join_path(&self.state, "bias"))?)?;
        }
        Ok(y)
    }
}

/// What a norm layer says of itself; its [`Model`] methods (the same for
/// every norm layer, `norm_models!`) check it, declare or apply its
/// [`Affine`] leaves and normalise the features on the last axis.
trait Norm {
    /// Check the configuration; the op name of the layer's errors.
    fn check(&self) -> Result<String>;
    /// The parameter state.
    fn layout(&self) -> Affine;
    /// `x` normalised (before the affine leaves).
    fn normalize(&self, x: &Tensor) -> Result<Tensor>;
}

/// The [`Model`] impl of each [`Norm`] layer listed.
macro_rules! norm_models {
    ($($t:ty),*) => {$(
        impl Model for $t {
            fn init(&self, init: &mut Init) -> Result<()> {
                self.check()?;
                self.layout().declare(init)
            }
            fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
                let op = self.check()?;
                let affine = self.layout();
                check_features(&op, x, affine.features)?;
                let y = self.normalize(x)?;
                affine.apply(ctx, y)
            }
        }
    )*};
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
}

impl Norm for LayerNorm {
    fn check(&self) -> Result<String> {
        checked("LayerNorm", &self.path, self.features, self.eps, |_| Ok(()))
    }
    fn layout(&self) -> Affine {
        Affine {
            state: self.state_path(),
            features: self.features,
            scale: self.use_scale,
            bias: self.use_bias,
        }
    }
    fn normalize(&self, x: &Tensor) -> Result<Tensor> {
        normalize(x, &[x.ndim() - 1], self.eps, true)
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
}

impl Norm for RmsNorm {
    fn check(&self) -> Result<String> {
        checked("RmsNorm", &self.path, self.features, self.eps, |_| Ok(()))
    }
    fn layout(&self) -> Affine {
        Affine {
            state: self.state_path(),
            features: self.features,
            scale: self.use_scale,
            bias: false,
        }
    }
    fn normalize(&self, x: &Tensor) -> Result<Tensor> {
        normalize(x, &[x.ndim() - 1], self.eps, false)
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
}

impl Norm for GroupNorm {
    fn check(&self) -> Result<String> {
        checked("GroupNorm", &self.path, self.features, self.eps, |op| {
            size_at_least_one(op, "num_groups", self.num_groups)?;
            if !self.features.is_multiple_of(self.num_groups) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "num_groups {} does not divide the {} features",
                        self.num_groups, self.features
                    ),
                ));
            }
            Ok(())
        })
    }
    fn layout(&self) -> Affine {
        Affine {
            state: self.state_path(),
            features: self.features,
            scale: self.use_scale,
            bias: self.use_bias,
        }
    }
    fn normalize(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.ndim();
        let mut grouped = x.shape()[..n - 1].to_vec();
        grouped.extend([self.num_groups, self.features / self.num_groups]);
        let g = x.reshape(&grouped)?;
        // brainstate: axes 1 .. n-1 of x, and the channels of the group.
        let mut axes: Vec<usize> = (1..n.saturating_sub(1)).collect();
        axes.push(n);
        normalize(&g, &axes, self.eps, true)?.reshape(x.shape())
    }
}

norm_models!(LayerNorm, RmsNorm, GroupNorm);
