//! The precision an algorithm keeps its eligibility traces in
//! (braintrace's `trace_dtype`): [`TraceDType`].

use crate::error::{Error, Result};
use crate::kernels::trace::Storage;
use crate::tensor::DType;

/// The precision of an algorithm's eligibility traces, set with
/// `DRtrl::trace_dtype` / `PpProp::trace_dtype` (braintrace's
/// `trace_dtype`).
///
/// D-RTRL's traces have the dimension of the parameters times the batch:
/// its fused trace kernels stream them once per step and are bound by
/// memory bandwidth, so narrower traces make a step faster. The trace is
/// stored narrow and loaded into the model's dtype for every step's
/// arithmetic; the gradient accumulates in the model's dtype (f32 for bf16
/// traces).
///
/// | model | allowed trace dtypes |
/// |---|---|
/// | f64 | `Model` (f64), `F64`, `F32` |
/// | f32 | `Model` (f32), `F32`, `BF16` |
///
/// Anything else is refused when the learner is compiled. Where it applies:
///
/// * D-RTRL's fused trace kernels (every built-in and any primitive that
///   declares a [`TraceKernel`](crate::etp::TraceKernel)) honour every
///   allowed dtype.
/// * D-RTRL's rule path (a primitive without a declared kernel, or
///   `fast_paths(false)`) keeps its traces as tensors of the step program:
///   it honours `F32` (the trace is stored as f32 and cast to the model's
///   dtype for the rules) and refuses `BF16` with an error naming the
///   primitive — tensors have no bf16 dtype, and a bf16 trace emulated in
///   f32 would cost the rounding without saving the bandwidth.
/// * pp_prop's traces are vectors (`x̄` per input, `f̄` per output, no
///   parameter dimension): there is no bandwidth to save. It honours `F32`
///   as the D-RTRL rule path does and refuses `BF16` for the same reason.
///
/// Accuracy (measured in `tests/trace_dtype.rs`): each step rounds every
/// trace element once, a relative error of at most `u` (f32: 2⁻²⁴, bf16:
/// 2⁻⁹). The hidden Jacobian `D` carries earlier errors forward without
/// amplifying them where `|D| ≤ 1`, so after `T` steps a trace element is
/// off by at most `T·u` relative to its size, and a gradient element by at
/// most `T·u·Σ|g||ε|`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TraceDType {
    /// The model's dtype (the default).
    #[default]
    Model,
    /// 64-bit float (an f64 model's default).
    F64,
    /// 32-bit float: for an f64 model, half the trace memory and traffic.
    F32,
    /// bfloat16 (8 significant bits, f32's exponent range): for an f32
    /// model, half the trace memory and traffic.
    BF16,
}

impl TraceDType {
    /// The short name (`model`, `f64`, `f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            TraceDType::Model => "model",
            TraceDType::F64 => "f64",
            TraceDType::F32 => "f32",
            TraceDType::BF16 => "bf16",
        }
    }

    /// The storage of traces for a `model` dtype model, or an error naming
    /// `op` when this dtype cannot be used with it.
    pub(crate) fn storage(self, op: &str, model: DType) -> Result<Storage> {
        let st = match self {
            TraceDType::Model => Storage::of(model),
            TraceDType::F64 => Some(Storage::F64),
            TraceDType::F32 => Some(Storage::F32),
            TraceDType::BF16 => Some(Storage::Bf16),
        };
        match st {
            Some(st) if st.fits(model) => Ok(st),
            _ => Err(Error::invalid(
                op,
                format!(
                    "trace_dtype {} with a {} model: f64 models keep f64 or f32 traces, f32 models f32 or bf16",
                    self.name(),
                    model.name()
                ),
            )),
        }
    }

    /// The tensor dtype of traces a step program carries for a `model`
    /// dtype model (the rule path), or an error naming `op` and `who` (the
    /// primitive or algorithm) when they cannot be kept as tensors.
    pub(crate) fn program_dtype(self, op: &str, who: &str, model: DType) -> Result<DType> {
        match self.storage(op, model)? {
            Storage::Bf16 => Err(Error::invalid(
                op,
                format!(
                    "{who} keeps its traces in the step program, which has no bf16 tensors: \
                     bf16 traces need a fused trace kernel (declare one on the primitive) \
                     or use trace_dtype F32 / Model"
                ),
            )),
            st => Ok(st.tensor_dtype()),
        }
    }
}
