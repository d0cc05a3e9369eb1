//! `EtpPrimitive`: a handle with identity over an ETP op. It holds the
//! op's name, implementation function, layout and spec, and its rules: the
//! `register_*` methods store them here, and the `ETP_RULES_*` registries
//! are views that read them back. Entering the name in the name table is
//! `registration`'s job; the checked rule calls are in `calls`, the graph
//! equation in `eqn`.

pub(super) mod options;
pub(super) mod spec;

use super::params::Params;
use super::rules::{
    EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, TensorMap, XyToDw, YwToW,
};
use super::trace_kernel::TraceKernel;
use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};
use options::{validate_layout, Counterpart, PrimitiveOptions};
use spec::{EtpPrimitiveSpec, ImplFn};
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

struct Inner {
    name: String,
    impl_fn: ImplFn,
    opts: PrimitiveOptions,
    spec: Option<Arc<EtpPrimitiveSpec>>,
    rules: RwLock<EtpRules>,
    shape_cache: Mutex<HashMap<(Vec<Aval>, Params), Aval>>,
    warned: AtomicBool,
    counterpart: RwLock<Option<Counterpart>>,
}

/// An ETP primitive: an op the learning compiler sees as one unit, plus its
/// rules. Cheap to clone; equal and hashed by identity, not by name.
#[derive(Clone)]
pub struct EtpPrimitive(Arc<Inner>);

impl PartialEq for EtpPrimitive {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for EtpPrimitive {}
impl Hash for EtpPrimitive {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as *const () as usize).hash(state);
    }
}
impl fmt::Debug for EtpPrimitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EtpPrimitive({})", self.0.name)
    }
}
impl fmt::Display for EtpPrimitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.name)
    }
}

