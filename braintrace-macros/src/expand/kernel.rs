//! `trace_kernel = ...` in the expansion.

use super::{lit, respan, UnrawString};
use crate::primitive::Primitive;
use proc_macro2::{Ident, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

/// `__o.trace_kernel = ..` for a declared kernel, and a never-called fn
/// type-checking the params it names (`Option<ElemFn>` transforms, `f64`
/// scales), each at the param's name in the flag.
pub(super) fn expand_trace_kernel(p: &Primitive, rt: &TokenStream) -> (TokenStream, TokenStream) {
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
