//! The one path generated code reaches the runtime through
//! (`::braintrace::__private`), so users never depend on internals.
//!
//! Besides re-exports, this holds the small conversion traits the companion
//! attributes (`#[yw_to_w]`, `#[xy_to_dw]`, ...) use to adapt a rule written
//! against the companion's own signature (`&Tensor` or `&TensorMap`, `&Aval`
//! or `Option<&Aval>`, ...) to the runtime's uniform rule types. Each trait
//! carries `#[diagnostic::on_unimplemented]`, so a companion argument of the
//! wrong type reads as a sentence at that argument's type.

pub use crate::error::{Error, Result};
pub use crate::etp::{
    ensure_static_registrations, lazy_counterpart, register_primitive_spec, register_static_spec,
    sole, AvalMap, ElemFn, EtpPrimitive, EtpPrimitiveSpec, ImplFn, InitDrtrl, InitPp, InstantDrtrl,
    ParamType, ParamValue, Params, PrimitiveOptions, Scale, SolveDrtrl, StaticPrimitive, TensorMap,
    TraceKernel, TraceKernelDecl, XyToDw, YwToW,
};
pub use crate::tensor::{Aval, Tensor};
pub use inventory;
pub use std::sync::{Arc, LazyLock, OnceLock};

use std::collections::BTreeMap;
use std::fmt;

/// Trainable arity of a primitive with exactly one trainable operand: its
/// rules may take and return plain tensors.
pub enum Single {}
/// Trainable arity of a primitive with several trainable operands: its rules
/// take and return values keyed by trainable name.
pub enum Keyed {}
/// The primitive has an `x` operand.
pub enum WithX {}
/// The primitive has no `x` operand (`x = none`).
pub enum NoX {}

/// `hidden` (and the solve's `g`): a `y`-shaped tensor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `hidden` argument of an ETP rule",
    label = "expected `&Tensor`",
    note = "the `hidden` argument (the solve's `g`) is a `y`-shaped tensor: write it as `hidden: &Tensor`"
)]
pub trait HiddenArg<'a>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: &'a Tensor) -> Result<Self>;
}
impl<'a> HiddenArg<'a> for &'a Tensor {
    fn from_rule_arg(v: &'a Tensor) -> Result<Self> {
        Ok(v)
    }
}

/// `trace`: the trace slots, one per trainable.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `trace` argument of this ETP rule",
    label = "expected `&Tensor` (one trainable) or `&TensorMap` (keyed by trainable name)",
    note = "a primitive with one trainable may take `trace: &Tensor`; with several trainables the rule takes `trace: &TensorMap`"
)]
pub trait TraceArg<'a, A>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: &'a TensorMap, rule: &str) -> Result<Self>;
}
impl<'a, A> TraceArg<'a, A> for &'a TensorMap {
    fn from_rule_arg(v: &'a TensorMap, _rule: &str) -> Result<Self> {
        Ok(v)
    }
}
impl<'a> TraceArg<'a, Single> for &'a Tensor {
    fn from_rule_arg(v: &'a TensorMap, rule: &str) -> Result<Self> {
        Ok(sole(v, rule)?.1)
    }
}

/// `w`: the trainable operands' values.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the weight argument of this ETP rule",
    label = "expected `&Tensor` (one trainable) or `&TensorMap` (keyed by trainable name)",
    note = "a primitive with one trainable may take `w: &Tensor`; with several trainables the rule takes `w: &TensorMap`"
)]
pub trait WeightArg<'a, A>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: &'a TensorMap, rule: &str) -> Result<Self>;
}
impl<'a, A> WeightArg<'a, A> for &'a TensorMap {
    fn from_rule_arg(v: &'a TensorMap, _rule: &str) -> Result<Self> {
        Ok(v)
    }
}
impl<'a> WeightArg<'a, Single> for &'a Tensor {
    fn from_rule_arg(v: &'a TensorMap, rule: &str) -> Result<Self> {
        Ok(sole(v, rule)?.1)
    }
}

/// `x` of `xy_to_dw` / `instant_drtrl`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `x` argument of this ETP rule",
    label = "expected `&Tensor`, or `Option<&Tensor>`",
    note = "write `x: &Tensor`; a primitive declared with `x = none` passes no `x`, so its rules take `x: Option<&Tensor>`"
)]
pub trait XArg<'a, X>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: Option<&'a Tensor>, rule: &str) -> Result<Self>;
}
impl<'a, X> XArg<'a, X> for Option<&'a Tensor> {
    fn from_rule_arg(v: Option<&'a Tensor>, _rule: &str) -> Result<Self> {
        Ok(v)
    }
}
impl<'a> XArg<'a, WithX> for &'a Tensor {
    fn from_rule_arg(v: Option<&'a Tensor>, rule: &str) -> Result<Self> {
        v.ok_or_else(|| Error::invalid(rule, "the rule was called without `x`"))
    }
}

