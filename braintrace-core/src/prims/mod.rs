//! The built-in ETP primitives: dense (`etp_mm`, `etp_mv`), convolution
//! (`etp_conv`), element-wise (`etp_elemwise`), sparse (`etp_sp_mm`,
//! `etp_sp_mv`), LoRA (`etp_lora_mm`, `etp_lora_mv`), grouped matmul
//! (`etp_gmm`, `etp_gmv`) and embedding (`etp_emb`, `etp_emb_v`), and the user-facing
//! ops that pick the batched or unbatched form from `x`'s rank. Each
//! built-in is defined with `#[etp_primitive]` and its companion rules,
//! exactly as a user-defined primitive would be; `prims::etp_mm` is the
//! binding function and `prims::etp_mm::primitive()` the handle.

mod common;
pub mod conv;
pub mod dense;
pub mod elemwise;
pub mod embedding;
pub mod grouped;
pub mod lora;
pub mod sparse;
mod user;

pub use conv::etp_conv;
pub use dense::{etp_mm, etp_mv};
pub use elemwise::etp_elemwise;
pub use embedding::{etp_emb, etp_emb_v};
pub use grouped::{etp_gmm, etp_gmv};
pub use lora::{etp_lora_mm, etp_lora_mv};
pub use sparse::CsrStructure;
pub use sparse::{etp_sp_mm, etp_sp_mv};
pub use user::{
    conv, conv_params, conv_typed_params, element_wise, lora_matmul, matmul, sparse_matmul,
    Transforms,
};
pub use user::{embedding, grouped_matmul};
