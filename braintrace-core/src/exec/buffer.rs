//! The executor's views of its buffers as plain slices, and (with the
//! `codegen` feature) the hand-off of a block's buffers to a loop generated
//! at plan time: the only `unsafe` of the executor. A value's elements are read and written as one slice in
//! memory order when its layout (row- or column-major, known from the plan
//! or checked here) makes them one contiguous run, without ndarray's
//! per-call contiguity check.

#[cfg(feature = "codegen")]
use super::codegen::{Kernel, Lane, MAX_INS, MAX_OUTS};
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

#[cfg(feature = "codegen")]
/// Run `k` on one block: `ins` (the group's inputs, then its broadcast
/// buffers) and `outs` of the block's length, `c` the group's constants
/// ([`constants`]).
///
/// # Panics
/// When the operands are not those `k` was compiled for (a bug in the
/// executor: these are checked because the compiled code trusts them).
pub(super) fn run_compiled<T: Lane>(k: &Kernel, ins: &[&[T]], c: &[T], outs: &mut [&mut [T]]) {
    let n = outs.first().map_or(0, |o| o.len());
    let (n_ins, n_outs, n_consts) = k.counts();
    assert!(
        T::DTYPE == k.dtype()
            && ins.len() == n_ins
            && outs.len() == n_outs
            && c.len() == n_consts
            && ins.iter().all(|s| s.len() >= n)
            && outs.iter().all(|o| o.len() == n),
        "a compiled loop called with operands it was not compiled for"
    );
    let mut ip = [std::ptr::null::<T>(); MAX_INS];
    for (p, s) in ip.iter_mut().zip(ins) {
        *p = s.as_ptr();
    }
    let mut op = [std::ptr::null_mut::<T>(); MAX_OUTS];
    for (p, s) in op.iter_mut().zip(outs.iter_mut()) {
        *p = s.as_mut_ptr();
    }
    type Loop<T> = extern "C" fn(*const *const T, *const *mut T, *const T, usize);
    // SAFETY: `k.addr` is the entry of a finalised function that
    // `jit::compile` emitted with signature (ptr, ptr, ptr, ptr) in the
    // C convention and whose module is never freed, for this dtype and
    // these operand counts (asserted above). It reads `n_ins` input
    // pointers and `n_outs` output pointers from the arrays, `n_consts`
    // constants from `c`, and elements `0..n` of each input and output,
    // all of which exist (asserted above); the outputs are unique borrows,
    // distinct from the inputs, so its stores alias nothing it reads.
    unsafe {
        let f: Loop<T> = std::mem::transmute::<usize, Loop<T>>(k.addr());
        f(ip.as_ptr(), op.as_ptr(), c.as_ptr(), n)
    }
}
