//! `#[etp_primitive]` expansion: the user's function (now binding the
//! primitive), its original body as a hidden function, and the same-name
//! module with `Params`, `SPEC`, `primitive()`, the completeness traits and
//! the `inventory` registration.

use crate::ctxt::Ctxt;
use crate::primitive::{self, Arg, ArgKind, Primitive};
use crate::rule::Rule;
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Item, Pat};

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

fn on_unimplemented_str(s: &str) -> Literal {
    // `{` and `}` are format placeholders in diagnostic attributes.
    lit(&s.replace('{', "{{").replace('}', "}}"))
}

/// The same-name module.
fn expand_module(p: &Primitive, n: &Names) -> TokenStream {
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

/// `__o.trace_kernel = ..` for a declared kernel, and a never-called fn
/// type-checking the params it names (`Option<ElemFn>` transforms, `f64`
/// scales), each at the param's name in the flag.
fn expand_trace_kernel(p: &Primitive, rt: &TokenStream) -> (TokenStream, TokenStream) {
    use crate::primitive::{KernelModel, ScaleModel};
    let Some(k) = &p.trace_kernel else {
        return (TokenStream::new(), TokenStream::new());
    };
    let mut checks: Vec<TokenStream> = Vec::new();
    let string = |s: &str| {
        let s = lit(s);
        quote!(::std::string::String::from(#s))
    };
    let opt = |s: &Option<String>| match s {
        Some(s) => {
            let s = string(s);
            quote!(::core::option::Option::Some(#s))
        }
        None => quote!(::core::option::Option::None),
    };
    // A param read as a transform (`Option<ElemFn>`) or a number (`f64`).
    let fn_key = |checks: &mut Vec<TokenStream>, id: &Ident| {
        let rt2 = respan(rt.clone(), id.span());
        checks.push(
            quote_spanned!(id.span()=> let _: &::core::option::Option<#rt2::ElemFn> = &__p.#id;),
        );
        string(&id.unraw_string())
    };
    let num_key = |checks: &mut Vec<TokenStream>, id: &Ident| {
        checks.push(quote_spanned!(id.span()=> let _: &f64 = &__p.#id;));
        string(&id.unraw_string())
    };
    let scale = |checks: &mut Vec<TokenStream>, s: &ScaleModel| match s {
        ScaleModel::One => quote!(#rt::Scale::One),
        ScaleModel::Fn(id) => {
            let key = fn_key(checks, id);
            quote!(#rt::Scale::Fn(#key))
        }
        ScaleModel::Param(id) => {
            let key = num_key(checks, id);
            quote!(#rt::Scale::Param(#key))
        }
    };
    let decl = match k {
        KernelModel::Chosen(path) => {
            let path = quote_spanned!(path.span()=> super::#path);
            quote!(#rt::TraceKernelDecl::Chosen(#path))
        }
        KernelModel::Dense {
            weight,
            bias,
            weight_scale,
            bias_scale,
        } => {
            let (w, b) = (string(weight), opt(bias));
            let ws = scale(&mut checks, weight_scale);
            let bs = scale(&mut checks, bias_scale);
            quote!(#rt::TraceKernelDecl::Fixed(#rt::TraceKernel::Dense { weight: #w, bias: #b, weight_scale: #ws, bias_scale: #bs }))
        }
        KernelModel::Sparse {
            weight,
            bias,
            structure,
            weight_scale,
            bias_scale,
        } => {
            let (w, b) = (string(weight), opt(bias));
            let ws = scale(&mut checks, weight_scale);
            let bs = scale(&mut checks, bias_scale);
            let st = string(&structure.unraw_string());
            quote!(#rt::TraceKernelDecl::Fixed(#rt::TraceKernel::Sparse { weight: #w, bias: #b, structure: #st, weight_scale: #ws, bias_scale: #bs }))
        }
        KernelModel::Lora {
            b,
            a,
            bias,
            alpha,
            a_fn,
            b_fn,
            bias_scale,
        } => {
            let (bn, an, bias) = (string(b), string(a), opt(bias));
            let al = num_key(&mut checks, alpha);
            let mut fopt = |f: &Option<Ident>| match f {
                Some(id) => {
                    let key = fn_key(&mut checks, id);
                    quote!(::core::option::Option::Some(#key))
                }
                None => quote!(::core::option::Option::None),
            };
            let (af, bf) = (fopt(a_fn), fopt(b_fn));
            let bs = scale(&mut checks, bias_scale);
            quote!(#rt::TraceKernelDecl::Fixed(#rt::TraceKernel::Lora { lora_b: #bn, lora_a: #an, bias: #bias, alpha: #al, a_fn: #af, b_fn: #bf, bias_scale: #bs }))
        }
    };
    let set = quote!(__o.trace_kernel = ::core::option::Option::Some(#decl););
    let check = quote! {
        /// Never called: the params the trace kernel names have its types.
        fn __check_trace_kernel_params(__p: &Params) {
            let _ = __p;
            #(#checks)*
        }
    };
    (set, check)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        etp_primitive(args, item).to_string()
    }

    #[test]
    fn expansion_shape() {
        let out = expand_str(
            quote!(name = "etp_scaled_mm", batched, x = x, weight = w),
            quote!(
                fn scaled_mm(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                    x.matmul(w)?.mul_scalar(scale)
                }
            ),
        );
        for needle in [
            "fn scaled_mm (x : & Tensor , w : & Tensor , scale : f64) -> Result < Tensor >",
            "scaled_mm :: try_primitive () ?",
            "fn __braintrace_impl_scaled_mm (x : & Tensor , w : & Tensor , scale : f64)",
            "mod scaled_mm",
            "pub const NAME : & str = \"etp_scaled_mm\"",
            "pub struct Params { # [doc = \" The `scale` param.\"] pub scale : f64 , }",
            "__o . batched = true",
            "__o . x_index = :: core :: option :: Option :: Some (0usize)",
            "(:: std :: string :: String :: from (\"weight\") , 1usize)",
            "< Rules as YwToWRule > :: rule ()",
            "has no `yw_to_w` rule",
            "add `#[init_pp(scaled_mm)]` on a function `fn(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize, p: &scaled_mm::Params) -> Result<Tensor>`",
            "inventory :: submit !",
            ":: braintrace :: __private",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        assert!(!out.contains("compile_error"), "{out}");
        assert!(!out.contains("# [param]"), "{out}");
    }

    #[test]
    fn expansion_param_defaults() {
        let out = expand_str(
            quote!(),
            quote!(
                fn op(
                    x: &Tensor,
                    w: &Tensor,
                    #[param(default = 1.0)] scale: f64,
                ) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        for needle in [
            "fn __default_scale () -> f64 { let __default : f64 = 1.0 ; __default }",
            "scale : (& :: braintrace :: __private :: ParamProbe :: < f64 > :: new ()) . read_or (__p , NAME , \"scale\" , __default_scale) ?",
            "impl :: core :: default :: Default for Params { fn default () -> Self { Params { scale : __default_scale () , } } }",
            "The `scale` param (default `1.0`).",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        // Without a default: a plain read, and no `Default`.
        let out = expand_str(
            quote!(),
            quote!(
                fn op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(
            !out.contains("__default_") && !out.contains("Default for Params"),
            "{out}"
        );
        assert!(out.contains(". read (__p , NAME , \"scale\") ?"), "{out}");
    }

    #[test]
    fn expansion_crate_and_counterpart() {
        let out = expand_str(
            quote!(crate = "crate", counterpart = super::mm),
            quote!(
                pub(crate) fn mv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(out.contains("pub use crate :: __private as __rt"), "{out}");
        assert!(out.contains("pub (crate) mod mv"), "{out}");
        assert!(out.contains("fn __braintrace_counterpart_mv () -> crate :: __private :: EtpPrimitive { super :: mm :: primitive () }"), "{out}");
        assert!(
            out.contains("lazy_counterpart (__o , super :: __braintrace_counterpart_mv)"),
            "{out}"
        );
    }

    #[test]
    fn expansion_not_a_function() {
        let out = expand_str(
            quote!(),
            quote!(
                struct S;
            ),
        );
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("applies to a free function"), "{out}");
        assert!(out.contains("struct S ;"), "{out}");
    }

    #[test]
    fn expansion_stub_after_structural_error() {
        let out = expand_str(
            quote!(),
            quote!(
                fn f<T>(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(out.contains("pub struct Rules"), "{out}");
        assert!(!out.contains("inventory"), "{out}");
    }

    #[test]
    fn expansion_full_after_flag_error() {
        // A bad flag is reported, and the rest still expands fully.
        let out = expand_str(
            quote!(batchd),
            quote!(
                fn f(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(out.contains("inventory :: submit !"), "{out}");
    }
}
