//! The built-in ETP primitives: dense (`etp_mm`, `etp_mv`), convolution
//! (`etp_conv`), element-wise (`etp_elemwise`), sparse (`etp_sp_mm`,
//! `etp_sp_mv`) and LoRA (`etp_lora_mm`, `etp_lora_mv`), and the user-facing
//! ops that pick the batched or unbatched form from `x`'s rank.

mod common;
pub mod conv;
pub mod dense;
pub mod elemwise;
pub mod lora;
mod register;
pub mod sparse;
mod user;

pub use register::{
    etp_conv, etp_elemwise, etp_lora_mm, etp_lora_mv, etp_mm, etp_mv, etp_sp_mm, etp_sp_mv,
};
pub use sparse::CsrStructure;
pub use user::{conv, conv_params, element_wise, lora_matmul, matmul, sparse_matmul, Transforms};
