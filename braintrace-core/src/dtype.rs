//! The element type of a tensor, below every other module: errors carry
//! dtypes typed ([`Error::DType`](crate::Error::DType)).

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 64-bit signed integer (indices).
    I64,
    /// Boolean (masks, comparison results).
    Bool,
}

impl DType {
    /// The floating-point dtypes, what a float-only op accepts (the
    /// `expected` of its [`Error::DType`](crate::Error::DType)).
    pub const FLOATS: [DType; 2] = [DType::F32, DType::F64];
    /// Whether this is a floating-point type (the only differentiable ones).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
    /// The size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }
    /// The short name used in printed graphs (`f32`, `f64`, `i64`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
