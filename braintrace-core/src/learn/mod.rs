//! Online learning with eligibility traces: model state addressed by path,
//! the ETP compiler (hidden groups, relations, diagnostics), the learner
//! and its step programs, the online algorithms — D-RTRL, ES-D-RTRL
//! (pp_prop), SnAp-1/2, UORO and random projection, one module each on the
//! traits of `learn/algorithm.rs` — and a BPTT reference.
//!
//! ```
//! use braintrace_core::learn::{compile, DRtrl, ModelState, Reduction};
//! use braintrace_core::nn::GruCell;
//! use braintrace_core::{DType, Tensor};
//!
//! let model = GruCell::new("rnn", 3, 4);
//! let state = ModelState::new(&model, DType::F64, 0, Some(2))?;
//! let mut learner = compile(model, state, DRtrl::default(), &Tensor::zeros(&[2, 3], DType::F64), Some(2))?;
//! let xs = Tensor::ones(&[5, 2, 3], DType::F64);
//! let ys = Tensor::zeros(&[5, 2, 4], DType::F64);
//! let out = learner.etrace_grad(&xs, &ys, |o, y| o.sub(y)?.square()?.mean_all(), Reduction::Mean)?;
//! assert_eq!(out.grads["rnn/Wz/weight/weight"].shape(), &[7, 4]);
//! assert_eq!(out.losses.shape(), &[5]);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

mod algorithm;
mod axes;
mod boilerplate;
mod bptt;
mod by_name;
mod compiler;
mod control_flow;
mod custom_trace;
mod diagnostics;
mod fast;
mod hooked;
mod in_step;
mod kernel_check;
mod kernel_kind;
mod learner;
mod nonfinite;
mod pp_fast;
mod precision;
mod program;
mod report;
mod rows;
mod shared;
mod state;
mod work;

/// The algorithms: each a module of its own (its configuration type, its
/// trace rule and learner-side state), registered by one line here (see
/// `learn/algorithm.rs`).
/// `named [..]` lists the configuration types [`Algorithm::by_name`] finds.
macro_rules! algorithms {
    ($($module:ident::{$($public:ident),*} named [$($named:ident),*];)*) => {
        $(mod $module; pub use $module::{$($public),*};)*
        /// Every algorithm of the list, for [`Algorithm::by_name`].
        pub(crate) fn registered() -> Vec<by_name::Entry> {
            vec![$($(by_name::Entry::of::<$module::$named>(),)*)*]
        }
    };
}

algorithms! {
    drtrl::{DRtrl} named [DRtrl];
    pp_prop::{rank_decay, PpProp} named [PpProp];
    eprop::{EProp, Feedback} named [EProp];
    ostl::{OstlFeedforward, OstlRecurrent} named [OstlRecurrent, OstlFeedforward];
    three_factor::{ThreeFactor} named [ThreeFactor];
    snap::{SnAp} named [SnAp];
    uoro::{Draws, RandomProjection, Uoro} named [Uoro, RandomProjection];
    dni::{train_synthetic_gradient, train_synthetic_gradient_with, Dni, SgTrainOpts, SyntheticGradient} named [Dni];
}

pub use algorithm::{Algorithm, InStepPaths, NonTemporal, Reduction, VjpMethod};
pub use axes::{EtraceConfig, LearningSignal, RecurrenceScope, TraceFactorization};
pub use bptt::{bptt_grad, Bptt};
pub use compiler::{EtraceGraph, HiddenGroup, Relation, RelationTrainable};
pub use control_flow::{canonicalize_control_flow, CondPolicy, ControlFlowPolicy};
pub use diagnostics::{Diagnostic, DiagnosticKind, Level};
pub use learner::{
    compile, EtraceGrads, EtraceOpts, EtraceOut, EvolveOpts, Learner, LearnerSnapshot, StepLoss,
};
pub use nonfinite::{check_finite, first_non_finite, NonFinite};
pub use pp_fast::pp_chunk_rows;
pub use precision::TraceDType;
pub use report::{CompilationReport, ReportCounts};
pub use state::{
    float_dtype, float_input, join_path, step_values, HiddenInfo, Init, Model, ModelState,
    ParamInfo, StepCtx, TensorDict,
};
mod inputs;
pub use inputs::bptt_grad_inputs;
pub use learner::{compile_with, CompileOpts};
