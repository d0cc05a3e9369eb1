//! Dense `etp_mm` (x `(B, I)`) and `etp_mv` (x `(I,)`): `y = x @ f(W) (+ g(b))`
//! with `W (I, O)`, optional bias `b (O,)` and optional element-wise
//! transforms `weight_fn` / `bias_fn`. In order: impl, rules, initialisers,
//! user-facing op, tests.

use super::common::{fn_param, over_inputs, sum_batch, trace_dtype, with_state, xt_h};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, Params, TensorMap};
use crate::tensor::{Aval, Tensor};

/// The dense impl: `x @ weight_fn(W) (+ bias_fn(b))`.
pub(crate) fn dense_impl(op: &str, args: &[Tensor], p: &Params) -> Result<Tensor> {
    let wf = fn_param(p, op, "weight_fn")?;
    let bf = fn_param(p, op, "bias_fn")?;
    let y = args[0]
        .matmul(&apply_fn(&wf, &args[1])?)
        .map_err(|e| Error::etp(op, "bind", e.to_string()))?;
    match args.get(2) {
        Some(b) => y
            .add(&apply_fn(&bf, b)?)
            .map_err(|e| Error::etp(op, "bind", e.to_string())),
        None => Ok(y),
    }
}

/// `yw_to_w`: `trace_W[..., i, o] *= h[..., o]`, `trace_b *= h`.
pub(crate) fn dense_yw_to_w(hidden: &Tensor, trace: &TensorMap, _p: &Params) -> Result<TensorMap> {
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

/// `xy_to_dw`: `dW = (xᵀ h) ⊙ f'(W)`, `db = Σ_batch h ⊙ g'(b)`.
pub(crate) fn dense_xy_to_dw(
    op: &str,
    x: Option<&Tensor>,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let x = x.ok_or_else(|| Error::etp(op, "rule xy_to_dw", "needs x"))?;
    let mut out = TensorMap::new();
    for (k, w) in ws {
        let (raw, f): (Tensor, Option<ElemFn>) = if k == "bias" {
            (
                sum_batch(hidden, x.ndim() == 2)?,
                fn_param(p, op, "bias_fn")?,
            )
        } else {
            (xt_h(x, hidden)?, fn_param(p, op, "weight_fn")?)
        };
        out.insert(k.clone(), times_derivative(&f, w, &raw)?);
    }
    Ok(out)
}

/// `init_drtrl`: `{weight (B?, I, O, S), bias (B?, O, S)}`.
pub(crate) fn dense_init_drtrl(
    x: Option<&Aval>,
    y: &Aval,
    ws: &AvalMap,
    s: usize,
    _p: &Params,
) -> Result<TensorMap> {
    let dt = trace_dtype(x, y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    ws.iter()
        .map(|(k, w)| {
            let shape = if k == "bias" {
                with_state(y.shape(), s)
            } else {
                with_state(&[lead, w.shape()].concat(), s)
            };
            Ok((k.clone(), Tensor::zeros(&shape, dt)))
        })
        .collect()
}

/// `init_pp` of every built-in: zeros of `(*y.shape, S)` in `y`'s dtype.
pub(crate) fn init_pp_y(
    _x: Option<&Aval>,
    y: &Aval,
    _ws: &AvalMap,
    s: usize,
    _p: &Params,
) -> Result<Tensor> {
    Ok(Tensor::zeros(&with_state(y.shape(), s), y.dtype()))
}
