//! Helpers shared by the built-in primitives: param reading, trace shapes,
//! and the small tensor idioms the rules repeat.

use crate::error::Result;
use crate::etp::{AvalMap, ElemFn, Params, TensorMap};
use crate::tensor::{Aval, DType, Tensor};

/// An optional element-wise transform param (`None`, a built-in name, or an `ElemFn`).
pub(crate) fn fn_param(p: &Params, op: &str, key: &str) -> Result<Option<ElemFn>> {
    p.get_or::<Option<ElemFn>>(op, key, None)
}

/// `shape ++ [s]`.
pub(crate) fn with_state(shape: &[usize], s: usize) -> Vec<usize> {
    let mut v = shape.to_vec();
    v.push(s);
    v
}

/// The trace dtype: the widest float among the operands.
pub(crate) fn trace_dtype(x: Option<&Aval>, y: &Aval, ws: &AvalMap) -> DType {
    let any64 = x
        .iter()
        .map(|a| a.dtype())
        .chain([y.dtype()])
        .chain(ws.values().map(|a| a.dtype()))
        .any(|d| d == DType::F64);
    if any64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `h[..., None, :]`: a y-shaped factor spread over the input axis.
pub(crate) fn over_inputs(h: &Tensor) -> Result<Tensor> {
    h.expand_dims(h.ndim().saturating_sub(1))
}

/// `x^T h` summed over the batch for 2-D `x`, `outer(x, h)` for 1-D.
pub(crate) fn xt_h(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.mul(&h.expand_dims(0)?)
    } else {
        x.t()?.matmul(h)
    }
}

/// Sum a y-shaped factor over the batch axis when it has one.
pub(crate) fn sum_batch(h: &Tensor, batched: bool) -> Result<Tensor> {
    if batched {
        h.sum(&[0])
    } else {
        Ok(h.clone())
    }
}

/// Look up a leaf of a rule's map argument.
pub(crate) fn leaf<'a>(m: &'a TensorMap, op: &str, key: &str) -> Result<&'a Tensor> {
    m.get(key).ok_or_else(|| {
        crate::Error::etp(
            op,
            "rule",
            format!(
                "expected a `{key}` entry, got keys {:?}",
                m.keys().collect::<Vec<_>>()
            ),
        )
    })
}
