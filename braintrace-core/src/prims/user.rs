//! User-facing ops: they pick the batched or unbatched built-in from `x`'s
//! rank.

use super::conv::etp_conv;
use super::dense::{etp_mm, etp_mv};
use super::elemwise::etp_elemwise;
use super::lora::{etp_lora_mm, etp_lora_mv};
use super::sparse::{etp_sp_mm, etp_sp_mv, CsrStructure};
use crate::error::{Error, Result};
use crate::etp::{ElemFn, ParamType, ParamValue, Params};
use crate::ops::{ConvPadding, ConvParams};
use crate::tensor::Tensor;

/// Optional element-wise transforms applied to trainables before use
/// (`None` = identity). `weight_fn`/`bias_fn` serve dense, sparse and
/// element-wise ops; conv reads `weight_fn` as its `kernel_fn`; LoRA reads
/// `b_fn`, `a_fn` and `bias_fn`.
#[derive(Clone, Debug, Default)]
pub struct Transforms {
    /// Transform of the weight (conv: the kernel).
    pub weight_fn: Option<ElemFn>,
    /// Transform of the bias.
    pub bias_fn: Option<ElemFn>,
    /// LoRA: transform of `lora_b`.
    pub b_fn: Option<ElemFn>,
    /// LoRA: transform of `lora_a`.
    pub a_fn: Option<ElemFn>,
}

/// Whether `x` is the unbatched (`Ok(false)`) or batched (`Ok(true)`) form.
fn batched(op: &str, x: &Tensor, unbatched_rank: usize) -> Result<bool> {
    match x.ndim() {
        r if r == unbatched_rank => Ok(false),
        r if r == unbatched_rank + 1 => Ok(true),
        _ => Err(Error::shapes(
            op,
            [x.shape()],
            format!(
                "x must have rank {unbatched_rank} (unbatched) or {} (batched)",
                unbatched_rank + 1
            ),
        )),
    }
}

/// `x @ f(W) (+ g(b))` through `etp_mv` (x `(I,)`) or `etp_mm` (x `(B, I)`).
///
/// ```
/// use braintrace_core::{prims::{matmul, Transforms}, Tensor, DType};
/// let y = matmul(&Tensor::ones(&[2, 3], DType::F64), &Tensor::ones(&[3, 4], DType::F64), None, &Transforms::default())?;
/// assert_eq!(y.shape(), &[2, 4]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn matmul(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    t: &Transforms,
) -> Result<Tensor> {
    let (wf, bf) = (t.weight_fn.clone(), t.bias_fn.clone());
    if batched("matmul", x, 1)? {
        etp_mm(x, weight, bias, bias.is_some(), wf, bf)
    } else {
        etp_mv(x, weight, bias, bias.is_some(), wf, bf)
    }
}

/// Sparse `x @ M(f(w)) (+ g(b))` through `etp_sp_mv` / `etp_sp_mm`.
pub fn sparse_matmul(
    x: &Tensor,
    values: &Tensor,
    structure: &CsrStructure,
    bias: Option<&Tensor>,
    t: &Transforms,
) -> Result<Tensor> {
    let (s, wf, bf) = (structure.clone(), t.weight_fn.clone(), t.bias_fn.clone());
    if batched("sparse_matmul", x, 1)? {
        etp_sp_mm(x, values, bias, s, bias.is_some(), wf, bf)
    } else {
        etp_sp_mv(x, values, bias, s, bias.is_some(), wf, bf)
    }
}

/// LoRA `α x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))` through `etp_lora_mv` / `etp_lora_mm`.
pub fn lora_matmul(
    x: &Tensor,
    lora_b: &Tensor,
    lora_a: &Tensor,
    alpha: f64,
    bias: Option<&Tensor>,
    t: &Transforms,
) -> Result<Tensor> {
    let rank = lora_b.shape().last().copied().unwrap_or(0);
    let (b_fn, a_fn, bias_fn) = (t.b_fn.clone(), t.a_fn.clone(), t.bias_fn.clone());
    if batched("lora_matmul", x, 1)? {
        etp_lora_mm(
            x,
            lora_b,
            lora_a,
            bias,
            alpha,
            rank,
            bias.is_some(),
            b_fn,
            a_fn,
            bias_fn,
        )
    } else {
        etp_lora_mv(
            x,
            lora_b,
            lora_a,
            bias,
            alpha,
            rank,
            bias.is_some(),
            b_fn,
            a_fn,
            bias_fn,
        )
    }
}

/// `y = f(w)` through `etp_elemwise` (identity when `weight_fn` is `None`).
pub fn element_wise(weight: &Tensor, weight_fn: Option<ElemFn>) -> Result<Tensor> {
    etp_elemwise(weight, weight_fn)
}

/// The typed params of an `etp_conv` equation for these conv settings.
pub fn conv_typed_params(
    c: &ConvParams,
    has_bias: bool,
    t: &Transforms,
) -> super::conv::etp_conv::Params {
    let padding = match &c.padding {
        ConvPadding::Same => ParamValue::Str("SAME".into()),
        ConvPadding::Valid => ParamValue::Str("VALID".into()),
        ConvPadding::Explicit(v) => v.to_param(),
    };
    let opt = |v: &Vec<usize>| if v.is_empty() { None } else { Some(v.clone()) };
    super::conv::etp_conv::Params {
        has_bias,
        strides: Some(c.strides.clone()),
        padding,
        lhs_dilation: opt(&c.lhs_dilation),
        rhs_dilation: opt(&c.rhs_dilation),
        feature_group_count: c.feature_group_count,
        batch_group_count: 1,
        dimension_numbers: c
            .dimension_numbers
            .as_ref()
            .map(|d| vec![d.lhs.clone(), d.rhs.clone(), d.out.clone()]),
        kernel_fn: t.weight_fn.clone(),
        bias_fn: t.bias_fn.clone(),
    }
}

/// The params map of an `etp_conv` equation (for `bind` and the rules).
pub fn conv_params(c: &ConvParams, has_bias: bool, t: &Transforms) -> Params {
    conv_typed_params(c, has_bias, t).to_params()
}

/// Convolution through `etp_conv`; `x` must carry the batch axis
/// (rank = spatial dims + 2).
pub fn conv(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    c: &ConvParams,
    t: &Transforms,
) -> Result<Tensor> {
    let d = c.strides.len();
    if x.ndim() != d + 2 {
        return Err(Error::shapes(
            "conv",
            [x.shape()],
            format!(
                "x must have rank {} (batch, channel and {d} spatial axes)",
                d + 2
            ),
        ));
    }
    let p = conv_typed_params(c, bias.is_some(), t);
    etp_conv(
        x,
        kernel,
        bias,
        p.has_bias,
        p.strides,
        p.padding,
        p.lhs_dilation,
        p.rhs_dilation,
        p.feature_group_count,
        p.batch_group_count,
        p.dimension_numbers,
        p.kernel_fn,
        p.bias_fn,
    )
}
