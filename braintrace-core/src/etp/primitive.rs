//! `EtpPrimitive`: a handle with identity over an ETP op, its registration
//! (class-based), and the derived rules that make it a graph primitive:
//! abstract eval, lowering, JVP, transpose and identity-preserving batching,
//! all from the one implementation function.

use super::params::Params;
use super::registry::{
    self, ETP_RULES_INIT_DRTRL, ETP_RULES_INIT_PP, ETP_RULES_INSTANT_DRTRL, ETP_RULES_SOLVE_DRTRL,
    ETP_RULES_XY_TO_DW, ETP_RULES_YW_TO_W,
};
use super::rules::{
    AvalMap, EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, TensorMap, XyToDw, YwToW,
};
use super::spec::EtpPrimitiveSpec;
use crate::error::{Error, Result};
use crate::graph::{self, LinearArg, Primitive};
use crate::tensor::{Aval, Tensor};
use crate::transform::{jvp_graph, make_graph, vjp, vmap_graph};
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The implementation function of an ETP primitive: operands and params to `y`.
pub type ImplFn = Arc<dyn Fn(&[Tensor], &Params) -> Result<Tensor> + Send + Sync>;

/// Where the batched counterpart comes from.
#[derive(Clone)]
pub enum Counterpart {
    /// A primitive handle.
    Primitive(EtpPrimitive),
    /// Resolved on first use (macro-defined primitives refer to each other this way).
    Lazy(fn() -> EtpPrimitive),
}

impl fmt::Debug for Counterpart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Counterpart::Primitive(p) => write!(f, "{}", p.name()),
            Counterpart::Lazy(_) => f.write_str("<lazy>"),
        }
    }
}

/// Options of [`register_primitive`]: flags and layout.
///
/// Defaults follow the seed: `x` is operand 0, the trainable `weight` is
/// operand 1, not batched, not gradient-enabled.
#[derive(Clone, Debug)]
pub struct PrimitiveOptions {
    /// Whether `x` and `y` carry a leading batch axis.
    pub batched: bool,
    /// Whether the compiler's y -> h walk may pass through (identity-like ops only).
    pub gradient_enabled: bool,
    /// Operand index of `x` (`None` for ops without one, like `etp_elemwise`).
    pub x_index: Option<usize>,
    /// Trainable operands by name -> operand index.
    pub trainables: Vec<(String, usize)>,
    /// The exact number of operands (`None` = at least enough for the layout).
    pub num_args: Option<usize>,
    /// Trainables that may be absent: trailing operands (an optional bias)
    /// that a bind may leave out.
    pub optional: Vec<String>,
    /// The batched counterpart bound under `vmap` when only `x` is mapped.
    pub batched_counterpart: Option<Counterpart>,
    /// Whether `xy_to_dw` returns exactly the weights' shapes (conv's
    /// per-position bias does not).
    pub exact_dw_shapes: bool,
    /// Where the primitive is defined (shown in duplicate-name errors).
    pub origin: Option<String>,
}

impl Default for PrimitiveOptions {
    fn default() -> Self {
        PrimitiveOptions {
            batched: false,
            gradient_enabled: false,
            x_index: Some(0),
            trainables: vec![("weight".into(), 1)],
            num_args: None,
            optional: Vec::new(),
            batched_counterpart: None,
            exact_dw_shapes: true,
            origin: None,
        }
    }
}

impl PrimitiveOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Set `batched`.
    pub fn batched(mut self, v: bool) -> Self {
        self.batched = v;
        self
    }
    /// Set `gradient_enabled`.
    pub fn gradient_enabled(mut self, v: bool) -> Self {
        self.gradient_enabled = v;
        self
    }
    /// Set the operand index of `x`.
    pub fn x_index(mut self, i: Option<usize>) -> Self {
        self.x_index = i;
        self
    }
    /// Replace the trainables.
    pub fn trainables(mut self, t: &[(&str, usize)]) -> Self {
        self.trainables = t.iter().map(|(k, i)| (k.to_string(), *i)).collect();
        self
    }
    /// Set the exact operand count.
    pub fn num_args(mut self, n: usize) -> Self {
        self.num_args = Some(n);
        self
    }
    /// Mark a trainable as optional (a trailing operand a bind may omit).
    pub fn optional(mut self, name: &str) -> Self {
        self.optional.push(name.to_string());
        self
    }
    /// Set the batched counterpart.
    pub fn counterpart(mut self, p: &EtpPrimitive) -> Self {
        self.batched_counterpart = Some(Counterpart::Primitive(p.clone()));
        self
    }
}

