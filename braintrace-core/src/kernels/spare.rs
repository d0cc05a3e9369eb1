//! Lists of borrows that keep their allocation from call to call.
//!
//! A step's operand lists (slices of this step's buffers) cannot outlive
//! the step, but their allocations can: [`recast`] hands an emptied
//! vector's allocation over to another element type of the same size and
//! alignment, so a list kept empty between calls (in a plan's pool, or
//! per thread) is refilled without allocating.

use std::cell::Cell;

/// An empty vector with `v`'s allocation, for elements of another type of
/// the same size and alignment: `collect` reuses the allocation in place
/// (`recast_keeps_the_allocation`).
pub(crate) fn recast<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector was cleared"))
        .collect()
}

thread_local! {
    /// This thread's kept list of mutable slices (see [`with_slices`]).
    static SLICES: Cell<Vec<[usize; 2]>> = const { Cell::new(Vec::new()) };
}

/// Run `f` with an empty list of mutable slices whose allocation this
/// thread keeps from call to call.
pub(crate) fn with_slices<'a, T: 'a, R>(f: impl FnOnce(&mut Vec<&'a mut [T]>) -> R) -> R {
    let mut list: Vec<&'a mut [T]> = recast(SLICES.take());
    let r = f(&mut list);
    SLICES.set(recast(list));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn recast_keeps_the_allocation() {
        // The lists the plan keeps in its pool (borrowed element slices,
        // result slices) and [`with_slices`]', of either float type.
        fn check<A, B>(what: &str) {
            let mut v: Vec<A> = Vec::with_capacity(12);
            let (ptr, cap) = (v.as_mut_ptr() as usize, v.capacity());
            let mut w: Vec<B> = recast(v);
            assert_eq!(
                (w.as_mut_ptr() as usize, w.capacity()),
                (ptr, cap),
                "{what}"
            );
            let back: Vec<A> = recast(w);
            assert_eq!(
                (back.as_ptr() as usize, back.capacity()),
                (ptr, cap),
                "{what} back"
            );
        }
        check::<usize, &ndarray::ArrayD<f32>>("&ArrayD<f32>");
        check::<usize, &ndarray::ArrayD<f64>>("&ArrayD<f64>");
        check::<[usize; 3], Cow<'_, [f32]>>("Cow<[f32]>");
        check::<[usize; 3], Cow<'_, [f64]>>("Cow<[f64]>");
        check::<[usize; 2], &mut [f32]>("&mut [f32]");
        check::<[usize; 2], &mut [f64]>("&mut [f64]");
        // Elements are dropped, not kept.
        let v = vec![Cow::Owned(vec![1.0f32; 4]), Cow::Borrowed(&[2.0f32][..])];
        let w: Vec<[usize; 3]> = recast(v);
        assert!(w.is_empty());
    }

    #[test]
    fn with_slices_reuses_one_allocation() {
        let mut a = [1.0f32; 8];
        let mut b = [2.0f64; 8];
        let first = with_slices(|l: &mut Vec<&mut [f32]>| {
            l.extend(a.chunks_mut(2));
            l.as_ptr() as usize
        });
        let second = with_slices(|l: &mut Vec<&mut [f64]>| {
            assert!(l.is_empty());
            l.extend(b.chunks_mut(4));
            l.as_ptr() as usize
        });
        assert_eq!(first, second);
    }
}
