//! `Tensor`: a cheap-to-clone handle over either concrete ndarray data or a
//! symbolic variable of the graph currently being traced. User code, ETP
//! impls and rules are written once against `Tensor` and work in both cases.

mod data;
mod dtype;
mod inplace;
mod layout;

pub(crate) use data::byte_size;
pub use data::{memory_limit, ArrayData, Element};
pub(crate) use dtype::same_shape;
pub use dtype::{checked_size, saturating_size, Aval, DType};
pub use inplace::ArrayElement;
pub(crate) use layout::{
    assign, copy_array, copy_blocks, copy_to_vec, extend_copy, into_standard, map_elements,
    row_major, standard_layout, to_standard,
};

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::sync::Arc;

/// A symbolic variable: which trace it belongs to, its index there, its aval.
#[derive(Clone, Debug)]
pub(crate) struct SymVar {
    pub(crate) trace: u64,
    pub(crate) var: usize,
    pub(crate) aval: Aval,
}

#[derive(Debug)]
pub(crate) enum Repr {
    Concrete(ArrayData),
    Symbolic(SymVar),
}

/// A tensor value: concrete data, or a symbolic variable while tracing.
///
/// Cloning is cheap (a reference count). Operations return
/// `Result<Tensor>`; see [`crate::ops`] for the vocabulary.
///
/// ```
/// use braintrace_core::{Tensor, DType};
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(x.shape(), &[2, 2]);
/// assert_eq!(x.dtype(), DType::F64);
/// let y = x.mul_scalar(2.0)?;
/// assert_eq!(y.to_vec_f64()?, vec![2.0, 4.0, 6.0, 8.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Repr>);

