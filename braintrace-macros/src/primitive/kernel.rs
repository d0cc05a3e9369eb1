//! `trace_kernel = ...` validated into a [`KernelModel`].

use super::{Arg, ArgKind, KernelModel, ScaleModel};
use crate::attr::TraceKernelFlag;
use crate::ctxt::Ctxt;
use proc_macro2::Ident;
use syn::ext::IdentExt;

/// Validate `trace_kernel = ...`: every key known and given once, operand
/// keys naming trainables, param keys naming `#[param]`s, the kind's
/// required keys present. Every problem is reported; `None` after any.
pub(super) fn kernel_model(
    cx: &mut Ctxt,
    flag: &TraceKernelFlag,
    args: &[Arg],
    trainables: &[(String, usize)],
) -> Option<KernelModel> {
    let (kind, entries) = match flag {
        TraceKernelFlag::Chosen(p) => return Some(KernelModel::Chosen(p.clone())),
        TraceKernelFlag::Kind(k, e) => (k, e),
    };
    let kind_s = kind.to_string();
    // (key, is an operand key) the kind accepts.
    let keys: &[(&str, bool)] = match kind_s.as_str() {
        "dense" => &[
            ("weight", true),
            ("bias", true),
            ("weight_fn", false),
            ("bias_fn", false),
            ("scale", false),
        ],
        "sparse" => &[
            ("weight", true),
            ("bias", true),
            ("structure", false),
            ("weight_fn", false),
            ("bias_fn", false),
            ("scale", false),
        ],
        _ => &[
            ("b", true),
            ("a", true),
            ("bias", true),
            ("alpha", false),
            ("a_fn", false),
            ("b_fn", false),
            ("bias_fn", false),
        ],
    };
    let trainable_list = trainables
        .iter()
        .map(|(k, _)| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut ok = true;
    let mut got: Vec<(String, Ident, Option<String>)> = Vec::new();
    for (k, v) in entries {
        let ks = k.unraw().to_string();
        let Some(&(_, operand)) = keys.iter().find(|(n, _)| *n == ks) else {
            let known = keys
                .iter()
                .map(|(n, _)| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            cx.error(
                k.span(),
                format!("unknown `{kind_s}` trace-kernel key `{ks}`; expected one of: {known}"),
            );
            ok = false;
            continue;
        };
        if got.iter().any(|(g, _, _)| *g == ks) {
            cx.error(
                k.span(),
                format!("`{ks}` is given twice in `trace_kernel = {kind_s}(..)`"),
            );
            ok = false;
            continue;
        }
        let arg = args.iter().find(|a| a.ident.unraw() == v.unraw());
        let trainable = if operand {
            let name = match arg {
                Some(Arg {
                    kind: ArgKind::Operand(i),
                    ..
                }) => trainables
                    .iter()
                    .find(|(_, t)| t == i)
                    .map(|(n, _)| n.clone()),
                _ => None,
            };
            if name.is_none() {
                cx.error(v.span(), format!("`{ks} = {v}` must name a trainable operand of the primitive (trainables: {trainable_list})"));
                ok = false;
                continue;
            }
            name
        } else {
            if !matches!(
                arg,
                Some(Arg {
                    kind: ArgKind::Param,
                    ..
                })
            ) {
                cx.error(
                    v.span(),
                    format!("`{ks} = {v}` must name a `#[param]` argument of the primitive"),
                );
                ok = false;
                continue;
            }
            None
        };
        got.push((ks, v.clone(), trainable));
    }
    let find = |k: &str| got.iter().find(|(g, _, _)| g == k);
    let param = |k: &str| find(k).map(|(_, v, _)| v.clone());
    let operand = |k: &str| find(k).and_then(|(_, _, t)| t.clone());
    let by_name = |n: &str| {
        trainables
            .iter()
            .any(|(t, _)| t == n)
            .then(|| n.to_string())
    };
    let scale = |cx: &mut Ctxt, ok: &mut bool| match (param("weight_fn"), param("scale")) {
        (Some(_), Some(s)) => {
            cx.error(s.span(), "give the weight's scale once: `weight_fn = <param>` (an `Option<ElemFn>`) or `scale = <param>` (an `f64`)");
            *ok = false;
            ScaleModel::One
        }
        (Some(f), None) => ScaleModel::Fn(f),
        (None, Some(s)) => ScaleModel::Param(s),
        (None, None) => ScaleModel::One,
    };
    let bias_scale = param("bias_fn").map_or(ScaleModel::One, ScaleModel::Fn);
    // Dense and sparse: weight and bias by key, else the trainables in order.
    let weight_bias = |cx: &mut Ctxt, ok: &mut bool| -> (String, Option<String>) {
        let weight = operand("weight");
        let bias = operand("bias");
        if let Some(w) = weight {
            return (w, bias);
        }
        let rest: Vec<&String> = trainables
            .iter()
            .map(|(n, _)| n)
            .filter(|n| Some(*n) != bias.as_ref())
            .collect();
        match (rest.as_slice(), bias) {
            ([w], b) => ((*w).clone(), b),
            ([w, b], None) => ((*w).clone(), Some((*b).clone())),
            _ => {
                cx.error(kind.span(), format!("`trace_kernel = {kind_s}` cannot tell the weight from the bias among the trainables {trainable_list}: write `{kind_s}(weight = <arg>, bias = <arg>)`"));
                *ok = false;
                (String::new(), None)
            }
        }
    };
    let model = match kind_s.as_str() {
        "dense" => {
            let (weight, bias) = weight_bias(cx, &mut ok);
            let weight_scale = scale(cx, &mut ok);
            KernelModel::Dense {
                weight,
                bias,
                weight_scale,
                bias_scale,
            }
        }
        "sparse" => {
            let (weight, bias) = weight_bias(cx, &mut ok);
            let weight_scale = scale(cx, &mut ok);
            let Some(structure) = param("structure") else {
                cx.error(kind.span(), "`trace_kernel = sparse(..)` needs `structure = <param>`: the param holding the CSR structure");
                return None;
            };
            KernelModel::Sparse {
                weight,
                bias,
                structure,
                weight_scale,
                bias_scale,
            }
        }
        _ => {
            let b = operand("b").or_else(|| by_name("lora_b"));
            let a = operand("a").or_else(|| by_name("lora_a"));
            let alpha = param("alpha");
            let (Some(b), Some(a), Some(alpha)) = (b, a, alpha) else {
                cx.error(kind.span(), "`trace_kernel = lora(..)` needs `alpha = <param>` and the factors: trainables named `lora_b` and `lora_a`, or `b = <arg>, a = <arg>`");
                return None;
            };
            KernelModel::Lora {
                b,
                a,
                bias: operand("bias").or_else(|| by_name("bias")),
                alpha,
                a_fn: param("a_fn"),
                b_fn: param("b_fn"),
                bias_scale,
            }
        }
    };
    ok.then_some(model)
}
