//! Embedding (trainable lookup) `etp_emb` (batched) and `etp_emb_v`
//! (one sample): braintrace's `embedding`, `y[b, d] = f(T)[idx_b, d]` with
//! the table `T (V, D)`.
//!
//! **How the indices reach the primitive.** The primitive's `x` operand is
//! the *one-hot encoding* of the indices, `(B, V)` (`(V,)` for one sample),
//! in the table's dtype, and the lookup is the product `y = x @ f(T)`,
//! evaluated as a row gather when `x` is concrete. The user-facing
//! [`embedding`](fn@super::embedding) op (and the `Embedding` layer) take the
//! indices as an integer tensor or as a float tensor of integral values
//! (what a learner's step receives: its inputs are cast to the model's
//! float dtype), check them and encode them. This is braintrace's own
//! representation in its IO-dimension algorithms (its `pp_x_repr` rule
//! filters the one-hot), so with it pp_prop's input trace `x̄` is exactly
//! braintrace's, and D-RTRL's instantaneous term `xᵀ h` is exactly the
//! scatter-add braintrace computes from the integer indices. The price is
//! a `(B, V)` input and a `(B, V, D, S)` D-RTRL trace (braintrace's trace
//! has the same shape); pp_prop's trace `(B, D, S)` does not grow with `V`.
//!
//! Both declare the dense trace kernel (`trace_kernel = dense(..)`: the
//! structure is a product `x @ f(T)` without bias), so the learners' fused
//! D-RTRL and pp_prop paths serve them.
//!
//! Rules: `yw_to_w` spreads `h` over the vocabulary axis
//! (`trace[..., v, d] *= h[..., d]`); `xy_to_dw` is `(xᵀ h) ⊙ f'(T)`;
//! `init_drtrl` `{weight (B?, V, D, S)}`; `init_pp` `(*y.shape, S)`.

use super::common::{trace_dtype, with_state, xt_h};
use super::dense::{spread_over_outputs, y_trace};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, TensorMap};
use crate::graph::{bind1, Primitive};
use crate::tensor::{Aval, DType, Tensor};
use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};
use std::any::Any;
use std::sync::Arc;

// ---------------------------------------------------------------- impl

