//! `PrimitiveOptions`: an ETP primitive's flags and operand layout (where
//! `x` and the trainables are, the batched counterpart), and the check that
//! a layout is sound. A counterpart names another primitive, so this file
//! refers to the handle's type; it calls nothing of the handle.

use super::EtpPrimitive;
use crate::error::{Error, Result};
use crate::etp::trace_kernel::{TraceKernel, TraceKernelDecl};
use std::collections::HashSet;
use std::fmt;

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

/// Options of [`register_primitive`](crate::etp::register_primitive): flags and layout.
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
    /// The fused trace kernel the primitive declares (checked against its
    /// rules before a learner uses it), `None`: the rules run.
    pub trace_kernel: Option<TraceKernelDecl>,
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
            trace_kernel: None,
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
    /// Declare the primitive's fused trace kernel.
    pub fn trace_kernel(mut self, k: TraceKernel) -> Self {
        self.trace_kernel = Some(TraceKernelDecl::Fixed(k));
        self
    }
    /// Declare the trace kernel as chosen per equation from its params.
    pub fn trace_kernel_with(mut self, f: fn(&crate::etp::Params) -> Option<TraceKernel>) -> Self {
        self.trace_kernel = Some(TraceKernelDecl::Chosen(f));
        self
    }
    /// Set the batched counterpart.
    pub fn counterpart(mut self, p: &EtpPrimitive) -> Self {
        self.batched_counterpart = Some(Counterpart::Primitive(p.clone()));
        self
    }
}

/// Set a lazily resolved batched counterpart on options (used by the macros).
#[doc(hidden)]
pub fn lazy_counterpart(mut o: PrimitiveOptions, f: fn() -> EtpPrimitive) -> PrimitiveOptions {
    o.batched_counterpart = Some(Counterpart::Lazy(f));
    o
}

/// Check the layout of primitive `name`: at least one trainable, no name
/// or operand index used twice, every index within `num_args`.
pub(in crate::etp) fn validate_layout(name: &str, o: &PrimitiveOptions) -> Result<()> {
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
