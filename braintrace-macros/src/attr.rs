//! Parsing of `#[etp_primitive(...)]`'s arguments: first into raw
//! `key [= value | (list)]` entries (only a malformed list is fatal), then
//! each entry is interpreted on its own, so every bad flag is reported.

use crate::ctxt::Ctxt;
use crate::symbol::*;
use proc_macro2::{Delimiter, Ident, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, Expr, LitBool, LitStr, Meta, Path, Token};

/// One `key`, `key = value` or `key(list)` entry.
pub struct RawFlag {
    /// The key.
    pub key: Ident,
    /// What follows it.
    pub value: RawValue,
}

/// The part after a key.
pub enum RawValue {
    /// Nothing: a bare flag.
    None,
    /// `= tokens` up to the next top-level comma.
    Eq(TokenStream),
    /// `( tokens )`.
    List(TokenStream),
}

impl RawValue {
    fn span_or(&self, key: &Ident) -> Span {
        match self {
            RawValue::Eq(ts) | RawValue::List(ts) => ts
                .clone()
                .into_iter()
                .next()
                .map_or(key.span(), |t| t.span()),
            RawValue::None => key.span(),
        }
    }
}

/// Split the attribute's arguments into raw entries.
pub fn parse_raw(args: TokenStream) -> syn::Result<Vec<RawFlag>> {
    let parser = |input: ParseStream| {
        let mut out = Vec::new();
        while !input.is_empty() {
            let key = input.call(Ident::parse_any)?;
            let value = if input.peek(Token![=]) {
                let eq: Token![=] = input.parse()?;
                let mut ts = TokenStream::new();
                while !input.is_empty() && !input.peek(Token![,]) {
                    let tt: TokenTree = input.parse()?;
                    ts.extend(std::iter::once(tt));
                }
                if ts.is_empty() {
                    return Err(syn::Error::new(
                        eq.span,
                        format!("expected a value after `{key} =`"),
                    ));
                }
                RawValue::Eq(ts)
            } else if input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in input);
                RawValue::List(content.parse()?)
            } else {
                RawValue::None
            };
            out.push(RawFlag { key, value });
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(out)
    };
    parser.parse2(args)
}

/// The trainables as written.
#[derive(Clone)]
pub enum TrainableSpec {
    /// `weight = a` or `weight = [a, b]`: names derived from the arguments.
    Args(Vec<Ident>),
    /// `trainables(name = arg, ...)`.
    Named(Vec<(Ident, Ident)>),
}

/// `trace_kernel = ...` as written.
pub enum TraceKernelFlag {
    /// A kind by name with its `key = <arg>` entries: `dense(scale = s)`.
    Kind(Ident, Vec<(Ident, Ident)>),
    /// A function choosing the kernel from an equation's params.
    Chosen(Path),
}

/// The interpreted flags (absent ones are `None`; defaults apply later).
#[derive(Default)]
pub struct PrimitiveArgs {
    /// `name = "..."`.
    pub name: Option<LitStr>,
    /// `batched`.
    pub batched: bool,
    /// `gradient_enabled`.
    pub gradient_enabled: bool,
    /// `x = arg` (`Some(None)` for `x = none`).
    pub x: Option<Option<Ident>>,
    /// `weight = ...` or `trainables(...)`.
    pub trainables: Option<(Span, TrainableSpec)>,
    /// `counterpart = path`.
    pub counterpart: Option<Path>,
    /// `crate = "path"`.
    pub krate: Option<Path>,
    /// `exact_dw_shapes = bool` (default true).
    pub exact_dw_shapes: Option<bool>,
    /// `trace_kernel = ...`.
    pub trace_kernel: Option<TraceKernelFlag>,
}

