//! LoRA `etp_lora_mm` / `etp_lora_mv`: `y = α · x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))`
//! with `B (I, r)` ("lora_b", input-facing), `A (r, O)` ("lora_a"). The
//! D-RTRL trace under `lora_b` is the trace of the effective weight
//! `(I, O)`; `solve_drtrl` maps it back. In order: impl, rules, initialisers.

use super::common::{fn_param, leaf, over_inputs, sum_batch, trace_dtype, with_state, xt_h};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, Params, TensorMap};
use crate::tensor::{Aval, Tensor};

struct Lora {
    alpha: f64,
    b_fn: Option<crate::etp::ElemFn>,
    a_fn: Option<crate::etp::ElemFn>,
    bias_fn: Option<crate::etp::ElemFn>,
}

fn lora(op: &str, p: &Params) -> Result<Lora> {
    Ok(Lora {
        alpha: p.get_or(op, "alpha", 1.0)?,
        b_fn: fn_param(p, op, "b_fn")?,
        a_fn: fn_param(p, op, "a_fn")?,
        bias_fn: fn_param(p, op, "bias_fn")?,
    })
}

/// `y = α x @ b_fn(B) @ a_fn(A) (+ bias_fn(b))`.
pub(crate) fn lora_impl(op: &str, args: &[Tensor], p: &Params) -> Result<Tensor> {
    let l = lora(op, p)?;
    let wrap = |e: Error| Error::etp(op, "bind", e.to_string());
    let xb = args[0]
        .matmul(&apply_fn(&l.b_fn, &args[1])?)
        .map_err(wrap)?;
    let y = xb
        .matmul(&apply_fn(&l.a_fn, &args[2])?)
        .map_err(wrap)?
        .mul_scalar(l.alpha)?;
    match args.get(3) {
        Some(b) => y.add(&apply_fn(&l.bias_fn, b)?).map_err(wrap),
        None => Ok(y),
    }
}

/// `xy_to_dw`: `dB = α xᵀ (h Afᵀ) ⊙ b_fn'`, `dA = α (x Bf)ᵀ h ⊙ a_fn'`, `db = Σ_b h ⊙ g'`.
pub(crate) fn lora_xy_to_dw(
    op: &str,
    x: Option<&Tensor>,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let x = x.ok_or_else(|| Error::etp(op, "rule xy_to_dw", "needs x"))?;
    let l = lora(op, p)?;
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let (bf, af) = (apply_fn(&l.b_fn, b)?, apply_fn(&l.a_fn, a)?);
    let mut out = TensorMap::new();
    out.insert(
        "lora_b".into(),
        times_derivative(
            &l.b_fn,
            b,
            &xt_h(x, &hidden.matmul(&af.t()?)?)?.mul_scalar(l.alpha)?,
        )?,
    );
    out.insert(
        "lora_a".into(),
        times_derivative(
            &l.a_fn,
            a,
            &xt_h(&x.matmul(&bf)?, hidden)?.mul_scalar(l.alpha)?,
        )?,
    );
    if let Some(bias) = ws.get("bias") {
        out.insert(
            "bias".into(),
            times_derivative(&l.bias_fn, bias, &sum_batch(hidden, x.ndim() == 2)?)?,
        );
    }
    Ok(out)
}

/// `instant_drtrl` (per sample): `ι_B = outer(x, h)` (effective weight, no α, no f'),
/// `ι_A = α outer(x Bf, h) ⊙ a_fn'`, `ι_b = h ⊙ g'`.
pub(crate) fn lora_instant_drtrl(
    op: &str,
    x: Option<&Tensor>,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let x = x.ok_or_else(|| Error::etp(op, "rule instant_drtrl", "needs x"))?;
    let l = lora(op, p)?;
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let bf = apply_fn(&l.b_fn, b)?;
    let mut out = TensorMap::new();
    out.insert("lora_b".into(), xt_h(x, hidden)?);
    out.insert(
        "lora_a".into(),
        times_derivative(
            &l.a_fn,
            a,
            &xt_h(&x.matmul(&bf)?, hidden)?.mul_scalar(l.alpha)?,
        )?,
    );
    if let Some(bias) = ws.get("bias") {
        out.insert("bias".into(), times_derivative(&l.bias_fn, bias, hidden)?);
    }
    Ok(out)
}

/// `solve_drtrl` (per sample, `g (O,)`): `dB = α ((trace_B ⊙ g) Afᵀ) ⊙ b_fn'`,
/// `dA = trace_A ⊙ g`, `db = trace_b ⊙ g`.
pub(crate) fn lora_solve_drtrl(
    op: &str,
    g: &Tensor,
    trace: &TensorMap,
    ws: &TensorMap,
    p: &Params,
) -> Result<TensorMap> {
    let l = lora(op, p)?;
    let (b, a) = (leaf(ws, op, "lora_b")?, leaf(ws, op, "lora_a")?);
    let af = apply_fn(&l.a_fn, a)?;
    let gi = over_inputs(g)?;
    let mut out = TensorMap::new();
    let tb = leaf(trace, op, "lora_b")?.mul(&gi)?;
    out.insert(
        "lora_b".into(),
        times_derivative(&l.b_fn, b, &tb.matmul(&af.t()?)?.mul_scalar(l.alpha)?)?,
    );
    out.insert("lora_a".into(), leaf(trace, op, "lora_a")?.mul(&gi)?);
    if let Some(tbias) = trace.get("bias") {
        out.insert("bias".into(), tbias.mul(g)?);
    }
    Ok(out)
}

/// `init_drtrl`: `{lora_b (B?, I, O, S), lora_a (B?, r, O, S), bias (B?, O, S)}`.
pub(crate) fn lora_init_drtrl(
    x: Option<&Aval>,
    y: &Aval,
    ws: &AvalMap,
    s: usize,
    _p: &Params,
) -> Result<TensorMap> {
    let dt = trace_dtype(x, y, ws);
    let lead = &y.shape()[..y.ndim().saturating_sub(1)];
    let o = *y.shape().last().unwrap_or(&1);
    ws.iter()
        .map(|(k, w)| {
            let shape = match k.as_str() {
                "bias" => with_state(y.shape(), s),
                "lora_b" => with_state(&[lead, &[w.shape()[0], o]].concat(), s),
                _ => with_state(&[lead, w.shape()].concat(), s),
            };
            Ok((k.clone(), Tensor::zeros(&shape, dt)))
        })
        .collect()
}
