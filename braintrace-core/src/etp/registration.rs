//! Registration: the name table (one primitive per name), the entry points
//! that fill it (class-based `register_primitive`, spec-based
//! `register_primitive_spec`, and the compile-time primitives that the
//! macros submit through `inventory`), and lookups by name.
//!
//! The compile-time primitives (built-ins included) are entered once,
//! before anything else reads or writes the table, so a runtime
//! registration can never claim one of their names, whatever the call
//! order: it is refused with an error naming both definitions.

use super::params::Params;
use super::primitive::options::PrimitiveOptions;
use super::primitive::spec::EtpPrimitiveSpec;
use super::primitive::EtpPrimitive;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::sync::{Arc, Once, RwLock};

struct NameEntry {
    prim: EtpPrimitive,
    origin: String,
}

static NAMES: RwLock<BTreeMap<String, NameEntry>> = RwLock::new(BTreeMap::new());
static STATIC_ERRORS: RwLock<Vec<Error>> = RwLock::new(Vec::new());

/// Enter `p` in the name table; an existing name is an error naming both definitions.
fn register_name(p: &EtpPrimitive, origin: &str) -> Result<()> {
    let mut names = NAMES.write().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = names.get(p.name()) {
        if e.prim == *p {
            return Ok(());
        }
        return Err(Error::DuplicatePrimitive {
            name: p.name().to_string(),
            first: e.origin.clone(),
            second: origin.to_string(),
        });
    }
    names.insert(
        p.name().to_string(),
        NameEntry {
            prim: p.clone(),
            origin: origin.to_string(),
        },
    );
    Ok(())
}

/// A primitive defined with `#[etp_primitive]`, collected at link time.
#[doc(hidden)]
pub struct StaticPrimitive {
    /// Builds (once) and returns the primitive with its rules.
    pub get: fn() -> Result<EtpPrimitive>,
}

inventory::collect!(StaticPrimitive);

static STATIC_ONCE: Once = Once::new();

/// Register every macro-defined primitive (built-ins included). Runs once:
/// on the first registry read, the first runtime registration, or the first
/// `try_primitive()` of a macro primitive, whichever comes first; every
/// other caller waits until it has finished. So the compile-time primitives
/// always hold their names before any runtime registration is tried, and
/// between two of them with the same name the first in link order wins.
#[doc(hidden)]
pub fn ensure_static_registrations() {
    STATIC_ONCE.call_once(|| {
        for s in inventory::iter::<StaticPrimitive> {
            if let Err(e) = (s.get)() {
                log::error!("{e}");
                STATIC_ERRORS
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(e);
            }
        }
    });
}

/// Errors met while registering the macro-defined primitives (duplicate
/// names, with both definitions named). Empty when all is well.
pub fn registration_errors() -> Vec<Error> {
    ensure_static_registrations();
    STATIC_ERRORS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The primitive registered under `name`.
pub fn primitive_by_name(name: &str) -> Option<EtpPrimitive> {
    ensure_static_registrations();
    NAMES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .map(|e| e.prim.clone())
}

/// Like [`primitive_by_name`], with an error for an unknown name.
pub fn lookup_primitive(name: &str) -> Result<EtpPrimitive> {
    primitive_by_name(name).ok_or_else(|| Error::UnknownPrimitive(name.to_string()))
}

/// Every registered primitive, by name.
pub fn all_primitives() -> Vec<EtpPrimitive> {
    ensure_static_registrations();
    NAMES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(|e| e.prim.clone())
        .collect()
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
    ensure_static_registrations();
    enter(
        EtpPrimitive::new(name, Arc::new(impl_fn), options, None)?,
        origin,
    )
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

/// Register a primitive from its spec; fills the same four registries as
/// class-based registration.
///
/// As with [`register_primitive`], a name that
/// is already taken (by a built-in, an `#[etp_primitive]` or an earlier
/// runtime registration) is refused with an error naming both definitions.
#[track_caller]
pub fn register_primitive_spec(spec: Arc<EtpPrimitiveSpec>) -> Result<EtpPrimitive> {
    let origin = runtime_origin("register_primitive_spec", &spec.name);
    ensure_static_registrations();
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
    let p = EtpPrimitive::new(
        &spec.name,
        spec.impl_fn.clone(),
        spec.options.clone(),
        Some(spec.clone()),
    )?;
    p.register_etp_rules(spec.rules());
    enter(p, origin)
}

/// Enter `p` in the name table; `default_origin` names the definition in a
/// duplicate-name error when its options carry no origin.
fn enter(p: EtpPrimitive, default_origin: String) -> Result<EtpPrimitive> {
    let origin = p.origin().map_or(default_origin, str::to_string);
    register_name(&p, &origin)?;
    Ok(p)
}

/// The spec a primitive was built from (the same `Arc`), or `None` for a
/// class-based primitive.
pub fn get_primitive_spec(p: &EtpPrimitive) -> Option<Arc<EtpPrimitiveSpec>> {
    p.spec().cloned()
}