/// The hot column of each row of a concrete one-hot `x` (`(B, V)` or
/// `(V,)`), or `None` when a row is not exactly one-hot.
fn hot_columns(x: &Tensor) -> Result<Option<Vec<i64>>> {
    let v = x.shape().last().copied().unwrap_or(0);
    let vals = x.to_vec_f64()?;
    let mut out = Vec::with_capacity(vals.len() / v.max(1));
    for row in vals.chunks(v.max(1)) {
        let mut hot = None;
        for (c, &e) in row.iter().enumerate() {
            if e == 1.0 && hot.is_none() {
                hot = Some(c as i64);
            } else if e != 0.0 {
                return Ok(None);
            }
        }
        match hot {
            Some(c) => out.push(c),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

fn lookup(op: &str, batched: bool, x: &Tensor, w: &Tensor, wf: &Option<ElemFn>) -> Result<Tensor> {
    let rank = if batched { 2 } else { 1 };
    if w.ndim() != 2 || x.ndim() != rank || x.shape().last() != w.shape().first() {
        return Err(Error::shapes(
            op,
            [x.shape(), w.shape()],
            format!(
                "x (first) must be the one-hot indices {} and the table (second) (num_embeddings, features)",
                if batched {
                    "(batch, num_embeddings)"
                } else {
                    "(num_embeddings,)"
                }
            ),
        ));
    }
    let t = apply_fn(wf, w)?;
    if x.is_symbolic() {
        // Traced: the product, which equals the gather for one-hot rows.
        return x.matmul(&t);
    }
    match hot_columns(x)? {
        Some(idx) => {
            let n = idx.len();
            let rows = t.take(&Tensor::from_vec_typed(idx, &[n])?, 0)?;
            if batched {
                Ok(rows)
            } else {
                rows.squeeze(&[0])
            }
        }
        None => Err(Error::invalid(
            op,
            format!(
                "x must hold one-hot rows of {} entries (one 1, the rest 0): encode the indices with `prims::embedding`",
                w.shape()[0]
            ),
        )),
    }
}

/// `y = weight_fn(T)[idx]` for a batch: `x (B, V)` one-hot rows, `T (V, D)`,
/// `y (B, D)`.
#[etp_primitive(name = "etp_emb", crate = "crate", batched, x = x, weight = [weight], trace_kernel = dense(weight_fn = weight_fn))]
pub fn etp_emb(x: &Tensor, weight: &Tensor, #[param] weight_fn: Option<ElemFn>) -> Result<Tensor> {
    lookup("etp_emb", true, x, weight, &weight_fn)
}

/// `y = weight_fn(T)[idx]` for one sample: `x (V,)` one-hot, `y (D,)`.
#[etp_primitive(name = "etp_emb_v", crate = "crate", counterpart = etp_emb, x = x, weight = [weight], trace_kernel = dense(weight_fn = weight_fn))]
pub fn etp_emb_v(
    x: &Tensor,
    weight: &Tensor,
    #[param] weight_fn: Option<ElemFn>,
) -> Result<Tensor> {
    lookup("etp_emb_v", false, x, weight, &weight_fn)
}

// ---------------------------------------------------------------- rules

/// `dT = (xᵀ h) ⊙ f'(T)`: the scatter-add of `h` into the rows `x` selects
/// (summed over the batch); for pp_prop's filtered input trace `x̄` the same
/// product.
fn emb_dw(x: &Tensor, hidden: &Tensor, ws: &TensorMap, wf: &Option<ElemFn>) -> Result<TensorMap> {
    ws.iter()
        .map(|(k, w)| Ok((k.clone(), times_derivative(wf, w, &xt_h(x, hidden)?)?)))
        .collect()
}

/// `{weight (B?, V, D, S)}`; `B?` is `y`'s leading axes.
fn emb_trace(x: &Aval, y: &Aval, ws: &AvalMap, s: usize) -> Result<TensorMap> {
    let dt = trace_dtype(Some(x), y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    ws.iter()
        .map(|(k, w)| {
            let shape = with_state(&[lead, w.shape()].concat(), s);
            Ok((k.clone(), Tensor::try_zeros("init_drtrl", &shape, dt)?))
        })
        .collect()
}

/// The companion rules of an embedding primitive (`etp_emb` and `etp_emb_v` share them).
macro_rules! emb_rules {
    ($module:ident, $prim:ident) => {
        mod $module {
            use super::*;

            #[yw_to_w(super::$prim)]
            fn yw_to_w(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
                spread_over_outputs(hidden, trace)
            }

            #[xy_to_dw(super::$prim)]
            fn xy_to_dw(
                x: &Tensor,
                hidden: &Tensor,
                ws: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                emb_dw(x, hidden, ws, &p.weight_fn)
            }

            #[init_drtrl(super::$prim)]
            fn init_drtrl(
                x: &Aval,
                y: &Aval,
                ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<TensorMap> {
                emb_trace(x, y, ws, num_hidden_state)
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

emb_rules!(emb_rules_b, etp_emb);
emb_rules!(emb_rules_v, etp_emb_v);

// ---------------------------------------------------------------- encoding

/// Each index must be an integer in `[0, size)`: an error naming `op`, the
/// entry, the value and `size` otherwise.
fn check_index_values(op: &str, indices: &Tensor, size: usize) -> Result<()> {
    let vals = indices.to_vec_f64()?;
    if let Some((i, bad)) = vals
        .iter()
        .enumerate()
        .find(|(_, &v)| !(v >= 0.0 && v < size as f64 && v.fract() == 0.0))
    {
        return Err(Error::invalid(
            op,
            format!(
                "index {bad} (entry {i}) is not an integer in [0, {size}) (num_embeddings = {size})"
            ),
        ));
    }
    Ok(())
}

/// The identity on float indices that checks their values when evaluated
/// ([`check_index_values`]): how indices inside a traced step (a compiled
/// learner's) are checked when the step runs. Not differentiated.
#[derive(Clone, Debug)]
struct CheckIndices {
    op: String,
    size: usize,
}

impl Primitive for CheckIndices {
    fn name(&self) -> String {
        "check_indices".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("op".into(), self.op.clone()),
            ("size".into(), self.size.to_string()),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        match inputs {
            [a] => Ok(vec![a.clone()]),
            _ => Err(Error::arity("check_indices", 1, inputs.len())),
        }
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&[inputs[0].aval()])?;
        check_index_values(&self.op, &inputs[0], self.size)?;
        Ok(vec![inputs[0].clone()])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((vec![bind1(Arc::new(self.clone()), p)?], vec![None]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![bind1(Arc::new(self.clone()), args)?], vec![batched[0]]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The one-hot rows `(*indices.shape, V)` of `indices` in `dtype`: the `x`
/// the embedding primitives take (braintrace's `pp_x_repr` of the
/// indices). `indices` is an integer tensor or a float one holding
/// integers (a learner's input), a scalar or a vector `(B,)`. Each entry
/// must be an integer in `[0, V)`, else an error naming `op`, the entry, the
/// value and `V`: at once for a concrete `indices`, when the step runs for
/// a symbolic one (inside a traced step, e.g. a compiled learner's; the
/// step then fails before any state changes).
///
/// ```
/// use braintrace_core::{prims::embedding::one_hot_indices, Tensor, DType};
/// let x = one_hot_indices("demo", &Tensor::from_vec(vec![2.0, 0.0], &[2])?, 3, DType::F64)?;
/// assert_eq!(x.to_vec_f64()?, vec![0., 0., 1., 1., 0., 0.]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn one_hot_indices(
    op: &str,
    indices: &Tensor,
    num_embeddings: usize,
    dtype: DType,
) -> Result<Tensor> {
    if indices.ndim() > 1 {
        return Err(Error::shapes(
            op,
            [indices.shape()],
            "the indices must be a scalar or a vector (batch,): fold other axes into the batch",
        ));
    }
    if !indices.dtype().is_float() && indices.dtype() != DType::I64 {
        return Err(Error::dtype_with(
            op,
            "indices",
            [DType::I64, DType::F32, DType::F64],
            indices.dtype(),
            "integer token indices (or floats holding integers)",
        ));
    }
    let x = indices.cast(DType::F64)?;
    let x = if x.is_symbolic() {
        bind1(
            Arc::new(CheckIndices {
                op: op.to_string(),
                size: num_embeddings,
            }),
            &[x],
        )?
    } else {
        check_index_values(op, &x, num_embeddings)?;
        x
    };
    let ids: Vec<f64> = (0..num_embeddings).map(|c| c as f64).collect();
    let ids = Tensor::from_vec(ids, &[num_embeddings])?;
    x.expand_dims(indices.ndim())?.eq_elem(&ids)?.cast(dtype)
}

/// The rows `weight_fn(table)[indices]` through `etp_emb` (indices `(B,)`)
/// or `etp_emb_v` (a scalar), errors naming `op` (see
/// [`one_hot_indices`]).
pub fn lookup_named(
    op: &str,
    indices: &Tensor,
    table: &Tensor,
    weight_fn: Option<ElemFn>,
) -> Result<Tensor> {
    if table.ndim() != 2 {
        return Err(Error::shapes(
            op,
            [table.shape()],
            "the table must be (num_embeddings, features)",
        ));
    }
    let x = one_hot_indices(op, indices, table.shape()[0], table.dtype())?;
    if indices.ndim() == 1 {
        etp_emb(&x, table, weight_fn)
    } else {
        etp_emb_v(&x, table, weight_fn)
    }
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    fn onehot(idx: &[usize], v: usize) -> Tensor {
        let mut d = vec![0.0; idx.len() * v];
        for (r, &i) in idx.iter().enumerate() {
            d[r * v + i] = 1.0;
        }
        Tensor::from_vec(d, &[idx.len(), v]).unwrap()
    }

    #[test]
    fn emb_forward_is_the_gather() {
        let t = test_tensor(&[5, 3], 2);
        let y = etp_emb(&onehot(&[4, 0, 4], 5), &t, None).unwrap();
        let tv = t.to_vec_f64().unwrap();
        let want: Vec<f64> = [4usize, 0, 4]
            .iter()
            .flat_map(|&r| tv[r * 3..r * 3 + 3].to_vec())
            .collect();
        assert_eq!(y.to_vec_f64().unwrap(), want);
        let y1 = etp_emb_v(&onehot(&[2], 5).reshape(&[5]).unwrap(), &t, None).unwrap();
        assert_eq!(y1.to_vec_f64().unwrap(), tv[6..9].to_vec());
        // Not one-hot: refused, naming the op.
        let e = etp_emb(&test_tensor(&[2, 5], 1), &t, None).unwrap_err();
        assert!(
            e.to_string().contains("etp_emb") && e.to_string().contains("one-hot"),
            "{e}"
        );
        let e = etp_emb(&onehot(&[1], 4), &t, None).unwrap_err();
        assert!(e.to_string().contains("etp_emb"), "{e}");
    }

    #[test]
    fn emb_rules() {
        let p = etp_emb::Params {
            weight_fn: ElemFn::builtin("tanh"),
        }
        .to_params();
        let args = [onehot(&[1, 3, 1], 4), test_tensor(&[4, 3], 2)];
        let r = check_rules(&etp_emb::primitive(), &args, &p).unwrap();
        assert!(r.is_ok(), "{r}");
        let args = [
            onehot(&[2], 4).reshape(&[4]).unwrap(),
            test_tensor(&[4, 3], 2),
        ];
        let r = check_rules(&etp_emb_v::primitive(), &args, &p).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn one_hot_checks_the_indices() {
        let x = Tensor::from_vec(vec![2.0, 0.0], &[2]).unwrap();
        let h = one_hot_indices("t", &x, 3, DType::F64).unwrap();
        assert_eq!(h.to_vec_f64().unwrap(), vec![0., 0., 1., 1., 0., 0.]);
        let i = Tensor::from_vec_typed(vec![1i64], &[1]).unwrap();
        let h = one_hot_indices("t", &i, 2, DType::F32).unwrap();
        assert_eq!(h.dtype(), DType::F32);
        for bad in [3.0, -1.0, 0.5, f64::NAN] {
            let x = Tensor::from_vec(vec![0.0, bad], &[2]).unwrap();
            let e = one_hot_indices("Embedding `emb`", &x, 3, DType::F64).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("Embedding `emb`") && m.contains("[0, 3)"), "{m}");
        }
        let x = Tensor::zeros(&[2, 2], DType::F64);
        assert!(one_hot_indices("t", &x, 3, DType::F64).is_err());
    }
}
