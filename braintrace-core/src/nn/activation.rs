//! Activation functions as functions and as layers, with brainstate's
//! (`brainstate.nn`, which `braintrace.nn` forwards to) definitions and
//! defaults.
//!
//! Every function is written with the core [`Tensor`] ops (the exact GELU
//! with the `erf` op), so `grad`, `vmap`, `jit` and the learning compiler go
//! through it. Branches are `where`s whose untaken side cannot overflow
//! (an ELU's `exp` sees `min(x, 0)`), so their derivatives stay finite.
//!
//! [`Activation`] is the layer: a [`Model`] without
//! parameters or states. [`PRelu`] is the one activation with a trainable
//! parameter.

use super::init::Initializer;
use super::layers::{layer_op, size_at_least_one};
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::ops::where_;
use crate::prims::element_wise;
use crate::tensor::Tensor;

/// `α` of SELU (Klambauer et al. 2017), as jax's `selu`.
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// `λ` (scale) of SELU, as jax's `selu`.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

fn k(x: &Tensor, v: f64) -> Tensor {
    x.scalar_like(v)
}

/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.relu()
}

/// `min(max(x, 0), 6)`.
pub fn relu6(x: &Tensor) -> Result<Tensor> {
    x.relu()?.min_scalar(6.0)
}

/// The logistic sigmoid `1 / (1 + e^−x)`.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    x.sigmoid()
}

/// `tanh x`.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    x.tanh()
}

/// `relu6(x + 3) / 6`.
pub fn hard_sigmoid(x: &Tensor) -> Result<Tensor> {
    relu6(&x.add_scalar(3.0)?)?.div_scalar(6.0)
}

/// `x · hard_sigmoid(x)` (jax's `hard_silu`, brainstate's `Hardswish`).
pub fn hard_swish(x: &Tensor) -> Result<Tensor> {
    x.mul(&hard_sigmoid(x)?)
}

/// `x · σ(x)` (swish).
pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.mul(&x.sigmoid()?)
}

/// `x · tanh(softplus(x))`.
pub fn mish(x: &Tensor) -> Result<Tensor> {
    x.mul(&x.softplus()?.tanh()?)
}

/// `e^x − 1` of the non-positive part, `e^{min(x, 0)} − 1`.
fn expm1_neg(x: &Tensor) -> Result<Tensor> {
    x.min_scalar(0.0)?.exp()?.sub_scalar(1.0)
}

/// `x` for `x > 0`, `α (e^x − 1)` otherwise.
pub fn elu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    let neg = expm1_neg(x)?.mul_scalar(alpha)?;
    where_(&x.gt(&k(x, 0.0))?, x, &neg)
}

/// `max(x, 0) + α (e^{min(x, 0)/α} − 1)`.
pub fn celu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    let neg = x
        .min_scalar(0.0)?
        .div_scalar(alpha)?
        .exp()?
        .sub_scalar(1.0)?
        .mul_scalar(alpha)?;
    x.max_scalar(0.0)?.add(&neg)
}

/// `λ · elu(x, α)` with SELU's `α` and `λ`.
pub fn selu(x: &Tensor) -> Result<Tensor> {
    elu(x, SELU_ALPHA)?.mul_scalar(SELU_SCALE)
}

/// GELU: exact `x (1 + erf(x/√2)) / 2`, or (`approximate`) the tanh form
/// `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub fn gelu(x: &Tensor, approximate: bool) -> Result<Tensor> {
    if approximate {
        let s = (2.0 / std::f64::consts::PI).sqrt();
        let inner = x.add(&x.pow_scalar(3.0)?.mul_scalar(0.044715)?)?;
        let cdf = inner
            .mul_scalar(s)?
            .tanh()?
            .add_scalar(1.0)?
            .mul_scalar(0.5)?;
        x.mul(&cdf)
    } else {
        let e = x.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?.erf()?;
        x.mul(&e.add_scalar(1.0)?)?.div_scalar(2.0)
    }
}

/// `x` for `x ≥ 0`, `negative_slope · x` otherwise.
pub fn leaky_relu(x: &Tensor, negative_slope: f64) -> Result<Tensor> {
    where_(&x.ge(&k(x, 0.0))?, x, &x.mul_scalar(negative_slope)?)
}

