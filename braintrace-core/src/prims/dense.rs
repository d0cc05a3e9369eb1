//! Dense `etp_mm` (x `(B, I)`) and `etp_mv` (x `(I,)`): `y = x @ f(W) (+ g(b))`
//! with `W (I, O)`, optional bias `b (O,)` and optional element-wise
//! transforms `weight_fn` / `bias_fn`. `etp_mv`'s batched counterpart is
//! `etp_mm`. In order: impl, rules, initialisers, tests.

use super::common::{check_bias, over_inputs, sum_batch, trace_dtype, with_state, xt_h};
use crate::error::Result;
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, TensorMap};
use crate::tensor::{Aval, Tensor};
use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};

// ---------------------------------------------------------------- impl

fn dense(
    op: &str,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    has_bias: bool,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<Tensor> {
    check_bias(op, has_bias, b)?;
    let y = x.matmul(&apply_fn(wf, w)?)?;
    match b {
        Some(b) => y.add(&apply_fn(bf, b)?),
        None => Ok(y),
    }
}

/// `y = x @ weight_fn(W) (+ bias_fn(b))` for a batch `x (B, I)`.
#[etp_primitive(name = "etp_mm", crate = "crate", batched, x = x, weight = [weight, bias], trace_kernel = dense(weight_fn = weight_fn, bias_fn = bias_fn))]
pub fn etp_mm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    dense("etp_mm", x, weight, bias, has_bias, &weight_fn, &bias_fn)
}

/// `y = x @ weight_fn(W) (+ bias_fn(b))` for one sample `x (I,)`.
#[etp_primitive(name = "etp_mv", crate = "crate", counterpart = etp_mm, x = x, weight = [weight, bias], trace_kernel = dense(weight_fn = weight_fn, bias_fn = bias_fn))]
pub fn etp_mv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    dense("etp_mv", x, weight, bias, has_bias, &weight_fn, &bias_fn)
}

// ---------------------------------------------------------------- rules

/// `trace_W[..., i, o] *= h[..., o]`, `trace_b *= h` (shared with LoRA).
pub(crate) fn spread_over_outputs(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    trace
        .iter()
        .map(|(k, t)| {
            let f = if k == "bias" {
                t.mul(hidden)?
            } else {
                t.mul(&over_inputs(hidden)?)?
            };
            Ok((k.clone(), f))
        })
        .collect()
}

/// `dW = (xᵀ h) ⊙ f'(W)`, `db = Σ_batch h ⊙ g'(b)`.
fn dense_dw(
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<TensorMap> {
    ws.iter()
        .map(|(k, w)| {
            let v = if k == "bias" {
                times_derivative(bf, w, &sum_batch(hidden, x.ndim() == 2)?)?
            } else {
                times_derivative(wf, w, &xt_h(x, hidden)?)?
            };
            Ok((k.clone(), v))
        })
        .collect()
}

/// The companion rules of a dense primitive (`etp_mm` and `etp_mv` share them).
macro_rules! dense_rules {
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
                dense_dw(x, hidden, ws, &p.weight_fn, &p.bias_fn)
            }

            #[init_drtrl(super::$prim)]
            fn init_drtrl(
                x: &Aval,
                y: &Aval,
                ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<TensorMap> {
                dense_trace(Some(x), y, ws, num_hidden_state)
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

// ---------------------------------------------------------------- initialisers

/// `{weight (B?, I, O, S), bias (B?, O, S)}`; `B?` is `y`'s leading axes.
///
/// The shape comes from user input (`num_hidden_state`), so an impossible
/// one is an error, not a panic.
fn dense_trace(x: Option<&Aval>, y: &Aval, ws: &AvalMap, s: usize) -> Result<TensorMap> {
    let dt = trace_dtype(x, y, ws);
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

/// Zeros of `(*y.shape, S)` in `y`'s dtype: the `init_pp` of every built-in
/// (an error when `S` makes the shape impossible).
pub(crate) fn y_trace(y: &Aval, s: usize) -> Result<Tensor> {
    Tensor::try_zeros("init_pp", &with_state(y.shape(), s), y.dtype())
}

dense_rules!(mm_rules, etp_mm);
dense_rules!(mv_rules, etp_mv);

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::{check_rules, ElemFn};
    use crate::prims::common::test_tensor;
    use crate::tensor::DType;

    fn params(has_bias: bool) -> crate::etp::Params {
        etp_mm::Params {
            has_bias,
            weight_fn: ElemFn::builtin("tanh"),
            bias_fn: ElemFn::builtin("softplus"),
        }
        .to_params()
    }

    #[test]
    fn mm_forward() {
        let (x, w, b) = (
            test_tensor(&[2, 3], 1),
            test_tensor(&[3, 4], 2),
            test_tensor(&[4], 3),
        );
        let y = etp_mm(&x, &w, Some(&b), true, None, None).unwrap();
        let want = x.matmul(&w).unwrap().add(&b).unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
        assert!(
            etp_mm(&x, &w, None, true, None, None).is_err(),
            "has_bias without a bias is an error"
        );
    }

    #[test]
    fn mm_rules() {
        let args = [
            test_tensor(&[2, 3], 1),
            test_tensor(&[3, 4], 2),
            test_tensor(&[4], 3),
        ];
        let r = check_rules(&etp_mm::primitive(), &args, &params(true)).unwrap();
        assert!(r.is_ok(), "{r}");
        let r = check_rules(&etp_mm::primitive(), &args[..2], &params(false)).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn mv_rules() {
        let args = [
            test_tensor(&[3], 1),
            test_tensor(&[3, 4], 2),
            test_tensor(&[4], 3),
        ];
        let r = check_rules(&etp_mv::primitive(), &args, &params(true)).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn mv_batching() {
        let xs = test_tensor(&[5, 3], 1);
        let w = test_tensor(&[3, 4], 2);
        let f = crate::vmap(
            |a: &[Tensor]| Ok(vec![etp_mv(&a[0], &a[1], None, false, None, None)?]),
            vec![Some(0), None],
        );
        let g = crate::make_graph(&f, &[xs.aval(), w.aval()]).unwrap();
        assert_eq!(g.primitive_names(), vec!["etp_mm"]);
        let _ = DType::F64;
    }
}
