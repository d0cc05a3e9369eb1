//! Procedural macros of braintrace: `#[etp_primitive]` and the ETP rule
//! attributes `#[yw_to_w]`, `#[xy_to_dw]`, `#[init_drtrl]`, `#[init_pp]`
//! (plus the optional `#[instant_drtrl]`, `#[solve_drtrl]`).
//!
//! The entry points below are thin: each converts its tokens and calls a
//! `proc_macro2::TokenStream -> proc_macro2::TokenStream` function of the
//! internal modules (attribute parsing in `attr`, validation in `primitive`,
//! expansion in `expand` and `companion`), which `cargo test -p
//! braintrace-macros` unit-tests without a compiler in the loop. Generated
//! code reaches the runtime only through `<crate>::__private` (default
//! `::braintrace::__private`; `#[etp_primitive(crate = "...")]` redirects it).
//! Use the attributes through the `braintrace` facade, whose docs describe
//! them with examples.

mod attr;
mod companion;
mod ctxt;
mod expand;
mod primitive;
mod rule;
mod symbol;

use proc_macro::TokenStream;
use rule::Rule;

/// Define an ETP primitive from its implementation function.
///
/// ```ignore
/// use braintrace::prelude::*;
///
/// /// y = scale * (x @ w)
/// #[etp_primitive(name = "etp_scaled_mm", batched, x = x, weight = w)]
/// fn scaled_mm(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
///     x.matmul(w)?.mul_scalar(scale)
/// }
/// ```
///
/// The function keeps its signature (without the `#[param]` markers) and
/// now binds the primitive: one equation under tracing. Beside it, a module
/// of the same name holds `Params` (one field per `#[param]`), `SPEC`,
/// `NAME`, `primitive()` and `try_primitive()`; the primitive is collected
/// into the registries through `inventory`, before any registry lookup or
/// runtime registration (a runtime registration cannot claim its name).
///
/// Arguments of type `&Tensor` are the operands, in order; every other
/// argument must be marked `#[param]` and have a param type (an optional
/// bias is a separate entry point, or a `#[param] has_bias: bool`).
/// `#[param(default = <expr>)]` gives a param a default (an expression of
/// its type): a params map without it reads as that value (binding through
/// the handle, `Params::from_params`, the rules), and when every param has
/// one, `Params` implements `Default`.
///
/// Flags (all optional):
/// * `name = "etp_..."`: the registry name (default: the function's name);
/// * `batched`, `gradient_enabled` (also `= true` / `= false`);
/// * `x = <arg>` or `x = none` (default: the first operand);
/// * `weight = <arg>` or `weight = [<arg>, ...]` (default: the first operand
///   that is not `x`). One trainable is named `weight`; several are named by
///   their arguments. `trainables(<name> = <arg>, ...)` names them
///   explicitly, e.g. `trainables(lora_b = b, lora_a = a)`;
/// * `counterpart = <path>`: the `#[etp_primitive]` fn bound under `vmap`
///   when only `x` is mapped (resolved lazily);
/// * `exact_dw_shapes = false`: `xy_to_dw` may return other shapes;
/// * `crate = "path"`: the runtime's path (default `::braintrace`).
///
/// The four rules are companion functions (`#[yw_to_w(prim)]`, ...); a
/// primitive missing one does not compile, and the error names the rule and
/// the attribute to add.
#[proc_macro_attribute]
pub fn etp_primitive(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::etp_primitive(args.into(), item.into()).into()
}

/// The `yw_to_w` rule of a primitive:
/// `fn(hidden: &Tensor, trace: &Tensor, p: &prim::Params) -> Result<Tensor>`
/// (`&TensorMap` / `Result<TensorMap>` with several trainables; `p` optional).
#[proc_macro_attribute]
pub fn yw_to_w(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::YwToW, args.into(), item.into()).into()
}

/// The `xy_to_dw` rule of a primitive:
/// `fn(x: &Tensor, hidden: &Tensor, w: &Tensor, p: &prim::Params) -> Result<Tensor>`
/// (`x: Option<&Tensor>` for `x = none`; `&TensorMap` / `Result<TensorMap>`
/// with several trainables; `p` optional).
#[proc_macro_attribute]
pub fn xy_to_dw(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::XyToDw, args.into(), item.into()).into()
}

/// The `init_drtrl` rule of a primitive:
/// `fn(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor>`
/// (`x: Option<&Aval>` for `x = none`; `&AvalMap` / `Result<TensorMap>` with
/// several trainables; an optional trailing `p: &prim::Params`).
#[proc_macro_attribute]
pub fn init_drtrl(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::InitDrtrl, args.into(), item.into()).into()
}

/// The `init_pp` rule of a primitive:
/// `fn(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor>`
/// (`x: Option<&Aval>` for `x = none`; `&AvalMap` with several trainables;
/// an optional trailing `p: &prim::Params`).
#[proc_macro_attribute]
pub fn init_pp(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::InitPp, args.into(), item.into()).into()
}

/// The optional `instant_drtrl` override of a primitive (same signature as
/// `xy_to_dw`, trace-structured result).
#[proc_macro_attribute]
pub fn instant_drtrl(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::InstantDrtrl, args.into(), item.into()).into()
}

/// The optional `solve_drtrl` override of a primitive:
/// `fn(g: &Tensor, trace: &Tensor, w: &Tensor, p: &prim::Params) -> Result<Tensor>`.
#[proc_macro_attribute]
pub fn solve_drtrl(args: TokenStream, item: TokenStream) -> TokenStream {
    companion::companion(Rule::SolveDrtrl, args.into(), item.into()).into()
}