/// `log σ(x) = −softplus(−x)`.
pub fn log_sigmoid(x: &Tensor) -> Result<Tensor> {
    x.neg()?.softplus()?.neg()
}

/// `log(1 + e^x)` (stable).
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    x.softplus()
}

/// `x / (|x| + 1)`.
pub fn soft_sign(x: &Tensor) -> Result<Tensor> {
    x.div(&x.abs()?.add_scalar(1.0)?)
}

/// `x` clipped to `[min_val, max_val]`.
pub fn hard_tanh(x: &Tensor, min_val: f64, max_val: f64) -> Result<Tensor> {
    let lo = where_(&x.lt(&k(x, min_val))?, &k(x, min_val), x)?;
    where_(&x.gt(&k(x, max_val))?, &k(x, max_val), &lo)
}

/// `x` where `|x| > λ`, else 0.
pub fn hard_shrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    let zero = k(x, 0.0);
    let inner = where_(&x.lt(&k(x, -lambd))?, x, &zero)?;
    where_(&x.gt(&k(x, lambd))?, x, &inner)
}

/// `x − λ` above `λ`, `x + λ` below `−λ`, else 0.
pub fn soft_shrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    let zero = k(x, 0.0);
    let inner = where_(&x.lt(&k(x, -lambd))?, &x.add_scalar(lambd)?, &zero)?;
    where_(&x.gt(&k(x, lambd))?, &x.sub_scalar(lambd)?, &inner)
}

/// `x − tanh x`.
pub fn tanh_shrink(x: &Tensor) -> Result<Tensor> {
    x.sub(&x.tanh()?)
}

/// `x` where `x > threshold`, else `value`.
pub fn threshold(x: &Tensor, threshold: f64, value: f64) -> Result<Tensor> {
    where_(&x.gt(&k(x, threshold))?, x, &k(x, value))
}

/// `x` for `x ≥ 0`, `a · x` otherwise (`a` broadcasts against `x`).
pub fn prelu(x: &Tensor, a: &Tensor) -> Result<Tensor> {
    where_(&x.ge(&k(x, 0.0))?, x, &x.mul(a)?)
}

/// `(x + √(x² + b)) / 2`.
pub fn squareplus(x: &Tensor, b: f64) -> Result<Tensor> {
    x.add(&x.square()?.add_scalar(b)?.sqrt()?)?.div_scalar(2.0)
}

/// 0 below −1, `x` above 1, `(x + 1)² / 4` between.
pub fn sparse_plus(x: &Tensor) -> Result<Tensor> {
    let mid = x.add_scalar(1.0)?.square()?.div_scalar(4.0)?;
    let upper = where_(&x.ge(&k(x, 1.0))?, x, &mid)?;
    where_(&x.le(&k(x, -1.0))?, &k(x, 0.0), &upper)
}

/// `clip(x + 1, 0, 2) / 2`.
pub fn sparse_sigmoid(x: &Tensor) -> Result<Tensor> {
    hard_tanh(x, -1.0, 1.0)?.add_scalar(1.0)?.mul_scalar(0.5)
}

/// `axis` (negative counts from the end) of a tensor of rank `ndim`.
fn resolve_axis(op: &str, x: &Tensor, axis: isize) -> Result<usize> {
    let n = x.ndim() as isize;
    let a = if axis < 0 { axis + n } else { axis };
    if a < 0 || a >= n || x.shape()[a as usize] == 0 {
        return Err(Error::shapes(
            op,
            [x.shape()],
            format!("axis {axis} must name a non-empty axis of the input"),
        ));
    }
    Ok(a as usize)
}

/// The largest entry along `axis` (kept as size 1), cut from the
/// derivative: it only shifts the exponentials.
fn axis_max(x: &Tensor, axis: usize) -> Result<Tensor> {
    let c = x.shape()[axis];
    let mut m = x.slice_axis(axis, 0, 1)?;
    for j in 1..c {
        m = m.maximum(&x.slice_axis(axis, j, j + 1)?)?;
    }
    m.stop_gradient()
}

