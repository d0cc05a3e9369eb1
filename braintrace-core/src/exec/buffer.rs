//! The executor's views of its buffers as plain slices: the only `unsafe`
//! of the executor. A value's elements are read and written as one slice in
//! memory order when its layout (row- or column-major, known from the plan
//! or checked here) makes them one contiguous run, without ndarray's
//! per-call contiguity check.

use super::{order_of, unique_array_mut, Order, PoolFloat};
use crate::tensor::Tensor;
use ndarray::ArrayD;

/// The elements of a unique concrete `t` of element type `T`, in memory
/// order, when they are contiguous (`None` otherwise: the tensor is shared,
/// symbolic, of another type or strided).
pub(super) fn contiguous_mut<T: PoolFloat>(t: &mut Tensor) -> Option<&mut [T]> {
    let a = unique_array_mut::<T>(t)?;
    if order_of(a).is_none() && a.len() > 1 {
        return None;
    }
    // SAFETY: as in [`contiguous`]: in either order (positive strides) the
    // `a.len()` elements are the ones from `a.as_ptr()` on, each once; the
    // borrow of `t`, unique (`get_mut`), covers them.
    Some(unsafe { std::slice::from_raw_parts_mut(a.as_mut_ptr(), a.len()) })
}

/// `a`'s elements in memory order when they are contiguous (`a` in either
/// order, or at most one element).
pub(super) fn contiguous<T>(a: &ArrayD<T>, own: Option<Order>) -> Option<&[T]> {
    if own.is_some() || a.len() <= 1 {
        // SAFETY: with a fresh array's strides in either order (all
        // positive) the `a.len()` elements are the ones from `a.as_ptr()`
        // on, each once; one element (or none) is contiguous whatever its
        // strides. They live as long as the borrow of `a`.
        Some(unsafe { std::slice::from_raw_parts(a.as_ptr(), a.len()) })
    } else {
        None
    }
}
