//! Sparse `etp_sp_mm` / `etp_sp_mv`: `y = x @ M(f(w)) (+ g(b))` where `M`
//! places the `nnz` stored values into a fixed CSR structure (a param,
//! compared by value); `etp_sp_mv`'s counterpart is `etp_sp_mm`. In order:
//! structure, impl, rules, initialisers, tests.

use super::common::{check_bias, sum_batch, trace_dtype, with_state};
use super::dense::y_trace;
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, ParamType, ParamValue, TensorMap};
use crate::ops::index::scatter_add;
use crate::tensor::{Aval, Tensor};
use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};
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
            return Err(Error::shapes(
                "sparse",
                [values.shape(), &[self.nnz()][..]],
                format!(
                    "the weight (first) must hold one value per stored entry of the structure ({} entries)",
                    self.nnz()
                ),
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

// ---------------------------------------------------------------- impl

#[allow(clippy::too_many_arguments)]
fn sparse(
    op: &str,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    s: &CsrStructure,
    has_bias: bool,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<Tensor> {
    check_bias(op, has_bias, b)?;
    let dense = s
        .densify(&apply_fn(wf, w)?)
        .map_err(|e| Error::etp_wrap(op, "bind", e))?;
    let y = x.matmul(&dense)?;
    match b {
        Some(b) => y.add(&apply_fn(bf, b)?),
        None => Ok(y),
    }
}

/// `y = x @ M(weight_fn(w)) (+ bias_fn(b))` for a batch `x (B, I)`.
#[etp_primitive(name = "etp_sp_mm", crate = "crate", batched, x = x, weight = [weight, bias], trace_kernel = sparse(structure = sparse_mat, weight_fn = weight_fn, bias_fn = bias_fn))]
pub fn etp_sp_mm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] sparse_mat: CsrStructure,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    sparse(
        "etp_sp_mm",
        x,
        weight,
        bias,
        &sparse_mat,
        has_bias,
        &weight_fn,
        &bias_fn,
    )
}

/// `y = x @ M(weight_fn(w)) (+ bias_fn(b))` for one sample `x (I,)`.
#[etp_primitive(name = "etp_sp_mv", crate = "crate", counterpart = etp_sp_mm, x = x, weight = [weight, bias], trace_kernel = sparse(structure = sparse_mat, weight_fn = weight_fn, bias_fn = bias_fn))]
pub fn etp_sp_mv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] sparse_mat: CsrStructure,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    sparse(
        "etp_sp_mv",
        x,
        weight,
        bias,
        &sparse_mat,
        has_bias,
        &weight_fn,
        &bias_fn,
    )
}

// ---------------------------------------------------------------- rules

/// `trace_w[..., p] *= h[..., col(p)]`, `trace_b *= h`.
fn sparse_spread(s: &CsrStructure, hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    let cols = s.col_tensor()?;
    trace
        .iter()
        .map(|(k, t)| {
            let f = if k == "bias" {
                t.mul(hidden)?
            } else {
                t.mul(&hidden.take(&cols, hidden.ndim() - 1)?)?
            };
            Ok((k.clone(), f))
        })
        .collect()
}

/// `dw[p] = f'(w[p]) Σ_b x[b, row(p)] h[b, col(p)]`, `db = Σ_b h ⊙ g'(b)`.
fn sparse_dw(
    s: &CsrStructure,
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<TensorMap> {
    let batched = x.ndim() == 2;
    ws.iter()
        .map(|(k, w)| {
            let v = if k == "bias" {
                times_derivative(bf, w, &sum_batch(hidden, batched)?)?
            } else {
                let xr = x.take(&s.row_tensor()?, x.ndim() - 1)?;
                let hc = hidden.take(&s.col_tensor()?, hidden.ndim() - 1)?;
                times_derivative(wf, w, &sum_batch(&xr.mul(&hc)?, batched)?)?
            };
            Ok((k.clone(), v))
        })
        .collect()
}

// ---------------------------------------------------------------- initialisers

/// `{weight (B?, nnz, S), bias (B?, O, S)}`.
fn sparse_trace(x: &Aval, y: &Aval, ws: &AvalMap, s: usize) -> Result<TensorMap> {
    let dt = trace_dtype(Some(x), y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    ws.iter()
        .map(|(k, w)| {
            let shape = if k == "bias" {
                with_state(y.shape(), s)
            } else {
                with_state(&[lead, w.shape()].concat(), s)
            };
            Ok((k.clone(), Tensor::try_zeros("init_drtrl", &shape, dt)?))
        })
        .collect()
}

/// The companion rules of a sparse primitive (`etp_sp_mm` and `etp_sp_mv` share them).
macro_rules! sparse_rules {
    ($module:ident, $prim:ident) => {
        mod $module {
            use super::*;

            #[yw_to_w(super::$prim)]
            fn yw_to_w(
                hidden: &Tensor,
                trace: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                sparse_spread(&p.sparse_mat, hidden, trace)
            }

            #[xy_to_dw(super::$prim)]
            fn xy_to_dw(
                x: &Tensor,
                hidden: &Tensor,
                ws: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                sparse_dw(&p.sparse_mat, x, hidden, ws, &p.weight_fn, &p.bias_fn)
            }

            #[init_drtrl(super::$prim)]
            fn init_drtrl(
                x: &Aval,
                y: &Aval,
                ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<TensorMap> {
                sparse_trace(x, y, ws, num_hidden_state)
            }

            #[init_pp(super::$prim)]
            fn init_pp(
                _x: &Aval,
                y: &Aval,
                _ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<Tensor> {
                y_trace(y, num_hidden_state)
            }
        }
    };
}

sparse_rules!(sp_mm_rules, etp_sp_mm);
sparse_rules!(sp_mv_rules, etp_sp_mv);

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    fn structure() -> CsrStructure {
        CsrStructure::from_dense_pattern(4, 3, |r, c| (r + 2 * c) % 3 == 0 && r != 2)
    }

    #[test]
    fn sp_mm_rules() {
        let s = structure();
        let p = etp_sp_mm::Params {
            sparse_mat: s.clone(),
            has_bias: true,
            weight_fn: ElemFn::builtin("tanh"),
            bias_fn: None,
        }
        .to_params();
        let args = [
            test_tensor(&[2, 4], 1),
            test_tensor(&[s.nnz()], 2),
            test_tensor(&[3], 3),
        ];
        let r = check_rules(&etp_sp_mm::primitive(), &args, &p).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn sp_mv_forward_matches_dense() {
        let s = structure();
        let (x, w) = (test_tensor(&[4], 1), test_tensor(&[s.nnz()], 2));
        let y = etp_sp_mv(&x, &w, None, s.clone(), false, None, None).unwrap();
        let mut dense = vec![0.0; 12];
        for (p, (r, c)) in s.rows().iter().zip(&s.indices).enumerate() {
            dense[r * 3 + c] = w.to_vec_f64().unwrap()[p];
        }
        let want = x
            .matmul(&Tensor::from_vec(dense, &[4, 3]).unwrap())
            .unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    }

    #[test]
    fn csr_structure_is_validated() {
        assert!(CsrStructure::new((2, 2), vec![0, 1], vec![0]).is_err());
        assert!(CsrStructure::new((2, 2), vec![0, 1, 2], vec![0, 5]).is_err());
        assert!(CsrStructure::new((2, 2), vec![0, 1, 2], vec![0, 1]).is_ok());
    }
}
