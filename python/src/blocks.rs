//! The layers of issue 36 as native layers: activations and `PReLU`,
//! norms, dropout, pooling and reshaping (`nn::activation`, `nn::norm`,
//! `nn::dropout`, `nn::pool`), the weight-structured layers (`nn::wlayers`:
//! `SignedWLinear`, `ScaledWsLinear`, `SparseLinear`, `Lora`,
//! `Conv1d/2d/3d`), `GroupedLinear` and `Embedding`. `Layer`'s static
//! constructors call these; `braintrace_rs.nn` wraps them with braintrace's
//! (brainstate's) class names.

use crate::error::IntoPyResult;
use crate::model::{initializer, layer, Layer};
use braintrace_core::nn::{
    Activation, Conv1d, Conv2d, Conv3d, Dropout, Embedding, Flatten, GroupNorm, GroupedLinear,
    LayerNorm, Lora, PRelu, Pool, PoolKind, RmsNorm, ScaledWsLinear, SignedWLinear, SparseLinear,
    Unflatten,
};
use braintrace_core::ops::ConvPadding;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An optional initialiser given as `(name, scale)`.
pub type InitArg = Option<(String, Option<f64>)>;

/// The activation `kind` (brainstate's class name or jax's function name,
/// case-insensitive) with its hyperparameters from `params` (`alpha`,
/// `approximate`, `negative_slope`, `min_val`, `max_val`, `lambd`,
/// `threshold`, `value`, `axis` (or `dim`), `b`); brainstate's defaults for
/// the others. An unknown kind or parameter, or a bad value, is a
/// `ValueError`.
pub fn activation(
    py: Python<'_>,
    kind: &str,
    params: Option<&Bound<'_, PyDict>>,
) -> PyResult<Layer> {
    use Activation::*;
    // `Threshold` has no defaults in brainstate, so `by_name` leaves it out.
    let threshold = Threshold {
        threshold: 0.0,
        value: 0.0,
    };
    let mut act = match kind.to_ascii_lowercase().as_str() {
        "threshold" => Some(threshold),
        _ => Activation::by_name(kind),
    }
    .ok_or_else(|| PyValueError::new_err(format!("`kind`: unknown activation {kind:?}")))?;
    let given = match params {
        Some(d) => d.copy()?,
        None => PyDict::new(py),
    };
    let take_f = |name: &str, v: &mut f64| -> PyResult<()> {
        if let Some(x) = given.get_item(name)? {
            *v = x.extract()?;
            given.del_item(name)?;
        }
        Ok(())
    };
    match &mut act {
        Elu { alpha } | Celu { alpha } => take_f("alpha", alpha)?,
        LeakyRelu { negative_slope } => take_f("negative_slope", negative_slope)?,
        Hardtanh { min_val, max_val } => {
            take_f("min_val", min_val)?;
            take_f("max_val", max_val)?;
        }
        Hardshrink { lambd } | Softshrink { lambd } => take_f("lambd", lambd)?,
        Threshold { threshold, value } => {
            take_f("threshold", threshold)?;
            take_f("value", value)?;
        }
        Squareplus { b } => take_f("b", b)?,
        Gelu { approximate } => {
            if let Some(x) = given.get_item("approximate")? {
                *approximate = x.extract()?;
                given.del_item("approximate")?;
            }
        }
        Softmax { axis } | LogSoftmax { axis } | Softmin { axis } | Glu { axis } => {
            for name in ["axis", "dim"] {
                if let Some(x) = given.get_item(name)? {
                    if !x.is_none() {
                        *axis = x.extract()?;
                    }
                    given.del_item(name)?;
                }
            }
        }
        _ => {}
    }
    if !given.is_empty() {
        let names: Vec<String> = given.keys().extract()?;
        return Err(PyValueError::new_err(format!(
            "activation {kind:?}: unknown parameter(s) {names:?}"
        )));
    }
    act.validate().py()?;
    Ok(layer(act, "Activation"))
}

