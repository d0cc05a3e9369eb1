//! Spec-based registration: one value, `EtpPrimitiveSpec`, fully describes a
//! primitive (name, impl, the four rules, layout, flags);
//! `register_primitive_spec` builds the primitive and `get_primitive_spec`
//! returns that very spec.

use super::params::Params;
use super::primitive::{
    new_primitive, runtime_origin, Counterpart, EtpPrimitive, ImplFn, PrimitiveOptions,
};
use super::registry;
use super::rules::{EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, XyToDw, YwToW};
use crate::error::Result;
use crate::tensor::Tensor;
use std::fmt;
use std::sync::Arc;

/// A complete description of an ETP primitive. All four rules are required
/// fields, so an incomplete spec does not compile.
#[derive(Clone)]
pub struct EtpPrimitiveSpec {
    /// The primitive's name (unique).
    pub name: String,
    /// The implementation function.
    pub impl_fn: ImplFn,
    /// `yw_to_w`.
    pub yw_to_w: YwToW,
    /// `xy_to_dw`.
    pub xy_to_dw: XyToDw,
    /// `init_drtrl`.
    pub init_drtrl: InitDrtrl,
    /// `init_pp`.
    pub init_pp: InitPp,
    /// Optional `instant_drtrl`.
    pub instant_drtrl: Option<InstantDrtrl>,
    /// Optional `solve_drtrl`.
    pub solve_drtrl: Option<SolveDrtrl>,
    /// Flags and layout (`x` index, trainables, counterpart).
    pub options: PrimitiveOptions,
}

impl EtpPrimitiveSpec {
    /// A spec with default options (x = operand 0, weight = operand 1).
    pub fn new<F>(
        name: &str,
        impl_fn: F,
        yw_to_w: YwToW,
        xy_to_dw: XyToDw,
        init_drtrl: InitDrtrl,
        init_pp: InitPp,
    ) -> Self
    where
        F: Fn(&[Tensor], &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        EtpPrimitiveSpec {
            name: name.to_string(),
            impl_fn: Arc::new(impl_fn),
            yw_to_w,
            xy_to_dw,
            init_drtrl,
            init_pp,
            instant_drtrl: None,
            solve_drtrl: None,
            options: PrimitiveOptions::default(),
        }
    }
    /// Replace the options.
    pub fn with_options(mut self, options: PrimitiveOptions) -> Self {
        self.options = options;
        self
    }
    fn rules(&self) -> EtpRules {
        EtpRules {
            yw_to_w: Some(self.yw_to_w.clone()),
            xy_to_dw: Some(self.xy_to_dw.clone()),
            init_drtrl: Some(self.init_drtrl.clone()),
            init_pp: Some(self.init_pp.clone()),
            instant_drtrl: self.instant_drtrl.clone(),
            solve_drtrl: self.solve_drtrl.clone(),
        }
    }
}

impl fmt::Debug for EtpPrimitiveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtpPrimitiveSpec")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Register a primitive from its spec; fills the same four registries as
/// class-based registration.
///
/// As with [`register_primitive`](super::register_primitive), a name that
/// is already taken (by a built-in, an `#[etp_primitive]` or an earlier
/// runtime registration) is refused with an error naming both definitions.
#[track_caller]
pub fn register_primitive_spec(spec: Arc<EtpPrimitiveSpec>) -> Result<EtpPrimitive> {
    let origin = runtime_origin("register_primitive_spec", &spec.name);
    registry::ensure_static_registrations();
    build_from_spec(spec, origin)
}

/// The registration an `#[etp_primitive]` submits: like
/// [`register_primitive_spec`], but run while the compile-time primitives
/// are being entered, so it does not wait for them.
#[doc(hidden)]
pub fn register_static_spec(spec: Arc<EtpPrimitiveSpec>) -> Result<EtpPrimitive> {
    let origin = format!("`#[etp_primitive]` `{}`", spec.name);
    build_from_spec(spec, origin)
}

fn build_from_spec(spec: Arc<EtpPrimitiveSpec>, origin: String) -> Result<EtpPrimitive> {
    let p = new_primitive(
        &spec.name,
        spec.impl_fn.clone(),
        spec.options.clone(),
        Some(spec.clone()),
        origin,
    )?;
    p.register_etp_rules(spec.rules());
    Ok(p)
}

/// The spec a primitive was built from (the same `Arc`), or `None` for a
/// class-based primitive.
pub fn get_primitive_spec(p: &EtpPrimitive) -> Option<Arc<EtpPrimitiveSpec>> {
    p.spec().cloned()
}

/// Set a lazily resolved batched counterpart on options (used by the macros).
#[doc(hidden)]
pub fn lazy_counterpart(mut o: PrimitiveOptions, f: fn() -> EtpPrimitive) -> PrimitiveOptions {
    o.batched_counterpart = Some(Counterpart::Lazy(f));
    o
}