/// `x` of the initialisers (an abstract value).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `x` argument of this ETP initialiser",
    label = "expected `&Aval`, or `Option<&Aval>`",
    note = "write `x: &Aval`; a primitive declared with `x = none` has no `x`, so its initialisers take `x: Option<&Aval>`"
)]
pub trait XAvalArg<'a, X>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: Option<&'a Aval>, rule: &str) -> Result<Self>;
}
impl<'a, X> XAvalArg<'a, X> for Option<&'a Aval> {
    fn from_rule_arg(v: Option<&'a Aval>, _rule: &str) -> Result<Self> {
        Ok(v)
    }
}
impl<'a> XAvalArg<'a, WithX> for &'a Aval {
    fn from_rule_arg(v: Option<&'a Aval>, rule: &str) -> Result<Self> {
        v.ok_or_else(|| Error::invalid(rule, "the initialiser was called without `x`"))
    }
}

/// `y` of the initialisers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `y` argument of this ETP initialiser",
    label = "expected `&Aval`",
    note = "the initialisers receive the abstract value (shape and dtype) of `y`: write `y: &Aval`"
)]
pub trait YAvalArg<'a>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: &'a Aval) -> Result<Self>;
}
impl<'a> YAvalArg<'a> for &'a Aval {
    fn from_rule_arg(v: &'a Aval) -> Result<Self> {
        Ok(v)
    }
}

/// The trainables of the initialisers (abstract values).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the weight argument of this ETP initialiser",
    label = "expected `&Aval` (one trainable) or `&AvalMap` (keyed by trainable name)",
    note = "a primitive with one trainable may take `w: &Aval`; with several trainables the initialiser takes `w: &AvalMap`"
)]
pub trait WeightAvalArg<'a, A>: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: &'a AvalMap, rule: &str) -> Result<Self>;
}
impl<'a, A> WeightAvalArg<'a, A> for &'a AvalMap {
    fn from_rule_arg(v: &'a AvalMap, _rule: &str) -> Result<Self> {
        Ok(v)
    }
}
impl<'a> WeightAvalArg<'a, Single> for &'a Aval {
    fn from_rule_arg(v: &'a AvalMap, rule: &str) -> Result<Self> {
        Ok(sole(v, rule)?.1)
    }
}

/// `num_hidden_state` of the initialisers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `num_hidden_state` argument of this ETP initialiser",
    label = "expected `usize`",
    note = "write `num_hidden_state: usize`"
)]
pub trait CountArg: Sized {
    /// Adapt the runtime value.
    fn from_rule_arg(v: usize) -> Result<Self>;
}
impl CountArg for usize {
    fn from_rule_arg(v: usize) -> Result<Self> {
        Ok(v)
    }
}

/// The trailing params argument of a rule: a reference to the primitive's
/// own typed params struct.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the params type of this ETP primitive",
    label = "expected `&{P}`",
    note = "the last argument of a rule, when present, is the primitive's own params: `p: &<primitive>::Params`"
)]
pub trait ParamsArg<'a, P>: Sized {
    /// Adapt the typed params.
    fn from_typed(p: &'a P) -> Self;
}
impl<'a, P> ParamsArg<'a, P> for &'a P {
    fn from_typed(p: &'a P) -> Self {
        p
    }
}

/// The result of `yw_to_w`, `xy_to_dw`, `init_drtrl`, `instant_drtrl`,
/// `solve_drtrl`: one tensor per trainable.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be returned by this ETP rule",
    label = "expected `Result<Tensor>` (one trainable) or `Result<TensorMap>` (keyed by trainable name)",
    note = "a primitive with one trainable may return `Result<Tensor>`; with several trainables the rule returns `Result<TensorMap>`"
)]
pub trait MapOutput<A>: Sized {
    /// Adapt to a map keyed like `keys`.
    fn into_map<V>(self, keys: &BTreeMap<String, V>, rule: &str) -> Result<TensorMap>;
}
impl<A> MapOutput<A> for Result<TensorMap> {
    fn into_map<V>(self, _keys: &BTreeMap<String, V>, _rule: &str) -> Result<TensorMap> {
        self
    }
}
impl MapOutput<Single> for Result<Tensor> {
    fn into_map<V>(self, keys: &BTreeMap<String, V>, rule: &str) -> Result<TensorMap> {
        let (k, _) = sole(keys, rule)?;
        let t = self?;
        Ok(std::iter::once((k.clone(), t)).collect())
    }
}

