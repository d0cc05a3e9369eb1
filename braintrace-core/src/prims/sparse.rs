//! Sparse `etp_sp_mm` / `etp_sp_mv`: `y = x @ M(f(w)) (+ g(b))` where `M`
//! places the `nnz` stored values into a fixed CSR structure (a param,
//! compared by value). In order: structure, impl, rules, initialisers.

use super::common::{fn_param, sum_batch, trace_dtype, with_state};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ParamType, ParamValue, Params, TensorMap};
use crate::ops::index::scatter_add;
use crate::tensor::{Aval, Tensor};
use std::collections::BTreeMap;

/// A fixed CSR sparsity structure: `W[row_of_nnz[p], col_of_nnz[p]] = w[p]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CsrStructure {
    /// `(n_in, n_out)`.
    pub shape: (usize, usize),
    /// CSR row pointers (`n_in + 1`).
    pub indptr: Vec<usize>,
    /// Column of each stored entry, in CSR order.
    pub indices: Vec<usize>,
}

impl CsrStructure {
    /// A structure from CSR arrays; validated.
    pub fn new(shape: (usize, usize), indptr: Vec<usize>, indices: Vec<usize>) -> Result<Self> {
        let bad = |why: String| Error::invalid("CsrStructure", why);
        if indptr.len() != shape.0 + 1
            || indptr.first() != Some(&0)
            || indptr.windows(2).any(|w| w[0] > w[1])
        {
            return Err(bad(format!(
                "indptr {indptr:?} is not a valid row pointer array for {} rows",
                shape.0
            )));
        }
        if *indptr.last().expect("non-empty") != indices.len() {
            return Err(bad(format!(
                "indptr ends at {} but there are {} indices",
                indptr.last().expect("non-empty"),
                indices.len()
            )));
        }
        if let Some(c) = indices.iter().find(|&&c| c >= shape.1) {
            return Err(bad(format!(
                "column index {c} out of range for {} columns",
                shape.1
            )));
        }
        Ok(CsrStructure {
            shape,
            indptr,
            indices,
        })
    }
    /// The structure of the non-zeros of a dense `(n_in, n_out)` matrix given row-major.
    pub fn from_dense_pattern(
        n_in: usize,
        n_out: usize,
        nonzero: impl Fn(usize, usize) -> bool,
    ) -> Self {
        let mut indptr = vec![0];
        let mut indices = Vec::new();
        for r in 0..n_in {
            for c in 0..n_out {
                if nonzero(r, c) {
                    indices.push(c);
                }
            }
            indptr.push(indices.len());
        }
        CsrStructure {
            shape: (n_in, n_out),
            indptr,
            indices,
        }
    }
    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }
    /// Row of each stored entry.
    pub fn rows(&self) -> Vec<usize> {
        (0..self.shape.0)
            .flat_map(|r| std::iter::repeat_n(r, self.indptr[r + 1] - self.indptr[r]))
            .collect()
    }
    fn idx_tensor(v: &[usize]) -> Result<Tensor> {
        Tensor::from_vec_typed(v.iter().map(|&i| i as i64).collect(), &[v.len()])
    }
    /// Rows as an i64 tensor.
    pub fn row_tensor(&self) -> Result<Tensor> {
        Self::idx_tensor(&self.rows())
    }
    /// Columns as an i64 tensor.
    pub fn col_tensor(&self) -> Result<Tensor> {
        Self::idx_tensor(&self.indices)
    }
    /// Flat dense positions `row * n_out + col` as an i64 tensor.
    pub fn flat_tensor(&self) -> Result<Tensor> {
        let flat: Vec<usize> = self
            .rows()
            .iter()
            .zip(&self.indices)
            .map(|(r, c)| r * self.shape.1 + c)
            .collect();
        Self::idx_tensor(&flat)
    }
    /// The dense `(n_in, n_out)` matrix holding `values` (`(nnz,)`).
    pub fn densify(&self, values: &Tensor) -> Result<Tensor> {
        if values.shape() != [self.nnz()] {
            return Err(Error::shape(
                "sparse",
                format!("values {:?}, structure nnz {}", values.shape(), self.nnz()),
                "the weight must hold one value per stored entry",
            ));
        }
        scatter_add(
            &self.flat_tensor()?,
            values,
            0,
            &[self.shape.0 * self.shape.1],
        )?
        .reshape(&[self.shape.0, self.shape.1])
    }
}

