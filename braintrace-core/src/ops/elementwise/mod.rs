//! Element-wise core ops: unary math, binary arithmetic on equal shapes,
//! scalar ops, comparisons, select, cast and stop_gradient.

use super::{bcast_to_batch, lift, zeros_for};
use crate::error::{Error, Result};
use crate::graph::{bind1, Elementwise, LinearArg, Primitive};
use crate::kernels::avx2_dispatch;
use crate::kernels::broadcast::zip_flat;
use crate::tensor::{map_elements, ArrayData, Aval, DType, Tensor};
use crate::{map_float, map_float2};
use ndarray::{ArrayD, Zip};
use num_traits::Float;
use std::any::Any;
use std::sync::Arc;

fn same_avals(op: &str, a: &Aval, b: &Aval) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shapes(
            op,
            [a.shape(), b.shape()],
            "operands must have equal shapes",
        ));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::dtype_pair(
            op,
            (a.dtype(), a.shape()),
            (b.dtype(), b.shape()),
            false,
            "",
        ));
    }
    Ok(())
}

fn float_aval(op: &str, a: &Aval) -> Result<()> {
    if a.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype_with(
            op,
            "operand",
            DType::FLOATS,
            a.dtype(),
            format!("shape {:?}", a.shape()),
        ))
    }
}

mod binary;
mod logic;
mod scalar;
mod unary;

pub use binary::*;
pub use logic::*;
pub use scalar::*;
pub use unary::*;

#[cfg(test)]
mod tests;
