//! [`SpikeBitwise`]: logic of two spike trains in arithmetic, so that the
//! surrogate gradients flow through (brainstate's `SpikeBitwise`,
//! braintools' `spike_bitwise`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The operation of a [`SpikeBitwise`] on spikes `x`, `y` in `{0, 1}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BitwiseOp {
    /// `x + y` (brainstate's default `'add'`).
    #[default]
    Add,
    /// `x·y`.
    And,
    /// `(1 − x)·y`.
    Iand,
    /// `x + y − x·y`.
    Or,
    /// `x + y − 2·x·y`.
    Xor,
}

impl BitwiseOp {
    /// The op of brainstate's name (`add`, `and`, `iand`, `or`, `xor`).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "add" => BitwiseOp::Add,
            "and" => BitwiseOp::And,
            "iand" => BitwiseOp::Iand,
            "or" => BitwiseOp::Or,
            "xor" => BitwiseOp::Xor,
            other => {
                return Err(Error::Param {
                    op: "SpikeBitwise".into(),
                    param: "op".into(),
                    reason: format!("unknown operation `{other}` (add, and, iand, or, xor)"),
                })
            }
        })
    }
}

/// Two spike trains combined element-wise by a [`BitwiseOp`]; stateless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SpikeBitwise {
    /// The operation.
    pub op: BitwiseOp,
}

impl SpikeBitwise {
    /// A layer applying `op`.
    pub fn new(op: BitwiseOp) -> Self {
        SpikeBitwise { op }
    }
    /// `op(x, y)` (shapes broadcast as in [`Tensor::add`]).
    pub fn apply(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self.op {
            BitwiseOp::Add => x.add(y),
            BitwiseOp::And => x.mul(y),
            BitwiseOp::Iand => x.rsub_scalar(1.0)?.mul(y),
            BitwiseOp::Or => x.add(y)?.sub(&x.mul(y)?),
            BitwiseOp::Xor => x.add(y)?.sub(&x.mul(y)?.mul_scalar(2.0)?),
        }
    }
}
