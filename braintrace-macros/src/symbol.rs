//! Attribute keys, as named constants so the parser, the validator and the
//! error messages agree on the spelling.

/// `name = "etp_..."`: the primitive's registry name (default: the fn name).
pub const NAME: &str = "name";
/// `batched`: `x` and `y` carry a leading batch axis.
pub const BATCHED: &str = "batched";
/// `gradient_enabled`: identity-like op the compiler's y -> h walk may pass.
pub const GRADIENT_ENABLED: &str = "gradient_enabled";
/// `x = <arg>` or `x = none`.
pub const X: &str = "x";
/// `weight = <arg>` or `weight = [<arg>, ...]`.
pub const WEIGHT: &str = "weight";
/// `trainables(<name> = <arg>, ...)`: trainables with explicit names.
pub const TRAINABLES: &str = "trainables";
/// `counterpart = <path to an #[etp_primitive] fn>`: the batched counterpart.
pub const COUNTERPART: &str = "counterpart";
/// `crate = "path"`: where the runtime lives (default `::braintrace`).
pub const CRATE: &str = "crate";
/// `exact_dw_shapes = false`: `xy_to_dw` may return other shapes (conv).
pub const EXACT_DW_SHAPES: &str = "exact_dw_shapes";
/// `trace_kernel = dense | dense(..) | sparse(..) | lora(..) | <fn>`: the
/// primitive's fused trace kernel.
pub const TRACE_KERNEL: &str = "trace_kernel";
/// The trace-kernel kinds a primitive can declare by name.
pub const KERNEL_KINDS: &[&str] = &["dense", "sparse", "lora"];
/// The value of `x = none`.
pub const NONE: &str = "none";
/// `#[param]` on an argument of the impl function.
pub const PARAM: &str = "param";
/// `#[param(default = <expr>)]`: the value a missing param reads as.
pub const DEFAULT: &str = "default";

/// Every flag, in the order the "unknown flag" message lists them.
pub const ALL_FLAGS: &[&str] = &[
    "name = \"...\"",
    "batched",
    "gradient_enabled",
    "x = <arg> | none",
    "weight = <arg> | [<arg>, ...]",
    "trainables(<name> = <arg>, ...)",
    "counterpart = <fn>",
    "crate = \"...\"",
    "exact_dw_shapes = false",
    "trace_kernel = dense | dense(..) | sparse(..) | lora(..) | <fn>",
];

/// The trainable name of a primitive with a single trainable operand.
pub const SINGLE_TRAINABLE: &str = "weight";
/// The default runtime path.
pub const DEFAULT_CRATE: &str = "::braintrace";