pub(crate) struct Inner {
    name: String,
    impl_fn: ImplFn,
    opts: PrimitiveOptions,
    spec: Option<Arc<EtpPrimitiveSpec>>,
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

fn validate_layout(name: &str, o: &PrimitiveOptions) -> Result<()> {
    let mut seen = HashSet::new();
    let mut names = HashSet::new();
    if o.trainables.is_empty() {
        return Err(Error::etp(
            name,
            "registration",
            "an ETP primitive needs at least one trainable operand",
        ));
    }
    for (k, i) in &o.trainables {
        if !names.insert(k.as_str()) {
            return Err(Error::etp(
                name,
                "registration",
                format!("trainable `{k}` is listed twice"),
            ));
        }
        if !seen.insert(*i) {
            return Err(Error::etp(
                name,
                "registration",
                format!("operand index {i} is used twice in the layout"),
            ));
        }
    }
    if let Some(x) = o.x_index {
        if !seen.insert(x) {
            return Err(Error::etp(
                name,
                "registration",
                format!("x index {x} is also a trainable operand"),
            ));
        }
    }
    if let Some(n) = o.num_args {
        if let Some(&bad) = seen.iter().find(|&&i| i >= n) {
            return Err(Error::etp(
                name,
                "registration",
                format!("layout index {bad} is out of range for {n} operands"),
            ));
        }
    }
    Ok(())
}

/// Build a primitive and enter it in the name table. `default_origin`
/// names the definition in a duplicate-name error when the options carry
/// no origin. Runtime entry points call
/// [`registry::ensure_static_registrations`] first, so a built-in's or a
/// macro primitive's name is always taken before a runtime registration
/// can claim it.
pub(crate) fn new_primitive(
    name: &str,
    impl_fn: ImplFn,
    opts: PrimitiveOptions,
    spec: Option<Arc<EtpPrimitiveSpec>>,
    default_origin: String,
) -> Result<EtpPrimitive> {
    validate_layout(name, &opts)?;
    let counterpart = opts.batched_counterpart.clone();
    let p = EtpPrimitive(Arc::new(Inner {
        name: name.to_string(),
        impl_fn,
        opts,
        spec,
        shape_cache: Mutex::new(HashMap::new()),
        warned: AtomicBool::new(false),
        counterpart: RwLock::new(counterpart),
    }));
    let origin = p.0.opts.origin.clone().unwrap_or(default_origin);
    registry::register_name(&p, &origin)?;
    Ok(p)
}

/// Class-based registration: a new primitive from its implementation
/// function; attach the rules with the `register_*` methods.
///
/// A name that is already registered is refused with
/// [`Error::DuplicatePrimitive`], naming both definitions. The built-in
/// and `#[etp_primitive]` primitives are entered before any runtime
/// registration, so their names cannot be claimed here, whatever the call
/// order.
///
/// ```
/// use braintrace_core::etp::{register_primitive, Params, PrimitiveOptions};
/// use braintrace_core::Tensor;
/// let p = register_primitive(
///     "doc_scaled_mm",
///     |a: &[Tensor], p: &Params| a[0].matmul(&a[1])?.mul_scalar(p.get("doc_scaled_mm", "scale")?),
///     PrimitiveOptions::new().batched(true),
/// )?;
/// let y = p.bind(&[Tensor::ones(&[4, 3], braintrace_core::DType::F64), Tensor::ones(&[3, 5], braintrace_core::DType::F64)],
///                &Params::new().with("scale", 0.5))?;
/// assert!(y.to_vec_f64()?.iter().all(|&v| v == 1.5));
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[track_caller]
pub fn register_primitive<F>(
    name: &str,
    impl_fn: F,
    options: PrimitiveOptions,
) -> Result<EtpPrimitive>
where
    F: Fn(&[Tensor], &Params) -> Result<Tensor> + Send + Sync + 'static,
{
    let origin = runtime_origin("register_primitive", name);
    registry::ensure_static_registrations();
    new_primitive(name, Arc::new(impl_fn), options, None, origin)
}

/// How a runtime registration is named in a duplicate-name error: the entry
/// point and the caller's location.
#[track_caller]
pub(crate) fn runtime_origin(entry: &str, name: &str) -> String {
    let at = std::panic::Location::caller();
    format!(
        "`{entry}(\"{name}\", ..)` at runtime ({}:{})",
        at.file(),
        at.line()
    )
}

impl EtpPrimitive {
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