/// The result of `init_pp`: one `(*y.shape, S)` tensor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be returned by this ETP initialiser",
    label = "expected `Result<Tensor>`",
    note = "`init_pp` returns one tensor of shape `(*y.shape, num_hidden_state)`: `Result<Tensor>`"
)]
pub trait TensorOutput: Sized {
    /// Adapt the result.
    fn into_tensor(self) -> Result<Tensor>;
}
impl TensorOutput for Result<Tensor> {
    fn into_tensor(self) -> Result<Tensor> {
        self
    }
}

/// The user's function returns its own `Result` type: convert the error
/// (the identity for `braintrace::Result`).
pub fn convert_result<T, E: From<Error>>(r: Result<T>) -> std::result::Result<T, E> {
    r.map_err(E::from)
}

/// The impl function was given the wrong number of operands (only reachable
/// through `EtpPrimitive::call_impl`; `bind` checks the count first).
pub fn operand_range_error(primitive: &str, min: usize, max: usize, got: usize) -> Error {
    if min == max {
        return operand_count_error(primitive, min, got);
    }
    Error::Arity {
        op: primitive.to_string(),
        expected: format!("{min} to {max}"),
        got,
    }
}

/// Append optional trailing operand number `index`; a present one after an
/// absent one is an error (operands are positional).
pub fn push_optional_operand(
    primitive: &str,
    ops: &mut Vec<Tensor>,
    index: usize,
    opt: Option<&Tensor>,
) -> Result<()> {
    if let Some(t) = opt {
        if ops.len() != index {
            return Err(Error::etp(
                primitive,
                "bind",
                format!("optional operand {index} is given but an earlier optional operand is not"),
            ));
        }
        ops.push(t.clone());
    }
    Ok(())
}

#[doc(hidden)]
pub fn operand_count_error(primitive: &str, expected: usize, got: usize) -> Error {
    Error::Arity {
        op: primitive.to_string(),
        expected: expected.to_string(),
        got,
    }
}

/// A typed params struct's `Debug`: `Name { k: v, .. }` with the values as
/// the dynamic params print them.
pub fn fmt_params(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    fields: &[(&str, ParamValue)],
) -> fmt::Result {
    let mut d = f.debug_struct(name);
    for (k, v) in fields {
        d.field(k, &format_args!("{v}"));
    }
    d.finish()
}

/// Holder for the autoref dispatch of the optional rules (`instant_drtrl`,
/// `solve_drtrl`): the generated code calls a method on `&Optional<Rules>`
/// that resolves to `Some(rule)` when a companion implemented it, else to
/// `None`.
pub struct Optional<T>(pub std::marker::PhantomData<T>);

/// `Error` for a rule that could not be built because its companion did not
/// compile (only referenced by the fallback expansion after an error).
pub fn fallback_rule_error(rule: &str) -> Error {
    Error::invalid(rule, "this rule's companion did not compile")
}

