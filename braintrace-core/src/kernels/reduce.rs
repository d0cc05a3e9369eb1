//! Sum over axes, as a few flat loops over row-major data.
//!
//! After unit axes are dropped and neighbouring axes of one kind merged, a
//! standard-layout array is a chain of alternating kept/summed blocks. The
//! innermost block is reduced first, one pass at a time: a summed block
//! innermost sums contiguous rows; a kept block innermost adds contiguous
//! rows into one accumulator row. Each pass is a plain slice loop the
//! compiler vectorises, and the input is read in place (never cloned);
//! summing only unit axes is a reshape. ndarray's `sum_axis` per axis
//! clones the input and walks short or strided lanes one at a time.

use crate::tensor::{copy_to_vec, row_major, standard_layout};
use ndarray::{ArrayD, IxDyn};
use num_traits::Float;
use std::borrow::Cow;

/// `a` summed over `axes` (sorted, distinct, in range; checked by the
/// caller), the summed axes removed, in standard layout.
pub(crate) fn sum_axes<T: Float>(a: &ArrayD<T>, axes: &[usize]) -> ArrayD<T> {
    let shape = a.shape();
    let out_shape: Vec<usize> = (0..shape.len())
        .filter(|i| !axes.contains(i))
        .map(|i| shape[i])
        .collect();
    let out_dim = IxDyn(&out_shape);
    let n_out: usize = out_shape.iter().product();
    if a.is_empty() {
        return ArrayD::zeros(out_dim);
    }
    let std = standard_layout(a);
    let data = row_major(&std);
    // Blocks (length, summed?) without unit axes, neighbours of one kind merged.
    let mut blocks: Vec<(usize, bool)> = Vec::new();
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let summed = axes.contains(&i);
        match blocks.last_mut() {
            Some((len, s)) if *s == summed => *len *= d,
            _ => blocks.push((d, summed)),
        }
    }
    if blocks.iter().all(|&(_, s)| !s) {
        // Only unit axes are summed: the values are the input's.
        return ArrayD::from_shape_vec(out_dim, copy_to_vec(data))
            .expect("same number of elements");
    }
    let mut cur: Cow<'_, [T]> = Cow::Borrowed(data);
    while let Some(&(len, summed)) = blocks.last() {
        if summed {
            blocks.pop();
            cur = Cow::Owned(cur.chunks_exact(len).map(sum_run).collect());
        } else if blocks.len() >= 2 {
            let (r, _) = blocks[blocks.len() - 2];
            let k = len;
            let mut out = Vec::with_capacity(cur.len() / r);
            for outer in cur.chunks_exact(r * k) {
                let start = out.len();
                out.extend_from_slice(&outer[..k]);
                let acc = &mut out[start..];
                for row in outer[k..].chunks_exact(k) {
                    for (o, &x) in acc.iter_mut().zip(row) {
                        *o = *o + x;
                    }
                }
            }
            cur = Cow::Owned(out);
            blocks.remove(blocks.len() - 2);
            // The kept block may now sit next to another kept block.
            if blocks.len() >= 2 && !blocks[blocks.len() - 2].1 {
                let (k2, _) = blocks.pop().expect("two blocks");
                blocks.last_mut().expect("one block").0 *= k2;
            }
        } else {
            break;
        }
    }
    debug_assert_eq!(cur.len(), n_out);
    ArrayD::from_shape_vec(out_dim, cur.into_owned()).expect("same number of elements")
}

/// The sum of a summed block's run (at least two elements). Short runs
/// (the states of a trace, 2 for LIF) are summed inline: a call per run
/// costs more than the run. Same order as `sum_slice`, which adds runs
/// under 8 one by one from zero.
#[inline]
fn sum_run<T: Float>(c: &[T]) -> T {
    match c.len() {
        2 => T::zero() + c[0] + c[1],
        3..=7 => c.iter().fold(T::zero(), |a, &v| a + v),
        _ => sum_slice(c),
    }
}

/// The sum over every axis of an array whose row-major elements are `x`:
/// the one value [`sum_axes`] gives when it sums every axis longer than 1
/// (the planned executor's reduction to a scalar, bit for bit).
pub(crate) fn sum_all<T: Float>(x: &[T]) -> T {
    match x {
        [] => T::zero(),
        [v] => *v,
        _ => sum_run(x),
    }
}

/// The sum of a slice with eight partial sums (vectorisable, and no less
/// accurate than one running sum).
fn sum_slice<T: Float>(x: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = *a + v;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in chunks.remainder() {
        s = s + v;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Dimension;

    /// The reference: every element added to its output cell by explicit
    /// multi-index arithmetic, in f64.
    fn reference(a: &ArrayD<f64>, axes: &[usize]) -> Vec<f64> {
        let sh = a.shape().to_vec();
        let out_sh: Vec<usize> = (0..sh.len())
            .filter(|i| !axes.contains(i))
            .map(|i| sh[i])
            .collect();
        let mut out = vec![0.0; out_sh.iter().product()];
        for (ix, &v) in a.indexed_iter() {
            let mut o = 0;
            for (d, &i) in ix.slice().iter().enumerate() {
                if !axes.contains(&d) {
                    o = o * sh[d] + i;
                }
            }
            out[o] += v;
        }
        out
    }

    #[test]
    fn sum_axes_matches_explicit_loops() {
        let shapes: &[&[usize]] = &[
            &[16, 128, 1, 1],
            &[3, 1, 4, 1, 5],
            &[2, 3, 4, 5],
            &[5, 7],
            &[9],
            &[2, 0, 3],
            &[1, 1],
        ];
        for &sh in shapes {
            let n: usize = sh.iter().product();
            let a = ArrayD::from_shape_vec(
                IxDyn(sh),
                (0..n)
                    .map(|i| ((i * 37 % 101) as f64) / 7.0 - 3.0)
                    .collect(),
            )
            .unwrap();
            // Every subset of axes, on the array and on a transposed copy.
            for mask in 0u32..(1 << sh.len()) {
                let axes: Vec<usize> = (0..sh.len()).filter(|i| mask >> i & 1 == 1).collect();
                let got = sum_axes(&a, &axes);
                let want = reference(&a, &axes);
                assert!(got.is_standard_layout());
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{sh:?} {axes:?}");
                }
                assert_eq!(got.len(), want.len());
                let rev: Vec<usize> = (0..sh.len()).rev().collect();
                let t = a.view().permuted_axes(IxDyn(&rev)).to_owned();
                let got = sum_axes(&t, &axes);
                let want = reference(&t, &axes);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{sh:?}ᵀ {axes:?}");
                }
            }
        }
    }
}
