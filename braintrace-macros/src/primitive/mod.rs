//! `#[etp_primitive]`: validate the implementation function and the flags
//! into a [`Primitive`] model. Problems are recorded in the context; the
//! model falls back to defaults where a flag was bad, so the expansion still
//! compiles and one mistake gives one error. Only problems that leave no
//! sensible primitive (a generic or `async` fn, a method) make the caller use
//! the stub expansion instead.

use crate::attr::{self, tokens_to_string, PrimitiveArgs};
use crate::ctxt::Ctxt;
use crate::symbol::*;
use proc_macro2::{Ident, Span};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, Path, ReturnType, Safety, Type};

mod kernel;
mod layout;
#[cfg(test)]
mod tests;

use kernel::kernel_model;
use layout::layout;

/// One argument of the implementation function.
#[derive(Clone)]
pub struct Arg {
    /// Its name.
    pub ident: Ident,
    /// Its type as written.
    pub ty: Type,
    /// Operand (`&Tensor`) or `#[param]`.
    pub kind: ArgKind,
    /// An optional trailing operand (`Option<&Tensor>`, e.g. a bias).
    pub optional: bool,
    /// A param's default value, from `#[param(default = <expr>)]`.
    pub default: Option<syn::Expr>,
}

/// Operand or param.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArgKind {
    /// The n-th operand.
    Operand(usize),
    /// A `#[param]`.
    Param,
}

/// A validated primitive.
pub struct Primitive {
    /// The implementation function with `#[param]` removed.
    pub func: ItemFn,
    /// The registry name.
    pub name: String,
    /// The runtime path (`::braintrace` unless `crate = "..."`).
    pub krate: Path,
    /// `batched`.
    pub batched: bool,
    /// `gradient_enabled`.
    pub gradient_enabled: bool,
    /// `exact_dw_shapes`.
    pub exact_dw_shapes: bool,
    /// `counterpart = path`.
    pub counterpart: Option<Path>,
    /// The arguments in order.
    pub args: Vec<Arg>,
    /// Operand index of `x`.
    pub x: Option<usize>,
    /// Trainables: name -> operand index.
    pub trainables: Vec<(String, usize)>,
    /// `trace_kernel = ...`, validated against the layout and the params.
    pub trace_kernel: Option<KernelModel>,
    /// Whether the expansion must be the stub (the function itself is unusable).
    pub structural_error: bool,
}

/// A parameter's scale in a declared kernel.
#[derive(Clone)]
pub enum ScaleModel {
    /// None.
    One,
    /// `weight_fn = <param>`: an `Option<ElemFn>` param.
    Fn(Ident),
    /// `scale = <param>`: an `f64` param.
    Param(Ident),
}

/// A validated `trace_kernel = ...`: trainables by their layout names,
/// params by argument.
#[derive(Clone)]
pub enum KernelModel {
    /// `dense(..)`.
    Dense {
        weight: String,
        bias: Option<String>,
        weight_scale: ScaleModel,
        bias_scale: ScaleModel,
    },
    /// `sparse(..)`.
    Sparse {
        weight: String,
        bias: Option<String>,
        structure: Ident,
        weight_scale: ScaleModel,
        bias_scale: ScaleModel,
    },
    /// `lora(..)`.
    Lora {
        b: String,
        a: String,
        bias: Option<String>,
        alpha: Ident,
        a_fn: Option<Ident>,
        b_fn: Option<Ident>,
        bias_scale: ScaleModel,
    },
    /// `trace_kernel = <fn>`.
    Chosen(Path),
}

impl Primitive {
    /// The fn's (and module's) name.
    pub fn ident(&self) -> &Ident {
        &self.func.sig.ident
    }
    /// The operands in order.
    pub fn operands(&self) -> impl Iterator<Item = &Arg> {
        self.args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Operand(_)))
    }
    /// Number of operands that every bind passes (the rest are optional).
    pub fn required_operands(&self) -> usize {
        self.operands().filter(|a| !a.optional).count()
    }
    /// The params in order.
    pub fn params(&self) -> impl Iterator<Item = &Arg> {
        self.args.iter().filter(|a| a.kind == ArgKind::Param)
    }
    /// Whether the rules see several trainables (keyed by name).
    pub fn keyed(&self) -> bool {
        self.trainables.len() != 1
    }
}