/// `log softmax` along `axis`: `x − max − log Σ e^{x − max}`.
pub fn log_softmax(x: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = resolve_axis("log_softmax", x, axis)?;
    let z = x.sub(&axis_max(x, ax)?)?;
    let lse = z.exp()?.sum(&[ax])?.log()?.expand_dims(ax)?;
    z.sub(&lse)
}

/// `softmax` along `axis`: `e^{x − max} / Σ e^{x − max}`.
pub fn softmax(x: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = resolve_axis("softmax", x, axis)?;
    let e = x.sub(&axis_max(x, ax)?)?.exp()?;
    e.div(&e.sum(&[ax])?.expand_dims(ax)?)
}

/// `softmax(−x)` along `axis`.
pub fn softmin(x: &Tensor, axis: isize) -> Result<Tensor> {
    softmax(&x.neg()?, axis)
}

/// Gated linear unit: `x` split in halves `a`, `b` along `axis`, `a · σ(b)`.
pub fn glu(x: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = resolve_axis("glu", x, axis)?;
    let n = x.shape()[ax];
    if !n.is_multiple_of(2) {
        return Err(Error::shapes(
            "glu",
            [x.shape()],
            format!("axis {axis} has {n} entries, which do not split into two halves"),
        ));
    }
    let a = x.slice_axis(ax, 0, n / 2)?;
    let b = x.slice_axis(ax, n / 2, n)?;
    a.mul(&b.sigmoid()?)
}

/// An activation as a layer (brainstate's class names in brackets; their
/// defaults in [`Activation::by_name`]). It declares no parameters or
/// states; its `step` applies the function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `x` (`Identity`).
    Identity,
    /// [`relu`] (`ReLU`).
    Relu,
    /// [`relu6`] (`ReLU6`).
    Relu6,
    /// [`sigmoid`] (`Sigmoid`).
    Sigmoid,
    /// [`tanh`] (`Tanh`).
    Tanh,
    /// [`hard_sigmoid`] (`Hardsigmoid`).
    HardSigmoid,
    /// [`hard_swish`] (`Hardswish`).
    HardSwish,
    /// [`silu`] (`SiLU`).
    Silu,
    /// [`mish`] (`Mish`).
    Mish,
    /// [`elu`] (`ELU`, `alpha = 1`).
    Elu {
        /// Scale of the negative part.
        alpha: f64,
    },
    /// [`celu`] (`CELU`, `alpha = 1`; must not be 0).
    Celu {
        /// Scale and temperature of the negative part.
        alpha: f64,
    },
    /// [`selu`] (`SELU`).
    Selu,
    /// [`gelu`] (`GELU`, exact by default as brainstate's layer).
    Gelu {
        /// The tanh approximation instead of `erf`.
        approximate: bool,
    },
    /// [`leaky_relu`] (`LeakyReLU`, `negative_slope = 0.01`).
    LeakyRelu {
        /// Slope for `x < 0`.
        negative_slope: f64,
    },
    /// [`log_sigmoid`] (`LogSigmoid`).
    LogSigmoid,
    /// [`softplus`] (`Softplus`).
    Softplus,
    /// [`soft_sign`] (`Softsign`).
    Softsign,
    /// [`hard_tanh`] (`Hardtanh`, `[-1, 1]`).
    Hardtanh {
        /// Lower bound.
        min_val: f64,
        /// Upper bound (at least `min_val`).
        max_val: f64,
    },
    /// [`hard_shrink`] (`Hardshrink`, `lambd = 0.5`).
    Hardshrink {
        /// The dead zone's half width (≥ 0).
        lambd: f64,
    },
    /// [`soft_shrink`] (`Softshrink`, `lambd = 0.5`).
    Softshrink {
        /// The dead zone's half width (≥ 0).
        lambd: f64,
    },
    /// [`tanh_shrink`] (`Tanhshrink`).
    Tanhshrink,
    /// [`threshold`] (`Threshold`).
    Threshold {
        /// Values at or below it are replaced.
        threshold: f64,
        /// The replacement.
        value: f64,
    },
    /// [`softmax`] (`Softmax`, `axis = -1`).
    Softmax {
        /// The axis (negative from the end).
        axis: isize,
    },
    /// [`log_softmax`] (`LogSoftmax`, `axis = -1`).
    LogSoftmax {
        /// The axis (negative from the end).
        axis: isize,
    },
    /// [`softmin`] (`Softmin`, `axis = -1`).
    Softmin {
        /// The axis (negative from the end).
        axis: isize,
    },
    /// [`glu`] (`GLU`, `axis = -1`): halves the axis.
    Glu {
        /// The axis split in two (negative from the end).
        axis: isize,
    },
    /// [`squareplus`] (jax's `squareplus`, `b = 4`).
    Squareplus {
        /// The smoothing constant (≥ 0).
        b: f64,
    },
    /// [`sparse_plus`] (jax's `sparse_plus`).
    SparsePlus,
    /// [`sparse_sigmoid`] (jax's `sparse_sigmoid`).
    SparseSigmoid,
}

