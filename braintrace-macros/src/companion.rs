//! The companion attributes `#[yw_to_w(prim)]`, `#[xy_to_dw(prim)]`,
//! `#[init_drtrl(prim)]`, `#[init_pp(prim)]` (and the optional
//! `#[instant_drtrl(prim)]`, `#[solve_drtrl(prim)]`): leave the function as
//! it is and implement the primitive's completeness trait for that rule with
//! an adapter from the runtime's rule type to the function's own signature.
//! The adapter converts each argument through a `__private` trait chosen by
//! its role, so a wrong type is reported at that argument's type.

use crate::attr::tokens_to_string;
use crate::ctxt::Ctxt;
use crate::expand::item_span;
use crate::primitive::check_signature;
use crate::rule::{Generic, Output, Rule};
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Item, ItemFn, Path, ReturnType, Type};

/// The whole pipeline of one companion attribute.
pub fn companion(rule: Rule, args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::new();
    let rname = rule.name();
    let prim = parse_prim_path(&mut cx, rule, args);
    let func = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(f)) => f,
        Ok(other) => {
            cx.error(
                item_span(&other),
                format!("`#[{rname}]` applies to a free function: the primitive's `{rname}` rule"),
            );
            // The stub keeps the primitive from also reporting the rule missing.
            let stub = prim.as_ref().map(|p| expand_stub(rule, p));
            let errors = cx.into_compile_errors();
            return quote!(#other #stub #errors);
        }
        Err(e) => {
            cx.push(e);
            let errors = cx.into_compile_errors();
            return quote!(#item #errors);
        }
    };
    let Some(prim) = prim else {
        let errors = cx.into_compile_errors();
        return quote!(#func #errors);
    };
    let sound = check_companion(&mut cx, rule, &prim, &func);
    let imp = if sound {
        expand(rule, &prim, &func)
    } else {
        expand_stub(rule, &prim)
    };
    let errors = cx.into_compile_errors();
    quote!(#func #imp #errors)
}

fn parse_prim_path(cx: &mut Ctxt, rule: Rule, args: TokenStream) -> Option<Path> {
    let rname = rule.name();
    if args.is_empty() {
        cx.error(Span::call_site(), format!("name the primitive this rule belongs to: `#[{rname}(my_op)]`, where `my_op` is an `#[etp_primitive]` fn"));
        return None;
    }
    match syn::parse2::<Path>(args.clone()) {
        Ok(p) => Some(p),
        Err(_) => {
            cx.error_spanned(args, format!("expected the path of an `#[etp_primitive]` fn: `#[{rname}(my_op)]` or `#[{rname}(crate::ops::my_op)]`"));
            None
        }
    }
}

/// Check the companion's shape; returns whether the adapter can be built.
fn check_companion(cx: &mut Ctxt, rule: Rule, prim: &Path, func: &ItemFn) -> bool {
    let rname = rule.name();
    let attr = format!("#[{rname}]");
    let mut ok = !check_signature(cx, func, &attr, &format!("a `{rname}` rule"));
    let n_roles = rule.roles().len();
    let n = func.sig.inputs.len();
    let params = format!("{}::Params", tokens_to_string(prim));
    if n != n_roles && n != n_roles + 1 {
        cx.error(
            func.sig.paren_token.span.join(),
            format!(
                "{} `{rname}` rule takes {n_roles} arguments, or {} with the params: `{}`; this function takes {n}",
                article(rname),
                n_roles + 1,
                rule.generic_signature(&params)
            ),
        );
        ok = false;
    }
    if let ReturnType::Default = func.sig.output {
        let out = match rule.output() {
            Output::Tensor => "Result<Tensor>",
            Output::Map => "Result<Tensor>` (or `Result<TensorMap>`",
        };
        cx.error(
            func.sig.paren_token.span.close(),
            format!("{} `{rname}` rule returns `{out}`", article(rname)),
        );
        ok = false;
    }
    ok
}

/// "a" or "an" before a rule name.
pub fn article(rule: &str) -> &'static str {
    if rule.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The names the adapter uses, imported from the primitive's module by one
/// `use` at the primitive's path: if the path is not an `#[etp_primitive]`,
/// that one import fails (once) and the names it would have brought are
/// silently unresolved.
const RT: &str = "__braintrace_rt";
const RULES: &str = "__BraintraceRules";
const PARAMS: &str = "__BraintraceParams";
const ARITY: &str = "__BraintraceArity";
const XKIND: &str = "__BraintraceX";
const TRAIT: &str = "__BraintraceRuleTrait";

fn id(name: &str, span: Span) -> Ident {
    Ident::new(name, span)
}

/// `const _: () = { use <prim>::{..}; impl Trait for Rules { fn rule() -> R { body } } };`
fn wrap_impl(rule: Rule, prim: &Path, body: TokenStream) -> TokenStream {
    let span = prim.span();
    let tr = rule.trait_ident(span);
    let ty = rule.runtime_type(Span::call_site());
    let (rt, rules, params, arity, xkind, alias) = (
        id(RT, span),
        id(RULES, span),
        id(PARAMS, span),
        id(ARITY, span),
        id(XKIND, span),
        id(TRAIT, span),
    );
    // The impl header carries the path's span: a second companion for the
    // same rule is reported there.
    let imp = quote_spanned! {span=>
        impl #alias for #rules
    };
    quote! {
        const _: () = {
            #[allow(unused_imports)]
            use #prim::{__rt as #rt, Rules as #rules, Params as #params, __Arity as #arity, __X as #xkind, #tr as #alias};
            #imp {
                fn rule() -> #rt::#ty {
                    #body
                }
            }
        };
    }
}