    fn check_args(&self, args: &[Tensor]) -> Result<()> {
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

    /// Apply the primitive: one equation while tracing, its impl when eager.
    pub fn bind(&self, args: &[Tensor], params: &Params) -> Result<Tensor> {
        self.check_args(args)?;
        graph::bind1(
            Arc::new(EtpEqn {
                prim: self.clone(),
                params: params.clone(),
            }),
            args,
        )
    }

    /// Register the `yw_to_w` rule.
    pub fn register_yw_to_w(&self, rule: YwToW) -> &Self {
        ETP_RULES_YW_TO_W.insert(self, rule);
        self
    }
    /// Register the `xy_to_dw` rule.
    pub fn register_xy_to_dw(&self, rule: XyToDw) -> &Self {
        ETP_RULES_XY_TO_DW.insert(self, rule);
        self
    }
    /// Register the `init_drtrl` rule.
    pub fn register_init_drtrl(&self, rule: InitDrtrl) -> &Self {
        ETP_RULES_INIT_DRTRL.insert(self, rule);
        self
    }
    /// Register the `init_pp` rule.
    pub fn register_init_pp(&self, rule: InitPp) -> &Self {
        ETP_RULES_INIT_PP.insert(self, rule);
        self
    }
    /// Register the optional `instant_drtrl` override.
    pub fn register_instant_drtrl(&self, rule: InstantDrtrl) -> &Self {
        ETP_RULES_INSTANT_DRTRL.insert(self, rule);
        self
    }
    /// Register the optional `solve_drtrl` override.
    pub fn register_solve_drtrl(&self, rule: SolveDrtrl) -> &Self {
        ETP_RULES_SOLVE_DRTRL.insert(self, rule);
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

    fn missing(&self, rule: &str) -> Error {
        Error::MissingRule {
            primitive: self.0.name.clone(),
            rule: rule.into(),
            detail: format!("; register it with `register_{rule}`"),
        }
    }

    fn check_like(&self, rule: &str, out: &TensorMap, like: &BTreeMapView) -> Result<()> {
        for (k, a) in like {
            match out.get(*k) {
                None => {
                    return Err(Error::etp(
                        &self.0.name,
                        format!("rule {rule}"),
                        format!(
                            "result lacks trainable `{k}` (got keys {:?})",
                            out.keys().collect::<Vec<_>>()
                        ),
                    ))
                }
                Some(t) if t.shape() != a.shape() => {
                    return Err(Error::etp(
                        &self.0.name,
                        format!("rule {rule}"),
                        format!(
                            "result `{k}` has shape {:?}, expected {:?}",
                            t.shape(),
                            a.shape()
                        ),
                    ))
                }
                _ => {}
            }
        }
        if out.len() != like.len() {
            return Err(Error::etp(
                &self.0.name,
                format!("rule {rule}"),
                format!(
                    "result has keys {:?}, expected {:?}",
                    out.keys().collect::<Vec<_>>(),
                    like.iter().map(|(k, _)| k).collect::<Vec<_>>()
                ),
            ));
        }
        Ok(())
    }

    /// Call the registered `yw_to_w`, checking that the result has the trace's structure.
    pub fn yw_to_w(
        &self,
        hidden: &Tensor,
        trace: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = ETP_RULES_YW_TO_W
            .get(self)
            .ok_or_else(|| self.missing("yw_to_w"))?;
        let out = r
            .call(hidden, trace, params)
            .map_err(|e| self.wrap("rule yw_to_w", e))?;
        let like: BTreeMapView = trace.iter().map(|(k, t)| (k.as_str(), t.aval())).collect();
        self.check_like("yw_to_w", &out, &like)?;
        Ok(out)
    }
    /// Call the registered `xy_to_dw`, checking keys (and shapes, unless the primitive opts out).
    pub fn xy_to_dw(
        &self,
        x: Option<&Tensor>,
        hidden: &Tensor,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = ETP_RULES_XY_TO_DW
            .get(self)
            .ok_or_else(|| self.missing("xy_to_dw"))?;
        let out = r
            .call(x, hidden, weights, params)
            .map_err(|e| self.wrap("rule xy_to_dw", e))?;
        if self.exact_dw_shapes() {
            let like: BTreeMapView = weights
                .iter()
                .map(|(k, t)| (k.as_str(), t.aval()))
                .collect();
            self.check_like("xy_to_dw", &out, &like)?;
        }
        Ok(out)
    }
    /// The D-RTRL instantaneous term: `instant_drtrl` where registered, else `xy_to_dw`.
    pub fn instant_drtrl(
        &self,
        x: Option<&Tensor>,
        hidden: &Tensor,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        match ETP_RULES_INSTANT_DRTRL.get(self) {
            Some(r) => r
                .call(x, hidden, weights, params)
                .map_err(|e| self.wrap("rule instant_drtrl", e)),
            None => self.xy_to_dw(x, hidden, weights, params),
        }
    }
    /// The D-RTRL solve: `solve_drtrl` where registered, else `yw_to_w(g, trace)`.
    pub fn solve_drtrl(
        &self,
        g: &Tensor,
        trace: &TensorMap,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        match ETP_RULES_SOLVE_DRTRL.get(self) {
            Some(r) => r
                .call(g, trace, weights, params)
                .map_err(|e| self.wrap("rule solve_drtrl", e)),
            None => self.yw_to_w(g, trace, params),
        }
    }
    /// Call `init_drtrl`, checking keys, zeros and the trailing state axis.
    pub fn init_drtrl(
        &self,
        x: Option<&Aval>,
        y: &Aval,
        weights: &AvalMap,
        num_hidden_state: usize,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = ETP_RULES_INIT_DRTRL
            .get(self)
            .ok_or_else(|| self.missing("init_drtrl"))?;
        let out = r
            .call(x, y, weights, num_hidden_state, params)
            .map_err(|e| self.wrap("rule init_drtrl", e))?;
        for k in weights.keys() {
            let t = out.get(k).ok_or_else(|| {
                Error::etp(
                    &self.0.name,
                    "rule init_drtrl",
                    format!("result lacks trainable `{k}`"),
                )
            })?;
            if t.shape().last() != Some(&num_hidden_state) {
                return Err(Error::etp(&self.0.name, "rule init_drtrl", format!("result `{k}` has shape {:?}; its last axis must be num_hidden_state = {num_hidden_state}", t.shape())));
            }
        }
        Ok(out)
    }
    /// Call `init_pp`, checking the shape `(*y.shape, S)`.
    pub fn init_pp(
        &self,
        x: Option<&Aval>,
        y: &Aval,
        weights: &AvalMap,
        num_hidden_state: usize,
        params: &Params,
    ) -> Result<Tensor> {
        let r = ETP_RULES_INIT_PP
            .get(self)
            .ok_or_else(|| self.missing("init_pp"))?;
        let out = r
            .call(x, y, weights, num_hidden_state, params)
            .map_err(|e| self.wrap("rule init_pp", e))?;
        let mut want = y.shape().to_vec();
        want.push(num_hidden_state);
        if out.shape() != want.as_slice() {
            return Err(Error::etp(
                &self.0.name,
                "rule init_pp",
                format!(
                    "result has shape {:?}, expected (*y.shape, S) = {want:?}",
                    out.shape()
                ),
            ));
        }
        Ok(out)
    }

    fn wrap(&self, context: &str, e: Error) -> Error {
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

type BTreeMapView<'a> = Vec<(&'a str, Aval)>;

fn shapes(args: &[Tensor]) -> String {
    args.iter()
        .map(|a| a.aval().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An ETP primitive bound with params: the graph equation.
#[derive(Clone)]
pub struct EtpEqn {
    /// The primitive.
    pub prim: EtpPrimitive,
    /// Its params.
    pub params: Params,
}

impl fmt::Debug for EtpEqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.prim.name(), self.params)
    }
}

impl EtpEqn {
    fn impl_closure(&self) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + '_ {
        move |a: &[Tensor]| Ok(vec![(self.prim.0.impl_fn)(a, &self.params)?])
    }
    fn impl_graph(&self, avals: &[Aval]) -> Result<graph::Graph> {
        make_graph(self.impl_closure(), avals).map_err(|e| self.prim.wrap("tracing the impl", e))
    }
}

impl Primitive for EtpEqn {
    fn name(&self) -> String {
        self.prim.name().to_string()
    }
    fn params(&self) -> Vec<(String, String)> {
        self.params
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let key = (inputs.to_vec(), self.params.clone());
        if let Some(a) = self
            .prim
            .0
            .shape_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(vec![a.clone()]);
        }
        let g = self.impl_graph(inputs)?;
        let out = g.out_avals().remove(0);
        self.prim
            .0
            .shape_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, out.clone());
        Ok(vec![out])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![
            (self.prim.0.impl_fn)(inputs, &self.params).map_err(|e| self.prim.wrap("bind", e))?
        ])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        // The primal stays one ETP equation; the tangent is the JVP of the impl.
        let y = graph::bind1(Arc::new(self.clone()), p)?;
        let g = self.impl_graph(&crate::ops::avals(p))?;
        let (_, touts) = jvp_graph(&g, p, t)?;
        Ok((vec![y], touts))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        // Transpose through linearisation of the impl, valid in the operands
        // it is linear in: evaluate the VJP at zeros of the linear operands.
        let Some(ct) = &cts[0] else {
            return Ok(vec![None; args.len()]);
        };
        let lin: Vec<usize> = (0..args.len()).filter(|&i| args[i].is_linear()).collect();
        let f = |l: &[Tensor]| {
            let mut full = Vec::with_capacity(args.len());
            let mut it = l.iter();
            for a in args {
                full.push(match a {
                    LinearArg::Known(t) => t.clone(),
                    LinearArg::Linear(_) => it.next().expect("one per linear operand").clone(),
                });
            }
            Ok(vec![(self.prim.0.impl_fn)(&full, &self.params)?])
        };
        let zeros: Vec<Tensor> = lin
            .iter()
            .map(|&i| Tensor::zeros_aval(&args[i].aval()))
            .collect();
        let (_, pb) = vjp(f, &zeros)?;
        let g = pb.apply(std::slice::from_ref(ct))?;
        let mut out = vec![None; args.len()];
        for (&i, gi) in lin.iter().zip(g) {
            out[i] = Some(gi);
        }
        Ok(out)
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let only_x = self
            .prim
            .x_index()
            .is_some_and(|xi| batched.iter().enumerate().all(|(i, &b)| b == (i == xi)));
        if only_x {
            if let Some(cp) = self.prim.batched_counterpart() {
                return Ok((vec![cp.bind(args, &self.params)?], vec![true]));
            }
        }
        if !self.prim.0.warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                "ETP primitive '{}' was decomposed into core ops under vmap (batched operands {:?}); its trainable parameters will not be recognised by the eligibility-trace compiler. Map over the data input only (weights unbatched), or call the batched op directly.",
                self.prim.name(),
                batched
            );
            record_decomposition(self.prim.name());
        }
        let ex: Vec<Aval> = args
            .iter()
            .zip(batched)
            .map(|(a, &b)| {
                if b {
                    a.aval().with_shape(&a.shape()[1..])
                } else {
                    a.aval()
                }
            })
            .collect();
        let g = self.impl_graph(&ex)?;
        vmap_graph(&g, args, batched, size)
    }
    fn lower(&self, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
        Some(
            (self.prim.0.impl_fn)(inputs, &self.params)
                .map(|y| vec![y])
                .map_err(|e| self.prim.wrap("lowering", e)),
        )
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

static DECOMPOSED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_decomposition(name: &str) {
    DECOMPOSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.to_string());
}

/// Names of the primitives that were decomposed under `vmap` (each warned
/// once, through the `log` facade, when it first happened).
pub fn decomposition_warnings() -> Vec<String> {
    DECOMPOSED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The ETP equation behind a graph equation, if it is one.
pub fn as_etp_eqn(prim: &dyn Primitive) -> Option<&EtpEqn> {
    prim.as_any().downcast_ref::<EtpEqn>()
}