/// Whether `ty` is `Option<&Tensor>` (an optional trailing operand).
pub fn is_opt_tensor_ref(ty: &Type) -> bool {
    let Type::Path(p) = ty else { return false };
    let Some(seg) = p.path.segments.last() else {
        return false;
    };
    if seg.ident != "Option" {
        return false;
    }
    let syn::PathArguments::AngleBracketed(a) = &seg.arguments else {
        return false;
    };
    matches!(a.args.first(), Some(syn::GenericArgument::Type(t)) if a.args.len() == 1 && is_tensor_ref(t))
}

/// Whether `ty` is `&Tensor` (any path ending in `Tensor`, no lifetime needed).
pub fn is_tensor_ref(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => is_tensor_path(&r.elem),
        Type::Paren(p) => is_tensor_ref(&p.elem),
        Type::Group(g) => is_tensor_ref(&g.elem),
        _ => false,
    }
}

fn is_tensor_path(ty: &Type) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Tensor" && s.arguments.is_none()),
        Type::Group(g) => is_tensor_path(&g.elem),
        _ => false,
    }
}

fn is_reference(ty: &Type) -> bool {
    match ty {
        Type::Reference(_) => true,
        Type::Paren(p) => is_reference(&p.elem),
        Type::Group(g) => is_reference(&g.elem),
        _ => false,
    }
}

/// Validate `func` with its flags. `#[param]` attributes are removed from
/// the returned function whatever happens.
pub fn analyse(cx: &mut Ctxt, flags: PrimitiveArgs, mut func: ItemFn) -> Primitive {
    let mut structural = check_signature(
        cx,
        &func,
        "#[etp_primitive]",
        "an ETP primitive's implementation",
    );
    let fn_name = func.sig.ident.unraw().to_string();

    // Arguments: operands (`&Tensor`) and `#[param]`s.
    let mut args = Vec::new();
    let mut n_operands = 0;
    for input in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = input else { continue };
        let mut is_param = false;
        let mut default = None;
        pt.attrs.retain(|a| {
            if a.path().is_ident(PARAM) {
                if is_param {
                    cx.error_spanned(
                        a,
                        "`#[param]` is given twice on this argument; give it once",
                    );
                } else {
                    is_param = true;
                    default = attr::param_default(cx, a);
                }
                false
            } else {
                true
            }
        });
        let ident = match &*pt.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
            other => {
                cx.error_spanned(other, "an `#[etp_primitive]` argument needs a plain name (its operand or param name), not a pattern");
                structural = true;
                continue;
            }
        };
        let ty = (*pt.ty).clone();
        let kind = if is_param {
            if is_reference(&ty) {
                cx.error_spanned(
                    &ty,
                    format!("`#[param]` argument `{ident}` must be an owned value (params are stored in the equation): use e.g. `Vec<usize>` or `String` instead of `{}`", tokens_to_string(&ty)),
                );
                structural = true;
            }
            ArgKind::Param
        } else if is_tensor_ref(&ty) || is_opt_tensor_ref(&ty) {
            let optional = is_opt_tensor_ref(&ty);
            if !optional && args.iter().any(|a: &Arg| a.optional) {
                cx.error_spanned(
                    &ty,
                    format!("operand `{ident}` follows an optional operand: optional operands (`Option<&Tensor>`) must come after every `&Tensor` operand"),
                );
            }
            n_operands += 1;
            ArgKind::Operand(n_operands - 1)
        } else {
            cx.error_spanned(
                &ty,
                format!("argument `{ident}: {}` is neither an operand nor a param: operands are `&Tensor`; mark a static parameter `#[param] {ident}: {}`", tokens_to_string(&ty), tokens_to_string(&ty)),
            );
            if is_reference(&ty) {
                structural = true;
            }
            ArgKind::Param
        };
        let optional = kind != ArgKind::Param && is_opt_tensor_ref(&ty);
        args.push(Arg {
            ident,
            ty,
            kind,
            optional,
            default,
        });
    }
    if n_operands == 0 && !structural {
        cx.error(func.sig.ident.span(), format!("`{fn_name}` has no operand: an ETP primitive takes its tensors as `&Tensor` arguments (`x: &Tensor, w: &Tensor`)"));
        structural = true;
    }
    if let ReturnType::Default = func.sig.output {
        cx.error(
            func.sig.paren_token.span.close(),
            format!("`{fn_name}` must return `Result<Tensor>` (the primitive's output `y`)"),
        );
        structural = true;
    }

    let (x, trainables) = layout(cx, &flags, &args, &fn_name);
    if let Some(xa) = x.and_then(|i| args.iter().find(|a| a.kind == ArgKind::Operand(i))) {
        if xa.optional {
            cx.error_spanned(
                &xa.ty,
                format!("`x` operand `{}` cannot be optional: only trainable operands (a bias) may be `Option<&Tensor>`", xa.ident),
            );
        }
    }
    let trace_kernel = match &flags.trace_kernel {
        Some(f) => kernel_model(cx, f, &args, &trainables),
        None => None,
    };
    let name = flags
        .name
        .as_ref()
        .map_or_else(|| fn_name.clone(), |lit| lit.value());
    let krate = flags
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_str(DEFAULT_CRATE).expect("a path"));
    Primitive {
        func,
        name,
        krate,
        batched: flags.batched,
        gradient_enabled: flags.gradient_enabled,
        exact_dw_shapes: flags.exact_dw_shapes.unwrap_or(true),
        counterpart: flags.counterpart,
        args,
        x,
        trainables,
        trace_kernel,
        structural_error: structural,
    }
}

