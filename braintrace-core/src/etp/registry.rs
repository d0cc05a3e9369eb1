//! The four global rule registries (plus the optional D-RTRL overrides),
//! the name table, and the compile-time registrations the macros submit
//! through `inventory`. All are safe to read and write from many threads.

use super::primitive::EtpPrimitive;
use super::rules::{InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, XyToDw, YwToW};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Once, RwLock};

/// A registry of one rule kind, keyed by primitive identity.
pub struct RuleRegistry<R> {
    name: &'static str,
    map: RwLock<Option<HashMap<EtpPrimitive, R>>>,
}

impl<R: Clone> RuleRegistry<R> {
    const fn new(name: &'static str) -> Self {
        RuleRegistry {
            name,
            map: RwLock::new(None),
        }
    }
    /// The rule's name (`yw_to_w`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The rule registered for `p`.
    pub fn get(&self, p: &EtpPrimitive) -> Option<R> {
        ensure_static_registrations();
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|m| m.get(p).cloned())
    }
    /// Whether `p` has this rule.
    pub fn contains(&self, p: &EtpPrimitive) -> bool {
        self.get(p).is_some()
    }
    /// Number of primitives with this rule.
    pub fn len(&self) -> usize {
        ensure_static_registrations();
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, HashMap::len)
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The primitives that have this rule.
    pub fn primitives(&self) -> Vec<EtpPrimitive> {
        ensure_static_registrations();
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(Vec::new, |m| m.keys().cloned().collect())
    }
    pub(crate) fn insert(&self, p: &EtpPrimitive, rule: R) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(p.clone(), rule);
    }
}

/// `yw_to_w` rules (braintrace 0.2.6 calls this `dt_to_t`).
pub static ETP_RULES_YW_TO_W: RuleRegistry<YwToW> = RuleRegistry::new("yw_to_w");
/// Alias of [`ETP_RULES_YW_TO_W`] under braintrace 0.2.6's name.
pub use self::ETP_RULES_YW_TO_W as ETP_RULES_DT_TO_T;
/// `xy_to_dw` rules.
pub static ETP_RULES_XY_TO_DW: RuleRegistry<XyToDw> = RuleRegistry::new("xy_to_dw");
/// `init_drtrl` rules.
pub static ETP_RULES_INIT_DRTRL: RuleRegistry<InitDrtrl> = RuleRegistry::new("init_drtrl");
/// `init_pp` rules.
pub static ETP_RULES_INIT_PP: RuleRegistry<InitPp> = RuleRegistry::new("init_pp");
/// Optional `instant_drtrl` overrides.
pub static ETP_RULES_INSTANT_DRTRL: RuleRegistry<InstantDrtrl> = RuleRegistry::new("instant_drtrl");
/// Optional `solve_drtrl` overrides.
pub static ETP_RULES_SOLVE_DRTRL: RuleRegistry<SolveDrtrl> = RuleRegistry::new("solve_drtrl");

struct NameEntry {
    prim: EtpPrimitive,
    origin: String,
}

static NAMES: RwLock<BTreeMap<String, NameEntry>> = RwLock::new(BTreeMap::new());
static STATIC_ERRORS: RwLock<Vec<Error>> = RwLock::new(Vec::new());

/// Enter `p` in the name table; an existing name is an error naming both definitions.
pub(crate) fn register_name(p: &EtpPrimitive, origin: &str) -> Result<()> {
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