/// Interpret every raw entry, recording each problem in `cx`.
pub fn interpret(cx: &mut Ctxt, raw: Vec<RawFlag>) -> PrimitiveArgs {
    let mut out = PrimitiveArgs::default();
    // (setting, key as written) of every flag seen so far.
    let mut seen: Vec<(String, String)> = Vec::new();
    for RawFlag { key, value } in raw {
        let k = key.unraw().to_string();
        // `weight` and `trainables` are two spellings of one setting.
        let slot = if k == TRAINABLES {
            WEIGHT.to_string()
        } else {
            k.clone()
        };
        if ALL_KEYS.contains(&k.as_str()) {
            if let Some((_, first)) = seen.iter().find(|(s, _)| *s == slot) {
                let msg = if *first != k {
                    "the trainables are given twice: use either `weight = ...` or `trainables(...)`, once".to_string()
                } else {
                    format!("`{k}` is given twice; give each `#[etp_primitive]` flag once")
                };
                cx.error(key.span(), msg);
                continue;
            }
            seen.push((slot, k.clone()));
        }
        match k.as_str() {
            NAME => {
                if let Some(lit) = expect_eq(cx, &key, value, "name = \"etp_my_op\"").and_then(|ts| parse_or_report::<LitStr>(cx, ts, "expected a string literal: `name = \"etp_my_op\"`")) {
                    if lit.value().is_empty() {
                        cx.error(lit.span(), "the primitive's name must not be empty");
                    } else {
                        out.name = Some(lit);
                    }
                }
            }
            BATCHED => out.batched = bool_flag(cx, &key, value),
            GRADIENT_ENABLED => out.gradient_enabled = bool_flag(cx, &key, value),
            EXACT_DW_SHAPES => out.exact_dw_shapes = Some(bool_flag(cx, &key, value)),
            X => {
                if let Some(id) = expect_eq(cx, &key, value, "x = <arg>` or `x = none").and_then(|ts| parse_or_report::<Ident>(cx, ts, "expected an argument name or `none`: `x = x` or `x = none`")) {
                    out.x = Some(if id == NONE { None } else { Some(id) });
                }
            }
            WEIGHT => {
                let span = value.span_or(&key);
                if let Some(ts) = expect_eq(cx, &key, value, "weight = <arg>` or `weight = [<arg>, ...]") {
                    if let Some(ids) = weight_list(cx, ts) {
                        out.trainables = Some((span, TrainableSpec::Args(ids)));
                    }
                }
            }
            TRAINABLES => {
                let span = key.span();
                match value {
                    RawValue::List(ts) => {
                        if let Some(pairs) = trainable_pairs(cx, ts) {
                            out.trainables = Some((span, TrainableSpec::Named(pairs)));
                        }
                    }
                    _ => cx.error(key.span(), "expected a list: `trainables(lora_b = b, lora_a = a)`"),
                }
            }
            COUNTERPART => {
                if let Some(p) = expect_eq(cx, &key, value, "counterpart = <fn>").and_then(|ts| parse_or_report::<Path>(cx, ts, "expected the path of an `#[etp_primitive]` fn: `counterpart = my_op_batched`")) {
                    out.counterpart = Some(p);
                }
            }
            CRATE => {
                if let Some(lit) = expect_eq(cx, &key, value, "crate = \"::braintrace\"").and_then(|ts| parse_or_report::<LitStr>(cx, ts, "expected a string literal: `crate = \"::braintrace\"`")) {
                    match lit.parse::<Path>() {
                        Ok(p) => out.krate = Some(p),
                        Err(_) => cx.error(lit.span(), format!("`{}` is not a path; write `crate = \"::braintrace\"`", lit.value())),
                    }
                }
            }
            TRACE_KERNEL => {
                if let Some(ts) = expect_eq(cx, &key, value, "trace_kernel = dense` or `trace_kernel = dense(scale = <param>)") {
                    out.trace_kernel = trace_kernel_flag(cx, ts);
                }
            }
            _ => cx.error(key.span(), format!("unknown `#[etp_primitive]` flag `{k}`; expected one of: {}", ALL_FLAGS.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", "))),
        }
    }
    out
}

const ALL_KEYS: &[&str] = &[
    NAME,
    BATCHED,
    GRADIENT_ENABLED,
    X,
    WEIGHT,
    TRAINABLES,
    COUNTERPART,
    CRATE,
    EXACT_DW_SHAPES,
    TRACE_KERNEL,
];

/// `dense`, `dense(k = v, ..)`, `sparse(..)`, `lora(..)`, or a path to a
/// chooser function.
fn trace_kernel_flag(cx: &mut Ctxt, ts: TokenStream) -> Option<TraceKernelFlag> {
    let tokens: Vec<TokenTree> = ts.clone().into_iter().collect();
    let kind = match tokens.first() {
        Some(TokenTree::Ident(id)) if KERNEL_KINDS.contains(&id.to_string().as_str()) => {
            id.clone()
        }
        _ => {
            return parse_or_report::<Path>(
                cx,
                ts,
                "expected a trace-kernel kind (`dense`, `sparse(..)`, `lora(..)`) or the path of a fn choosing one",
            )
            .map(TraceKernelFlag::Chosen)
        }
    };
    match &tokens[1..] {
        [] => Some(TraceKernelFlag::Kind(kind, Vec::new())),
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::Parenthesis => {
            let parser = |input: ParseStream| {
                let mut v = Vec::new();
                while !input.is_empty() {
                    let k = input.call(Ident::parse_any)?;
                    input.parse::<Token![=]>()?;
                    let a = input.call(Ident::parse_any)?;
                    v.push((k, a));
                    if !input.is_empty() {
                        input.parse::<Token![,]>()?;
                    }
                }
                Ok(v)
            };
            match parser.parse2(g.stream()) {
                Ok(v) => Some(TraceKernelFlag::Kind(kind, v)),
                Err(e) => {
                    cx.error(
                        e.span(),
                        format!(
                            "expected `{kind}(<key> = <arg>, ...)`, e.g. `dense(scale = scale)`"
                        ),
                    );
                    None
                }
            }
        }
        _ => {
            cx.error_spanned(
                ts,
                format!("expected `{kind}` or `{kind}(<key> = <arg>, ...)`"),
            );
            None
        }
    }
}

