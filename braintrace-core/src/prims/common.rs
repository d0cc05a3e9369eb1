//! Helpers shared by the built-in primitives: trace shapes, bias checks
//! and the small tensor idioms the rules repeat.

use crate::error::Result;
use crate::etp::{AvalMap, TensorMap};
use crate::tensor::{Aval, DType, Tensor};

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

/// `has_bias` must agree with whether a bias operand was passed.
pub(crate) fn check_bias(op: &str, has_bias: bool, bias: Option<&Tensor>) -> Result<()> {
    if has_bias != bias.is_some() {
        return Err(crate::Error::etp(
            op,
            "bind",
            format!(
                "param has_bias = {has_bias} but {} bias operand was given",
                if bias.is_some() { "a" } else { "no" }
            ),
        ));
    }
    Ok(())
}

/// Deterministic values in [-1, 1) for unit tests.
#[cfg(test)]
pub(crate) fn test_tensor(shape: &[usize], seed: u64) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape).expect("shape matches")
}
