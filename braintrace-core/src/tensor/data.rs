//! Concrete tensor storage: one ndarray per supported dtype, and the
//! dispatch macros kernels use to be written once for `f32` and `f64`.

use super::dtype::DType;
use super::layout::{copy_to_vec, map_standard, row_major, standard_layout};
use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

/// Concrete data of a tensor.
#[derive(Clone, Debug)]
pub enum ArrayData {
    /// f32 data.
    F32(ArrayD<f32>),
    /// f64 data.
    F64(ArrayD<f64>),
    /// i64 data.
    I64(ArrayD<i64>),
    /// bool data.
    Bool(ArrayD<bool>),
}

/// Apply a generic float expression to the array inside an [`ArrayData`],
/// rewrapping the result; non-float data yields a dtype error.
#[macro_export]
#[doc(hidden)]
macro_rules! map_float {
    ($data:expr, $op:expr, |$a:ident| $body:expr) => {
        match $data {
            $crate::tensor::ArrayData::F32($a) => Ok($crate::tensor::ArrayData::F32($body)),
            $crate::tensor::ArrayData::F64($a) => Ok($crate::tensor::ArrayData::F64($body)),
            other => Err($crate::Error::dtype_with(
                $op,
                "operand",
                $crate::DType::FLOATS,
                other.dtype(),
                format!("shape {:?}", other.shape()),
            )),
        }
    };
}

/// Apply a generic float expression to two arrays of the same float dtype.
#[macro_export]
#[doc(hidden)]
macro_rules! map_float2 {
    ($x:expr, $y:expr, $op:expr, |$a:ident, $b:ident| $body:expr) => {
        match ($x, $y) {
            ($crate::tensor::ArrayData::F32($a), $crate::tensor::ArrayData::F32($b)) => {
                Ok($crate::tensor::ArrayData::F32($body))
            }
            ($crate::tensor::ArrayData::F64($a), $crate::tensor::ArrayData::F64($b)) => {
                Ok($crate::tensor::ArrayData::F64($body))
            }
            (l, r) => Err($crate::Error::dtype_pair(
                $op,
                (l.dtype(), l.shape()),
                (r.dtype(), r.shape()),
                true,
                "",
            )),
        }
    };
}

/// The most memory one array may take: the machine's RAM plus swap (read
/// once from `/proc/meminfo` on Linux), else `isize::MAX` bytes. A request
/// above it is refused before any memory is touched: the OS might grant it
/// (overcommit), and then filling it would swap for minutes or end the
/// process.
pub fn memory_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let kib = |text: &str, key: &str| -> Option<usize> {
            let line = text.lines().find(|l| l.starts_with(key))?;
            line[key.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        };
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                let total = kib(&t, "MemTotal:")?;
                let swap = kib(&t, "SwapTotal:").unwrap_or(0);
                total.checked_add(swap)?.checked_mul(1024)
            })
            .filter(|&b| b > 0)
            .map_or(isize::MAX as usize, |b| b.min(isize::MAX as usize))
    })
}

/// The element count and byte size of an array of `shape` and `dtype`, or
/// an [`Error::Allocation`] naming `op` when the bytes overflow or exceed
/// [`memory_limit`] (an [`Error::Shape`] when no array can have the shape).
pub(crate) fn byte_size(op: &str, shape: &[usize], dtype: DType) -> Result<(usize, usize)> {
    let n = super::checked_size(op, shape)?;
    let over = |bytes: String| Error::Allocation {
        op: op.to_string(),
        shape: shape.into(),
        elements: n,
        bytes,
    };
    let bytes = n
        .checked_mul(dtype.size_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| over("more than isize::MAX bytes".into()))?;
    let limit = memory_limit();
    if bytes > limit {
        return Err(over(format!(
            "{bytes} bytes, more than this machine's memory of {limit} bytes"
        )));
    }
    Ok((n, bytes))
}

