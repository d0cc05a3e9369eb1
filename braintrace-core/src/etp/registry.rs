//! The rule registries `ETP_RULES_*`: public views over the rules each
//! primitive holds. `ETP_RULES_YW_TO_W.get(&p)` is `p`'s `yw_to_w` rule; a
//! registry's `primitives()` are the registered primitives that have it.
//! Safe to read from many threads while others register.

use super::primitive::EtpPrimitive;
use super::registration::all_primitives;
use super::rules::{EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, XyToDw, YwToW};

/// A registry of one rule kind: a view, keyed by primitive identity, of
/// one slot of every primitive's rules.
pub struct RuleRegistry<R: 'static> {
    name: &'static str,
    slot: fn(&EtpRules) -> &Option<R>,
}

impl<R: Clone> RuleRegistry<R> {
    const fn new(name: &'static str, slot: fn(&EtpRules) -> &Option<R>) -> Self {
        RuleRegistry { name, slot }
    }
    /// The rule's name (`yw_to_w`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The rule registered for `p`.
    pub fn get(&self, p: &EtpPrimitive) -> Option<R> {
        p.rule(self.slot)
    }
    /// Whether `p` has this rule.
    pub fn contains(&self, p: &EtpPrimitive) -> bool {
        self.get(p).is_some()
    }
    /// Number of registered primitives with this rule.
    pub fn len(&self) -> usize {
        self.primitives().len()
    }
    /// Whether no registered primitive has this rule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The registered primitives that have this rule, by name.
    pub fn primitives(&self) -> Vec<EtpPrimitive> {
        all_primitives()
            .into_iter()
            .filter(|p| self.contains(p))
            .collect()
    }
}

/// `yw_to_w` rules (braintrace 0.2.6 calls this `dt_to_t`).
pub static ETP_RULES_YW_TO_W: RuleRegistry<YwToW> = RuleRegistry::new("yw_to_w", |r| &r.yw_to_w);
/// Alias of [`ETP_RULES_YW_TO_W`] under braintrace 0.2.6's name.
pub use self::ETP_RULES_YW_TO_W as ETP_RULES_DT_TO_T;
/// `xy_to_dw` rules.
pub static ETP_RULES_XY_TO_DW: RuleRegistry<XyToDw> =
    RuleRegistry::new("xy_to_dw", |r| &r.xy_to_dw);
/// `init_drtrl` rules.
pub static ETP_RULES_INIT_DRTRL: RuleRegistry<InitDrtrl> =
    RuleRegistry::new("init_drtrl", |r| &r.init_drtrl);
/// `init_pp` rules.
pub static ETP_RULES_INIT_PP: RuleRegistry<InitPp> = RuleRegistry::new("init_pp", |r| &r.init_pp);
/// Optional `instant_drtrl` overrides.
pub static ETP_RULES_INSTANT_DRTRL: RuleRegistry<InstantDrtrl> =
    RuleRegistry::new("instant_drtrl", |r| &r.instant_drtrl);
/// Optional `solve_drtrl` overrides.
pub static ETP_RULES_SOLVE_DRTRL: RuleRegistry<SolveDrtrl> =
    RuleRegistry::new("solve_drtrl", |r| &r.solve_drtrl);
