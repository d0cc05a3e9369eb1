//! `etp_elemwise`: `y = f(w)` (identity when no `weight_fn`), the identity
//! marker for element-wise trainable parameters; no `x`; the only built-in
//! that is `gradient_enabled`. In order: impl, rules, initialisers.

use super::common::{fn_param, with_state};
use crate::error::Result;
use crate::etp::{apply_fn, times_derivative, AvalMap, Params, TensorMap};
use crate::tensor::{Aval, Tensor};

/// `y = weight_fn(w)`.
pub(crate) fn elemwise_impl(args: &[Tensor], p: &Params) -> Result<Tensor> {
    apply_fn(&fn_param(p, "etp_elemwise", "weight_fn")?, &args[0])
}

/// `yw_to_w`: `trace *= h`.
pub(crate) fn elemwise_yw_to_w(
    hidden: &Tensor,
    trace: &TensorMap,
    _p: &Params,
) -> Result<TensorMap> {
    trace
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.mul(hidden)?)))
        .collect()
}

/// `xy_to_dw`: `h ⊙ f'(w)`.
pub(crate) fn elemwise_xy_to_dw(
    _x: Option<&Tensor>,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let f = fn_param(p, "etp_elemwise", "weight_fn")?;
    ws.iter()
        .map(|(k, w)| Ok((k.clone(), times_derivative(&f, w, hidden)?)))
        .collect()
}

/// `init_drtrl`: `{weight: (*y.shape, S)}` (a model passes the hidden group's shape as `y`).
pub(crate) fn elemwise_init_drtrl(
    _x: Option<&Aval>,
    y: &Aval,
    ws: &AvalMap,
    s: usize,
    _p: &Params,
) -> Result<TensorMap> {
    Ok(ws
        .keys()
        .map(|k| {
            (
                k.clone(),
                Tensor::zeros(&with_state(y.shape(), s), y.dtype()),
            )
        })
        .collect())
}
