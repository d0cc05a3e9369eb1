//! ETP primitives: the handle, class-based and spec-based registration, the
//! four rule registries, derived graph rules, and the rule checker.

mod check;
mod params;
mod primitive;
mod registry;
mod rules;
mod spec;

pub use check::{check_rules, RuleCheck, RuleReport};
pub use params::{apply_fn, times_derivative, ElemFn, ParamType, ParamValue, Params};
pub use primitive::{
    as_etp_eqn, decomposition_warnings, register_primitive, Counterpart, EtpEqn, EtpPrimitive,
    ImplFn, PrimitiveOptions,
};
pub use registry::{
    all_primitives, ensure_static_registrations, lookup_primitive, primitive_by_name,
    registration_errors, RuleRegistry, StaticPrimitive, ETP_RULES_DT_TO_T, ETP_RULES_INIT_DRTRL,
    ETP_RULES_INIT_PP, ETP_RULES_INSTANT_DRTRL, ETP_RULES_SOLVE_DRTRL, ETP_RULES_XY_TO_DW,
    ETP_RULES_YW_TO_W,
};
pub use rules::{
    sole, AvalMap, EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, TensorMap, XyToDw, YwToW,
};
pub use spec::{
    get_primitive_spec, lazy_counterpart, register_primitive_spec, register_static_spec,
    EtpPrimitiveSpec,
};
