//! Row-major (standard-layout) access to dynamic-rank arrays, fast.
//!
//! Kernels that want a flat slice call [`standard_layout`]: data already in
//! standard layout is borrowed; anything else (a transposed, sliced or
//! broadcast view) is copied once. ndarray's own `as_standard_layout` /
//! `to_owned` / `iter()` on `IxDyn` arrays walk element by element with a
//! dynamic index (cloned per element), tens of nanoseconds an element; the
//! copy here drops unit axes, orders the loops by the source's strides and
//! runs them with a fixed rank, so the innermost loop is a plain strided one.

use ndarray::{
    ArrayBase, ArrayD, ArrayViewD, ArrayViewMutD, Axis, CowArray, Data, Dimension, Ix1, Ix2, Ix3,
    Ix4, Ix5, Ix6, IxDyn, Zip,
};

/// The array in standard layout: borrowed when it already is, otherwise a
/// row-major copy (see the module docs for why this and not ndarray's
/// `as_standard_layout`).
pub(crate) fn standard_layout<'a, T, S>(a: &'a ArrayBase<S, IxDyn>) -> CowArray<'a, T, IxDyn>
where
    T: Clone,
    S: Data<Elem = T>,
{
    if a.is_standard_layout() {
        CowArray::from(a.view())
    } else {
        CowArray::from(to_standard(a.view()))
    }
}

/// An owned array in standard layout: moved through when it already is,
/// copied otherwise.
pub(crate) fn into_standard<T: Clone>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        a
    } else {
        to_standard(a.view())
    }
}

/// A row-major copy of any view (always a new array).
pub(crate) fn to_standard<T: Clone>(a: ArrayViewD<'_, T>) -> ArrayD<T> {
    let Some(first) = a.iter().next().cloned() else {
        // No elements: any buffer will do.
        return ArrayD::from_shape_vec(a.raw_dim(), Vec::new()).expect("empty shape holds nothing");
    };
    let mut out = ArrayD::from_elem(a.raw_dim(), first);
    assign(out.view_mut(), a);
    out
}

/// `dst[i] = src[i]` for every index (equal shapes, checked by the caller),
/// with fixed-rank loops ordered by the source's strides.
pub(crate) fn assign<T: Clone>(dst: ArrayViewMutD<'_, T>, src: ArrayViewD<'_, T>) {
    debug_assert_eq!(dst.shape(), src.shape());
    let (mut dst, mut src) = (dst, src);
    if dst.is_empty() {
        return;
    }
    // Unit axes only cost loop levels.
    let mut ax = 0;
    while ax < src.ndim() {
        if src.shape()[ax] == 1 {
            src.index_axis_inplace(Axis(ax), 0);
            dst.index_axis_inplace(Axis(ax), 0);
        } else {
            ax += 1;
        }
    }
    // Loop in the source's memory order: the smallest stride innermost, so
    // reads are sequential and the inner loop is as long as it can be.
    let mut perm: Vec<usize> = (0..src.ndim()).collect();
    perm.sort_by_key(|&i| std::cmp::Reverse(src.strides()[i].unsigned_abs()));
    let src = src.permuted_axes(IxDyn(&perm));
    let dst = dst.permuted_axes(IxDyn(&perm));
    macro_rules! fixed {
        ($d:ty) => {{
            let mut d = dst.into_dimensionality::<$d>().expect("rank checked");
            let s = src.into_dimensionality::<$d>().expect("rank checked");
            Zip::from(&mut d).and(&s).for_each(|o, x| *o = x.clone());
        }};
    }
    match src.ndim() {
        0 => {
            let (mut d, s) = (dst, src);
            if let (Some(o), Some(x)) = (d.first_mut(), s.first()) {
                *o = x.clone();
            }
        }
        1 => fixed!(Ix1),
        2 => fixed!(Ix2),
        3 => fixed!(Ix3),
        4 => fixed!(Ix4),
        5 => fixed!(Ix5),
        6 => fixed!(Ix6),
        _ => {
            let mut d = dst;
            Zip::from(&mut d).and(&src).for_each(|o, x| *o = x.clone());
        }
    }
}

/// Elements of a bulk copy done per memcpy call: blocks of 1 KiB.
///
/// glibc copies blocks of 2 KiB and more with `rep movsb`, which on this
/// kind of machine runs ten times slower than its vector loop when source
/// and destination are a small distance apart modulo 4 KiB (as consecutive
/// heap blocks of 8–32 KiB often are): a 16 KiB reshape copy took 6 µs
/// instead of 0.6 µs. Smaller blocks take the vector loop.
fn block<T>() -> usize {
    (1024 / std::mem::size_of::<T>().max(1)).max(1)
}

/// Append `src` to `dst` in blocks (see [`block`]).
pub(crate) fn extend_copy<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
    dst.reserve(src.len());
    for c in src.chunks(block::<T>()) {
        dst.extend_from_slice(c);
    }
}

/// Copy `src` into `dst` (of the same length) in blocks (see [`block`]).
pub(crate) fn copy_blocks<T: Copy>(dst: &mut [T], src: &[T]) {
    for (d, s) in dst.chunks_mut(block::<T>()).zip(src.chunks(block::<T>())) {
        d.copy_from_slice(s);
    }
}

/// A copy of `src` as a vector, in blocks (see [`block`]).
pub(crate) fn copy_to_vec<T: Copy>(src: &[T]) -> Vec<T> {
    let mut v = Vec::with_capacity(src.len());
    extend_copy(&mut v, src);
    v
}

