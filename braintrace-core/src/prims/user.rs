//! User-facing ops: they pick the batched or unbatched built-in from `x`'s
//! rank.

use super::conv::etp_conv;
use super::dense::{etp_mm, etp_mv};
use super::elemwise::etp_elemwise;
use super::grouped::{etp_gmm, etp_gmv};
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

/// Grouped (block-diagonal) `y[..., g, :] = x[..., g, :] @ f(W)[g] (+ g(b)[g])`
/// through `etp_gmv` (x `(G, K)`) or `etp_gmm` (x `(B, G, K)`); `W (G, K, N)`,
/// `b (G, N)`: braintrace's `grouped_matmul`.
///
/// ```
/// use braintrace_core::{prims::{grouped_matmul, Transforms}, Tensor, DType};
/// let x = Tensor::ones(&[5, 2, 3], DType::F64); // (batch, groups, in)
/// let w = Tensor::ones(&[2, 3, 4], DType::F64); // (groups, in, out)
/// let y = grouped_matmul(&x, &w, None, &Transforms::default())?;
/// assert_eq!(y.shape(), &[5, 2, 4]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn grouped_matmul(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    t: &Transforms,
) -> Result<Tensor> {
    let (wf, bf) = (t.weight_fn.clone(), t.bias_fn.clone());
    if batched("grouped_matmul", x, 2)? {
        etp_gmm(x, weight, bias, bias.is_some(), wf, bf)
    } else {
        etp_gmv(x, weight, bias, bias.is_some(), wf, bf)
    }
}

/// The rows `weight_fn(table)[indices]`, `(*indices.shape, D)`, through
/// `etp_emb` (indices `(B,)`) or `etp_emb_v` (a scalar index): braintrace's
/// `embedding`. `indices` is an integer tensor or a float one holding
/// integers (a learner casts its inputs to the model's float dtype); a
/// concrete index outside `[0, V)` is an error naming it. The primitive
/// receives the indices one-hot encoded (see the `prims::embedding` module).
///
/// ```
/// use braintrace_core::{prims::embedding, Tensor};
/// let table = Tensor::from_vec((0..12).map(f64::from).collect(), &[4, 3])?;
/// let tokens = Tensor::from_vec_typed(vec![0i64, 2], &[2])?;
/// let y = embedding(&tokens, &table, None)?;
/// assert_eq!(y.to_vec_f64()?, vec![0., 1., 2., 6., 7., 8.]);
/// assert!(embedding(&Tensor::from_vec_typed(vec![4i64], &[1])?, &table, None).is_err());
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn embedding(indices: &Tensor, table: &Tensor, weight_fn: Option<ElemFn>) -> Result<Tensor> {
    super::embedding::lookup_named("embedding", indices, table, weight_fn)
}
