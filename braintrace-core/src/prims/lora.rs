//! LoRA `etp_lora_mm` / `etp_lora_mv`: `y = α · x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))`
//! with `B (I, r)` ("lora_b", input-facing) and `A (r, O)` ("lora_a"). The
//! D-RTRL trace under `lora_b` is the trace of the effective weight
//! `(I, O)`; `solve_drtrl` maps it back. `etp_lora_mv`'s counterpart is
//! `etp_lora_mm`. In order: impl, rules, initialisers, tests.

use super::common::{check_bias, leaf, over_inputs, sum_batch, trace_dtype, with_state, xt_h};
use super::dense::{spread_over_outputs, y_trace};
use crate::error::Result;
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, TensorMap};
use crate::tensor::{Aval, Tensor};
use braintrace_macros::{
    etp_primitive, init_drtrl, init_pp, instant_drtrl, solve_drtrl, xy_to_dw, yw_to_w,
};

/// The transforms and scale shared by both LoRA primitives' rules.
struct Lora<'a> {
    alpha: f64,
    b_fn: &'a Option<ElemFn>,
    a_fn: &'a Option<ElemFn>,
    bias_fn: &'a Option<ElemFn>,
}

macro_rules! lora_of {
    ($p:expr) => {
        Lora {
            alpha: $p.alpha,
            b_fn: &$p.b_fn,
            a_fn: &$p.a_fn,
            bias_fn: &$p.bias_fn,
        }
    };
}

// ---------------------------------------------------------------- impl

fn lora(
    op: &str,
    x: &Tensor,
    b: &Tensor,
    a: &Tensor,
    bias: Option<&Tensor>,
    has_bias: bool,
    l: Lora,
) -> Result<Tensor> {
    check_bias(op, has_bias, bias)?;
    let y = x
        .matmul(&apply_fn(l.b_fn, b)?)?
        .matmul(&apply_fn(l.a_fn, a)?)?
        .mul_scalar(l.alpha)?;
    match bias {
        Some(c) => y.add(&apply_fn(l.bias_fn, c)?),
        None => Ok(y),
    }
}

/// `y = α x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))` for a batch `x (B, I)`.
#[allow(clippy::too_many_arguments)]
#[etp_primitive(name = "etp_lora_mm", crate = "crate", batched, x = x, trainables(lora_b = lora_b, lora_a = lora_a, bias = bias), trace_kernel = lora(alpha = alpha, a_fn = a_fn, b_fn = b_fn, bias_fn = bias_fn))]
pub fn etp_lora_mm(
    x: &Tensor,
    lora_b: &Tensor,
    lora_a: &Tensor,
    bias: Option<&Tensor>,
    #[param] alpha: f64,
    #[param] rank: usize,
    #[param] has_bias: bool,
    #[param] b_fn: Option<ElemFn>,
    #[param] a_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    let _ = rank;
    lora(
        "etp_lora_mm",
        x,
        lora_b,
        lora_a,
        bias,
        has_bias,
        Lora {
            alpha,
            b_fn: &b_fn,
            a_fn: &a_fn,
            bias_fn: &bias_fn,
        },
    )
}

/// `y = α x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))` for one sample `x (I,)`.
#[allow(clippy::too_many_arguments)]
#[etp_primitive(name = "etp_lora_mv", crate = "crate", counterpart = etp_lora_mm, x = x, trainables(lora_b = lora_b, lora_a = lora_a, bias = bias), trace_kernel = lora(alpha = alpha, a_fn = a_fn, b_fn = b_fn, bias_fn = bias_fn))]
pub fn etp_lora_mv(
    x: &Tensor,
    lora_b: &Tensor,
    lora_a: &Tensor,
    bias: Option<&Tensor>,
    #[param] alpha: f64,
    #[param] rank: usize,
    #[param] has_bias: bool,
    #[param] b_fn: Option<ElemFn>,
    #[param] a_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    let _ = rank;
    lora(
        "etp_lora_mv",
        x,
        lora_b,
        lora_a,
        bias,
        has_bias,
        Lora {
            alpha,
            b_fn: &b_fn,
            a_fn: &a_fn,
            bias_fn: &bias_fn,
        },
    )
}

// ---------------------------------------------------------------- rules

/// `dB = α xᵀ (h Afᵀ) ⊙ b_fn'`, `dA = α (x Bf)ᵀ h ⊙ a_fn'`, `db = Σ_b h ⊙ g'`.
fn lora_dw(op: &str, x: &Tensor, hidden: &Tensor, ws: &TensorMap, l: Lora) -> Result<TensorMap> {
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let (bf, af) = (apply_fn(l.b_fn, b)?, apply_fn(l.a_fn, a)?);
    let mut out = TensorMap::new();
    out.insert(
        "lora_b".into(),
        times_derivative(
            l.b_fn,
            b,
            &xt_h(x, &hidden.matmul(&af.t()?)?)?.mul_scalar(l.alpha)?,
        )?,
    );
    out.insert(
        "lora_a".into(),
        times_derivative(
            l.a_fn,
            a,
            &xt_h(&x.matmul(&bf)?, hidden)?.mul_scalar(l.alpha)?,
        )?,
    );
    if let Some(bias) = ws.get("bias") {
        out.insert(
            "bias".into(),
            times_derivative(l.bias_fn, bias, &sum_batch(hidden, x.ndim() == 2)?)?,
        );
    }
    Ok(out)
}