/// A copy of `a` with the same strides (a standard-layout array is copied
/// in blocks, see [`block`]; anything else through ndarray's `clone`).
pub(crate) fn copy_array<T: Copy>(a: &ArrayD<T>) -> ArrayD<T> {
    match a.as_slice() {
        Some(s) => ArrayD::from_shape_vec(a.raw_dim(), copy_to_vec(s)).expect("same shape"),
        None => a.clone(),
    }
}

/// `f` of every element, keeping the memory layout when the data is
/// contiguous in memory (a transposed array stays transposed, mapped in one
/// slice loop); anything else is copied to standard layout first.
pub(crate) fn map_elements<T, U, S>(a: &ArrayBase<S, IxDyn>, f: impl FnMut(T) -> U) -> ArrayD<U>
where
    T: Clone,
    S: Data<Elem = T>,
{
    if a.is_standard_layout() || a.as_slice_memory_order().is_none() {
        map_standard(a, f)
    } else {
        let mut f = f;
        a.map(|x| f(x.clone()))
    }
}

/// `f` of every element, as a new standard-layout array (one pass over
/// standard data: a slice loop the compiler can vectorise).
pub(crate) fn map_standard<T, U, S>(a: &ArrayBase<S, IxDyn>, f: impl FnMut(T) -> U) -> ArrayD<U>
where
    T: Clone,
    S: Data<Elem = T>,
{
    let a = standard_layout(a);
    let mut f = f;
    let v: Vec<U> = row_major(&a).iter().map(|x| f(x.clone())).collect();
    ArrayD::from_shape_vec(a.raw_dim(), v).expect("same number of elements")
}

/// The elements in row-major order as one slice, when `a` is in standard
/// layout (a helper for kernels that already called [`standard_layout`]).
pub(crate) fn row_major<'a, T, D: Dimension>(a: &'a CowArray<'_, T, D>) -> &'a [T] {
    a.as_slice()
        .expect("standard_layout returns standard-layout data")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{s, Array};

    /// Row-major elements by explicit multi-index loops (the reference).
    fn by_index(a: &ArrayViewD<'_, i64>) -> Vec<i64> {
        let sh = a.shape().to_vec();
        let n: usize = sh.iter().product();
        (0..n)
            .map(|mut k| {
                let mut ix = vec![0; sh.len()];
                for d in (0..sh.len()).rev() {
                    ix[d] = k % sh[d];
                    k /= sh[d];
                }
                a[IxDyn(&ix)]
            })
            .collect()
    }

    fn check(a: ArrayViewD<'_, i64>) {
        let want = by_index(&a);
        let got = to_standard(a.view());
        assert!(got.is_standard_layout());
        assert_eq!(got.shape(), a.shape());
        assert_eq!(got.as_slice().unwrap(), &want[..]);
        let cow = standard_layout(&a);
        assert_eq!(row_major(&cow), &want[..]);
    }

    #[test]
    fn standard_layout_copies_permuted_sliced_broadcast_views() {
        let base = Array::from_iter(0..2 * 3 * 4 * 5)
            .into_shape_with_order((2, 3, 4, 5))
            .unwrap();
        let d = base.into_dyn();
        check(d.view());
        for perm in [[3, 2, 1, 0], [1, 3, 0, 2], [0, 2, 1, 3], [2, 0, 3, 1]] {
            check(d.view().permuted_axes(IxDyn(&perm)));
        }
        check(d.slice(s![.., 1.., ..;2, 1..4]).into_dyn());
        check(d.slice(s![..;-1, .., 2, ..]).into_dyn());
        let v = Array::from_iter(0..4i64).into_dyn();
        check(v.broadcast(IxDyn(&[3, 4])).unwrap());
        let col = Array::from_iter(0..3i64)
            .into_shape_with_order((3, 1))
            .unwrap()
            .into_dyn();
        check(col.broadcast(IxDyn(&[2, 3, 4])).unwrap());
        // Unit axes, rank 0, rank 7, empty.
        let u = Array::from_iter(0..6i64)
            .into_shape_with_order(IxDyn(&[1, 2, 1, 3, 1]))
            .unwrap();
        check(u.view().permuted_axes(IxDyn(&[3, 1, 0, 4, 2])));
        check(ArrayD::from_elem(IxDyn(&[]), 7i64).view());
        let big = Array::from_iter(0..2 * 3 * 2 * 2 * 3 * 2 * 2i64)
            .into_shape_with_order(IxDyn(&[2, 3, 2, 2, 3, 2, 2]))
            .unwrap();
        check(big.view().permuted_axes(IxDyn(&[6, 0, 5, 1, 4, 2, 3])));
        let e = ArrayD::<i64>::zeros(IxDyn(&[3, 0, 2]));
        check(e.view().permuted_axes(IxDyn(&[2, 1, 0])));
    }

    #[test]
    fn standard_layout_borrows_standard_data() {
        let a = Array::from_iter(0..6i64)
            .into_shape_with_order(IxDyn(&[2, 3]))
            .unwrap();
        let cow = standard_layout(&a);
        assert!(cow.is_view());
        assert_eq!(cow.as_ptr(), a.as_ptr());
        let p = a.as_ptr();
        assert_eq!(into_standard(a).as_ptr(), p);
    }
}
