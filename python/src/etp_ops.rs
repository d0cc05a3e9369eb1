//! More ETP primitives for models written in Python — sparse
//! (`etp_sp_mm`, braintrace's `sparse_matmul`), LoRA (`etp_lora_mm`,
//! `lora_matmul`) and convolution (`etp_conv`, `conv`) — and the spike
//! logic of `SpikeBitwise` (`spike_bitwise`). Each picks the batched or
//! unbatched primitive from `x`'s rank, as the library's user-facing ops
//! do.

use crate::array::tensor_in;
use crate::error::IntoPyResult;
use crate::tensor::{elem_fn, PyTensor};
use braintrace_core::nn::{BitwiseOp, SpikeBitwise};
use braintrace_core::ops::{ConvPadding, ConvParams};
use braintrace_core::prims::{conv, lora_matmul, sparse_matmul, CsrStructure, Transforms};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

/// A CSR structure from an object with `indptr`, `indices` and `shape`
/// (a scipy.sparse CSR matrix, brainevent's CSR) or a tuple
/// `(indptr, indices, shape)`.
fn csr_in(s: &Bound<'_, PyAny>) -> PyResult<CsrStructure> {
    let (indptr, indices, shape) = if let Ok(t) = s.cast::<PyTuple>() {
        if t.len() != 3 {
            return Err(PyValueError::new_err(
                "`sparse_mat`: a tuple (indptr, indices, shape)",
            ));
        }
        (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?)
    } else if s.hasattr("indptr")? && s.hasattr("indices")? && s.hasattr("shape")? {
        (
            s.getattr("indptr")?,
            s.getattr("indices")?,
            s.getattr("shape")?,
        )
    } else {
        return Err(PyTypeError::new_err(
            "`sparse_mat`: expected a CSR matrix (indptr, indices, shape attributes) or a tuple (indptr, indices, shape)",
        ));
    };
    let ints = |v: &Bound<'_, PyAny>, what: &str| -> PyResult<Vec<usize>> {
        v.try_iter()?
            .map(|i| i?.extract::<usize>())
            .collect::<PyResult<_>>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "`sparse_mat`: {what} must be non-negative integers"
                ))
            })
    };
    let (indptr, indices, shape) = (
        ints(&indptr, "indptr")?,
        ints(&indices, "indices")?,
        ints(&shape, "shape")?,
    );
    if shape.len() != 2 {
        return Err(PyValueError::new_err(format!(
            "`sparse_mat`: shape must be (n_in, n_out), got {shape:?}"
        )));
    }
    CsrStructure::new((shape[0], shape[1]), indptr, indices)
        .map_err(|e| PyValueError::new_err(format!("`sparse_mat`: {e}")))
}

/// `x @ M(weight_fn(weight)) (+ bias_fn(bias))` as the ETP primitive
/// `etp_sp_mm` (x `(B, n_in)`) or `etp_sp_mv` (x `(n_in,)`): `M` the
/// `(n_in, n_out)` matrix whose non-zeros, in the CSR order of
/// `sparse_mat`, are the trainable values `weight` `(nnz,)`. `sparse_mat`
/// is a CSR matrix (anything with `indptr`, `indices`, `shape`, e.g.
/// scipy's) or a tuple `(indptr, indices, shape)`; its values are ignored.
#[pyfunction]
#[pyo3(signature = (x, weight, sparse_mat, bias=None, weight_fn=None, bias_fn=None))]
pub fn etp_sp_mm(
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    sparse_mat: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    weight_fn: Option<&str>,
    bias_fn: Option<&str>,
) -> PyResult<PyTensor> {
    let x = tensor_in(x, "x")?;
    let w = tensor_in(weight, "weight")?;
    let s = csr_in(sparse_mat)?;
    let b = bias.map(|b| tensor_in(b, "bias")).transpose()?;
    let t = Transforms {
        weight_fn: elem_fn(weight_fn)?,
        bias_fn: elem_fn(bias_fn)?,
        ..Transforms::default()
    };
    Ok(PyTensor::new(
        sparse_matmul(&x, &w, &s, b.as_ref(), &t).py()?,
    ))
}

/// LoRA `alpha · x @ b_fn(B) @ a_fn(A) (+ bias_fn(bias))` as the ETP
/// primitive `etp_lora_mm` (x `(batch, I)`) or `etp_lora_mv` (x `(I,)`),
/// with `B` `(I, r)` and `A` `(r, O)` both trainable.
#[pyfunction]
#[pyo3(name = "etp_lora_mm", signature = (x, B, A, alpha=1.0, bias=None, b_fn=None, a_fn=None, bias_fn=None))]
#[allow(non_snake_case, clippy::too_many_arguments)]
pub fn etp_lora_mm(
    x: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    alpha: f64,
    bias: Option<&Bound<'_, PyAny>>,
    b_fn: Option<&str>,
    a_fn: Option<&str>,
    bias_fn: Option<&str>,
) -> PyResult<PyTensor> {
    if !alpha.is_finite() {
        return Err(PyValueError::new_err(format!(
            "`alpha`: must be finite, got {alpha}"
        )));
    }
    let x = tensor_in(x, "x")?;
    let (b, a) = (tensor_in(B, "B")?, tensor_in(A, "A")?);
    let bias = bias.map(|c| tensor_in(c, "bias")).transpose()?;
    let t = Transforms {
        b_fn: elem_fn(b_fn)?,
        a_fn: elem_fn(a_fn)?,
        bias_fn: elem_fn(bias_fn)?,
        ..Transforms::default()
    };
    Ok(PyTensor::new(
        lora_matmul(&x, &b, &a, alpha, bias.as_ref(), &t).py()?,
    ))
}

