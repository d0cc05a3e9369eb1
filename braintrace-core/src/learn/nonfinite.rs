//! What to do with a NaN or an infinity: the [`NonFinite`] policy the
//! optimisers follow (and the learner can), and the one scan that finds the
//! first non-finite element of a tensor.

use crate::error::{Error, Result};
use crate::tensor::{standard_layout, ArrayData, Tensor};

/// The treatment of a non-finite value (NaN or ±∞) in what an update reads.
///
/// A NaN in one gradient, written into a parameter, turns every later output
/// into NaN; nothing recovers it but restoring the parameters. So the
/// default is to refuse the update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NonFinite {
    /// Return an [`Error::NonFinite`] naming the first non-finite value
    /// (its key and index); nothing changes (the default).
    #[default]
    Error,
    /// Drop the update (nothing changes, no error) and count it.
    Skip,
    /// Apply it as it is, NaN and all (no scan).
    Allow,
}

/// The row-major index and value of the first non-finite element of `t`
/// (`None` for an integer or bool tensor, which cannot hold one). An error
/// when `t` is symbolic.
pub fn first_non_finite(t: &Tensor) -> Result<Option<(Vec<usize>, f64)>> {
    fn scan<T: Copy + Into<f64>>(
        a: &ndarray::ArrayD<T>,
        any_non_finite: impl Fn(&[T]) -> bool,
        finite: impl Fn(T) -> bool,
    ) -> Option<(Vec<usize>, f64)> {
        // Without a copy when the data is contiguous (the usual case);
        // the position is looked for only when something was found.
        if let Some(flat) = a.as_slice() {
            if !any_non_finite(flat) {
                return None;
            }
            let i = flat.iter().position(|&v| !finite(v))?;
            return Some((unravel(i, a.shape()), flat[i].into()));
        }
        let a = standard_layout(a);
        let flat = a.as_slice()?;
        let i = flat.iter().position(|&v| !finite(v))?;
        Some((unravel(i, a.shape()), flat[i].into()))
    }
    Ok(match t.data_for("first_non_finite")? {
        ArrayData::F32(a) => scan(a, any_non_finite_f32, f32::is_finite),
        ArrayData::F64(a) => scan(a, any_non_finite_f64, f64::is_finite),
        ArrayData::I64(_) | ArrayData::Bool(_) => None,
    })
}

/// Whether any element is NaN or ±∞: its exponent bits all set. One
/// branch-free pass of integer ORs, which the compiler vectorises (a
/// float comparison chain would not be reordered).
fn any_non_finite_f32(v: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    v.iter()
        .fold(0u32, |acc, x| acc | u32::from(x.to_bits() & EXP == EXP))
        != 0
}

/// [`any_non_finite_f32`] for f64.
fn any_non_finite_f64(v: &[f64]) -> bool {
    const EXP: u64 = 0x7ff0_0000_0000_0000;
    v.iter()
        .fold(0u64, |acc, x| acc | u64::from(x.to_bits() & EXP == EXP))
        != 0
}

/// The multi-index of row-major position `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (slot, &d) in idx.iter_mut().zip(shape).rev() {
        *slot = i % d.max(1);
        i /= d.max(1);
    }
    idx
}

/// An [`Error::NonFinite`] from `op` when `t` (called `key`) holds a NaN or
/// an infinity; `what` says what `key` is (`gradient`, `parameter`).
pub fn check_finite(op: &str, what: &str, key: &str, t: &Tensor) -> Result<()> {
    match first_non_finite(t)? {
        None => Ok(()),
        Some((index, value)) => Err(Error::NonFinite {
            op: op.to_string(),
            what: what.to_string(),
            key: key.to_string(),
            index,
            value,
            step: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn finds_the_first_non_finite_in_row_major_order() {
        let t =
            Tensor::from_vec(vec![1.0, 2.0, f64::INFINITY, f64::NAN, 5.0, 6.0], &[2, 3]).unwrap();
        let (idx, v) = first_non_finite(&t).unwrap().unwrap();
        assert_eq!(idx, vec![0, 2]);
        assert_eq!(v, f64::INFINITY);
        // Through a transpose (a permuted layout), still row-major order of
        // the transposed tensor: [[1, nan], [2, 5], [inf, 6]].
        let (idx, v) = first_non_finite(&t.transpose(&[1, 0]).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(idx, vec![0, 1]);
        assert!(v.is_nan());
        let f = t.cast(DType::F32).unwrap();
        assert_eq!(first_non_finite(&f).unwrap().unwrap().0, vec![0, 2]);
        assert!(first_non_finite(&Tensor::ones(&[4], DType::F32))
            .unwrap()
            .is_none());
        let e = check_finite("Sgd", "gradient", "w", &t).unwrap_err();
        assert_eq!(e.to_string(), "Sgd: gradient `w` holds inf at index [0, 2]");
    }
}
