//! braintrace: eligibility-trace propagation (ETP) primitives, defined
//! declaratively, on a small JAX-like tracing core.
//!
//! * [`Tensor`] and the core ops, with the transforms [`jvp`], [`vjp`],
//!   [`grad`], [`vmap`], [`jit`], [`make_graph`];
//! * [`etp`]: ETP primitives, their four rules and the registries;
//! * the attributes [`etp_primitive`], [`yw_to_w`], [`xy_to_dw`],
//!   [`init_drtrl`], [`init_pp`] that define a primitive declaratively;
//! * [`learn`]: model state, the ETP compiler and the online learners;
//!   [`nn`]: layers, optimisers, safetensors and checkpoints.
//!
//! `use braintrace::prelude::*;` brings the names a training loop uses
//! (tensors, transforms, primitives, `compile`, `DRtrl`, `PpProp`,
//! `ModelState`, the layers, `Adam`, `Sgd`, `Checkpoint`, ...).

pub use braintrace_core::*;
pub use braintrace_macros::{
    etp_primitive, init_drtrl, init_pp, instant_drtrl, solve_drtrl, xy_to_dw, yw_to_w,
};

/// Everything a user of the library usually needs.
pub mod prelude {
    pub use braintrace_core::etp::{
        check_rules, get_primitive_spec, primitive_by_name, register_primitive,
        register_primitive_spec, AvalMap, ElemFn, EtpPrimitive, EtpPrimitiveSpec, EtpRules,
        InitDrtrl, InitPp, InstantDrtrl, Params, PrimitiveOptions, SolveDrtrl, TensorMap, XyToDw,
        YwToW, ETP_RULES_INIT_DRTRL, ETP_RULES_INIT_PP, ETP_RULES_XY_TO_DW, ETP_RULES_YW_TO_W,
    };
    pub use braintrace_core::{
        avals, concat, custom_jvp, eval_shape, grad, grad_scalar, jit, jvp, make_graph, spike,
        stack, value_and_grad, value_and_grad_vec, vjp, vmap, vmap_out, where_, Aval, CustomJvp,
        DType, Error, Graph, Jit, Result, Surrogate, Tensor, VjpFn,
    };
    pub use braintrace_macros::{
        etp_primitive, init_drtrl, init_pp, instant_drtrl, solve_drtrl, xy_to_dw, yw_to_w,
    };
    // Online learning: what a training loop always imports.
    pub use braintrace_core::learn::{
        bptt_grad, compile, DRtrl, EtraceGrads, Init, Learner, Model, ModelState, NonFinite,
        NonTemporal, PpProp, Reduction, StepCtx, TensorDict, VjpMethod,
    };
    pub use braintrace_core::nn::{
        clip_grad_norm, Adam, Chain, Checkpoint, ExpSynapse, GruCell, LeakyRateReadout, LifCell,
        Linear, Optimizer, Sgd,
    };
}

/// The book's chapters, included so that `cargo test --doc` compiles and
/// runs every Rust sample in `book/src/` (as PyO3 does for its guide).
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../book/src/introduction.md")]
    mod introduction {}
    #[doc = include_str!("../book/src/getting-started.md")]
    mod getting_started {}
    #[doc = include_str!("../book/src/custom-primitives.md")]
    mod custom_primitives {}
    #[doc = include_str!("../book/src/compile-time-checks.md")]
    mod compile_time_checks {}
    #[doc = include_str!("../book/src/builtins.md")]
    mod builtins {}
    #[doc = include_str!("../book/src/checking-rules.md")]
    mod checking_rules {}
    #[doc = include_str!("../book/src/online-learning.md")]
    mod online_learning {}
    #[doc = include_str!("../book/src/eprop-ostl-three-factor.md")]
    mod eprop_ostl_three_factor {}
    #[doc = include_str!("../book/src/algorithms-rtrl.md")]
    mod algorithms_rtrl {}
    #[doc = include_str!("../book/src/python-names.md")]
    mod python_names {}
    #[doc = include_str!("../book/src/internals.md")]
    mod internals {}
    #[doc = include_str!("../book/src/custom-derivatives.md")]
    mod custom_derivatives {}
    #[doc = include_str!("../book/src/training.md")]
    mod training {}
    #[doc = include_str!("../book/src/layers.md")]
    mod layers {}
    #[doc = include_str!("../book/src/dni.md")]
    mod dni {}
}