impl EtpPrimitive {
    /// A new primitive with no rules, after checking its layout. It is not
    /// in the name table yet (see `registration`).
    pub(super) fn new(
        name: &str,
        impl_fn: ImplFn,
        opts: PrimitiveOptions,
        spec: Option<Arc<EtpPrimitiveSpec>>,
    ) -> Result<EtpPrimitive> {
        validate_layout(name, &opts)?;
        let counterpart = opts.batched_counterpart.clone();
        Ok(EtpPrimitive(Arc::new(Inner {
            name: name.to_string(),
            impl_fn,
            opts,
            spec,
            rules: RwLock::new(EtpRules::default()),
            shape_cache: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
            counterpart: RwLock::new(counterpart),
        })))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// Whether `x`/`y` carry a leading batch axis.
    pub fn is_batched(&self) -> bool {
        self.0.opts.batched
    }
    /// Whether the compiler's y -> h walk may pass through this primitive.
    /// Only identity-like primitives set it; trainable ops leave it off so
    /// the compiler treats them as a tail boundary.
    pub fn is_gradient_enabled(&self) -> bool {
        self.0.opts.gradient_enabled
    }
    /// Operand index of `x`.
    pub fn x_index(&self) -> Option<usize> {
        self.0.opts.x_index
    }
    /// Trainable operands, name -> index, in declaration order (including
    /// optional ones; see [`EtpPrimitive::present_trainables`]).
    pub fn trainables(&self) -> &[(String, usize)] {
        &self.0.opts.trainables
    }
    /// The trainables present in a bind with `num_args` operands.
    pub fn present_trainables(&self, num_args: usize) -> Vec<(String, usize)> {
        self.0
            .opts
            .trainables
            .iter()
            .filter(|(_, i)| *i < num_args)
            .cloned()
            .collect()
    }
    /// Output index of `y` (always 0: primitives have one output).
    pub fn y_index(&self) -> usize {
        0
    }
    /// The exact operand count, when declared.
    pub fn num_args(&self) -> Option<usize> {
        self.0.opts.num_args
    }
    /// Whether `xy_to_dw` returns the weights' exact shapes.
    pub fn exact_dw_shapes(&self) -> bool {
        self.0.opts.exact_dw_shapes
    }
    /// The fused trace kernel this primitive declares for an equation with
    /// `params` (`None`: none declared, or the declaration does not cover
    /// these params). Every learning algorithm asks here; the declaration
    /// is a claim that `learn` checks against the rules before use.
    pub fn trace_kernel(&self, params: &Params) -> Option<TraceKernel> {
        self.0.opts.trace_kernel.as_ref()?.for_params(params)
    }
    /// The spec this primitive was built from (spec-based and macro registration).
    pub fn spec(&self) -> Option<&Arc<EtpPrimitiveSpec>> {
        self.0.spec.as_ref()
    }
    /// The batched counterpart, if any.
    pub fn batched_counterpart(&self) -> Option<EtpPrimitive> {
        let c = self
            .0
            .counterpart
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        c.map(|c| match c {
            Counterpart::Primitive(p) => p,
            Counterpart::Lazy(f) => f(),
        })
    }
    /// Set the batched counterpart after registration.
    pub fn set_batched_counterpart(&self, p: &EtpPrimitive) {
        *self
            .0
            .counterpart
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(Counterpart::Primitive(p.clone()));
    }
    /// Call the implementation function directly (no equation is recorded
    /// for the primitive itself; its core ops are).
    pub fn call_impl(&self, args: &[Tensor], params: &Params) -> Result<Tensor> {
        (self.0.impl_fn)(args, params)
    }

    /// Check operands against the layout: count, and float trainables.
    pub(super) fn check_args(&self, args: &[Tensor]) -> Result<()> {
        let o = &self.0.opts;
        if let Some(n) = o.num_args {
            if args.len() != n {
                return Err(Error::etp(
                    &self.0.name,
                    "bind",
                    format!(
                        "expected {n} operands, got {} (shapes {})",
                        args.len(),
                        shapes(args)
                    ),
                ));
            }
        }
        let max = o
            .trainables
            .iter()
            .filter(|(k, _)| !o.optional.contains(k))
            .map(|(_, i)| *i)
            .chain(o.x_index)
            .max()
            .unwrap_or(0);
        if args.len() <= max {
            return Err(Error::etp(
                &self.0.name,
                "bind",
                format!(
                    "the layout needs at least {} operands, got {} (shapes {})",
                    max + 1,
                    args.len(),
                    shapes(args)
                ),
            ));
        }
        for (k, i) in &o.trainables {
            if *i >= args.len() {
                continue;
            }
            if !args[*i].dtype().is_float() {
                return Err(Error::etp(
                    &self.0.name,
                    "bind",
                    format!(
                        "trainable `{k}` (operand {i}) must be a float tensor, got {}",
                        args[*i].aval()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Where the primitive is defined, when its options say.
    pub(super) fn origin(&self) -> Option<&str> {
        self.0.opts.origin.as_deref()
    }
    /// The implementation function.
    pub(super) fn impl_fn(&self) -> &ImplFn {
        &self.0.impl_fn
    }
    /// The output aval cached for these input avals and params.
    pub(super) fn cached_shape(&self, key: &(Vec<Aval>, Params)) -> Option<Aval> {
        self.0
            .shape_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
    /// Cache the output aval for these input avals and params.
    pub(super) fn cache_shape(&self, key: (Vec<Aval>, Params), out: Aval) {
        self.0
            .shape_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, out);
    }
    /// True the first time it is called (the decomposition warning is given once).
    pub(super) fn first_decomposition(&self) -> bool {
        !self.0.warned.swap(true, Ordering::Relaxed)
    }

    /// The rule in one slot of this primitive's rules.
    pub(super) fn rule<R: Clone>(&self, slot: fn(&EtpRules) -> &Option<R>) -> Option<R> {
        slot(&self.0.rules.read().unwrap_or_else(|e| e.into_inner())).clone()
    }
    fn set_rule<R>(&self, slot: fn(&mut EtpRules) -> &mut Option<R>, rule: R) {
        *slot(&mut self.0.rules.write().unwrap_or_else(|e| e.into_inner())) = Some(rule);
    }

    /// Register the `yw_to_w` rule.
    pub fn register_yw_to_w(&self, rule: YwToW) -> &Self {
        self.set_rule(|r| &mut r.yw_to_w, rule);
        self
    }
    /// Register the `xy_to_dw` rule.
    pub fn register_xy_to_dw(&self, rule: XyToDw) -> &Self {
        self.set_rule(|r| &mut r.xy_to_dw, rule);
        self
    }
    /// Register the `init_drtrl` rule.
    pub fn register_init_drtrl(&self, rule: InitDrtrl) -> &Self {
        self.set_rule(|r| &mut r.init_drtrl, rule);
        self
    }
    /// Register the `init_pp` rule.
    pub fn register_init_pp(&self, rule: InitPp) -> &Self {
        self.set_rule(|r| &mut r.init_pp, rule);
        self
    }
    /// Register the optional `instant_drtrl` override.
    pub fn register_instant_drtrl(&self, rule: InstantDrtrl) -> &Self {
        self.set_rule(|r| &mut r.instant_drtrl, rule);
        self
    }
    /// Register the optional `solve_drtrl` override.
    pub fn register_solve_drtrl(&self, rule: SolveDrtrl) -> &Self {
        self.set_rule(|r| &mut r.solve_drtrl, rule);
        self
    }
    /// Register any subset of the rules at once.
    pub fn register_etp_rules(&self, rules: EtpRules) -> &Self {
        if let Some(r) = rules.yw_to_w {
            self.register_yw_to_w(r);
        }
        if let Some(r) = rules.xy_to_dw {
            self.register_xy_to_dw(r);
        }
        if let Some(r) = rules.init_drtrl {
            self.register_init_drtrl(r);
        }
        if let Some(r) = rules.init_pp {
            self.register_init_pp(r);
        }
        if let Some(r) = rules.instant_drtrl {
            self.register_instant_drtrl(r);
        }
        if let Some(r) = rules.solve_drtrl {
            self.register_solve_drtrl(r);
        }
        self
    }

    /// `e` as an error of this primitive in `context` (an error this
    /// primitive already raised passes through unchanged).
    pub(super) fn wrap(&self, context: &str, e: Error) -> Error {
        match e {
            Error::Etp { ref primitive, .. } if *primitive == self.0.name => e,
            other => Error::etp_wrap(&self.0.name, context, other),
        }
    }

    /// Split operands into `(x, weights keyed by name)` by the layout.
    pub fn split_args(&self, args: &[Tensor]) -> Result<(Option<Tensor>, TensorMap)> {
        self.check_args(args)?;
        let x = self.x_index().map(|i| args[i].clone());
        let w = self
            .present_trainables(args.len())
            .into_iter()
            .map(|(k, i)| (k, args[i].clone()))
            .collect();
        Ok((x, w))
    }
}

fn shapes(args: &[Tensor]) -> String {
    args.iter()
        .map(|a| a.aval().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
