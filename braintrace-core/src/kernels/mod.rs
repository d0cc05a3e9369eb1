//! Plain ndarray kernels used by the core ops' eval rules.

pub(crate) mod broadcast;
pub mod conv;
pub mod fastmath;
pub mod gather;
pub(crate) mod reduce;

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

/// An array of zeros of `shape` for a kernel's output, or an error naming
/// `op` when the shape comes from user input and no array can have it (see
/// [`checked_size`](crate::tensor::checked_size)) or it cannot be allocated
/// (the allocation is fallible: no abort).
pub(crate) fn try_zeros_array<T: Clone + num_traits::Zero>(
    op: &str,
    shape: &[usize],
) -> Result<ArrayD<T>> {
    let n = crate::tensor::checked_size(op, shape)?;
    let too_big = || Error::allocation(op, shape, n, std::mem::size_of::<T>());
    if n.checked_mul(std::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(too_big());
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_big())?;
    v.resize(n, T::zero());
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|_| too_big())
}
