//! Index select along one axis (`take`, like `numpy.take` without wrapping) and its adjoint
//! (`scatter_add`, which accumulates duplicate indices).

use std::ops::AddAssign;

use crate::error::{Error, Result};

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use num_traits::Zero;

/// Validates `indices` against `bound` and converts them to `usize`, in logical order.
fn checked_indices(
    op: &str,
    indices: &ArrayViewD<i64>,
    axis: usize,
    bound: usize,
) -> Result<Vec<usize>> {
    indices
        .iter()
        .map(|&i| match usize::try_from(i) {
            Ok(u) if u < bound => Ok(u),
            _ => Err(Error::Index {
                op: op.to_string(),
                index: i,
                axis,
                size: bound,
            }),
        })
        .collect()
}

/// `shape[..axis] ++ idx_shape ++ shape[axis+1..]`.
fn taken_shape(shape: &[usize], idx_shape: &[usize], axis: usize) -> Vec<usize> {
    shape[..axis]
        .iter()
        .chain(idx_shape)
        .chain(&shape[axis + 1..])
        .copied()
        .collect()
}

/// out = x taken along `axis` at `indices` (numpy take): out.shape = x.shape[..axis] ++ indices.shape ++ x.shape[axis+1..].
/// Indices are i64; an index outside `[0, x.shape[axis])` is an Err naming the index and the bound (negative indices are NOT wrapped).
pub fn take<T: Clone + Zero>(
    x: &ArrayViewD<T>,
    indices: &ArrayViewD<i64>,
    axis: usize,
) -> Result<ArrayD<T>> {
    let shape = x.shape();
    if axis >= shape.len() {
        return Err(Error::axis("take", axis as isize, shape));
    }
    let bound = shape[axis];
    let idx = checked_indices("take", indices, axis, bound)?;
    let out_shape = taken_shape(shape, indices.shape(), axis);
    crate::tensor::checked_size("take", &out_shape)?;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let xc = crate::tensor::standard_layout(x);
    let xs = xc
        .as_slice()
        .ok_or_else(|| Error::invalid("take", "internal error: x is not contiguous"))?;
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        let base = o * bound * inner;
        for &i in &idx {
            let start = base + i * inner;
            out.extend_from_slice(&xs[start..start + inner]);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out)
        .map_err(|e| Error::invalid("take", format!("internal shape error: {e}")))
}

