//! Structural core ops: reshape, transpose, broadcast_in_dim, reduce-sum,
//! slice, pad and concatenate.

use crate::error::Error;
use crate::tensor::{Aval, Tensor};

macro_rules! map_any {
    ($data:expr, |$a:ident| $body:expr) => {
        match $data {
            ArrayData::F32($a) => ArrayData::F32($body),
            ArrayData::F64($a) => ArrayData::F64($body),
            ArrayData::I64($a) => ArrayData::I64($body),
            ArrayData::Bool($a) => ArrayData::Bool($body),
        }
    };
}

/// [`map_any!`] for a body that returns a `Result` of an array.
macro_rules! try_map_any {
    ($data:expr, |$a:ident| $body:expr) => {
        match $data {
            ArrayData::F32($a) => ArrayData::F32($body?),
            ArrayData::F64($a) => ArrayData::F64($body?),
            ArrayData::I64($a) => ArrayData::I64($body?),
            ArrayData::Bool($a) => ArrayData::Bool($body?),
        }
    };
}

/// An ndarray shape error met after the op's own checks passed, as an error
/// naming the op and the shape it was building.
fn internal<'a>(
    op: &'static str,
    shape: &'a [usize],
) -> impl Fn(ndarray::ShapeError) -> Error + 'a {
    move |e| Error::shapes(op, [shape], format!("internal shape error: {e}"))
}

fn avals_of(inputs: &[Tensor]) -> Vec<Aval> {
    inputs.iter().map(Tensor::aval).collect()
}

fn fmt_list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}").replace(' ', "")
}

mod broadcast;
mod concat;
mod layout;
mod slice;

pub use broadcast::{broadcast_in_dim, BroadcastInDim, ReduceSum};
pub use concat::{concat, Concat};
pub(crate) use layout::check_perm;
pub use layout::{Reshape, Transpose};
pub use slice::{pad, Pad, SliceOp};