fn expect_eq(cx: &mut Ctxt, key: &Ident, value: RawValue, syntax: &str) -> Option<TokenStream> {
    match value {
        RawValue::Eq(ts) => Some(ts),
        _ => {
            cx.error(key.span(), format!("expected `{syntax}`"));
            None
        }
    }
}

fn parse_or_report<T: syn::parse::Parse>(cx: &mut Ctxt, ts: TokenStream, msg: &str) -> Option<T> {
    match syn::parse2::<T>(ts.clone()) {
        Ok(v) => Some(v),
        Err(_) => {
            cx.error_spanned(ts, msg);
            None
        }
    }
}

fn bool_flag(cx: &mut Ctxt, key: &Ident, value: RawValue) -> bool {
    match value {
        RawValue::None => true,
        RawValue::Eq(ts) => parse_or_report::<LitBool>(
            cx,
            ts,
            &format!("expected `{key}` alone, or `{key} = true` / `{key} = false`"),
        )
        .is_some_and(|b| b.value),
        RawValue::List(ts) => {
            cx.error_spanned(
                ts,
                format!("expected `{key}` alone, or `{key} = true` / `{key} = false`"),
            );
            false
        }
    }
}

fn weight_list(cx: &mut Ctxt, ts: TokenStream) -> Option<Vec<Ident>> {
    let mut it = ts.clone().into_iter();
    let first = it.next();
    let rest = it.next();
    match (first, rest) {
        (Some(TokenTree::Ident(id)), None) => Some(vec![id]),
        (Some(TokenTree::Group(g)), None) if g.delimiter() == Delimiter::Bracket => {
            let parser = syn::punctuated::Punctuated::<Ident, Token![,]>::parse_terminated;
            match parser.parse2(g.stream()) {
                Ok(list) if !list.is_empty() => Some(list.into_iter().collect()),
                Ok(_) => {
                    cx.error(
                        g.span(),
                        "`weight = []` lists no trainable; a primitive needs at least one",
                    );
                    None
                }
                Err(_) => {
                    cx.error(
                        g.span(),
                        "expected argument names: `weight = [weight, bias]`",
                    );
                    None
                }
            }
        }
        _ => {
            cx.error_spanned(
                ts,
                "expected an argument name or a list: `weight = w` or `weight = [weight, bias]`",
            );
            None
        }
    }
}

