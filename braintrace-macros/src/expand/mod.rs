//! `#[etp_primitive]` expansion: the user's function (now binding the
//! primitive), its original body as a hidden function, and the same-name
//! module with `Params`, `SPEC`, `primitive()`, the completeness traits and
//! the `inventory` registration.

use crate::ctxt::Ctxt;
use crate::primitive::{self, Primitive};
use crate::rule::Rule;
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Item, Pat};

mod kernel;
mod module;
#[cfg(test)]
mod tests;

use module::expand_module;

/// The whole `#[etp_primitive]` pipeline: parse, validate, expand.
pub fn etp_primitive(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::new();
    let flags = primitive::parse_flags(&mut cx, args);
    let func = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(f)) => f,
        Ok(other) => {
            cx.error(item_span(&other), "`#[etp_primitive]` applies to a free function: `fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor>`");
            let errors = cx.into_compile_errors();
            return quote!(#other #errors);
        }
        Err(e) => {
            cx.push(e);
            let errors = cx.into_compile_errors();
            return quote!(#item #errors);
        }
    };
    let p = primitive::analyse(&mut cx, flags, func);
    let body = if p.structural_error {
        expand_stub(&p)
    } else {
        expand(&p)
    };
    let errors = cx.into_compile_errors();
    quote!(#body #errors)
}

/// Where to report "not a function" for an item.
pub fn item_span(item: &Item) -> Span {
    match item {
        Item::Struct(s) => s.ident.span(),
        Item::Enum(e) => e.ident.span(),
        Item::Const(c) => c.ident.span(),
        Item::Static(s) => s.ident.span(),
        Item::Mod(m) => m.ident.span(),
        Item::Trait(t) => t.ident.span(),
        Item::Type(t) => t.ident.span(),
        Item::Union(u) => u.ident.span(),
        other => other.span(),
    }
}

/// `ts` with every token at `span` (so an error in it points at `span`).
fn respan(ts: TokenStream, span: Span) -> TokenStream {
    ts.into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut ng = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                ng.set_span(span);
                tt = proc_macro2::TokenTree::Group(ng);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

fn lit(s: &str) -> Literal {
    Literal::string(s)
}

/// `#[cfg]` attributes, which every generated item must share.
fn cfgs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).collect()
}

/// Lint attributes (and `cfg`), which the hidden body function keeps.
fn body_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    const KEEP: &[&str] = &["cfg", "allow", "expect", "warn", "deny", "forbid"];
    attrs
        .iter()
        .filter(|a| KEEP.iter().any(|k| a.path().is_ident(k)))
        .collect()
}

struct Names {
    rt: TokenStream,
    impl_fn: Ident,
    counterpart_fn: Ident,
}

fn names(p: &Primitive) -> Names {
    let krate = &p.krate;
    let ident = p.ident();
    Names {
        rt: quote!(#krate::__private),
        impl_fn: format_ident!("__braintrace_impl_{}", ident),
        counterpart_fn: format_ident!("__braintrace_counterpart_{}", ident),
    }
}

/// The user's function, its hidden original, and the module.
pub fn expand(p: &Primitive) -> TokenStream {
    let n = names(p);
    let wrapper = expand_wrapper(p);
    let hidden = expand_hidden_impl(p, &n);
    let counterpart = p.counterpart.as_ref().map(|path| {
        let (cf, rt) = (&n.counterpart_fn, &n.rt);
        let cfgs = cfgs(&p.func.attrs);
        quote! {
            #(#cfgs)*
            #[doc(hidden)]
            fn #cf() -> #rt::EtpPrimitive {
                #path::primitive()
            }
        }
    });
    let module = expand_module(p, &n);
    quote!(#wrapper #hidden #counterpart #module)
}

/// The user-facing function: same signature, binds the primitive.
fn expand_wrapper(p: &Primitive) -> TokenStream {
    let ident = p.ident();
    let mut func = p.func.clone();
    // Patterns such as `mut scale` matter to the body, not to the wrapper.
    for input in func.sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = input {
            pt.attrs.clear();
            if let Pat::Ident(pi) = &mut *pt.pat {
                pi.mutability = None;
            }
        }
    }
    let required = p.operands().filter(|a| !a.optional).map(|a| &a.ident);
    let optional = p.operands().filter(|a| a.optional).map(|a| &a.ident);
    let optional_idx = p.required_operands()..p.operands().count();
    let params = p.params().map(|a| &a.ident);
    let attrs = &func.attrs;
    let vis = &func.vis;
    let sig = &func.sig;
    quote! {
        #(#attrs)*
        #vis #sig {
            let __braintrace_params = #ident::Params { #(#params),* };
            let __braintrace_primitive = #ident::try_primitive()?;
            #[allow(unused_mut)]
            let mut __braintrace_operands = ::std::vec![#(::core::clone::Clone::clone(#required)),*];
            #(#ident::__rt::push_optional_operand(#ident::NAME, &mut __braintrace_operands, #optional_idx, #optional)?;)*
            #ident::__rt::convert_result(__braintrace_primitive.bind(
                &__braintrace_operands,
                &#ident::Params::to_params(&__braintrace_params),
            ))
        }
    }
}

