//! Which computation a declared trace kernel is to the learner
//! ([`FusedKind`]) and how it scales a trainable's instantaneous term (the
//! transform read from the equation's params): what the fused buffers
//! (`fast`), the check (`kernel_check`) and pp_prop's dense path
//! (`pp_fast`) read of a [`TraceKernel`].

use crate::error::{Error, Result};
use crate::etp::{ElemFn, ParamType, ParamValue, Params, Role, Scale, TraceKernel};
use crate::tensor::Tensor;

/// The transform under `key`: `None` when absent or `None`; an error when
/// the param holds something that is not a transform.
pub(crate) fn elem_fn(params: &Params, key: &str) -> Result<Option<ElemFn>> {
    match params.raw(key) {
        None | Some(ParamValue::None) => Ok(None),
        Some(v) => ElemFn::from_param(v).map(Some).ok_or_else(|| {
            Error::invalid(
                "D-RTRL fused kernel",
                format!("param `{key}` is not an element-wise transform"),
            )
        }),
    }
}

/// The kind of computation a fused kernel runs (the learner's side of a
/// declared [`TraceKernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusedKind {
    /// [`TraceKernel::Dense`].
    Dense,
    /// [`TraceKernel::Sparse`].
    Sparse,
    /// [`TraceKernel::Lora`].
    Lora,
    /// [`TraceKernel::Conv`].
    Conv,
    /// [`TraceKernel::Custom`].
    Custom,
}

impl FusedKind {
    pub(crate) fn of(k: &TraceKernel) -> Self {
        match k {
            TraceKernel::Dense { .. } => FusedKind::Dense,
            TraceKernel::Sparse { .. } => FusedKind::Sparse,
            TraceKernel::Lora { .. } => FusedKind::Lora,
            TraceKernel::Custom(_) => FusedKind::Custom,
            _ => FusedKind::Conv,
        }
    }
}

/// The transform of a trainable in `role` as the kernel scales it: an
/// [`ElemFn`] param, or a constant `c` read as the transform `c · W`;
/// `None` for the identity. An error when the param is unreadable.
pub(crate) fn scale_fn(
    kernel: &TraceKernel,
    role: &Role,
    params: &Params,
) -> Result<Option<ElemFn>> {
    match kernel.scale(role) {
        Scale::One => Ok(None),
        Scale::Fn(key) => elem_fn(params, &key),
        Scale::Param(key) => {
            let c = params.get::<f64>("D-RTRL fused kernel", &key)?;
            Ok(Some(ElemFn::new(
                &format!("{c} * w"),
                move |w: &Tensor| w.mul_scalar(c),
                move |w: &Tensor| w.ones_like().mul_scalar(c),
            )))
        }
    }
}