/// The adjoint of `take`: an array of shape `operand_shape` with zeros, to which each update slice is added at its index (duplicates accumulate).
pub fn scatter_add<T: Clone + Zero + AddAssign>(
    operand_shape: &[usize],
    indices: &ArrayViewD<i64>,
    updates: &ArrayViewD<T>,
    axis: usize,
) -> Result<ArrayD<T>> {
    if axis >= operand_shape.len() {
        return Err(Error::axis("scatter_add", axis as isize, operand_shape));
    }
    let expected = taken_shape(operand_shape, indices.shape(), axis);
    if updates.shape() != expected.as_slice() {
        return Err(Error::shapes(
            "scatter_add",
            [updates.shape(), &expected[..], operand_shape, indices.shape()],
            format!("updates (the first) must have the shape of the second: operand (third) with axis {axis} replaced by the indices' shape (fourth)"),
        ));
    }
    let bound = operand_shape[axis];
    let idx = checked_indices("scatter_add", indices, axis, bound)?;
    let outer: usize = operand_shape[..axis].iter().product();
    let inner: usize = operand_shape[axis + 1..].iter().product();
    let mut out = super::try_zeros_array::<T>("scatter_add", operand_shape)?;
    let uc = crate::tensor::standard_layout(updates);
    let us = uc.as_slice().ok_or_else(|| {
        Error::invalid("scatter_add", "internal error: updates are not contiguous")
    })?;
    let os = out
        .as_slice_mut()
        .ok_or_else(|| Error::invalid("scatter_add", "internal error: output is not contiguous"))?;
    let m = idx.len();
    for o in 0..outer {
        for (j, &i) in idx.iter().enumerate() {
            let src = &us[(o * m + j) * inner..(o * m + j + 1) * inner];
            let dst = &mut os[(o * bound + i) * inner..(o * bound + i + 1) * inner];
            for (d, s) in dst.iter_mut().zip(src) {
                *d += s.clone();
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, Dimension, IxDyn};

    struct Lcg(u64);
    impl Lcg {
        fn next_u64(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn uniform(&mut self) -> f64 {
            (self.next_u64() as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        fn array(&mut self, shape: &[usize]) -> ArrayD<f64> {
            ArrayD::from_shape_fn(IxDyn(shape), |_| self.uniform())
        }
        fn indices(&mut self, shape: &[usize], bound: usize) -> ArrayD<i64> {
            ArrayD::from_shape_fn(IxDyn(shape), |_| self.below(bound) as i64)
        }
    }

    /// Naive take via explicit multi-index loops.
    fn naive_take(x: &ArrayD<f64>, idx: &ArrayD<i64>, axis: usize) -> ArrayD<f64> {
        let shape = taken_shape(x.shape(), idx.shape(), axis);
        let r = idx.ndim();
        ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
            let ix = ix.slice();
            let ii: Vec<usize> = ix[axis..axis + r].to_vec();
            let mut src: Vec<usize> = ix[..axis].to_vec();
            src.push(idx[IxDyn(&ii)] as usize);
            src.extend_from_slice(&ix[axis + r..]);
            x[IxDyn(&src)]
        })
    }

    fn dot(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
        assert_eq!(a.shape(), b.shape());
        a.iter().zip(b.iter()).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn take_matches_naive_all_axes() {
        let mut rng = Lcg(7);
        let xshape = [3usize, 4, 5];
        let x = rng.array(&xshape);
        for (axis, &bound) in xshape.iter().enumerate() {
            for ishape in [vec![], vec![6], vec![2, 3]] {
                let idx = rng.indices(&ishape, bound);
                let got = take(&x.view(), &idx.view(), axis).unwrap();
                assert_eq!(
                    got,
                    naive_take(&x, &idx, axis),
                    "axis {axis} ishape {ishape:?}"
                );
            }
        }
    }

    #[test]
    fn take_non_standard_layout() {
        let mut rng = Lcg(11);
        let x = rng.array(&[4, 5]);
        let xt = x.t().to_owned();
        let idx = rng.indices(&[7], 5);
        let got = take(&x.t(), &idx.view(), 0).unwrap();
        assert_eq!(got, naive_take(&xt, &idx, 0));
        let idx_t = rng.indices(&[3, 2], 4);
        let got = take(&x.view(), &idx_t.t(), 0).unwrap();
        assert_eq!(got, naive_take(&x, &idx_t.t().to_owned(), 0));
    }

    #[test]
    fn take_errors() {
        let x = ArrayD::<f64>::zeros(IxDyn(&[3, 4]));
        let idx = ndarray::arr1(&[0i64, 4]).into_dyn();
        let e = take(&x.view(), &idx.view(), 1).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Index {
                    index: 4,
                    axis: 1,
                    size: 4,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("take") && e.to_string().contains("size 4"),
            "{e}"
        );
        let neg = ndarray::arr1(&[-1i64]).into_dyn();
        let e = take(&x.view(), &neg.view(), 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Index {
                    index: -1,
                    size: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = take(&x.view(), &idx.view(), 2).unwrap_err();
        assert!(matches!(e, Error::Axis { axis: 2, .. }), "{e:?}");
    }

    #[test]
    fn scatter_add_duplicates_accumulate() {
        let idx = ndarray::arr1(&[1i64, 0, 1, 1]).into_dyn();
        let upd = ndarray::arr2(&[[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]]).into_dyn();
        let got = scatter_add(&[2, 3], &idx.view(), &upd.view(), 1).unwrap();
        let want = ndarray::arr2(&[[2.0, 1.0 + 3.0 + 4.0, 0.0], [20.0, 10.0 + 30.0 + 40.0, 0.0]])
            .into_dyn();
        assert_eq!(got, want);
    }

    #[test]
    fn scatter_add_is_adjoint_of_take() {
        let mut rng = Lcg(3);
        let xshape = [2usize, 3, 4, 2];
        for axis in 0..4 {
            for ishape in [vec![], vec![5], vec![3, 4]] {
                let x = rng.array(&xshape);
                let idx = rng.indices(&ishape, xshape[axis]);
                let y = take(&x.view(), &idx.view(), axis).unwrap();
                let ct = rng.array(y.shape());
                let back = scatter_add(&xshape, &idx.view(), &ct.view(), axis).unwrap();
                assert_eq!(back.shape(), &xshape);
                let (a, b) = (dot(&ct, &y), dot(&back, &x));
                assert!(
                    (a - b).abs() <= 1e-10 * a.abs().max(b.abs()).max(1.0),
                    "{a} vs {b}"
                );
                // Naive scatter: explicit loops.
                let mut naive = ArrayD::<f64>::zeros(IxDyn(&xshape));
                let r = idx.ndim();
                for (ix, &v) in ct.indexed_iter() {
                    let ix = ix.slice();
                    let mut dst: Vec<usize> = ix[..axis].to_vec();
                    dst.push(idx[IxDyn(&ix[axis..axis + r])] as usize);
                    dst.extend_from_slice(&ix[axis + r..]);
                    naive[IxDyn(&dst)] += v;
                }
                for (p, q) in back.iter().zip(naive.iter()) {
                    assert!((p - q).abs() <= 1e-12, "{p} vs {q}");
                }
            }
        }
    }

    #[test]
    fn scatter_add_errors() {
        let idx = ndarray::arr1(&[0i64, 3]).into_dyn();
        let upd = ArrayD::<f64>::zeros(IxDyn(&[2, 2]));
        let e = scatter_add(&[3, 2], &idx.view(), &upd.view(), 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Index {
                    index: 3,
                    size: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let bad = ArrayD::<f64>::zeros(IxDyn(&[2, 3]));
        let e = scatter_add(&[3, 2], &idx.view(), &bad.view(), 0).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e:?}");
        let e = scatter_add(&[3, 2], &idx.view(), &upd.view(), 2).unwrap_err();
        assert!(matches!(e, Error::Axis { .. }), "{e:?}");
    }

    /// Regression: an operand shape whose size overflows made `scatter_add`
    /// panic allocating its result; it is an error naming the op.
    #[test]
    fn scatter_add_oversized_result_is_an_error() {
        let idx = ArrayD::<i64>::zeros(IxDyn(&[0]));
        let upd = ArrayD::<f64>::zeros(IxDyn(&[0, 1 << 62]));
        let e = scatter_add(&[4, 1 << 62], &idx.view(), &upd.view(), 0).unwrap_err();
        assert!(
            matches!(e, Error::Shape { ref op, .. } if op == "scatter_add"),
            "{e:?}"
        );
    }

    #[test]
    fn empty_indices_and_f32() {
        let x = ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]).into_dyn();
        let idx = ArrayD::<i64>::zeros(IxDyn(&[0]));
        let y = take(&x.view(), &idx.view(), 0).unwrap();
        assert_eq!(y.shape(), &[0, 2]);
        let z = scatter_add(&[2, 2], &idx.view(), &y.view(), 0).unwrap();
        assert_eq!(z, ArrayD::<f32>::zeros(IxDyn(&[2, 2])));
    }
}