/// brainstate's `PReLU`: `num_parameters` slopes (key `name/weight`)
/// starting at `init`.
pub fn prelu(num_parameters: usize, init: f64, name: &str) -> Layer {
    let mut p = PRelu::new(name, num_parameters);
    p.init = init;
    layer(p, "PReLU")
}

/// `LayerNorm`, `RMSNorm` or `GroupNorm` (`kind`) over `features` on the
/// last axis.
pub fn norm(
    kind: &str,
    features: usize,
    name: &str,
    eps: f64,
    num_groups: usize,
    use_scale: bool,
    use_bias: bool,
) -> PyResult<Layer> {
    Ok(match kind {
        "LayerNorm" => layer(
            LayerNorm::new(name, features)
                .with_eps(eps)
                .with_affine(use_scale, use_bias),
            "LayerNorm",
        ),
        "RMSNorm" => {
            let mut n = RmsNorm::new(name, features).with_eps(eps);
            n.use_scale = use_scale;
            layer(n, "RMSNorm")
        }
        "GroupNorm" => {
            let mut n = GroupNorm::new(name, features, num_groups).with_eps(eps);
            n.use_scale = use_scale;
            n.use_bias = use_bias;
            layer(n, "GroupNorm")
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "`kind`: unknown norm {other:?}; one of LayerNorm, RMSNorm, GroupNorm"
            )))
        }
    })
}

/// brainstate's `Dropout`: keep probability `prob` in `(0, 1]`, the mask
/// hashed with `seed`; training until `Layer.training` is set off.
pub fn dropout(prob: f64, seed: u64) -> PyResult<Layer> {
    let d = Dropout::keep(prob, seed).py()?;
    let mut l = layer(d.clone(), "Dropout");
    l.dropout = Some(d);
    Ok(l)
}

fn arr<const D: usize>(what: &str, kind: &str, v: &[usize]) -> PyResult<[usize; D]> {
    v.try_into().map_err(|_| {
        PyValueError::new_err(format!("{kind}: `{what}` must have {D} entries, got {v:?}"))
    })
}

fn pool_d<const D: usize>(
    k: PoolKind,
    kind: &'static str,
    kernel: &[usize],
    stride: &[usize],
    padding: usize,
) -> PyResult<Layer> {
    let p = Pool::<D>::new(k, arr("kernel_size", kind, kernel)?)
        .with_stride(arr("stride", kind, stride)?)
        .with_padding(padding);
    p.validate().py()?;
    Ok(layer(p, kind))
}

/// A pooling layer by kind (`MaxPool1d`, `MaxPool2d`, `AvgPool1d`,
/// `AvgPool2d`) over the spatial axes before the channel axis; `stride`
/// defaults to the kernel, `padding` positions on both sides.
pub fn pool(
    kind: &str,
    kernel_size: Vec<usize>,
    stride: Option<Vec<usize>>,
    padding: usize,
) -> PyResult<Layer> {
    let s = stride.unwrap_or_else(|| kernel_size.clone());
    let (k, s) = (&kernel_size[..], &s[..]);
    match kind {
        "MaxPool1d" => pool_d::<1>(PoolKind::Max, "MaxPool1d", k, s, padding),
        "MaxPool2d" => pool_d::<2>(PoolKind::Max, "MaxPool2d", k, s, padding),
        "AvgPool1d" => pool_d::<1>(PoolKind::Avg, "AvgPool1d", k, s, padding),
        "AvgPool2d" => pool_d::<2>(PoolKind::Avg, "AvgPool2d", k, s, padding),
        other => Err(PyValueError::new_err(format!(
            "`kind`: unknown pooling {other:?}; one of MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d"
        ))),
    }
}

/// brainstate's `Flatten` of a per-sample rank `in_rank`.
pub fn flatten(in_rank: usize, start_axis: isize, end_axis: isize) -> PyResult<Layer> {
    let f = Flatten::new(in_rank).with_axes(start_axis, end_axis);
    // The axes are checked by `init`; check them here too.
    let mut probe = braintrace_core::learn::Init::new(braintrace_core::DType::F64, 0);
    braintrace_core::learn::Model::init(&f, &mut probe).py()?;
    Ok(layer(f, "Flatten"))
}