/// Probe for a `#[param]` type: the typed params struct converts its fields
/// through `(&ParamProbe::<T>::new()).to_value(..)`, which resolves to the
/// `ParamType` conversion when `T` implements it, and otherwise to an
/// unreachable fallback. A type that is not a param type is then reported
/// once, by [`check_param_type`] at the argument's type, instead of once
/// per generated use.
pub struct ParamProbe<T>(std::marker::PhantomData<T>);
impl<T> ParamProbe<T> {
    /// A probe.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        ParamProbe(std::marker::PhantomData)
    }
}
/// The real conversion of a param type.
pub trait ParamProbeImpl<T> {
    /// To the dynamic value.
    fn to_value(&self, v: &T) -> ParamValue;
    /// Read `key` from `params`.
    fn read(&self, params: &Params, op: &str, key: &str) -> Result<T>;
    /// Read `key` from `params`, or `default()` when it is absent.
    fn read_or(&self, params: &Params, op: &str, key: &str, default: fn() -> T) -> Result<T>;
    /// [`AParamType`].
    fn param_kind(&self) -> AParamType;
}
impl<T: ParamType> ParamProbeImpl<T> for ParamProbe<T> {
    fn param_kind(&self) -> AParamType {
        AParamType
    }
    fn to_value(&self, v: &T) -> ParamValue {
        v.to_param()
    }
    fn read(&self, params: &Params, op: &str, key: &str) -> Result<T> {
        params.get(op, key)
    }
    fn read_or(&self, params: &Params, op: &str, key: &str, default: fn() -> T) -> Result<T> {
        match params.raw(key) {
            Some(_) => params.get(op, key),
            None => Ok(default()),
        }
    }
}
/// The fallback for a type that is not a param type (never runs: the
/// crate does not compile, [`check_param_type`] says why).
pub trait ParamProbeFallback<T> {
    /// Unreachable.
    fn to_value(&self, v: &T) -> ParamValue;
    /// Unreachable.
    fn read(&self, params: &Params, op: &str, key: &str) -> Result<T>;
    /// Unreachable.
    fn read_or(&self, params: &Params, op: &str, key: &str, default: fn() -> T) -> Result<T>;
    /// [`NotAParamType`].
    fn param_kind(&self) -> NotAParamType;
}
impl<T> ParamProbeFallback<T> for &ParamProbe<T> {
    fn param_kind(&self) -> NotAParamType {
        NotAParamType
    }
    fn to_value(&self, _v: &T) -> ParamValue {
        unreachable!("not a param type (reported at compile time)")
    }
    fn read(&self, _params: &Params, _op: &str, _key: &str) -> Result<T> {
        unreachable!("not a param type (reported at compile time)")
    }
    fn read_or(&self, _params: &Params, _op: &str, _key: &str, _default: fn() -> T) -> Result<T> {
        unreachable!("not a param type (reported at compile time)")
    }
}
/// What [`ParamProbeImpl::param_kind`] returns for a param type.
pub struct AParamType;
/// What [`ParamProbeFallback::param_kind`] returns for any other type.
pub struct NotAParamType;

/// Compile-time check of a `#[param]` type `T`: only [`AParamType`]
/// passes. Checking the probe's answer (rather than `T: ParamType`
/// directly) keeps the error to one sentence about the user's type, without
/// a list of every param type in the crate graph.
#[diagnostic::on_unimplemented(
    message = "`{T}` cannot be an ETP primitive param",
    label = "this `#[param]` type is not a param type",
    note = "params must be hashable and comparable: integers, bools, floats, strings, `ElemFn`, and `Vec`/`Option`/tuples of those; implement `braintrace::etp::ParamType` for your own type"
)]
pub trait ParamTypeCheck<T> {}
impl<T> ParamTypeCheck<T> for AParamType {}

/// `check_param_type(&probe, (&probe).param_kind())` compiles only for a param type.
pub fn check_param_type<T, K: ParamTypeCheck<T>>(_probe: &ParamProbe<T>, _kind: K) {}

/// The macros inside this crate (`crate = "crate"`), as the built-in
/// primitives use them.
#[cfg(test)]
mod tests {
    use crate::etp::{
        check_rules, get_primitive_spec, primitive_by_name, Params as DynParams, ETP_RULES_INIT_PP,
    };
    use crate::tensor::{Aval, DType, Tensor};
    use crate::Result;
    use braintrace_macros::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w};

    /// y = scale * (x @ w), x `(I,)`.
    #[etp_primitive(name = "etp_private_test_mv", crate = "crate")]
    fn private_mv(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
        x.matmul(w)?.mul_scalar(scale)
    }

    #[yw_to_w(private_mv)]
    fn yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
        trace.mul(&hidden.expand_dims(0)?)
    }

    #[xy_to_dw(private_mv)]
    fn xy(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &private_mv::Params) -> Result<Tensor> {
        x.expand_dims(1)?
            .matmul(&hidden.expand_dims(0)?)?
            .mul_scalar(p.scale)
    }

    #[init_drtrl(private_mv)]
    fn drtrl(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
    }

    #[init_pp(private_mv)]
    fn pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
    }

    #[test]
    fn macros_inside_the_core_crate() -> Result<()> {
        let p = primitive_by_name("etp_private_test_mv").expect("collected through inventory");
        assert_eq!(p, private_mv::primitive());
        assert!(std::sync::Arc::ptr_eq(
            &get_primitive_spec(&p).expect("spec"),
            &*private_mv::SPEC
        ));
        assert!(ETP_RULES_INIT_PP.contains(&p));
        let (x, w) = (
            Tensor::from_vec(vec![1.0, -2.0, 0.5], &[3])?,
            Tensor::ones(&[3, 2], DType::F64),
        );
        assert_eq!(private_mv(&x, &w, 2.0)?.to_vec_f64()?, vec![-1.0, -1.0]);
        assert!(check_rules(&p, &[x, w], &DynParams::new().with("scale", 2.0))?.is_ok());
        Ok(())
    }
}