impl ArrayData {
    /// The dtype of this data.
    pub fn dtype(&self) -> DType {
        match self {
            ArrayData::F32(_) => DType::F32,
            ArrayData::F64(_) => DType::F64,
            ArrayData::I64(_) => DType::I64,
            ArrayData::Bool(_) => DType::Bool,
        }
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            ArrayData::F32(a) => a.shape(),
            ArrayData::F64(a) => a.shape(),
            ArrayData::I64(a) => a.shape(),
            ArrayData::Bool(a) => a.shape(),
        }
    }
    /// Zeros of a shape and dtype.
    pub fn zeros(shape: &[usize], dtype: DType) -> Self {
        Self::full(shape, 0.0, dtype)
    }
    /// Zeros of a shape and dtype, or an error naming `op` when no array can
    /// have that shape (see [`checked_size`](super::checked_size)), its byte
    /// size exceeds [`memory_limit`], or its memory is refused (the
    /// allocation is fallible, not an abort).
    pub fn try_zeros(op: &str, shape: &[usize], dtype: DType) -> Result<Self> {
        let (n, _) = byte_size(op, shape, dtype)?;
        let too_big = || Error::allocation(op, shape, n, dtype.size_bytes());
        fn zeros<T: Clone + Default>(n: usize, shape: &[usize]) -> Option<ArrayD<T>> {
            // Try the reservation first (a refusal is an error, not an
            // abort), give it back, then take zeroed memory from the
            // allocator (`calloc`: the OS hands out zero pages lazily, so a
            // large trace costs nothing until it is written).
            let mut probe: Vec<T> = Vec::new();
            probe.try_reserve_exact(n).ok()?;
            drop(probe);
            ArrayD::from_shape_vec(IxDyn(shape), vec![T::default(); n]).ok()
        }
        match dtype {
            DType::F32 => zeros(n, shape).map(ArrayData::F32),
            DType::F64 => zeros(n, shape).map(ArrayData::F64),
            DType::I64 => zeros(n, shape).map(ArrayData::I64),
            DType::Bool => zeros(n, shape).map(ArrayData::Bool),
        }
        .ok_or_else(too_big)
    }
    /// A constant of a shape and dtype, or an error naming `op` as
    /// [`ArrayData::try_zeros`] gives one. Every element is written, so the
    /// size is refused before any memory is touched.
    pub fn try_full(op: &str, shape: &[usize], value: f64, dtype: DType) -> Result<Self> {
        if value == 0.0 {
            return Self::try_zeros(op, shape, dtype);
        }
        let (n, _) = byte_size(op, shape, dtype)?;
        let too_big = || Error::allocation(op, shape, n, dtype.size_bytes());
        fn full<T: Clone>(n: usize, shape: &[usize], v: T) -> Option<ArrayD<T>> {
            let mut data: Vec<T> = Vec::new();
            data.try_reserve_exact(n).ok()?;
            data.resize(n, v);
            ArrayD::from_shape_vec(IxDyn(shape), data).ok()
        }
        match dtype {
            DType::F32 => full(n, shape, value as f32).map(ArrayData::F32),
            DType::F64 => full(n, shape, value).map(ArrayData::F64),
            DType::I64 => full(n, shape, value as i64).map(ArrayData::I64),
            DType::Bool => full(n, shape, value != 0.0).map(ArrayData::Bool),
        }
        .ok_or_else(too_big)
    }
    /// Whether an array of `shape` and `dtype` can be allocated: an error
    /// naming `op` when no array can have the shape, its byte size overflows
    /// or exceeds [`memory_limit`], or (for more than 1 GiB) the memory is
    /// refused. Kernels that build a result of a user-given shape through
    /// ndarray (whose allocation would abort the process on failure) call
    /// this first.
    pub fn check_alloc(op: &str, shape: &[usize], dtype: DType) -> Result<()> {
        let (n, bytes) = byte_size(op, shape, dtype)?;
        if bytes > 1 << 30 {
            let mut probe: Vec<u8> = Vec::new();
            probe
                .try_reserve_exact(bytes)
                .map_err(|_| Error::allocation(op, shape, n, dtype.size_bytes()))?;
        }
        Ok(())
    }
    /// A constant of a shape and dtype (`value` is converted; bool is `value != 0`).
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Self {
        let sh = IxDyn(shape);
        match dtype {
            DType::F32 => ArrayData::F32(ArrayD::from_elem(sh, value as f32)),
            DType::F64 => ArrayData::F64(ArrayD::from_elem(sh, value)),
            DType::I64 => ArrayData::I64(ArrayD::from_elem(sh, value as i64)),
            DType::Bool => ArrayData::Bool(ArrayD::from_elem(sh, value != 0.0)),
        }
    }
    /// Convert to another dtype.
    pub fn cast(&self, dtype: DType) -> Self {
        // One pass over row-major data (a no-op copy of the layout when it
        // is already standard); the result is in standard layout.
        macro_rules! conv {
            ($a:expr, $f:expr) => {
                match dtype {
                    DType::F32 => ArrayData::F32(map_standard($a, |v| $f(v) as f32)),
                    DType::F64 => ArrayData::F64(map_standard($a, |v| $f(v))),
                    DType::I64 => ArrayData::I64(map_standard($a, |v| $f(v) as i64)),
                    DType::Bool => ArrayData::Bool(map_standard($a, |v| $f(v) != 0.0)),
                }
            };
        }
        match self {
            ArrayData::F32(a) => conv!(a, |v: f32| v as f64),
            ArrayData::F64(a) => conv!(a, |v: f64| v),
            ArrayData::I64(a) => conv!(a, |v: i64| v as f64),
            ArrayData::Bool(a) => conv!(a, |v: bool| if v { 1.0 } else { 0.0 }),
        }
    }
    /// All elements as f64, row-major.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        match self {
            ArrayData::F32(a) => row_major(&standard_layout(a))
                .iter()
                .map(|&v| v as f64)
                .collect(),
            ArrayData::F64(a) => copy_to_vec(row_major(&standard_layout(a))),
            ArrayData::I64(a) => row_major(&standard_layout(a))
                .iter()
                .map(|&v| v as f64)
                .collect(),
            ArrayData::Bool(a) => row_major(&standard_layout(a))
                .iter()
                .map(|&v| if v { 1.0 } else { 0.0 })
                .collect(),
        }
    }
    /// The f64 array, converting from other dtypes.
    pub fn to_f64_array(&self) -> ArrayD<f64> {
        match self.cast(DType::F64) {
            ArrayData::F64(a) => a,
            _ => unreachable!("cast to F64 yields F64"),
        }
    }
    /// Borrow as i64 indices, or a dtype error naming `op`.
    pub fn as_i64(&self, op: &str) -> Result<&ArrayD<i64>> {
        match self {
            ArrayData::I64(a) => Ok(a),
            other => Err(Error::dtype_with(
                op,
                "indices",
                [DType::I64],
                other.dtype(),
                format!("shape {:?}", other.shape()),
            )),
        }
    }
    /// Borrow as bool, or a dtype error naming `op`.
    pub fn as_bool(&self, op: &str) -> Result<&ArrayD<bool>> {
        match self {
            ArrayData::Bool(a) => Ok(a),
            other => Err(Error::dtype_with(
                op,
                "mask",
                [DType::Bool],
                other.dtype(),
                format!("shape {:?}", other.shape()),
            )),
        }
    }
}

/// Element types a [`crate::Tensor`] can be built from.
pub trait Element: Clone + 'static {
    /// Wrap an array of this element type.
    fn wrap(a: ArrayD<Self>) -> ArrayData;
}
impl Element for f32 {
    fn wrap(a: ArrayD<Self>) -> ArrayData {
        ArrayData::F32(a)
    }
}
impl Element for f64 {
    fn wrap(a: ArrayD<Self>) -> ArrayData {
        ArrayData::F64(a)
    }
}
impl Element for i64 {
    fn wrap(a: ArrayD<Self>) -> ArrayData {
        ArrayData::I64(a)
    }
}
impl Element for bool {
    fn wrap(a: ArrayD<Self>) -> ArrayData {
        ArrayData::Bool(a)
    }
}
