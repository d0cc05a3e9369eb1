//! Grouped (block-diagonal) matmul `etp_gmm` (x `(B, G, K)`) and `etp_gmv`
//! (x `(G, K)`): `y[..., g, n] = Σ_k x[..., g, k] f(W)[g, k, n] (+ g(b)[g, n])`
//! with `W (G, K, N)` and an optional bias `b (G, N)`; braintrace's
//! `grouped_matmul`. Each weight entry touches one output component per
//! sample, as in dense matmul with one more (group) axis, so the rules are
//! the dense ones with that axis kept: the D-RTRL weight trace is
//! `(B?, G, K, N, S)`, `G` times smaller than the trace of the equivalent
//! block-diagonal dense matrix. `etp_gmv`'s batched counterpart is
//! `etp_gmm`. In order: impl, rules, initialisers, tests.

use super::common::{check_bias, sum_batch, trace_dtype, with_state};
use super::dense::{spread_over_outputs, y_trace};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, TensorMap};
use crate::tensor::{Aval, Tensor};
use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};

// ---------------------------------------------------------------- impl

/// `x` must be `(G, K)` (unbatched) or `(B, G, K)` and `W` `(G, K, N)`.
fn check_shapes(op: &str, x: &Tensor, w: &Tensor, batched: bool) -> Result<()> {
    let rank = if batched { 3 } else { 2 };
    if w.ndim() != 3 || x.ndim() != rank || x.shape()[rank - 2..] != w.shape()[..2] {
        return Err(Error::shapes(
            op,
            [x.shape(), w.shape()],
            format!(
                "x (first) must be {} and the weight (second) (groups, in_features, out_features), with the same groups and in_features",
                if batched {
                    "(batch, groups, in_features)"
                } else {
                    "(groups, in_features)"
                }
            ),
        ));
    }
    Ok(())
}

/// `einsum('...gk,gkn->...gn', x, W)` as a matmul batched over the groups.
fn grouped_product(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.ndim() == 2 {
        // (G, 1, K) @ (G, K, N) -> (G, 1, N) -> (G, N)
        x.expand_dims(1)?.matmul(w)?.squeeze(&[1])
    } else {
        // (G, B, K) @ (G, K, N) -> (G, B, N) -> (B, G, N)
        x.transpose(&[1, 0, 2])?.matmul(w)?.transpose(&[1, 0, 2])
    }
}

#[allow(clippy::too_many_arguments)]
fn grouped(
    op: &str,
    batched: bool,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    has_bias: bool,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<Tensor> {
    check_bias(op, has_bias, b)?;
    check_shapes(op, x, w, batched)?;
    let y = grouped_product(x, &apply_fn(wf, w)?)?;
    match b {
        Some(b) => {
            let want = [w.shape()[0], w.shape()[2]];
            if b.shape() != want {
                return Err(Error::shapes(
                    op,
                    [b.shape(), &want[..]],
                    "the bias (first) must be (groups, out_features) (second)",
                ));
            }
            y.add(&apply_fn(bf, b)?)
        }
        None => Ok(y),
    }
}

/// `y[b, g, :] = x[b, g, :] @ weight_fn(W)[g] (+ bias_fn(b)[g])` for a batch
/// `x (B, G, K)`, `W (G, K, N)`, `b (G, N)`.
#[etp_primitive(name = "etp_gmm", crate = "crate", batched, x = x, weight = [weight, bias])]
pub fn etp_gmm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    grouped(
        "etp_gmm", true, x, weight, bias, has_bias, &weight_fn, &bias_fn,
    )
}

/// `y[g, :] = x[g, :] @ weight_fn(W)[g] (+ bias_fn(b)[g])` for one sample
/// `x (G, K)`.
#[etp_primitive(name = "etp_gmv", crate = "crate", counterpart = etp_gmm, x = x, weight = [weight, bias])]
pub fn etp_gmv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] has_bias: bool,
    #[param] weight_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    grouped(
        "etp_gmv", false, x, weight, bias, has_bias, &weight_fn, &bias_fn,
    )
}

// ---------------------------------------------------------------- rules

/// `dW[g, k, n] = f'(W) Σ_b x[b, g, k] h[b, g, n]`, `db = g'(b) Σ_b h`.
/// `x` is `(G, K)` for one sample (the D-RTRL instantaneous term) or
/// `(B, G, K)` for a batch (pp_prop's solve with the input trace).
fn grouped_dw(
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    wf: &Option<ElemFn>,
    bf: &Option<ElemFn>,
) -> Result<TensorMap> {
    let batched = x.ndim() == 3;
    ws.iter()
        .map(|(k, w)| {
            let v = if k == "bias" {
                times_derivative(bf, w, &sum_batch(hidden, batched)?)?
            } else {
                let xh = if batched {
                    // (G, K, B) @ (G, B, N) -> (G, K, N)
                    x.transpose(&[1, 2, 0])?
                        .matmul(&hidden.transpose(&[1, 0, 2])?)?
                } else {
                    // (G, K, 1) * (G, 1, N)
                    x.expand_dims(2)?.mul(&hidden.expand_dims(1)?)?
                };
                times_derivative(wf, w, &xh)?
            };
            Ok((k.clone(), v))
        })
        .collect()
}

