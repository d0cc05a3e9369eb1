//! The one path generated code reaches the runtime through
//! (`::braintrace::__private`), so users never depend on internals.

pub use crate::etp::{
    lazy_counterpart, register_primitive_spec, AvalMap, EtpPrimitive, EtpPrimitiveSpec, InitDrtrl, InitPp, InstantDrtrl, ParamType, ParamValue, Params,
    PrimitiveOptions, SolveDrtrl, StaticPrimitive, TensorMap, XyToDw, YwToW,
};
pub use crate::error::{Error, Result};
pub use crate::tensor::{Aval, Tensor};
pub use inventory;
pub use std::sync::{Arc, LazyLock, OnceLock};