fn usize_list(m: &BTreeMap<String, ParamValue>, key: &str) -> Option<Vec<usize>> {
    Vec::<usize>::from_param(m.get(key)?)
}

impl ParamType for CsrStructure {
    fn to_param(&self) -> ParamValue {
        let mut m = BTreeMap::new();
        m.insert("format".into(), ParamValue::Str("csr".into()));
        m.insert("shape".into(), vec![self.shape.0, self.shape.1].to_param());
        m.insert("indptr".into(), self.indptr.to_param());
        m.insert("indices".into(), self.indices.to_param());
        ParamValue::Map(m)
    }
    fn from_param(v: &ParamValue) -> Option<Self> {
        let ParamValue::Map(m) = v else { return None };
        let shape = usize_list(m, "shape")?;
        if shape.len() != 2 {
            return None;
        }
        CsrStructure::new(
            (shape[0], shape[1]),
            usize_list(m, "indptr")?,
            usize_list(m, "indices")?,
        )
        .ok()
    }
}

fn structure(op: &str, p: &Params) -> Result<CsrStructure> {
    p.get::<CsrStructure>(op, "sparse_mat")
}

/// `y = x @ densify(weight_fn(w)) (+ bias_fn(b))`.
pub(crate) fn sparse_impl(op: &str, args: &[Tensor], p: &Params) -> Result<Tensor> {
    let s = structure(op, p)?;
    let w = s
        .densify(&apply_fn(&fn_param(p, op, "weight_fn")?, &args[1])?)
        .map_err(|e| Error::etp(op, "bind", e.to_string()))?;
    let y = args[0]
        .matmul(&w)
        .map_err(|e| Error::etp(op, "bind", e.to_string()))?;
    match args.get(2) {
        Some(b) => y
            .add(&apply_fn(&fn_param(p, op, "bias_fn")?, b)?)
            .map_err(|e| Error::etp(op, "bind", e.to_string())),
        None => Ok(y),
    }
}

/// `yw_to_w`: `trace_w[..., p] *= h[..., col(p)]`, `trace_b *= h`.
pub(crate) fn sparse_yw_to_w(
    op: &str,
    hidden: &Tensor,
    trace: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let s = structure(op, p)?;
    trace
        .iter()
        .map(|(k, t)| {
            let f = if k == "bias" {
                t.mul(hidden)?
            } else {
                t.mul(&hidden.take(&s.col_tensor()?, hidden.ndim() - 1)?)?
            };
            Ok((k.clone(), f))
        })
        .collect()
}

/// `xy_to_dw`: `dw[p] = f'(w[p]) Σ_b x[b, row(p)] h[b, col(p)]`, `db = Σ_b h ⊙ g'(b)`.
pub(crate) fn sparse_xy_to_dw(
    op: &str,
    x: Option<&Tensor>,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let x = x.ok_or_else(|| Error::etp(op, "rule xy_to_dw", "needs x"))?;
    let s = structure(op, p)?;
    let batched = x.ndim() == 2;
    let mut out = TensorMap::new();
    for (k, w) in ws {
        let v = if k == "bias" {
            times_derivative(
                &fn_param(p, op, "bias_fn")?,
                w,
                &sum_batch(hidden, batched)?,
            )?
        } else {
            let xr = x.take(&s.row_tensor()?, x.ndim() - 1)?;
            let hc = hidden.take(&s.col_tensor()?, hidden.ndim() - 1)?;
            times_derivative(
                &fn_param(p, op, "weight_fn")?,
                w,
                &sum_batch(&xr.mul(&hc)?, batched)?,
            )?
        };
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// `init_drtrl`: `{weight (B?, nnz, S), bias (B?, O, S)}`.
pub(crate) fn sparse_init_drtrl(
    x: Option<&Aval>,
    y: &Aval,
    ws: &AvalMap,
    s: usize,
    _p: &Params,
) -> Result<TensorMap> {
    let dt = trace_dtype(x, y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    Ok(ws
        .iter()
        .map(|(k, w)| {
            let shape = if k == "bias" {
                with_state(y.shape(), s)
            } else {
                with_state(&[lead, w.shape()].concat(), s)
            };
            (k.clone(), Tensor::zeros(&shape, dt))
        })
        .collect())
}
