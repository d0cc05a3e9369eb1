//! Row-block kernels for broadcasting and concatenation on row-major data.
//!
//! The broadcasts met in a model step are of two kinds, each a flat loop
//! over contiguous blocks of the output: a *repeat* (a bias `[128]` against
//! `[16, 128]`: the operand's elements are the output's last axes, repeated
//! for each leading index) and a *spread* (a scalar, or a column `[16, 1]`:
//! each operand element covers a contiguous block of the output). The
//! kernels here recognise the two, and concatenation as one copy of a
//! contiguous row per operand and leading index; anything else is left to
//! the caller's general (strided) path.

use crate::tensor::{assign, copy_to_vec, extend_copy, row_major, standard_layout};
use ndarray::{ArrayD, ArrayView, IxDyn};

/// How an operand of a broadcast covers a row-major output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cover {
    /// The operand has the output's shape.
    Same,
    /// The operand is the output's trailing block of this many elements,
    /// repeated for each leading index.
    Repeat(usize),
    /// Each operand element covers this many consecutive output elements
    /// (a scalar covers them all).
    Spread(usize),
}

/// How `operand` (numpy right-aligned broadcasting, already checked
/// compatible) covers `out`, when it is one of the flat kinds.
pub(crate) fn cover(operand: &[usize], out: &[usize]) -> Option<Cover> {
    let n: usize = out.iter().product();
    if operand == out {
        return Some(Cover::Same);
    }
    if operand.len() > out.len() {
        return None;
    }
    if operand.iter().product::<usize>() == 1 {
        return Some(Cover::Spread(n));
    }
    let lead = out.len() - operand.len();
    let dim = |i: usize| if i < lead { 1 } else { operand[i - lead] };
    let first = (0..out.len()).find(|&i| dim(i) != 1).unwrap_or(out.len());
    if (first..out.len()).all(|i| dim(i) == out[i]) {
        return Some(Cover::Repeat(out[first..].iter().product()));
    }
    let end = (0..out.len()).rfind(|&i| dim(i) != 1).map_or(0, |i| i + 1);
    if (0..end).all(|i| dim(i) == out[i]) {
        return Some(Cover::Spread(out[end..].iter().product()));
    }
    None
}

/// `f(a, b)` over the output, `a` and `b` row-major and covering it as
/// `ca` and `cb` (not both broadcast: one of them is [`Cover::Same`], or
/// both are [`Cover::Spread`] of the whole output, i.e. scalars).
fn zip_cover<T: Copy, U>(
    a: &[T],
    ca: Cover,
    b: &[T],
    cb: Cover,
    n: usize,
    f: impl Fn(T, T) -> U,
) -> Option<Vec<U>> {
    let mut out = Vec::with_capacity(n);
    match (ca, cb) {
        (Cover::Same, Cover::Same) => out.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y))),
        (Cover::Same, Cover::Repeat(k)) if k > 0 => {
            for ra in a.chunks_exact(k) {
                out.extend(ra.iter().zip(b).map(|(&x, &y)| f(x, y)));
            }
        }
        (Cover::Repeat(k), Cover::Same) if k > 0 => {
            for rb in b.chunks_exact(k) {
                out.extend(a.iter().zip(rb).map(|(&x, &y)| f(x, y)));
            }
        }
        (Cover::Same, Cover::Spread(k)) if k > 0 => {
            for (ra, &y) in a.chunks_exact(k).zip(b) {
                out.extend(ra.iter().map(|&x| f(x, y)));
            }
        }
        (Cover::Spread(k), Cover::Same) if k > 0 => {
            for (rb, &x) in b.chunks_exact(k).zip(a) {
                out.extend(rb.iter().map(|&y| f(x, y)));
            }
        }
        (Cover::Spread(ka), Cover::Spread(kb)) if ka == n && kb == n && n > 0 => {
            out.push(f(a[0], b[0]));
        }
        _ => return None,
    }
    (out.len() == n).then_some(out)
}

/// `f(a, b)` element-wise with `a` and `b` broadcast to `out_shape`, when
/// both cover it in a flat way (see [`cover`]); `None` otherwise (the
/// caller then takes its general path). The result is in standard layout.
pub(crate) fn zip_flat<T: Copy, U>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    out_shape: &[usize],
    f: impl Fn(T, T) -> U,
) -> Option<ArrayD<U>> {
    let ca = cover(a.shape(), out_shape)?;
    let cb = cover(b.shape(), out_shape)?;
    let n: usize = out_shape.iter().product();
    let (sa, sb) = (standard_layout(a), standard_layout(b));
    let v = zip_cover(row_major(&sa), ca, row_major(&sb), cb, n, f)?;
    ArrayD::from_shape_vec(IxDyn(out_shape), v).ok()
}

