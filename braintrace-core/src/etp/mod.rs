//! ETP primitives: the handle, class-based and spec-based registration, the
//! four rule registries, derived graph rules, and the rule checker.
//!
//! Files, from the bottom up (each uses only those above it, except that
//! `options` names the handle's type, since a batched counterpart is a
//! primitive):
//! * `params`, `rules`: param values, and the rules as values;
//! * `trace_kernel`: the fused trace kernel a primitive declares;
//! * `options`, `spec`: a primitive's layout and flags, and its full
//!   description as plain data;
//! * `primitive`: the handle, holding its impl, layout, spec and rules;
//! * `calls`: the checked rule calls (`p.yw_to_w(..)`, ...);
//! * `eqn`: `bind` and the graph equation with its derived rules;
//! * `registration`: the name table, the entry points that fill it, the
//!   compile-time primitives and lookups by name;
//! * `registry`: the `ETP_RULES_*` registries, views over the primitives'
//!   rules;
//! * `check`: the rule checker.

mod calls;
mod check;
mod custom_kernel;
mod eqn;
mod params;
mod primitive;
mod registration;
mod registry;
mod rules;
mod trace_kernel;

pub use check::{check_rules, RuleCheck, RuleReport};
pub use custom_kernel::{CustomKernel, CustomTraceKernel, TraceStep};
pub use eqn::{as_etp_eqn, decomposition_warnings, EtpEqn};
pub use params::{apply_fn, times_derivative, ElemFn, ParamType, ParamValue, Params};
pub use primitive::options::{lazy_counterpart, Counterpart, PrimitiveOptions};
pub use primitive::spec::{EtpPrimitiveSpec, ImplFn};
pub use primitive::EtpPrimitive;
pub use registration::{
    all_primitives, ensure_static_registrations, get_primitive_spec, lookup_primitive,
    primitive_by_name, register_primitive, register_primitive_spec, register_static_spec,
    registration_errors, StaticPrimitive,
};
pub use registry::{
    RuleRegistry, ETP_RULES_DT_TO_T, ETP_RULES_INIT_DRTRL, ETP_RULES_INIT_PP,
    ETP_RULES_INSTANT_DRTRL, ETP_RULES_SOLVE_DRTRL, ETP_RULES_XY_TO_DW, ETP_RULES_YW_TO_W,
};
pub use rules::{
    sole, AvalMap, EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, TensorMap, XyToDw, YwToW,
};
pub use trace_kernel::{Role, Scale, TraceKernel, TraceKernelDecl};
