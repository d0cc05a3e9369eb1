//! `etp_elemwise`: `y = f(w)` (identity when no `weight_fn`), the identity
//! marker for element-wise trainable parameters; no `x`; the only built-in
//! that is `gradient_enabled`. In order: impl, rules, initialisers, tests.

use super::common::with_state;
use super::dense::y_trace;
use crate::error::Result;
use crate::etp::{apply_fn, times_derivative, ElemFn};
use crate::tensor::{Aval, Tensor};
use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};

// ---------------------------------------------------------------- impl

/// `y = weight_fn(w)`. Its `xy_to_dw` broadcasts over leading axes of `hidden`
/// (a batched hidden state), as braintrace's does, hence `exact_dw_shapes = false`.
#[etp_primitive(name = "etp_elemwise", crate = "crate", gradient_enabled, exact_dw_shapes = false, x = none, weight = weight, trace_kernel = dense(weight_fn = weight_fn))]
pub fn etp_elemwise(weight: &Tensor, #[param] weight_fn: Option<ElemFn>) -> Result<Tensor> {
    apply_fn(&weight_fn, weight)
}

// ---------------------------------------------------------------- rules

/// `trace *= h`.
#[yw_to_w(etp_elemwise)]
fn elemwise_yw_to_w(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(hidden)
}

/// `h ⊙ f'(w)`.
#[xy_to_dw(etp_elemwise)]
fn elemwise_xy_to_dw(
    _x: Option<&Tensor>,
    hidden: &Tensor,
    w: &Tensor,
    p: &etp_elemwise::Params,
) -> Result<Tensor> {
    times_derivative(&p.weight_fn, w, hidden)
}

// ---------------------------------------------------------------- initialisers

/// `(*y.shape, S)`: a model passes the hidden group's shape as `y`.
#[init_drtrl(etp_elemwise)]
fn elemwise_init_drtrl(
    _x: Option<&Aval>,
    y: &Aval,
    _w: &Aval,
    num_hidden_state: usize,
) -> Result<Tensor> {
    Tensor::try_zeros(
        "init_drtrl",
        &with_state(y.shape(), num_hidden_state),
        y.dtype(),
    )
}

#[init_pp(etp_elemwise)]
fn elemwise_init_pp(
    _x: Option<&Aval>,
    y: &Aval,
    _w: &Aval,
    num_hidden_state: usize,
) -> Result<Tensor> {
    y_trace(y, num_hidden_state)
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    #[test]
    fn elemwise_rules() {
        for f in [None, Some("exp"), Some("sigmoid")] {
            let p = etp_elemwise::Params {
                weight_fn: f.and_then(ElemFn::builtin),
            }
            .to_params();
            let r =
                check_rules(&etp_elemwise::primitive(), &[test_tensor(&[2, 3], 1)], &p).unwrap();
            assert!(r.is_ok(), "{r}");
        }
    }

    #[test]
    fn elemwise_is_the_only_gradient_enabled_builtin() {
        assert!(etp_elemwise::primitive().is_gradient_enabled());
        assert_eq!(etp_elemwise::primitive().x_index(), None);
    }
}