impl Activation {
    /// The layer of brainstate's class name (`"GELU"`, `"LeakyReLU"`, also
    /// jax's function names such as `"gelu"`, `"silu"`, case-insensitive),
    /// with brainstate's defaults; `None` for an unknown name.
    pub fn by_name(name: &str) -> Option<Activation> {
        use Activation::*;
        Some(match name.to_ascii_lowercase().replace('_', "").as_str() {
            "identity" => Identity,
            "relu" => Relu,
            "relu6" => Relu6,
            "sigmoid" => Sigmoid,
            "tanh" => Tanh,
            "hardsigmoid" => HardSigmoid,
            "hardswish" | "hardsilu" => HardSwish,
            "silu" | "swish" => Silu,
            "mish" => Mish,
            "elu" => Elu { alpha: 1.0 },
            "celu" => Celu { alpha: 1.0 },
            "selu" => Selu,
            "gelu" => Gelu { approximate: false },
            "leakyrelu" => LeakyRelu {
                negative_slope: 0.01,
            },
            "logsigmoid" => LogSigmoid,
            "softplus" => Softplus,
            "softsign" => Softsign,
            "hardtanh" => Hardtanh {
                min_val: -1.0,
                max_val: 1.0,
            },
            "hardshrink" => Hardshrink { lambd: 0.5 },
            "softshrink" => Softshrink { lambd: 0.5 },
            "tanhshrink" => Tanhshrink,
            "softmax" => Softmax { axis: -1 },
            "logsoftmax" => LogSoftmax { axis: -1 },
            "softmin" => Softmin { axis: -1 },
            "glu" => Glu { axis: -1 },
            "squareplus" => Squareplus { b: 4.0 },
            "sparseplus" => SparsePlus,
            "sparsesigmoid" => SparseSigmoid,
            _ => return None,
        })
    }