/// The original body, kept as a hidden function the spec's impl calls.
fn expand_hidden_impl(p: &Primitive, n: &Names) -> TokenStream {
    let mut func = p.func.clone();
    func.sig.ident = n.impl_fn.clone();
    func.vis = syn::Visibility::Inherited;
    let keep: Vec<Attribute> = body_attrs(&p.func.attrs).into_iter().cloned().collect();
    func.attrs = keep;
    quote! {
        #[doc(hidden)]
        #[allow(clippy::too_many_arguments)]
        #func
    }
}

/// After an error that leaves no usable primitive: the function as written
/// (so its body is still checked) and a module with the names companions
/// refer to, so they add no errors of their own.
pub fn expand_stub(p: &Primitive) -> TokenStream {
    let func = &p.func;
    let ident = p.ident();
    let vis = &func.vis;
    let cfgs = cfgs(&func.attrs);
    let rt = &names(p).rt;
    let krate = &p.krate;
    // A by-reference param was reported; its field gets the referenced type
    // so companions using it add no errors.
    let fields = p.params().map(|a| {
        let id = &a.ident;
        match &a.ty {
            syn::Type::Reference(r) => {
                let ty = &r.elem;
                quote!(pub #id: #ty)
            }
            ty => quote!(pub #id: #ty),
        }
    });
    let rule_traits = Rule::ALL.iter().map(|&r| {
        let tr = r.trait_ident(Span::call_site());
        let ty = r.runtime_type(Span::call_site());
        quote!(pub trait #tr { fn rule() -> #rt::#ty; })
    });
    let name = lit(&p.name);
    quote! {
        #[allow(dead_code)]
        #func
        #(#cfgs)*
        #[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
        #vis mod #ident {
            #[allow(unused_imports)]
            use super::*;
            pub use #krate::__private as __rt;
            pub const NAME: &str = #name;
            pub struct Params { #(#fields,)* }
            impl Params {
                pub fn from_params(_: &#rt::Params) -> #rt::Result<Self> {
                    ::core::result::Result::Err(#rt::fallback_rule_error(NAME))
                }
                pub fn to_params(&self) -> #rt::Params {
                    #rt::Params::new()
                }
            }
            pub struct Rules;
            pub type __Arity = #rt::Single;
            pub type __X = #rt::WithX;
            #(#rule_traits)*
            pub fn try_primitive() -> #rt::Result<#rt::EtpPrimitive> {
                ::core::result::Result::Err(#rt::fallback_rule_error(NAME))
            }
            pub fn primitive() -> #rt::EtpPrimitive {
                ::core::panic!("`{}` did not compile", NAME)
            }
        }
    }
}

trait UnrawString {
    fn unraw_string(&self) -> String;
}
impl UnrawString for Ident {
    fn unraw_string(&self) -> String {
        syn::ext::IdentExt::unraw(self).to_string()
    }
}
