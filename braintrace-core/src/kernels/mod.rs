//! Plain ndarray kernels used by the core ops' eval rules.

pub mod conv;
pub mod fastmath;
pub mod gather;