    /// Check the hyperparameters (a CELU `alpha` of 0 divides by 0, a
    /// `Hardtanh` whose `min_val > max_val`, a negative shrink width or
    /// squareplus `b`, a value that is not finite): an error naming the
    /// activation and the value.
    pub fn validate(&self) -> Result<()> {
        use Activation::*;
        let op = format!("Activation::{self:?}");
        let bad = |what: &str, v: f64, need: &str| {
            Err(Error::invalid(
                &op,
                format!("{what} must be {need}, got {v}"),
            ))
        };
        let finite = |what: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                bad(what, v, "finite")
            }
        };
        match *self {
            Elu { alpha } => finite("alpha", alpha),
            Celu { alpha } => {
                finite("alpha", alpha)?;
                if alpha == 0.0 {
                    return bad("alpha", alpha, "non-zero");
                }
                Ok(())
            }
            LeakyRelu { negative_slope } => finite("negative_slope", negative_slope),
            Hardtanh { min_val, max_val } => {
                finite("min_val", min_val)?;
                finite("max_val", max_val)?;
                if min_val > max_val {
                    return Err(Error::invalid(
                        &op,
                        format!("min_val {min_val} must not exceed max_val {max_val}"),
                    ));
                }
                Ok(())
            }
            Hardshrink { lambd } | Softshrink { lambd } => {
                if lambd.is_finite() && lambd >= 0.0 {
                    Ok(())
                } else {
                    bad("lambd", lambd, "finite and >= 0")
                }
            }
            Threshold { threshold, value } => {
                finite("threshold", threshold)?;
                finite("value", value)
            }
            Squareplus { b } => {
                if b.is_finite() && b >= 0.0 {
                    Ok(())
                } else {
                    bad("b", b, "finite and >= 0")
                }
            }
            _ => Ok(()),
        }
    }

    /// Apply the activation (after [`Activation::validate`]).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        use Activation::*;
        self.validate()?;
        match *self {
            Identity => Ok(x.clone()),
            Relu => relu(x),
            Relu6 => relu6(x),
            Sigmoid => sigmoid(x),
            Tanh => tanh(x),
            HardSigmoid => hard_sigmoid(x),
            HardSwish => hard_swish(x),
            Silu => silu(x),
            Mish => mish(x),
            Elu { alpha } => elu(x, alpha),
            Celu { alpha } => celu(x, alpha),
            Selu => selu(x),
            Gelu { approximate } => gelu(x, approximate),
            LeakyRelu { negative_slope } => leaky_relu(x, negative_slope),
            LogSigmoid => log_sigmoid(x),
            Softplus => softplus(x),
            Softsign => soft_sign(x),
            Hardtanh { min_val, max_val } => hard_tanh(x, min_val, max_val),
            Hardshrink { lambd } => hard_shrink(x, lambd),
            Softshrink { lambd } => soft_shrink(x, lambd),
            Tanhshrink => tanh_shrink(x),
            Threshold {
                threshold: t,
                value,
            } => threshold(x, t, value),
            Softmax { axis } => softmax(x, axis),
            LogSoftmax { axis } => log_softmax(x, axis),
            Softmin { axis } => softmin(x, axis),
            Glu { axis } => glu(x, axis),
            Squareplus { b } => squareplus(x, b),
            SparsePlus => sparse_plus(x),
            SparseSigmoid => sparse_sigmoid(x),
        }
    }
}

impl Model for Activation {
    fn init(&self, _init: &mut Init) -> Result<()> {
        self.validate()
    }
    fn step(&self, _ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}

/// brainstate's `PReLU`: `x` for `x ≥ 0`, `a · x` otherwise, with a
/// trainable slope `a` of shape `(num_parameters,)` (1 shares one slope;
/// else one per feature on the last axis), initialised to `init` (0.25).
/// A bare parameter `<path>/weight`, read through `etp_elemwise` so the
/// learning compiler sees it as a trainable (it has no relation to a hidden
/// state: it learns by its in-step gradient, see
/// [`NonTemporal`](crate::learn::NonTemporal)).
#[derive(Clone, Debug)]
pub struct PRelu {
    /// The layer's path.
    pub path: String,
    /// Number of slopes (1, or the number of features).
    pub num_parameters: usize,
    /// Initial slope.
    pub init: f64,
}

impl PRelu {
    /// A PReLU with `num_parameters` slopes starting at 0.25.
    pub fn new(path: &str, num_parameters: usize) -> Self {
        PRelu {
            path: path.to_string(),
            num_parameters,
            init: 0.25,
        }
    }
    /// The slope's key (`<path>/weight`).
    pub fn weight_key(&self) -> String {
        join_path(&self.path, "weight")
    }
}

impl Model for PRelu {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("PRelu", &self.path);
        size_at_least_one(&op, "num_parameters", self.num_parameters)?;
        if !self.init.is_finite() {
            return Err(Error::invalid(
                &op,
                format!("init must be finite, got {}", self.init),
            ));
        }
        let w = Initializer::Constant(self.init).try_draw(
            &format!("{op}: weight"),
            &[self.num_parameters],
            init.dtype(),
            init.rng(),
        )?;
        init.param(&self.weight_key(), None, w)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let op = layer_op("PRelu", &self.path);
        if self.num_parameters != 1 && x.shape().last() != Some(&self.num_parameters) {
            return Err(Error::shapes(
                &op,
                [x.shape()],
                format!(
                    "{} slopes need {} features on the last axis",
                    self.num_parameters, self.num_parameters
                ),
            ));
        }
        let a = element_wise(&ctx.param(&self.weight_key())?, None)?;
        prelu(x, &a)
    }
}