/// `x` (row-major `data` of shape `mid`, the output's rank with unit axes
/// where it broadcasts) broadcast to `out`, in standard layout.
pub(crate) fn broadcast_rows<T: Copy>(data: &[T], mid: &[usize], out: &[usize]) -> ArrayD<T> {
    let n: usize = out.iter().product();
    let shape = IxDyn(out);
    let filled = |v: Vec<T>| ArrayD::from_shape_vec(shape.clone(), v).expect("size checked");
    if n == 0 {
        return filled(Vec::new());
    }
    match cover(mid, out) {
        Some(Cover::Same) => filled(copy_to_vec(data)),
        Some(Cover::Repeat(k)) if k > 0 => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n / k {
                extend_copy(&mut v, data);
            }
            filled(v)
        }
        Some(Cover::Spread(k)) if k > 0 => {
            let mut v = Vec::with_capacity(n);
            for x in data {
                v.extend(std::iter::repeat_n(*x, k));
            }
            filled(v)
        }
        _ => {
            let view = ArrayView::from_shape(IxDyn(mid), data).expect("size checked");
            let b = view.broadcast(shape.clone()).expect("shapes checked");
            let mut o = ArrayD::from_elem(shape, data[0]);
            assign(o.view_mut(), b);
            o
        }
    }
}

/// `parts` joined along `axis` into `out_shape` (shapes checked by the
/// caller). The output is a run of rows, one per leading index; each
/// operand fills its own column range of every row: a block copy for long
/// ranges, fixed-size moves for short ones (a memcpy call per element of a
/// `[16, 128, 1]`-by-`[16, 128, 1]` join cost ten times the copy).
pub(crate) fn concat_rows<T: Copy>(
    parts: &[&ArrayD<T>],
    axis: usize,
    out_shape: &[usize],
) -> ArrayD<T> {
    let total: usize = out_shape.iter().product();
    let first = parts.iter().find_map(|a| a.iter().next().copied());
    let Some(first) = first.filter(|_| total > 0) else {
        return ArrayD::from_shape_vec(IxDyn(out_shape), Vec::new()).expect("no elements");
    };
    let stds: Vec<_> = parts.iter().map(|a| standard_layout(*a)).collect();
    let srcs: Vec<&[T]> = stds.iter().map(row_major).collect();
    let mut v = vec![first; total];
    concat_rows_into(&srcs, axis, out_shape, &mut v);
    ArrayD::from_shape_vec(IxDyn(out_shape), v).expect("shapes checked")
}

/// [`concat_rows`] of the parts' row-major elements `srcs` into `v`
/// (`out_shape`'s element count, row-major), every element of which it
/// writes: the planned executor's concatenation into a recycled buffer.
pub(crate) fn concat_rows_into<T: Copy, S: AsRef<[T]>>(
    srcs: &[S],
    axis: usize,
    out_shape: &[usize],
    v: &mut [T],
) {
    let total: usize = out_shape.iter().product();
    debug_assert_eq!(v.len(), total);
    if total == 0 {
        return;
    }
    let row: usize = out_shape[axis..].iter().product();
    let outer = total / row;
    if let [a, b] = srcs {
        let (a, b) = (a.as_ref(), b.as_ref());
        if a.len() == outer && b.len() == outer {
            // Two operands of one element per row (stacking a pair along a
            // new last axis): an interleave the compiler vectorises.
            for ((d, &x), &y) in v.chunks_exact_mut(2).zip(a).zip(b) {
                d[0] = x;
                d[1] = y;
            }
            return;
        }
    }
    if srcs.iter().all(|s| s.as_ref().len() == outer) {
        // One element per operand and row (a stack along a new last
        // axis): fill each output row in turn, the stores sequential.
        for (o, d) in v.chunks_exact_mut(row).enumerate() {
            for (x, s) in d.iter_mut().zip(srcs) {
                *x = s.as_ref()[o];
            }
        }
        return;
    }
    let mut off = 0;
    for src in srcs {
        let src = src.as_ref();
        let r = src.len() / outer;
        if r > 0 {
            match r {
                1 => fill_columns::<T, 1>(v, row, off, src),
                2 => fill_columns::<T, 2>(v, row, off, src),
                3 => fill_columns::<T, 3>(v, row, off, src),
                4 => fill_columns::<T, 4>(v, row, off, src),
                8 => fill_columns::<T, 8>(v, row, off, src),
                _ => {
                    for (d, s) in v.chunks_exact_mut(row).zip(src.chunks_exact(r)) {
                        copy_inline(&mut d[off..off + r], s);
                    }
                }
            }
        }
        off += r;
    }
}

