//! `#[etp_primitive]`: validate the implementation function and the flags
//! into a [`Primitive`] model. Problems are recorded in the context; the
//! model falls back to defaults where a flag was bad, so the expansion still
//! compiles and one mistake gives one error. Only problems that leave no
//! sensible primitive (a generic or `async` fn, a method) make the caller use
//! the stub expansion instead.

use crate::attr::{self, tokens_to_string, PrimitiveArgs, TraceKernelFlag, TrainableSpec};
use crate::ctxt::Ctxt;
use crate::symbol::*;
use proc_macro2::{Ident, Span};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, Path, ReturnType, Safety, Type};

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

/// Validate `trace_kernel = ...`: every key known and given once, operand
/// keys naming trainables, param keys naming `#[param]`s, the kind's
/// required keys present. Every problem is reported; `None` after any.
fn kernel_model(
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

/// Where `x` and the trainables are, from the flags or the seed's defaults
/// (x = the first operand, weight = the first other operand). A flag naming
/// a bad argument is reported and replaced by its default, so the rest of
/// the expansion (and the companions) see a sound layout.
fn layout(
    cx: &mut Ctxt,
    flags: &PrimitiveArgs,
    args: &[Arg],
    fn_name: &str,
) -> (Option<usize>, Vec<(String, usize)>) {
    let operands: Vec<&Arg> = args.iter().filter(|a| a.kind != ArgKind::Param).collect();
    let operand_list = || {
        operands
            .iter()
            .map(|a| format!("`{}`", a.ident))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Resolve an argument named by a flag to its operand index.
    let resolve = |cx: &mut Ctxt, id: &Ident, flag: &str| -> Option<usize> {
        match args.iter().find(|a| a.ident.unraw() == id.unraw()) {
            Some(Arg {
                kind: ArgKind::Operand(i),
                ..
            }) => Some(*i),
            Some(_) => {
                cx.error(id.span(), format!("`{flag} = {id}` names a `#[param]` argument; `{flag}` must be a `&Tensor` operand (operands: {})", operand_list()));
                None
            }
            None => {
                cx.error(
                    id.span(),
                    format!(
                        "`{flag} = {id}` names no argument of `{fn_name}`; its operands are {}",
                        operand_list()
                    ),
                );
                None
            }
        }
    };

    // Trainables as written (`None`: absent, or unusable and reported).
    let mut named: Option<Vec<(String, usize, Span)>> = None;
    if let Some((_, spec)) = &flags.trainables {
        let entries: Vec<(String, &Ident, Span)> = match spec {
            TrainableSpec::Args(ids) => {
                let single = ids.len() == 1;
                ids.iter()
                    .map(|id| {
                        (
                            if single {
                                SINGLE_TRAINABLE.to_string()
                            } else {
                                id.unraw().to_string()
                            },
                            id,
                            id.span(),
                        )
                    })
                    .collect()
            }
            TrainableSpec::Named(pairs) => pairs
                .iter()
                .map(|(k, id)| (k.unraw().to_string(), id, k.span()))
                .collect(),
        };
        let flag = if matches!(spec, TrainableSpec::Args(_)) {
            WEIGHT
        } else {
            TRAINABLES
        };
        let mut ok = true;
        let mut list: Vec<(String, usize, Span)> = Vec::new();
        for (key, id, span) in entries {
            let Some(i) = resolve(cx, id, flag) else {
                ok = false;
                continue;
            };
            if list.iter().any(|(_, j, _)| *j == i) {
                cx.error(
                    id.span(),
                    format!("operand `{id}` is listed twice as a trainable"),
                );
            } else if list.iter().any(|(k, _, _)| *k == key) {
                cx.error(span, format!("trainable name `{key}` is used twice"));
            } else {
                list.push((key, i, span));
            }
        }
        if ok && !list.is_empty() {
            named = Some(list);
        }
    }

    // x: explicit, else the first operand (unless it is an explicit trainable).
    let is_trainable = |i: usize, named: &Option<Vec<(String, usize, Span)>>| {
        named
            .as_ref()
            .is_some_and(|n| n.iter().any(|(_, j, _)| *j == i))
    };
    let default_x = |named: &Option<Vec<(String, usize, Span)>>| {
        if operands.is_empty() || is_trainable(0, named) {
            None
        } else {
            Some(0)
        }
    };
    let x = match &flags.x {
        Some(Some(id)) => match resolve(cx, id, X) {
            Some(i) if is_trainable(i, &named) => {
                cx.error(
                    id.span(),
                    format!("`{id}` is both `x` and a trainable; an operand is one or the other"),
                );
                None
            }
            Some(i) => Some(i),
            None => default_x(&named),
        },
        Some(None) => None,
        None => {
            if let (Some(list), false) = (&named, operands.is_empty()) {
                if let Some((_, _, span)) = list.iter().find(|(_, j, _)| *j == 0) {
                    cx.error(
                        *span,
                        format!("`x` defaults to the first operand `{}`, which is listed as a trainable; say which operand is `x` (`x = <arg>`), or write `x = none`", operands[0].ident),
                    );
                }
            }
            default_x(&named)
        }
    };

    // Trainables: as written, else the first operand that is not `x`.
    let named = match named {
        Some(list) => list,
        None => match (0..operands.len()).find(|i| Some(*i) != x) {
            Some(i) => vec![(SINGLE_TRAINABLE.to_string(), i, Span::call_site())],
            None => {
                if let Some(only) = operands.first().map(|a| &a.ident) {
                    if flags.trainables.is_none() {
                        cx.error(
                            only.span(),
                            format!("`{fn_name}` has one operand `{only}`, which is `x`: an ETP primitive needs a trainable operand; write `x = none, weight = {only}` if `{only}` is trainable"),
                        );
                    }
                }
                Vec::new()
            }
        },
    };
    (x, named.into_iter().map(|(k, i, _)| (k, i)).collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn analyse_src(
        flags: proc_macro2::TokenStream,
        f: proc_macro2::TokenStream,
    ) -> (Primitive, String) {
        let mut cx = Ctxt::new();
        let flags = parse_flags(&mut cx, flags);
        let p = analyse(&mut cx, flags, syn::parse2(f).unwrap());
        (p, cx.into_compile_errors().to_string())
    }

    #[test]
    fn primitive_defaults_follow_the_seed() {
        let (p, e) = analyse_src(
            quote!(),
            quote!(
                fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.is_empty(), "{e}");
        assert_eq!(p.name, "my_op");
        assert_eq!(p.x, Some(0));
        assert_eq!(p.trainables, vec![("weight".to_string(), 1)]);
        assert_eq!(p.params().count(), 1);
        assert!(!p.keyed() && !p.batched && !p.gradient_enabled && p.exact_dw_shapes);
        // `#[param]` is gone from the function.
        assert!(!quote!(#(p.func)).to_string().contains("param"));
    }

    #[test]
    fn primitive_layout_flags() {
        let (p, e) = analyse_src(
            quote!(x = none, weight = w),
            quote!(
                fn id(w: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.is_empty(), "{e}");
        assert_eq!((p.x, p.trainables), (None, vec![("weight".to_string(), 0)]));
        let (p, e) = analyse_src(
            quote!(weight = [weight, bias]),
            quote!(
                fn lin(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.is_empty(), "{e}");
        assert_eq!(
            p.trainables,
            vec![("weight".to_string(), 1), ("bias".to_string(), 2)]
        );
        assert!(p.keyed());
        let (p, e) = analyse_src(
            quote!(x = x, trainables(lora_b = b, lora_a = a)),
            quote!(
                fn lora(a: &Tensor, x: &Tensor, b: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.is_empty(), "{e}");
        assert_eq!(
            (p.x, p.trainables),
            (
                Some(1),
                vec![("lora_b".to_string(), 2), ("lora_a".to_string(), 0)]
            )
        );
    }

    #[test]
    fn primitive_layout_errors() {
        let (_, e) = analyse_src(
            quote!(x = y, weight = v),
            quote!(
                fn f(x: &Tensor, w: &Tensor, #[param] s: f64) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(
            e.contains("`x = y` names no argument of `f`; its operands are `x`, `w`"),
            "{e}"
        );
        assert!(e.contains("`weight = v` names no argument"), "{e}");
        let (_, e) = analyse_src(
            quote!(weight = s),
            quote!(
                fn f(x: &Tensor, w: &Tensor, #[param] s: f64) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.contains("names a `#[param]` argument"), "{e}");
        let (_, e) = analyse_src(
            quote!(),
            quote!(
                fn f(x: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.contains("needs a trainable operand"), "{e}");
    }

    #[test]
    fn primitive_signature_errors() {
        let (p, e) = analyse_src(
            quote!(),
            quote!(
                async fn f<T>(x: &Tensor, w: &Tensor, n: usize, #[param] s: &str) {}
            ),
        );
        assert!(p.structural_error);
        for needle in [
            "`async fn`",
            "generic function",
            "neither an operand nor a param",
            "must be an owned value",
            "must return `Result<Tensor>`",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn param_defaults() {
        let (p, e) = analyse_src(
            quote!(),
            quote!(
                fn f(
                    x: &Tensor,
                    w: &Tensor,
                    #[param(default = 1.0)] scale: f64,
                    #[param] n: usize,
                    #[param(default = vec![1, 2],)] dims: Vec<usize>,
                ) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.is_empty(), "{e}");
        let defaults: Vec<Option<String>> = p
            .params()
            .map(|a| a.default.as_ref().map(tokens_to_string))
            .collect();
        assert_eq!(
            defaults,
            vec![Some("1.0".into()), None, Some("vec![1, 2]".into())]
        );
    }

    #[test]
    fn param_default_malformed() {
        for (attr, needle) in [
            (quote!(#[param(default)]), "expected `default = <value>`"),
            (
                quote!(#[param(default = )]),
                "expected a value after `default =`",
            ),
            (
                quote!(#[param(dflt = 1.0)]),
                "unknown `#[param]` option `dflt`",
            ),
            (quote!(#[param = 1.0]), "expected `#[param(default = 1.0)]`"),
            (quote!(#[param()]), "`#[param()]` is empty"),
            (
                quote!(#[param(default = 1.0, default = 2.0)]),
                "`default` is given twice",
            ),
            (quote!(#[param(default = 1.0 2.0)]), "expected `,`"),
            (quote!(#[param] #[param]), "`#[param]` is given twice"),
        ] {
            let (p, e) = analyse_src(
                quote!(),
                quote!(
                    fn f(x: &Tensor, w: &Tensor, #attr scale: f64) -> Result<Tensor> {
                        todo!()
                    }
                ),
            );
            assert!(e.contains(needle), "{attr}: missing {needle:?} in {e}");
            assert_eq!(e.matches("compile_error").count(), 1, "{attr}: {e}");
            // Still a param, without a default, and the expansion goes on.
            let a = p.params().next().expect("one param");
            assert!(a.default.is_none() || needle.contains("twice"), "{attr}");
            assert!(!p.structural_error, "{attr}");
        }
    }

    #[test]
    fn tensor_ref_detection() {
        assert!(is_tensor_ref(&syn::parse_quote!(&Tensor)));
        assert!(is_tensor_ref(&syn::parse_quote!(&'a braintrace::Tensor)));
        assert!(!is_tensor_ref(&syn::parse_quote!(&mut Tensor)));
        assert!(!is_tensor_ref(&syn::parse_quote!(Tensor)));
        assert!(!is_tensor_ref(&syn::parse_quote!(Option<&Tensor>)));
    }
}