impl Tensor {
    /// A tensor over concrete data.
    pub fn from_data(data: ArrayData) -> Tensor {
        Tensor(Arc::new(Repr::Concrete(data)))
    }
    pub(crate) fn symbolic(trace: u64, var: usize, aval: Aval) -> Tensor {
        Tensor(Arc::new(Repr::Symbolic(SymVar { trace, var, aval })))
    }
    /// A tensor over an ndarray array (`f32`, `f64`, `i64` or `bool`).
    pub fn from_array<T: Element>(a: ArrayD<T>) -> Tensor {
        Tensor::from_data(T::wrap(a))
    }
    /// An `f64` tensor from row-major data; the length must match the shape.
    pub fn from_vec(data: Vec<f64>, shape: &[usize]) -> Result<Tensor> {
        Self::from_vec_typed(data, shape)
    }
    /// A tensor of element type `T` from row-major data.
    pub fn from_vec_typed<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        const OP: &str = "Tensor::from_vec";
        let holds = checked_size(OP, shape)?;
        let n = data.len();
        if n != holds {
            return Err(Error::shapes(
                OP,
                [shape],
                format!("{n} elements given, the shape holds {holds}"),
            ));
        }
        ArrayD::from_shape_vec(IxDyn(shape), data)
            .map(Tensor::from_array)
            .map_err(|e| Error::shapes(OP, [shape], e.to_string()))
    }
    /// Zeros of a shape and dtype.
    ///
    /// Infallible, for shapes the program itself knows can be held: for a
    /// shape that comes from user input use [`Tensor::try_zeros`], which
    /// returns an [`Error::Allocation`] instead.
    ///
    /// # Panics
    ///
    /// When no array can have the shape (see [`checked_size`]) or its byte
    /// size exceeds [`memory_limit`], with a message naming the shape and the
    /// bytes (a panic that unwinds, where the allocation itself would abort
    /// the process).
    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        fits_or_panic("Tensor::zeros", shape, dtype);
        Tensor::from_data(ArrayData::zeros(shape, dtype))
    }
    /// Zeros of a shape and dtype, or an error naming `op` when no array can
    /// have that shape (see [`checked_size`]), its byte size exceeds
    /// [`memory_limit`] or its memory cannot be allocated.
    ///
    /// ```
    /// use braintrace_core::{DType, Error, Tensor};
    /// assert_eq!(Tensor::try_zeros("init", &[2, 3], DType::F32)?.shape(), &[2, 3]);
    /// assert!(Tensor::try_zeros("init", &[1 << 62, 4], DType::F32).is_err());
    /// let e = Tensor::try_zeros("init", &[1_000_000, 1_000_000], DType::F32).unwrap_err();
    /// assert!(matches!(e, Error::Allocation { .. }), "{e}");
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn try_zeros(op: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        ArrayData::try_zeros(op, shape, dtype).map(Tensor::from_data)
    }
    /// Ones of a shape and dtype (infallible; panics as [`Tensor::zeros`]
    /// does; [`Tensor::try_ones`] for a shape from user input).
    pub fn ones(shape: &[usize], dtype: DType) -> Tensor {
        fits_or_panic("Tensor::ones", shape, dtype);
        Tensor::from_data(ArrayData::full(shape, 1.0, dtype))
    }
    /// Ones of a shape and dtype, or an error as [`Tensor::try_zeros`] gives.
    pub fn try_ones(op: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::try_full(op, shape, 1.0, dtype)
    }
    /// A constant of a shape and dtype (infallible; panics as
    /// [`Tensor::zeros`] does; [`Tensor::try_full`] for a shape from user
    /// input).
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Tensor {
        fits_or_panic("Tensor::full", shape, dtype);
        Tensor::from_data(ArrayData::full(shape, value, dtype))
    }
    /// A constant of a shape and dtype, or an error as [`Tensor::try_zeros`]
    /// gives (refused before any memory is written).
    pub fn try_full(op: &str, shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        ArrayData::try_full(op, shape, value, dtype).map(Tensor::from_data)
    }
    /// A 0-d `f64` tensor.
    pub fn scalar(value: f64) -> Tensor {
        Tensor::full(&[], value, DType::F64)
    }
    /// A 0-d tensor of the given dtype.
    pub fn scalar_of(value: f64, dtype: DType) -> Tensor {
        Tensor::full(&[], value, dtype)
    }
    /// Zeros with this tensor's shape and dtype (a concrete constant, also while tracing).
    pub fn zeros_like(&self) -> Tensor {
        Tensor::zeros(self.shape(), self.dtype())
    }
    /// Ones with this tensor's shape and dtype.
    pub fn ones_like(&self) -> Tensor {
        Tensor::ones(self.shape(), self.dtype())
    }
    /// Zeros of an abstract value.
    pub fn zeros_aval(aval: &Aval) -> Tensor {
        Tensor::zeros(aval.shape(), aval.dtype())
    }
    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        match &*self.0 {
            Repr::Concrete(d) => d.shape(),
            Repr::Symbolic(v) => v.aval.shape(),
        }
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    /// Number of elements.
    pub fn size(&self) -> usize {
        self.shape().iter().product()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        match &*self.0 {
            Repr::Concrete(d) => d.dtype(),
            Repr::Symbolic(v) => v.aval.dtype(),
        }
    }
    /// Shape and dtype.
    pub fn aval(&self) -> Aval {
        match &*self.0 {
            Repr::Concrete(d) => Aval::new(d.shape(), d.dtype()),
            Repr::Symbolic(v) => v.aval.clone(),
        }
    }
    /// Whether this is a symbolic (traced) tensor.
    pub fn is_symbolic(&self) -> bool {
        matches!(&*self.0, Repr::Symbolic(_))
    }
    pub(crate) fn sym(&self) -> Option<&SymVar> {
        match &*self.0 {
            Repr::Symbolic(v) => Some(v),
            Repr::Concrete(_) => None,
        }
    }
    /// The concrete data, or an error naming `op` if the tensor is symbolic.
    pub fn data_for(&self, op: &str) -> Result<&ArrayData> {
        match &*self.0 {
            Repr::Concrete(d) => Ok(d),
            Repr::Symbolic(v) => Err(Error::Symbolic {
                op: op.to_string(),
                shape: v.aval.shape().into(),
            }),
        }
    }
    /// The concrete data (an error while the tensor is symbolic).
    pub fn data(&self) -> Result<&ArrayData> {
        self.data_for("Tensor::data")
    }
    /// All elements converted to `f64`, row-major.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.data_for("Tensor::to_vec_f64")?.to_vec_f64())
    }
    /// The data as an `f64` ndarray (converted if needed).
    ///
    /// The array is in standard (row-major, contiguous) layout, whatever
    /// layout the tensor holds internally (a transpose only permutes strides).
    pub fn to_array_f64(&self) -> Result<ArrayD<f64>> {
        Ok(into_standard(
            self.data_for("Tensor::to_array_f64")?.to_f64_array(),
        ))
    }
    /// The data as an `f32` ndarray (converted if needed), in standard layout.
    pub fn to_array_f32(&self) -> Result<ArrayD<f32>> {
        match self.data_for("Tensor::to_array_f32")?.cast(DType::F32) {
            ArrayData::F32(a) => Ok(into_standard(a)),
            _ => unreachable!("cast to F32 yields F32"),
        }
    }
    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f64> {
        let v = self.to_vec_f64()?;
        if v.len() != 1 {
            return Err(Error::shapes(
                "Tensor::item",
                [self.shape()],
                "expected exactly one element",
            ));
        }
        Ok(v[0])
    }
    /// Whether two handles are the same tensor object.
    pub fn ptr_eq(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    pub(crate) fn ptr_id(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Repr::Symbolic(v) => write!(f, "Traced<{}>", v.aval),
            Repr::Concrete(d) => {
                write!(f, "{}", self.aval())?;
                match d {
                    ArrayData::F32(a) => write!(f, " {a}"),
                    ArrayData::F64(a) => write!(f, " {a}"),
                    ArrayData::I64(a) => write!(f, " {a}"),
                    ArrayData::Bool(a) => write!(f, " {a}"),
                }
            }
        }
    }
}

impl<T: Element> From<ArrayD<T>> for Tensor {
    fn from(a: ArrayD<T>) -> Self {
        Tensor::from_array(a)
    }
}

/// The panic of the infallible constructors for a shape no array can have
/// or no machine memory holds (checked without allocating, so their cost
/// is a few multiplications).
#[track_caller]
fn fits_or_panic(op: &str, shape: &[usize], dtype: DType) {
    if let Err(e) = data::byte_size(op, shape, dtype) {
        panic!("{e} (use the fallible `try_` constructor for a size from user input)");
    }
}

/// Abstract values of a list of tensors.
pub fn avals(xs: &[Tensor]) -> Vec<Aval> {
    xs.iter().map(Tensor::aval).collect()
}
