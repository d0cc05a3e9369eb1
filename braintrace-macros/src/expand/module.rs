//! The same-name module of an `#[etp_primitive]` function.

use super::kernel::expand_trace_kernel;
use super::{cfgs, lit, respan, Names, UnrawString};
use crate::primitive::{Arg, ArgKind, Primitive};
use crate::rule::Rule;
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;

fn on_unimplemented_str(s: &str) -> Literal {
    // `{` and `}` are format placeholders in diagnostic attributes.
    lit(&s.replace('{', "{{").replace('}', "}}"))
}

/// The same-name module.
pub(super) fn expand_module(p: &Primitive, n: &Names) -> TokenStream {
    let ident = p.ident();
    let fn_name = ident.to_string();
    let rt = &n.rt;
    let krate = &p.krate;
    let vis = &p.func.vis;
    let cfgs = cfgs(&p.func.attrs);
    let name = lit(&p.name);
    let span = ident.span();
    let module_doc = lit(&format!(" Generated items of the ETP primitive `{}` (fn `{fn_name}`): its typed [`Params`], [`SPEC`] and [`primitive()`].", p.name));
    // Inside the same-name module, `module_path!()` is the fn's own path.
    let origin = quote_spanned!(span=> ::core::concat!("`#[etp_primitive]` fn `", ::core::module_path!(), "` (", ::core::file!(), ":", ::core::line!(), ")"));

    // Params.
    let params: Vec<&Arg> = p.params().collect();
    let fields = params.iter().map(|a| {
        let (id, ty) = (&a.ident, &a.ty);
        let doc = match &a.default {
            Some(d) => lit(&format!(
                " The `{id}` param (default `{}`).",
                crate::attr::tokens_to_string(d)
            )),
            None => lit(&format!(" The `{id}` param.")),
        };
        quote!(#[doc = #doc] pub #id: #ty)
    });
    // `#[param(default = ..)]`: one function per default, returning the
    // param's type, so a default of the wrong type is reported at it.
    let default_fn = |a: &Arg| format_ident!("__default_{}", a.ident.unraw_string());
    let default_fns = params.iter().filter_map(|a| {
        let d = a.default.as_ref()?;
        let (f, ty) = (default_fn(a), &a.ty);
        Some(quote! {
            #[allow(clippy::all)]
            fn #f() -> #ty {
                let __default: #ty = #d;
                __default
            }
        })
    });
    let reads = params.iter().map(|a| {
        let id = &a.ident;
        let key = lit(&a.ident.unraw_string());
        let ty = &a.ty;
        let probe = quote_spanned!(ty.span()=> (&#rt::ParamProbe::<#ty>::new()));
        match &a.default {
            Some(_) => {
                let f = default_fn(a);
                quote!(#id: #probe.read_or(__p, NAME, #key, #f)?)
            }
            None => quote!(#id: #probe.read(__p, NAME, #key)?),
        }
    });
    let default_impl = params.iter().all(|a| a.default.is_some()).then(|| {
        let inits = params.iter().map(|a| {
            let (id, f) = (&a.ident, default_fn(a));
            quote!(#id: #f())
        });
        quote! {
            /// Every param at its `#[param(default = ..)]` value.
            impl ::core::default::Default for Params {
                fn default() -> Self {
                    Params { #(#inits,)* }
                }
            }
        }
    });
    let keys: Vec<Literal> = params
        .iter()
        .map(|a| lit(&a.ident.unraw_string()))
        .collect();
    let idents: Vec<&Ident> = params.iter().map(|a| &a.ident).collect();
    let probes: Vec<TokenStream> = params
        .iter()
        .map(|a| {
            let ty = &a.ty;
            quote_spanned!(ty.span()=> (&#rt::ParamProbe::<#ty>::new()))
        })
        .collect();
    let check_params: Vec<TokenStream> = params
        .iter()
        .map(|a| {
            let ty = &a.ty;
            let rt = respan(rt.clone(), ty.span());
            quote_spanned!(ty.span()=> {
                let __probe = #rt::ParamProbe::<#ty>::new();
                #rt::check_param_type(&__probe, (&__probe).param_kind());
            })
        })
        .collect();
    let params_doc = lit(&format!(
        " Typed params of `{}`: one field per `#[param]` argument of `{fn_name}`.",
        p.name
    ));

    // Layout.
    let n_operands = p.operands().count();
    let x_index = match p.x {
        Some(i) => quote!(::core::option::Option::Some(#i)),
        None => quote!(::core::option::Option::None),
    };
    let trainables = p.trainables.iter().map(|(k, i)| {
        let k = lit(k);
        quote!((::std::string::String::from(#k), #i))
    });
    let (batched, gradient_enabled, exact) = (p.batched, p.gradient_enabled, p.exact_dw_shapes);
    let counterpart = p.counterpart.as_ref().map(|_| {
        let cf = &n.counterpart_fn;
        quote!(let __o = #rt::lazy_counterpart(__o, super::#cf);)
    });
    let arity = if p.keyed() {
        quote!(#rt::Keyed)
    } else {
        quote!(#rt::Single)
    };
    let x_kind = if p.x.is_some() {
        quote!(#rt::WithX)
    } else {
        quote!(#rt::NoX)
    };

    let (trace_kernel, kernel_checks) = expand_trace_kernel(p, rt);

    // The impl function over operand slices.
    let impl_fn = &n.impl_fn;
    let operand_vars: Vec<Ident> = (0..n_operands).map(|i| format_ident!("__o{}", i)).collect();
    let n_required = p.required_operands();
    let required_vars = &operand_vars[..n_required];
    let optional_vars = &operand_vars[n_required..];
    let required_idx: Vec<usize> = (0..n_required).collect();
    let optional_idx: Vec<usize> = (n_required..n_operands).collect();
    let optional_names: Vec<Literal> = p
        .trainables
        .iter()
        .filter(|(_, i)| *i >= n_required)
        .map(|(k, _)| lit(k))
        .collect();
    let call_args = p.args.iter().map(|a| match a.kind {
        ArgKind::Operand(i) => operand_vars[i].to_token_stream(),
        ArgKind::Param => {
            let id = &a.ident;
            quote!(__p.#id)
        }
    });

    // Rules: completeness traits (required ones carry the diagnostic) and
    // the autoref dispatch of the optional ones.
    let params_path = format!("{fn_name}::Params");
    let keyed = p.keyed();
    let has_x = p.x.is_some();
    let rule_traits = Rule::ALL.iter().map(|&r| {
        let tr = r.trait_ident(Span::call_site());
        let ty = r.runtime_type(Span::call_site());
        let rname = r.name();
        let doc = lit(&format!(" Implemented by `#[{rname}({fn_name})]`."));
        if r.required() {
            let message = on_unimplemented_str(&format!(
                "ETP primitive `{}` (fn `{fn_name}`) has no `{rname}` rule",
                p.name
            ));
            let label =
                on_unimplemented_str(&format!("the `{rname}` rule of `{fn_name}` is missing"));
            let note = on_unimplemented_str(&format!(
                "add `#[{rname}({fn_name})]` on a function `{}`",
                r.signature(&params_path, keyed, has_x)
            ));
            quote! {
                #[doc = #doc]
                #[doc(hidden)]
                #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
                pub trait #tr {
                    /// The rule.
                    fn rule() -> #rt::#ty;
                }
            }
        } else {
            let via = format_ident!("__Via{}", tr);
            let none = format_ident!("__No{}", tr);
            let m = r.optional_method(Span::call_site());
            quote! {
                #[doc = #doc]
                #[doc(hidden)]
                pub trait #tr {
                    /// The rule.
                    fn rule() -> #rt::#ty;
                }
                #[doc(hidden)]
                pub trait #via {
                    fn #m(&self) -> ::core::option::Option<#rt::#ty>;
                }
                impl<T: #tr> #via for #rt::Optional<T> {
                    fn #m(&self) -> ::core::option::Option<#rt::#ty> {
                        ::core::option::Option::Some(<T as #tr>::rule())
                    }
                }
                #[doc(hidden)]
                pub trait #none {
                    fn #m(&self) -> ::core::option::Option<#rt::#ty>;
                }
                impl<T> #none for &#rt::Optional<T> {
                    fn #m(&self) -> ::core::option::Option<#rt::#ty> {
                        ::core::option::Option::None
                    }
                }
            }
        }
    });
    let required_rules: Vec<TokenStream> = Rule::ALL
        .iter()
        .filter(|r| r.required())
        .map(|r| {
            let tr = r.trait_ident(Span::call_site());
            // Spanned at the fn's name: a missing companion is reported there.
            quote_spanned!(span=> <Rules as #tr>::rule())
        })
        .collect();
    let optional_rules = Rule::ALL.iter().filter(|r| !r.required()).map(|r| {
        let tr = r.trait_ident(Span::call_site());
        let field = format_ident!("{}", r.name());
        let via = format_ident!("__Via{}", tr);
        let none = format_ident!("__No{}", tr);
        let m = r.optional_method(Span::call_site());
        quote! {
            __s.#field = {
                #[allow(unused_imports)]
                use self::{#via as _, #none as _};
                (&#rt::Optional::<Rules>(::core::marker::PhantomData)).#m()
            };
        }
    });

    quote! {
        #(#cfgs)*
        #[doc = #module_doc]
        #[allow(dead_code, unreachable_pub, non_camel_case_types, non_snake_case, clippy::all)]
        #vis mod #ident {
            #[allow(unused_imports)]
            use super::*;
            #[doc(hidden)]
            pub use #krate::__private as __rt;

            /// The primitive's registry name.
            pub const NAME: &str = #name;
            /// Where the primitive is defined (named in duplicate-name errors).
            pub const ORIGIN: &str = #origin;

            #[doc = #params_doc]
            #[derive(Clone)]
            pub struct Params {
                #(#fields,)*
            }

            /// Never called: type-checks each `#[param]` type once, at its span.
            fn __check_param_types() {
                #[allow(unused_imports)]
                use #rt::{ParamProbeImpl as _, ParamProbeFallback as _};
                #(#check_params)*
            }

            impl Params {
                /// To the dynamic params map an equation carries.
                pub fn to_params(&self) -> #rt::Params {
                    #[allow(unused_imports)]
                    use #rt::{ParamProbeImpl as _, ParamProbeFallback as _};
                    #[allow(unused_mut)]
                    let mut __p = #rt::Params::new();
                    #( __p.insert(#keys, #probes.to_value(&self.#idents)); )*
                    __p
                }
                /// From the dynamic params map: a missing param reads as its
                /// `#[param(default = ..)]`; an error names a missing param
                /// without a default, or a mistyped one.
                pub fn from_params(__p: &#rt::Params) -> #rt::Result<Self> {
                    #[allow(unused_imports)]
                    use #rt::{ParamProbeImpl as _, ParamProbeFallback as _};
                    let _ = __p;
                    ::core::result::Result::Ok(Params { #( #reads, )* })
                }
            }
            #default_impl
            #(#default_fns)*
            impl ::core::fmt::Debug for Params {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    let __p = self.to_params();
                    let __fields: ::std::vec::Vec<(&str, #rt::ParamValue)> =
                        __p.iter().map(|(k, v)| (k.as_str(), ::core::clone::Clone::clone(v))).collect();
                    #rt::fmt_params(f, "Params", &__fields)
                }
            }
            impl ::core::cmp::PartialEq for Params {
                fn eq(&self, other: &Self) -> bool {
                    self.to_params() == other.to_params()
                }
            }

            #[doc(hidden)]
            pub struct Rules;
            #[doc(hidden)]
            pub type __Arity = #arity;
            #[doc(hidden)]
            pub type __X = #x_kind;
            #(#rule_traits)*

            fn __impl(__args: &[#rt::Tensor], __params: &#rt::Params) -> #rt::Result<#rt::Tensor> {
                if __args.len() < #n_required || __args.len() > #n_operands {
                    return ::core::result::Result::Err(#rt::operand_range_error(NAME, #n_required, #n_operands, __args.len()));
                }
                #(let #required_vars = &__args[#required_idx];)*
                #(let #optional_vars = __args.get(#optional_idx);)*
                let __p = Params::from_params(__params)?;
                let _ = &__p;
                ::core::result::Result::Ok(super::#impl_fn(#(#call_args),*)?)
            }

            fn __options() -> #rt::PrimitiveOptions {
                let mut __o = #rt::PrimitiveOptions::default();
                __o.batched = #batched;
                __o.gradient_enabled = #gradient_enabled;
                __o.x_index = #x_index;
                __o.trainables = ::std::vec![#(#trainables),*];
                __o.num_args = if #n_required == #n_operands { ::core::option::Option::Some(#n_operands) } else { ::core::option::Option::None };
                __o.optional = ::std::vec![#(::std::string::String::from(#optional_names)),*];
                __o.exact_dw_shapes = #exact;
                __o.origin = ::core::option::Option::Some(::std::string::String::from(ORIGIN));
                #trace_kernel
                #counterpart
                __o
            }
            #kernel_checks

            /// The primitive's spec: impl, rules, layout and flags.
            /// `get_primitive_spec(&primitive())` returns this same `Arc`.
            pub static SPEC: #rt::LazyLock<#rt::Arc<#rt::EtpPrimitiveSpec>> = #rt::LazyLock::new(|| {
                let mut __s = #rt::EtpPrimitiveSpec::new(NAME, __impl, #(#required_rules),*).with_options(__options());
                #(#optional_rules)*
                #rt::Arc::new(__s)
            });

            static __PRIMITIVE: #rt::OnceLock<#rt::Result<#rt::EtpPrimitive>> = #rt::OnceLock::new();

            /// Registers the primitive from [`SPEC`], once; what the
            /// `inventory` entry runs while the registries collect the
            /// compile-time primitives.
            #[doc(hidden)]
            pub fn __register() -> #rt::Result<#rt::EtpPrimitive> {
                ::core::clone::Clone::clone(__PRIMITIVE.get_or_init(|| #rt::register_static_spec(#rt::Arc::clone(&*SPEC))))
            }

            /// The primitive, registered from [`SPEC`] together with every
            /// other compile-time primitive, before any runtime
            /// registration. An error if another compile-time primitive
            /// (first in link order) holds [`NAME`].
            pub fn try_primitive() -> #rt::Result<#rt::EtpPrimitive> {
                #rt::ensure_static_registrations();
                __register()
            }

            /// The primitive handle.
            ///
            /// # Panics
            /// If registration failed (another primitive is registered under
            /// [`NAME`]); use [`try_primitive`] to get the error instead.
            pub fn primitive() -> #rt::EtpPrimitive {
                match try_primitive() {
                    ::core::result::Result::Ok(p) => p,
                    ::core::result::Result::Err(e) => ::core::panic!("{}", e),
                }
            }

            #rt::inventory::submit! {
                #rt::StaticPrimitive { get: __register }
            }
        }
    }
}