/// `"SAME"`, `"VALID"` or explicit `(lo, hi)` pairs per spatial axis.
fn padding_in(p: &Bound<'_, PyAny>) -> PyResult<ConvPadding> {
    if let Ok(s) = p.cast::<PyString>() {
        return match s.extract::<String>()?.to_ascii_uppercase().as_str() {
            "SAME" => Ok(ConvPadding::Same),
            "VALID" => Ok(ConvPadding::Valid),
            other => Err(PyValueError::new_err(format!(
                "`padding`: {other:?}; use \"SAME\", \"VALID\" or (lo, hi) pairs per spatial axis"
            ))),
        };
    }
    p.extract::<Vec<(i64, i64)>>()
        .map(ConvPadding::Explicit)
        .map_err(|_| {
            PyTypeError::new_err(
                "`padding`: expected \"SAME\", \"VALID\" or a sequence of (lo, hi) pairs",
            )
        })
}

/// Convolution as the ETP primitive `etp_conv`: `x` with its batch axis
/// (channel-first `(N, C, *spatial)` unless `dimension_numbers` says
/// otherwise), `kernel` `(O, I / groups, *window)` (or per
/// `dimension_numbers`, a triple of layout strings such as
/// `("NHWC", "HWIO", "NHWC")`), `bias` `(O,)` added per output channel.
/// `strides`, `lhs_dilation`, `rhs_dilation`: one int per spatial axis (1
/// by default); `padding`: `"SAME"` (default, as braintrace), `"VALID"` or
/// `(lo, hi)` pairs; `kernel_fn` / `bias_fn` transform the trainables.
#[pyfunction]
#[pyo3(signature = (x, kernel, bias=None, strides=None, padding=None, lhs_dilation=None, rhs_dilation=None, feature_group_count=1, dimension_numbers=None, kernel_fn=None, bias_fn=None))]
#[allow(clippy::too_many_arguments)]
pub fn etp_conv(
    x: &Bound<'_, PyAny>,
    kernel: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    strides: Option<Vec<usize>>,
    padding: Option<&Bound<'_, PyAny>>,
    lhs_dilation: Option<Vec<usize>>,
    rhs_dilation: Option<Vec<usize>>,
    feature_group_count: usize,
    dimension_numbers: Option<(String, String, String)>,
    kernel_fn: Option<&str>,
    bias_fn: Option<&str>,
) -> PyResult<PyTensor> {
    let x = tensor_in(x, "x")?;
    let k = tensor_in(kernel, "kernel")?;
    let b = bias.map(|b| tensor_in(b, "bias")).transpose()?;
    if x.ndim() < 3 {
        return Err(PyValueError::new_err(format!(
            "`x`: etp_conv needs a batch, a channel and at least one spatial axis; got shape {:?}",
            x.shape()
        )));
    }
    let d = x.ndim() - 2;
    let per_axis = |v: Option<Vec<usize>>, what: &str| -> PyResult<Vec<usize>> {
        match v {
            None => Ok(vec![1; d]),
            Some(v) if v.len() == d => Ok(v),
            Some(v) => Err(PyValueError::new_err(format!(
                "`{what}`: one value per spatial axis ({d}), got {v:?}"
            ))),
        }
    };
    if feature_group_count == 0 {
        return Err(PyValueError::new_err(
            "`feature_group_count`: must be at least 1",
        ));
    }
    let mut c = ConvParams::default_for(d)
        .with_strides(&per_axis(strides, "strides")?)
        .with_padding(match padding {
            None => ConvPadding::Same,
            Some(p) => padding_in(p)?,
        })
        .with_lhs_dilation(&per_axis(lhs_dilation, "lhs_dilation")?)
        .with_rhs_dilation(&per_axis(rhs_dilation, "rhs_dilation")?)
        .with_groups(feature_group_count);
    if let Some((l, r, o)) = dimension_numbers {
        c = c.with_dimension_numbers(&l, &r, &o);
    }
    let t = Transforms {
        weight_fn: elem_fn(kernel_fn)?,
        bias_fn: elem_fn(bias_fn)?,
        ..Transforms::default()
    };
    Ok(PyTensor::new(conv(&x, &k, b.as_ref(), &c, &t).py()?))
}

/// Two spike trains combined element-wise in arithmetic, so surrogate
/// gradients flow (brainstate's `SpikeBitwise`): `op` `"add"` (`x + y`),
/// `"and"` (`x·y`), `"iand"` (`(1 − x)·y`), `"or"` (`x + y − x·y`) or
/// `"xor"` (`x + y − 2·x·y`).
#[pyfunction]
#[pyo3(signature = (x, y, op="add"))]
pub fn spike_bitwise(x: &Bound<'_, PyAny>, y: &Bound<'_, PyAny>, op: &str) -> PyResult<PyTensor> {
    let op = BitwiseOp::from_name(op).py()?;
    let (x, y) = (tensor_in(x, "x")?, tensor_in(y, "y")?);
    Ok(PyTensor::new(SpikeBitwise::new(op).apply(&x, &y).py()?))
}