/// Per sample: `ι_B = outer(x, h)` (effective weight; no α, no f'),
/// `ι_A = α outer(x Bf, h) ⊙ a_fn'`, `ι_b = h ⊙ g'`.
fn lora_instant(
    op: &str,
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    l: Lora,
) -> Result<TensorMap> {
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let bf = apply_fn(l.b_fn, b)?;
    let mut out = TensorMap::new();
    out.insert("lora_b".into(), xt_h(x, hidden)?);
    out.insert(
        "lora_a".into(),
        times_derivative(
            l.a_fn,
            a,
            &xt_h(&x.matmul(&bf)?, hidden)?.mul_scalar(l.alpha)?,
        )?,
    );
    if let Some(bias) = ws.get("bias") {
        out.insert("bias".into(), times_derivative(l.bias_fn, bias, hidden)?);
    }
    Ok(out)
}

/// Per sample, `g (O,)`: `dB = α ((trace_B ⊙ g) Afᵀ) ⊙ b_fn'`, `dA = trace_A ⊙ g`, `db = trace_b ⊙ g`.
fn lora_solve(
    op: &str,
    g: &Tensor,
    trace: &TensorMap,
    ws: &TensorMap,
    l: Lora,
) -> Result<TensorMap> {
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let af = apply_fn(l.a_fn, a)?;
    let gi = over_inputs(g)?;
    let mut out = TensorMap::new();
    let tb = leaf(trace, op, "lora_b")?.mul(&gi)?;
    out.insert(
        "lora_b".into(),
        times_derivative(l.b_fn, b, &tb.matmul(&af.t()?)?.mul_scalar(l.alpha)?)?,
    );
    out.insert("lora_a".into(), leaf(trace, op, "lora_a")?.mul(&gi)?);
    if let Some(tbias) = trace.get("bias") {
        out.insert("bias".into(), tbias.mul(g)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------- initialisers

/// `{lora_b (B?, I, O, S), lora_a (B?, r, O, S), bias (B?, O, S)}`.
///
/// A `lora_b` without axes, or a shape made impossible by `S`, is an error.
fn lora_trace(x: &Aval, y: &Aval, ws: &AvalMap, s: usize) -> Result<TensorMap> {
    let dt = trace_dtype(Some(x), y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    let o = *y.shape().last().unwrap_or(&1);
    ws.iter()
        .map(|(k, w)| {
            let shape = match k.as_str() {
                "bias" => with_state(y.shape(), s),
                "lora_b" => {
                    let Some(&i) = w.shape().first() else {
                        return Err(crate::Error::shapes(
                            "init_drtrl",
                            [w.shape()],
                            "lora_b must have at least one axis (its input size)",
                        ));
                    };
                    with_state(&[lead, &[i, o]].concat(), s)
                }
                _ => with_state(&[lead, w.shape()].concat(), s),
            };
            Ok((k.clone(), Tensor::try_zeros("init_drtrl", &shape, dt)?))
        })
        .collect()
}

/// The companion rules of a LoRA primitive (`etp_lora_mm` and `etp_lora_mv` share them).
macro_rules! lora_rules {
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
                lora_dw(stringify!($prim), x, hidden, ws, lora_of!(p))
            }

            #[instant_drtrl(super::$prim)]
            fn instant_drtrl(
                x: &Tensor,
                hidden: &Tensor,
                ws: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                lora_instant(stringify!($prim), x, hidden, ws, lora_of!(p))
            }

            #[solve_drtrl(super::$prim)]
            fn solve_drtrl(
                g: &Tensor,
                trace: &TensorMap,
                ws: &TensorMap,
                p: &super::$prim::Params,
            ) -> Result<TensorMap> {
                lora_solve(stringify!($prim), g, trace, ws, lora_of!(p))
            }

            #[init_drtrl(super::$prim)]
            fn init_drtrl(
                x: &Aval,
                y: &Aval,
                ws: &AvalMap,
                num_hidden_state: usize,
            ) -> Result<TensorMap> {
                lora_trace(x, y, ws, num_hidden_state)
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

lora_rules!(lora_mm_rules, etp_lora_mm);
lora_rules!(lora_mv_rules, etp_lora_mv);

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    #[test]
    fn lora_mm_rules() {
        let p = etp_lora_mm::Params {
            alpha: 0.7,
            rank: 2,
            has_bias: true,
            b_fn: ElemFn::builtin("tanh"),
            a_fn: ElemFn::builtin("square"),
            bias_fn: None,
        }
        .to_params();
        let args = [
            test_tensor(&[3, 4], 1),
            test_tensor(&[4, 2], 2),
            test_tensor(&[2, 5], 3),
            test_tensor(&[5], 4),
        ];
        let r = check_rules(&etp_lora_mm::primitive(), &args, &p).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn lora_mv_rules() {
        let p = etp_lora_mv::Params {
            alpha: 2.0,
            rank: 1,
            has_bias: false,
            b_fn: None,
            a_fn: None,
            bias_fn: None,
        }
        .to_params();
        let args = [
            test_tensor(&[4], 1),
            test_tensor(&[4, 1], 2),
            test_tensor(&[1, 5], 3),
        ];
        let r = check_rules(&etp_lora_mv::primitive(), &args, &p).unwrap();
        assert!(r.is_ok(), "{r}");
    }
}