/// brainstate's `Unflatten`: axis `axis` split into `sizes`.
pub fn unflatten(axis: isize, sizes: Vec<usize>) -> Layer {
    layer(Unflatten::new(axis, &sizes), "Unflatten")
}

/// braintrace's `SignedWLinear` (bare weight `name/weight`), with an
/// optional `w_sign` array broadcasting to `(in_size, out_size)`.
pub fn signed_w_linear(
    in_size: usize,
    out_size: usize,
    name: &str,
    w_sign: Option<&Bound<'_, PyAny>>,
    w_init: InitArg,
) -> PyResult<Layer> {
    let mut l = SignedWLinear::new(name, in_size, out_size).py()?;
    if let Some(s) = w_sign {
        l = l.with_sign(&crate::array::tensor_in(s, "w_sign")?).py()?;
    }
    if let Some((n, s)) = w_init {
        l = l.with_init(initializer(&n, s)?);
    }
    Ok(layer(l, "SignedWLinear"))
}

/// braintrace's `ScaledWSLinear` (state `name/weight`: `weight`, `bias`,
/// `gain`).
#[allow(clippy::too_many_arguments)]
pub fn scaled_ws_linear(
    in_size: usize,
    out_size: usize,
    name: &str,
    bias: bool,
    ws_gain: bool,
    eps: f64,
    w_mask: Option<&Bound<'_, PyAny>>,
    w_init: InitArg,
) -> PyResult<Layer> {
    let mut l = ScaledWsLinear::new(name, in_size, out_size)
        .py()?
        .with_eps(eps)
        .py()?;
    if let Some(m) = w_mask {
        l = l.with_mask(&crate::array::tensor_in(m, "w_mask")?).py()?;
    }
    if !bias {
        l = l.without_bias();
    }
    if !ws_gain {
        l = l.without_gain();
    }
    if let Some((n, s)) = w_init {
        l.w_init = initializer(&n, s)?;
    }
    Ok(layer(l, "ScaledWSLinear"))
}

/// braintrace's `SparseLinear` holding the non-zero entries of the dense
/// `(n_in, n_out)` matrix `dense` (state `name/weight`: `weight` `(nnz,)`
/// and, with `b_init`, `bias`).
pub fn sparse_linear(dense: &Bound<'_, PyAny>, name: &str, b_init: InitArg) -> PyResult<Layer> {
    let d = crate::array::tensor_in(dense, "spar_mat")?;
    let mut l = SparseLinear::from_dense(name, &d).py()?;
    if let Some((n, s)) = b_init {
        l = l.with_bias(initializer(&n, s)?);
    }
    Ok(layer(l, "SparseLinear"))
}

/// braintrace's `LoRA` without a base module (state `name/weight`:
/// `lora_a`, `lora_b`).
pub fn lora(
    in_features: usize,
    lora_rank: usize,
    out_features: usize,
    name: &str,
    kernel_init: InitArg,
) -> PyResult<Layer> {
    let mut l = Lora::new(name, in_features, lora_rank, out_features).py()?;
    if let Some((n, s)) = kernel_init {
        l = l.with_init(initializer(&n, s)?);
    }
    Ok(layer(l, "LoRA"))
}

/// A convolution's padding: `"SAME"`, `"VALID"`, one int for every side,
/// or `(lo, hi)` pairs per spatial axis.
fn conv_padding(p: &Bound<'_, PyAny>, d: usize) -> PyResult<ConvPadding> {
    if let Ok(s) = p.extract::<String>() {
        return match s.to_ascii_uppercase().as_str() {
            "SAME" => Ok(ConvPadding::Same),
            "VALID" => Ok(ConvPadding::Valid),
            _ => Err(PyValueError::new_err(format!(
                "`padding`: {s:?} is not SAME, VALID, an int or (lo, hi) pairs"
            ))),
        };
    }
    if let Ok(n) = p.extract::<i64>() {
        return Ok(ConvPadding::Explicit(vec![(n, n); d]));
    }
    let pairs: Vec<(i64, i64)> = p.extract().map_err(|_| {
        PyValueError::new_err("`padding`: expected SAME, VALID, an int or (lo, hi) pairs")
    })?;
    Ok(ConvPadding::Explicit(pairs))
}