/// Reject what no ETP rule or primitive can be: methods, generic, `async`,
/// `const`, `unsafe`, `extern` and variadic functions. Returns whether any
/// was found.
pub fn check_signature(cx: &mut Ctxt, func: &ItemFn, attr: &str, what: &str) -> bool {
    let sig = &func.sig;
    let mut bad = false;
    let mut err = |cx: &mut Ctxt, span: Span, msg: String| {
        cx.error(span, msg);
        bad = true;
    };
    if let Some(t) = &sig.constness {
        err(
            cx,
            t.span,
            format!("`{attr}` cannot be used on a `const fn`: {what} is an ordinary function"),
        );
    }
    if let Some(t) = &sig.asyncness {
        err(
            cx,
            t.span,
            format!("`{attr}` cannot be used on an `async fn`: {what} is an ordinary function"),
        );
    }
    if let Safety::Unsafe(t) = &sig.safety {
        err(
            cx,
            t.span,
            format!("`{attr}` cannot be used on an `unsafe fn`: {what} is a safe function"),
        );
    }
    if let Some(abi) = &sig.abi {
        err(
            cx,
            abi.span(),
            format!("`{attr}` cannot be used on an `extern` function"),
        );
    }
    if let Some(v) = &sig.variadic {
        err(
            cx,
            v.dots.spans[0],
            format!("`{attr}` cannot be used on a variadic function"),
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        err(
            cx,
            sig.generics.span(),
            format!(
                "`{attr}` cannot be used on a generic function: {what} has concrete argument types"
            ),
        );
    }
    if let Some(r) = sig.receiver() {
        err(cx, r.self_token.span, format!("`{attr}` applies to a free function, not a method: move it out of the `impl` block"));
    }
    bad
}

/// Parse the flags, recording problems; a malformed list yields defaults.
pub fn parse_flags(cx: &mut Ctxt, args: proc_macro2::TokenStream) -> PrimitiveArgs {
    match attr::parse_raw(args) {
        Ok(raw) => attr::interpret(cx, raw),
        Err(e) => {
            cx.push(e);
            PrimitiveArgs::default()
        }
    }
}
