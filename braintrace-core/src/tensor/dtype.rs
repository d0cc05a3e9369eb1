//! Element types and abstract values (`Aval` = shape + dtype), the static
//! description of a tensor that tracing and shape rules work with.

pub use crate::dtype::DType;
use std::fmt;

/// An abstract value: what is known of a tensor without its data.
///
/// ```
/// use braintrace_core::{Aval, DType};
/// let a = Aval::new(&[2, 3], DType::F32);
/// assert_eq!(a.shape(), &[2, 3]);
/// assert_eq!(a.to_string(), "f32[2,3]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Aval {
    shape: Vec<usize>,
    dtype: DType,
}

impl Aval {
    /// A new abstract value.
    pub fn new(shape: &[usize], dtype: DType) -> Self {
        Aval {
            shape: shape.to_vec(),
            dtype,
        }
    }
    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (saturating at `usize::MAX` for a shape too large
    /// to exist; [`checked_size`] says whether it can).
    pub fn size(&self) -> usize {
        saturating_size(&self.shape)
    }
    /// The same aval with another shape.
    pub fn with_shape(&self, shape: &[usize]) -> Aval {
        Aval::new(shape, self.dtype)
    }
    /// The same aval with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Aval {
        Aval::new(&self.shape, dtype)
    }
}

impl fmt::Display for Aval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The number of elements of `shape`, saturating at `usize::MAX` (a shape
/// with a zero dimension holds none, however large the others).
pub fn saturating_size(shape: &[usize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// The number of elements of `shape`, or an [`Error::Shape`](crate::Error::Shape)
/// naming `op` when no array can have that shape: the product of its
/// non-zero dimensions must not exceed `isize::MAX` (the limit of ndarray,
/// and of any allocation).
///
/// ```
/// use braintrace_core::tensor::checked_size;
/// assert_eq!(checked_size("reshape", &[2, 3]).unwrap(), 6);
/// assert_eq!(checked_size("reshape", &[usize::MAX, 0]).is_err(), true);
/// assert!(checked_size("reshape", &[1 << 62, 4]).is_err());
/// ```
pub fn checked_size(op: &str, shape: &[usize]) -> crate::Result<usize> {
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize);
    match nonzero {
        Some(_) if shape.contains(&0) => Ok(0),
        Some(n) => Ok(n),
        None => Err(crate::Error::shapes(
            op,
            [shape],
            "the shape is too large: the product of its non-zero dimensions exceeds isize::MAX",
        )),
    }
}

/// Whether two shapes are equal, compared inline: `==` on the slices calls
/// the C library's `memcmp`, tens of instructions for the one to four
/// lengths of a shape, and the planned executor compares shapes several
/// times per equation.
#[inline]
pub(crate) fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}