fn trainable_pairs(cx: &mut Ctxt, ts: TokenStream) -> Option<Vec<(Ident, Ident)>> {
    let parser = |input: ParseStream| {
        let mut v = Vec::new();
        while !input.is_empty() {
            let k: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let a: Ident = input.parse()?;
            v.push((k, a));
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(v)
    };
    match parser.parse2(ts.clone()) {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => {
            cx.error(
                Span::call_site(),
                "`trainables()` lists no trainable; a primitive needs at least one",
            );
            None
        }
        Err(e) => {
            cx.error(e.span(), "expected `trainables(<name> = <arg>, ...)`, e.g. `trainables(lora_b = b, lora_a = a)`");
            None
        }
    }
}

/// The default of a `#[param]` attribute: `None` for `#[param]` alone,
/// the expression of `#[param(default = <expr>)]`. Any other form is
/// reported (and read as no default, so the rest still expands).
pub fn param_default(cx: &mut Ctxt, attr: &Attribute) -> Option<Expr> {
    const FORM: &str =
        "write `#[param]`, or `#[param(default = <value>)]` to give the param a default";
    let list = match &attr.meta {
        Meta::Path(_) => return None,
        Meta::NameValue(nv) => {
            cx.error_spanned(
                nv,
                format!(
                    "expected `#[param(default = {})]`: {FORM}",
                    tokens_to_string(&nv.value)
                ),
            );
            return None;
        }
        Meta::List(list) => list,
    };
    if list.tokens.is_empty() {
        cx.error_spanned(attr, format!("`#[param()]` is empty: {FORM}"));
        return None;
    }
    // `key = expr, ...`; only `default` is known. Every problem is reported.
    let parser = |input: ParseStream| -> syn::Result<Vec<(Ident, Option<Expr>)>> {
        let mut entries = Vec::new();
        while !input.is_empty() {
            let key = input.call(Ident::parse_any)?;
            let value = if input.peek(Token![=]) {
                let eq: Token![=] = input.parse()?;
                if input.is_empty() || input.peek(Token![,]) {
                    return Err(syn::Error::new(
                        eq.span,
                        format!("expected a value after `{key} =`: `#[param(default = <value>)]`"),
                    ));
                }
                Some(input.parse::<Expr>()?)
            } else {
                None
            };
            entries.push((key, value));
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(entries)
    };
    let entries = match parser.parse2(list.tokens.clone()) {
        Ok(e) => e,
        Err(e) => {
            cx.error(e.span(), e);
            return None;
        }
    };
    let mut default: Option<Expr> = None;
    for (key, value) in entries {
        if key != DEFAULT {
            cx.error(
                key.span(),
                format!(
                    "unknown `#[param]` option `{key}`; the only option is `default = <value>`"
                ),
            );
            continue;
        }
        let Some(value) = value else {
            cx.error(
                key.span(),
                "expected `default = <value>`: `#[param(default = 1.0)]`",
            );
            continue;
        };
        if default.is_some() {
            cx.error(key.span(), "`default` is given twice; give it once");
            continue;
        }
        default = Some(value);
    }
    default
}

/// Render tokens for messages.
pub fn tokens_to_string(t: impl ToTokens) -> String {
    let mut s = t.to_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        ("& ", "&"),
        (" < ", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
        (" ! [", "!["),
        (" ! (", "!("),
        (" ! {", "!{"),
    ] {
        s = s.replace(from, to);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn run(ts: TokenStream) -> (PrimitiveArgs, String) {
        let mut cx = Ctxt::new();
        let raw = parse_raw(ts).expect("well-formed");
        let out = interpret(&mut cx, raw);
        (out, cx.into_compile_errors().to_string())
    }

    #[test]
    fn flags_parse() {
        let (a, errs) = run(quote!(
            name = "etp_scaled_mm",
            batched,
            x = x,
            weight = w,
            counterpart = super::mm,
            crate = "crate",
            exact_dw_shapes = false
        ));
        assert!(errs.is_empty(), "{errs}");
        assert_eq!(a.name.unwrap().value(), "etp_scaled_mm");
        assert!(a.batched && !a.gradient_enabled);
        assert_eq!(a.x.unwrap().unwrap(), "x");
        assert!(matches!(a.trainables, Some((_, TrainableSpec::Args(ref v))) if v.len() == 1));
        assert_eq!(a.exact_dw_shapes, Some(false));
        assert_eq!(tokens_to_string(a.krate.unwrap()), "crate");
        assert_eq!(
            tokens_to_string(quote!(&std::collections::HashMap<String, f64>)),
            "&std::collections::HashMap<String, f64>"
        );
    }

    #[test]
    fn flags_lists() {
        let (a, errs) = run(quote!(x = none, weight = [weight, bias]));
        assert!(errs.is_empty(), "{errs}");
        assert!(a.x.unwrap().is_none());
        assert!(matches!(a.trainables, Some((_, TrainableSpec::Args(ref v))) if v.len() == 2));
        let (a, errs) = run(quote!(trainables(lora_b = b, lora_a = a)));
        assert!(errs.is_empty(), "{errs}");
        assert!(
            matches!(a.trainables, Some((_, TrainableSpec::Named(ref v))) if v[0].0 == "lora_b" && v[1].1 == "a")
        );
    }

    #[test]
    fn flags_errors_are_all_reported() {
        let (_, errs) = run(quote!(
            batchd,
            name = "a",
            name = "b",
            weight = w,
            trainables(k = w),
            x = 3
        ));
        assert!(
            errs.contains("unknown `#[etp_primitive]` flag `batchd`"),
            "{errs}"
        );
        assert!(errs.contains("`name` is given twice"), "{errs}");
        assert!(errs.contains("the trainables are given twice"), "{errs}");
        assert!(
            errs.contains("expected an argument name or `none`"),
            "{errs}"
        );
    }

    #[test]
    fn flags_malformed_list_is_fatal() {
        assert!(parse_raw(quote!(name = )).is_err());
        assert!(parse_raw(quote!(batched batched)).is_err());
    }
}
