//! Plain ndarray kernels used by the core ops' eval rules.

pub(crate) mod broadcast;
pub mod conv;
pub mod fastmath;
pub mod gather;
pub mod pages;
pub(crate) mod reduce;
pub mod sgemm;
pub(crate) mod spare;
pub(crate) mod trace;

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

/// Whether this CPU runs AVX2 and FMA (std checks once, then it is a load).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs AVX2, FMA and AVX-512 (F, VL, DQ, BW). In the
/// crate's tests, a thread can pretend it does not ([`without_avx512`]).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(test)]
    if NO_AVX512.with(|n| n.get()) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
thread_local! {
    static NO_AVX512: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` on this thread as if the CPU had no AVX-512, so that tests
/// reach the AVX2 copies of the dispatched kernels on a CPU with it.
#[cfg(test)]
pub(crate) fn without_avx512<R>(f: impl FnOnce() -> R) -> R {
    NO_AVX512.with(|n| n.set(true));
    let r = f();
    NO_AVX512.with(|n| n.set(false));
    r
}

/// `fn $name(args)`: calls `$body_fn(args)` compiled with AVX2 and FMA
/// enabled when the CPU has both, as is otherwise. `$body_fn` must be
/// `#[inline(always)]`, so that its loops are compiled inside the wide copy
/// (8 `f32` lanes instead of 4). The same operations either way, so the
/// results are bit-identical: Rust never contracts `a * b + c` into a fused
/// multiply-add on its own, and an explicit [`f32::mul_add`] (the
/// [`fastmath`] functions) is rounded once with or without the instruction.
///
/// `avx2_dispatch!(avx512: fn …)` adds a third copy, compiled with
/// AVX-512 (16 `f32` lanes), run where the CPU [has](has_avx512) it:
/// for the element-wise block kernels, whose loops are unit-stride (the
/// fused executor's transcendental groups ran 10–20% faster). Not for
/// loops with strided reads: there the compiler emits AVX-512 gathers,
/// and LIF's D-RTRL trace kernel ran 4× slower.
macro_rules! avx2_dispatch {
    (avx512: $($rest:tt)*) => { $crate::kernels::avx2_dispatch!(@emit true, $($rest)*); };
    (@emit $wider:literal, $(#[$m:meta])* $vis:vis fn $name:ident $(<$($T:ident: $B:path),+>)? ($($a:ident: $t:ty),* $(,)?) => $body_fn:ident) => {
        $(#[$m])*
        $vis fn $name $(<$($T: $B),+>)? ($($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw")]
                fn wider $(<$($T: $B),+>)? ($($a: $t),*) {
                    $body_fn($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn wide $(<$($T: $B),+>)? ($($a: $t),*) {
                    $body_fn($($a),*)
                }
                if $wider && $crate::kernels::has_avx512() {
                    // SAFETY: the CPU has these features (checked just
                    // above), the only requirement of a `target_feature`
                    // function.
                    return unsafe { wider($($a),*) };
                }
                if $crate::kernels::has_avx2_fma() {
                    // SAFETY: the CPU has AVX2 and FMA (checked just above),
                    // the only requirement of a `target_feature` function.
                    return unsafe { wide($($a),*) };
                }
            }
            $body_fn($($a),*)
        }
    };
    ($($rest:tt)*) => { $crate::kernels::avx2_dispatch!(@emit false, $($rest)*); };
}
pub(crate) use avx2_dispatch;

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