/// The companion rules of a grouped primitive (`etp_gmm` and `etp_gmv` share them).
macro_rules! grouped_rules {
    ($module:ident, $prim:ident) => {
        mod $module {
            use super::*;

            #[yw_to_w(super::$prim)]
            fn yw_to_w(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
                // trace_W[..., g, k, n] *= h[..., g, None, n]; trace_b *= h.
                spread_over_outputs(hidden, trace)
            }

            #[xy_to_dw(super::$prim)]
            fn xy_to_dw(
                x: &Tensor,
                hidden: &Tensor,
                ws: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                grouped_dw(x, hidden, ws, &p.weight_fn, &p.bias_fn)
            }

            #[init_drtrl(super::$prim)]
            fn init_drtrl(
                x: &Aval,
                y: &Aval,
                ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<TensorMap> {
                grouped_trace(x, y, ws, num_hidden_state)
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

/// `{weight (B?, G, K, N, S), bias (B?, G, N, S)}`; `B?` is `y`'s axes
/// before `(G, N)`.
fn grouped_trace(x: &Aval, y: &Aval, ws: &AvalMap, s: usize) -> Result<TensorMap> {
    let dt = trace_dtype(Some(x), y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(2)];
    ws.iter()
        .map(|(k, w)| {
            let shape = with_state(&[lead, w.shape()].concat(), s);
            Ok((k.clone(), Tensor::try_zeros("init_drtrl", &shape, dt)?))
        })
        .collect()
}

grouped_rules!(gmm_rules, etp_gmm);
grouped_rules!(gmv_rules, etp_gmv);

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    fn params(has_bias: bool, wf: Option<&str>) -> crate::etp::Params {
        etp_gmm::Params {
            has_bias,
            weight_fn: wf.and_then(ElemFn::builtin),
            bias_fn: ElemFn::builtin("softplus"),
        }
        .to_params()
    }

    /// The forward against an explicit loop over `b, g, k, n`.
    #[test]
    fn gmm_forward_matches_loops() {
        let (bs, g, k, n) = (2, 3, 4, 2);
        let (x, w, b) = (
            test_tensor(&[bs, g, k], 1),
            test_tensor(&[g, k, n], 2),
            test_tensor(&[g, n], 3),
        );
        let y = etp_gmm(&x, &w, Some(&b), true, None, None).unwrap();
        let (xv, wv, bv) = (
            x.to_vec_f64().unwrap(),
            w.to_vec_f64().unwrap(),
            b.to_vec_f64().unwrap(),
        );
        let mut want = vec![0.0; bs * g * n];
        for bi in 0..bs {
            for gi in 0..g {
                for ni in 0..n {
                    let mut s = bv[gi * n + ni];
                    for ki in 0..k {
                        s += xv[(bi * g + gi) * k + ki] * wv[(gi * k + ki) * n + ni];
                    }
                    want[(bi * g + gi) * n + ni] = s;
                }
            }
        }
        assert_eq!(y.shape(), &[bs, g, n]);
        let got = y.to_vec_f64().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-14, "{a} vs {b}");
        }
        let y1 = etp_gmv(&x.index_axis0(1).unwrap(), &w, Some(&b), true, None, None).unwrap();
        assert_eq!(
            y1.to_vec_f64().unwrap(),
            y.index_axis0(1).unwrap().to_vec_f64().unwrap()
        );
    }

    #[test]
    fn gmm_rules() {
        let args = [
            test_tensor(&[2, 3, 4], 1),
            test_tensor(&[3, 4, 2], 2),
            test_tensor(&[3, 2], 3),
        ];
        for wf in [None, Some("tanh")] {
            let r = check_rules(&etp_gmm::primitive(), &args, &params(true, wf)).unwrap();
            assert!(r.is_ok(), "{r}");
            let r = check_rules(&etp_gmm::primitive(), &args[..2], &params(false, wf)).unwrap();
            assert!(r.is_ok(), "{r}");
        }
    }

    #[test]
    fn gmv_rules() {
        let args = [
            test_tensor(&[3, 4], 1),
            test_tensor(&[3, 4, 2], 2),
            test_tensor(&[3, 2], 3),
        ];
        let r = check_rules(&etp_gmv::primitive(), &args, &params(true, Some("tanh"))).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn gmv_batches_to_gmm() {
        let xs = test_tensor(&[5, 3, 4], 1);
        let w = test_tensor(&[3, 4, 2], 2);
        let f = crate::vmap(
            |a: &[Tensor]| Ok(vec![etp_gmv(&a[0], &a[1], None, false, None, None)?]),
            vec![Some(0), None],
        );
        let g = crate::make_graph(&f, &[xs.aval(), w.aval()]).unwrap();
        assert_eq!(g.primitive_names(), vec!["etp_gmm"]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let w = test_tensor(&[3, 4, 2], 2);
        let e = etp_gmm(&test_tensor(&[2, 3, 5], 1), &w, None, false, None, None).unwrap_err();
        assert!(e.to_string().contains("etp_gmm"), "{e}");
        assert!(etp_gmv(&test_tensor(&[2, 3, 4], 1), &w, None, false, None, None).is_err());
        let b = test_tensor(&[2, 3], 3);
        let e = etp_gmm(&test_tensor(&[2, 3, 4], 1), &w, Some(&b), true, None, None).unwrap_err();
        assert!(e.to_string().contains("bias"), "{e}");
    }
}
