//! User-facing ops: they pick the batched or unbatched built-in from `x`'s
//! rank and build the params.

use super::register::{
    etp_conv, etp_elemwise, etp_lora_mm, etp_lora_mv, etp_mm, etp_mv, etp_sp_mm, etp_sp_mv,
};
use super::sparse::CsrStructure;
use crate::error::{Error, Result};
use crate::etp::{ElemFn, EtpPrimitive, ParamType, ParamValue, Params};
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

type PrimFn = fn() -> EtpPrimitive;

fn pick(
    op: &str,
    x: &Tensor,
    ranks: (usize, usize),
    prims: (PrimFn, PrimFn),
) -> Result<EtpPrimitive> {
    match x.ndim() {
        r if r == ranks.0 => Ok(prims.0()),
        r if r == ranks.1 => Ok(prims.1()),
        _ => Err(Error::shape(
            op,
            format!("x {:?}", x.shape()),
            format!(
                "x must have rank {} (unbatched) or {} (batched)",
                ranks.0, ranks.1
            ),
        )),
    }
}

fn operands(x: &Tensor, ws: &[&Tensor], bias: Option<&Tensor>) -> Vec<Tensor> {
    let mut v = vec![x.clone()];
    v.extend(ws.iter().map(|w| (*w).clone()));
    v.extend(bias.cloned());
    v
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
    let p = pick("matmul", x, (1, 2), (etp_mv, etp_mm))?;
    let params = Params::new()
        .with("has_bias", bias.is_some())
        .with("weight_fn", t.weight_fn.clone())
        .with("bias_fn", t.bias_fn.clone());
    p.bind(&operands(x, &[weight], bias), &params)
}

/// Sparse `x @ M(f(w)) (+ g(b))` through `etp_sp_mv` / `etp_sp_mm`.
pub fn sparse_matmul(
    x: &Tensor,
    values: &Tensor,
    structure: &CsrStructure,
    bias: Option<&Tensor>,
    t: &Transforms,
) -> Result<Tensor> {
    let p = pick("sparse_matmul", x, (1, 2), (etp_sp_mv, etp_sp_mm))?;
    let params = Params::new()
        .with("sparse_mat", structure.clone())
        .with("has_bias", bias.is_some())
        .with("weight_fn", t.weight_fn.clone())
        .with("bias_fn", t.bias_fn.clone());
    p.bind(&operands(x, &[values], bias), &params)
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
    let p = pick("lora_matmul", x, (1, 2), (etp_lora_mv, etp_lora_mm))?;
    let rank = lora_b.shape().last().copied().unwrap_or(0);
    let params = Params::new()
        .with("alpha", alpha)
        .with("rank", rank)
        .with("has_bias", bias.is_some())
        .with("b_fn", t.b_fn.clone())
        .with("a_fn", t.a_fn.clone())
        .with("bias_fn", t.bias_fn.clone());
    p.bind(&operands(x, &[lora_b, lora_a], bias), &params)
}

/// `y = f(w)` through `etp_elemwise` (identity when `weight_fn` is `None`).
pub fn element_wise(weight: &Tensor, weight_fn: Option<ElemFn>) -> Result<Tensor> {
    etp_elemwise().bind(
        std::slice::from_ref(weight),
        &Params::new().with("weight_fn", weight_fn),
    )
}

/// The params map of an `etp_conv` equation.
pub fn conv_params(c: &ConvParams, has_bias: bool, t: &Transforms) -> Params {
    let padding = match &c.padding {
        ConvPadding::Same => ParamValue::Str("SAME".into()),
        ConvPadding::Valid => ParamValue::Str("VALID".into()),
        ConvPadding::Explicit(v) => v.to_param(),
    };
    let opt = |v: &Vec<usize>| if v.is_empty() { None } else { Some(v.clone()) };
    let mut p = Params::new()
        .with("has_bias", has_bias)
        .with("strides", c.strides.clone())
        .with("lhs_dilation", opt(&c.lhs_dilation))
        .with("rhs_dilation", opt(&c.rhs_dilation))
        .with("feature_group_count", c.feature_group_count)
        .with("batch_group_count", 1usize)
        .with(
            "dimension_numbers",
            c.dimension_numbers
                .as_ref()
                .map(|d| vec![d.lhs.clone(), d.rhs.clone(), d.out.clone()]),
        )
        .with("kernel_fn", t.weight_fn.clone())
        .with("bias_fn", t.bias_fn.clone());
    p.insert("padding", padding);
    p
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
        return Err(Error::shape(
            "conv",
            format!("x {:?}", x.shape()),
            format!(
                "x must have rank {} (batch, channel and {d} spatial axes)",
                d + 2
            ),
        ));
    }
    etp_conv().bind(
        &operands(x, &[kernel], bias),
        &conv_params(c, bias.is_some(), t),
    )
}