/// Columns `off..off + K` of every `row`-long row of `out` from `src`
/// (`K` elements per row), with fixed-size moves.
fn fill_columns<T: Copy, const K: usize>(out: &mut [T], row: usize, off: usize, src: &[T]) {
    for (d, s) in out.chunks_exact_mut(row).zip(src.chunks_exact(K)) {
        let d: &mut [T; K] = (&mut d[off..off + K]).try_into().expect("K columns");
        let s: &[T; K] = s.try_into().expect("K elements");
        *d = *s;
    }
}

/// `dst = src` (equal lengths) by moves of 16 elements inlined in the
/// loop, not a `memcpy` call per row: a concatenation's rows are short
/// (16 and 128 `f32` in a GRU's `[x, h]`). `bench_learn --profile`, GRU
/// pp_prop, two runs each: the joins of hidden 4, batch 64 0.56–0.57 →
/// 0.50 µs each; of hidden 128, batch 64 1.30–1.36 → 1.27–1.28 µs (at a
/// slow moment of the machine).
fn copy_inline<T: Copy>(dst: &mut [T], src: &[T]) {
    const W: usize = 16;
    let mut d = dst.chunks_exact_mut(W);
    let mut s = src.chunks_exact(W);
    for (dc, sc) in (&mut d).zip(&mut s) {
        let dc: &mut [T; W] = dc.try_into().expect("W elements");
        let sc: &[T; W] = sc.try_into().expect("W elements");
        *dc = *sc;
    }
    for (x, &y) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *x = y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length, whole moves of 16 and a remainder or not: `dst` is
    /// `src`, and nothing past it is written.
    #[test]
    fn copy_inline_copies_every_length() {
        for n in 0..50usize {
            let src: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
            let mut dst = vec![0u32; n + 3];
            copy_inline(&mut dst[..n], &src);
            assert_eq!(&dst[..n], &src[..], "length {n}");
            assert_eq!(&dst[n..], &[0, 0, 0], "length {n}: past the end");
        }
    }

    #[test]
    fn cover_kinds() {
        assert_eq!(cover(&[16, 128], &[16, 128]), Some(Cover::Same));
        assert_eq!(cover(&[128], &[16, 128]), Some(Cover::Repeat(128)));
        assert_eq!(cover(&[1, 128], &[16, 128]), Some(Cover::Repeat(128)));
        assert_eq!(cover(&[], &[16, 128]), Some(Cover::Spread(2048)));
        assert_eq!(cover(&[1, 1], &[16, 128]), Some(Cover::Spread(2048)));
        assert_eq!(cover(&[16, 1], &[16, 128]), Some(Cover::Spread(128)));
        assert_eq!(cover(&[4, 1, 1], &[4, 2, 3]), Some(Cover::Spread(6)));
        assert_eq!(cover(&[2, 3], &[4, 2, 3]), Some(Cover::Repeat(6)));
        assert_eq!(cover(&[4, 1, 3], &[4, 2, 3]), None);
        assert_eq!(cover(&[2, 1], &[4, 2, 3]), None);
    }

    #[test]
    fn broadcast_rows_matches_index_rule() {
        // out[i, j, k] = x[i or 0, j or 0, k or 0] by the numpy rule.
        let out = [3usize, 2, 4];
        for mid in [
            [3, 2, 4],
            [1, 2, 4],
            [3, 1, 1],
            [1, 1, 1],
            [3, 1, 4],
            [1, 2, 1],
        ] {
            let n: usize = mid.iter().product();
            let data: Vec<i64> = (0..n as i64).collect();
            let got = broadcast_rows(&data, &mid, &out);
            for i in 0..3 {
                for j in 0..2 {
                    for k in 0..4 {
                        let (a, b, c) = (
                            if mid[0] == 1 { 0 } else { i },
                            if mid[1] == 1 { 0 } else { j },
                            if mid[2] == 1 { 0 } else { k },
                        );
                        let want = data[(a * mid[1] + b) * mid[2] + c];
                        assert_eq!(got[[i, j, k]], want, "{mid:?}");
                    }
                }
            }
        }
    }
}