fn expand(rule: Rule, prim: &Path, func: &ItemFn) -> TokenStream {
    let rname = Literal::string(rule.name());
    let ty = rule.runtime_type(Span::call_site());
    let rt = id(RT, Span::call_site());
    let roles = rule.roles();
    let closure_params: Vec<Ident> = roles
        .iter()
        .map(|r| r.closure_ident(Span::call_site()))
        .chain(std::iter::once(format_ident!("__params")))
        .collect();
    let types: Vec<&Type> = func
        .sig
        .inputs
        .iter()
        .map(|a| match a {
            FnArg::Typed(pt) => &*pt.ty,
            FnArg::Receiver(_) => unreachable!("rejected by check_signature"),
        })
        .collect();
    let mut stmts = Vec::new();
    let mut call_args = Vec::new();
    for (i, (role, ty)) in roles.iter().zip(&types).enumerate() {
        // Every generated token of the statement carries the type's span, so
        // a conversion error points at the argument's type alone.
        let sp = ty.span();
        let var = format_ident!("__a{}", i);
        let src = role.closure_ident(Span::call_site());
        let (tr, generic) = role.conversion();
        let (tr, rt) = (id(tr, sp), id(RT, sp));
        let generic = match generic {
            Generic::None => quote!(),
            Generic::Arity => {
                let a = id(ARITY, sp);
                quote_spanned!(sp=> ::<#a>)
            }
            Generic::X => {
                let x = id(XKIND, sp);
                quote_spanned!(sp=> ::<#x>)
            }
        };
        let extra = if role.takes_rule_name() {
            quote!(, #rname)
        } else {
            quote!()
        };
        stmts.push(quote_spanned! {sp=>
            let #var: #ty = #rt::#tr #generic::from_rule_arg(#src #extra)?;
        });
        call_args.push(var);
    }
    if types.len() == roles.len() + 1 {
        let ty = types[roles.len()];
        let sp = ty.span();
        let (rt, params) = (id(RT, sp), id(PARAMS, sp));
        stmts.push(quote_spanned! {sp=>
            let __typed = #params::from_params(__params)?;
            let __ap: #ty = #rt::ParamsArg::<#params>::from_typed(&__typed);
        });
        call_args.push(format_ident!("__ap"));
    }
    let f = &func.sig.ident;
    let ret_span = match &func.sig.output {
        ReturnType::Type(_, t) => t.span(),
        ReturnType::Default => func.sig.ident.span(),
    };
    let keys = rule.output_keys().closure_ident(Span::call_site());
    let (rt_ret, arity_ret) = (id(RT, ret_span), id(ARITY, ret_span));
    let finish = match rule.output() {
        Output::Map => {
            quote_spanned!(ret_span=> #rt_ret::MapOutput::<#arity_ret>::into_map(__out, #keys, #rname))
        }
        Output::Tensor => quote_spanned!(ret_span=> #rt_ret::TensorOutput::into_tensor(__out)),
    };
    let body = quote! {
        #rt::#ty::new(|#(#closure_params),*| {
            #(#stmts)*
            let __out = #f(#(#call_args),*);
            #finish
        })
    };
    wrap_impl(rule, prim, body)
}

/// After a companion error: a rule that is never called, so the primitive
/// does not also report the rule as missing.
fn expand_stub(rule: Rule, prim: &Path) -> TokenStream {
    let rt = id(RT, Span::call_site());
    let ty = rule.runtime_type(Span::call_site());
    let rname = Literal::string(rule.name());
    let underscores = (0..=rule.roles().len()).map(|_| quote!(_));
    let body = quote! {
        #rt::#ty::new(|#(#underscores),*| ::core::result::Result::Err(#rt::fallback_rule_error(#rname)))
    };
    wrap_impl(rule, prim, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rule: Rule, args: TokenStream, item: TokenStream) -> String {
        companion(rule, args, item).to_string()
    }

    #[test]
    fn companion_adapter() {
        let out = run(
            Rule::YwToW,
            quote!(scaled_mm),
            quote!(
                fn r(hidden: &Tensor, trace: &Tensor, p: &scaled_mm::Params) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        for needle in [
            "fn r (hidden : & Tensor",
            "use scaled_mm :: { __rt as __braintrace_rt , Rules as __BraintraceRules",
            "YwToWRule as __BraintraceRuleTrait }",
            "impl __BraintraceRuleTrait for __BraintraceRules",
            "let __a1 : & Tensor = __braintrace_rt :: TraceArg :: < __BraintraceArity > :: from_rule_arg (__trace , \"yw_to_w\") ?",
            "ParamsArg :: < __BraintraceParams > :: from_typed (& __typed)",
            "let __out = r (__a0 , __a1 , __ap)",
            "MapOutput :: < __BraintraceArity > :: into_map (__out , __trace , \"yw_to_w\")",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn companion_init_without_params() {
        let out = run(
            Rule::InitPp,
            quote!(super::ops::mm),
            quote!(
                fn i(x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(out.contains("use super :: ops :: mm :: {"), "{out}");
        assert!(
            out.contains("CountArg :: from_rule_arg (__num_hidden_state) ?"),
            "{out}"
        );
        assert!(out.contains("TensorOutput :: into_tensor (__out)"), "{out}");
        assert!(!out.contains("__typed"), "{out}");
    }

    #[test]
    fn companion_wrong_arity() {
        let out = run(
            Rule::XyToDw,
            quote!(mm),
            quote!(
                fn d(x: &Tensor, hidden: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(
            out.contains("a `xy_to_dw` rule takes 3 arguments, or 4 with the params"),
            "{out}"
        );
        // The stub still implements the rule, so no "missing rule" follows.
        assert!(out.contains("XyToDwRule as __BraintraceRuleTrait"), "{out}");
    }

    #[test]
    fn companion_needs_a_primitive() {
        let out = run(
            Rule::InitDrtrl,
            quote!(),
            quote!(
                fn i(x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(
            out.contains("name the primitive this rule belongs to"),
            "{out}"
        );
        let out = run(
            Rule::InitDrtrl,
            quote!(),
            quote!(
                struct S;
            ),
        );
        assert!(out.contains("applies to a free function"), "{out}");
    }
}