/// The convolution options of [`conv`].
pub struct ConvOpts<'a, 'py> {
    /// Strides per spatial axis.
    pub stride: Vec<usize>,
    /// The padding (see [`conv_padding`]).
    pub padding: &'a Bound<'py, PyAny>,
    /// Input dilation.
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation.
    pub rhs_dilation: Vec<usize>,
    /// Feature groups.
    pub groups: usize,
    /// Kernel initialiser.
    pub w_init: InitArg,
    /// Bias initialiser (no bias when `None`).
    pub b_init: InitArg,
    /// Channel-first layout.
    pub channel_first: bool,
}

macro_rules! build_conv {
    ($ty:ident, $d:expr, $name:expr, $in:expr, $out:expr, $k:expr, $o:expr) => {{
        let mut c = $ty::new($name, $in, $out, $k).py()?;
        c = c.with_stride(&$o.stride).py()?;
        c = c.with_padding(conv_padding($o.padding, $d)?).py()?;
        c = c.with_lhs_dilation(&$o.lhs_dilation).py()?;
        c = c.with_rhs_dilation(&$o.rhs_dilation).py()?;
        c = c.with_groups($o.groups).py()?;
        if $o.channel_first {
            c = c.channel_first().py()?;
        }
        if let Some((n, s)) = $o.w_init {
            c = c.with_init(initializer(&n, s)?);
        }
        if let Some((n, s)) = $o.b_init {
            c = c.with_bias(initializer(&n, s)?);
        }
        layer(c, stringify!($ty))
    }};
}

/// braintrace's `Conv1d`/`Conv2d`/`Conv3d` (`dims` spatial axes; state
/// `name/weight`: `weight` and, with a bias initialiser, `bias`). Sizes
/// given as one int are repeated over the spatial axes by the caller.
pub fn conv(
    dims: usize,
    in_size: Vec<usize>,
    out_channels: usize,
    kernel_size: Vec<usize>,
    name: &str,
    o: ConvOpts<'_, '_>,
) -> PyResult<Layer> {
    let (i, k) = (&in_size[..], &kernel_size[..]);
    Ok(match dims {
        1 => build_conv!(Conv1d, 1, name, i, out_channels, k, o),
        2 => build_conv!(Conv2d, 2, name, i, out_channels, k, o),
        3 => build_conv!(Conv3d, 3, name, i, out_channels, k, o),
        d => {
            return Err(PyValueError::new_err(format!(
                "`dims`: a convolution has 1, 2 or 3 spatial axes, got {d}"
            )))
        }
    })
}

/// braintrace's `GroupedLinear` (state `name/weight`: `weight` `(G, K, N)`
/// and `bias` `(G, N)`).
pub fn grouped_linear(
    num_groups: usize,
    in_features: usize,
    out_features: usize,
    name: &str,
    bias: bool,
    w_init: InitArg,
) -> PyResult<Layer> {
    let mut l = GroupedLinear::new(name, num_groups, in_features, out_features).py()?;
    if !bias {
        l = l.without_bias();
    }
    if let Some((n, s)) = w_init {
        l = l.with_init(initializer(&n, s)?);
    }
    Ok(layer(l, "GroupedLinear"))
}

/// braintrace's `Embedding` (bare table `name/weight`).
pub fn embedding(num_embeddings: usize, embedding_size: usize, name: &str) -> PyResult<Layer> {
    Ok(layer(
        Embedding::new(name, num_embeddings, embedding_size).py()?,
        "Embedding",
    ))
}
