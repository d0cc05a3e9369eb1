//! In-place access to a tensor's storage: a uniquely owned concrete tensor
//! hands out its ndarray mutably, or is unwrapped into it, without a copy;
//! a shared one is copied first (copy-on-write), so no other holder of the
//! value ever sees it change.
//!
//! This is what lets a learner keep its traces in its own buffers and update
//! them in place (see `crate::ops::inplace` for the kernels that write into
//! a preallocated output).

use super::{ArrayData, Element, Repr, Tensor};
use crate::error::{Error, Result};
use ndarray::ArrayD;
use std::sync::Arc;

/// Element types whose arrays can be borrowed from, or moved out of, an
/// [`ArrayData`] (`f32`, `f64`, `i64`, `bool`).
pub trait ArrayElement: Element {
    /// The array, if `data` holds this element type.
    fn array(data: &ArrayData) -> Option<&ArrayD<Self>>;
    /// The array, if `data` holds this element type.
    fn array_mut(data: &mut ArrayData) -> Option<&mut ArrayD<Self>>;
    /// The array, or `data` back if it holds another element type.
    fn into_array(data: ArrayData) -> std::result::Result<ArrayD<Self>, ArrayData>;
    /// The dtype this element type is stored as.
    fn dtype() -> super::DType;
}

macro_rules! array_element {
    ($t:ty, $variant:ident) => {
        impl ArrayElement for $t {
            fn array(data: &ArrayData) -> Option<&ArrayD<Self>> {
                match data {
                    ArrayData::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn array_mut(data: &mut ArrayData) -> Option<&mut ArrayD<Self>> {
                match data {
                    ArrayData::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn into_array(data: ArrayData) -> std::result::Result<ArrayD<Self>, ArrayData> {
                match data {
                    ArrayData::$variant(a) => Ok(a),
                    other => Err(other),
                }
            }
            fn dtype() -> super::DType {
                super::DType::$variant
            }
        }
    };
}
array_element!(f32, F32);
array_element!(f64, F64);
array_element!(i64, I64);
array_element!(bool, Bool);

fn dtype_error(op: &str, want: super::DType, got: super::DType, shape: &[usize]) -> Error {
    Error::dtype_with(
        op,
        format!("the tensor of shape {shape:?}"),
        [want],
        got,
        format!("asked for {want} data"),
    )
}

impl Tensor {
    /// Whether this handle is the only one to its value (no clone of it is
    /// alive), so that writing through [`Tensor::data_mut`] copies nothing.
    pub fn is_unique(&self) -> bool {
        // `get_mut` also needs no weak references; none are ever made.
        Arc::strong_count(&self.0) == 1 && Arc::weak_count(&self.0) == 0
    }

    /// The concrete data for writing, copied first only if it is shared
    /// (copy-on-write): other handles to the old value keep the old value.
    /// An error naming `Tensor::data_mut` if the tensor is symbolic.
    ///
    /// ```
    /// use braintrace_core::{ArrayData, Tensor};
    /// let mut t = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
    /// if let ArrayData::F64(a) = t.data_mut()? {
    ///     a[[1]] = 5.0;
    /// }
    /// assert_eq!(t.to_vec_f64()?, vec![1.0, 5.0]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn data_mut(&mut self) -> Result<&mut ArrayData> {
        self.data_mut_for("Tensor::data_mut")
    }

    pub(crate) fn data_mut_for(&mut self, op: &str) -> Result<&mut ArrayData> {
        if let Repr::Symbolic(v) = &*self.0 {
            return Err(Error::Symbolic {
                op: op.to_string(),
                shape: v.aval.shape().into(),
            });
        }
        if Arc::get_mut(&mut self.0).is_none() {
            let copy = self.data_for(op)?.clone();
            self.0 = Arc::new(Repr::Concrete(copy));
        }
        match Arc::get_mut(&mut self.0) {
            Some(Repr::Concrete(d)) => Ok(d),
            // Unreachable: the handle was made unique and concrete above.
            _ => Err(Error::invalid(op, "the tensor could not be made unique")),
        }
    }

    /// The data, if this handle is unique and concrete: no copy is ever
    /// made (`None` when shared or symbolic).
    pub fn try_data_mut(&mut self) -> Option<&mut ArrayData> {
        match Arc::get_mut(&mut self.0) {
            Some(Repr::Concrete(d)) => Some(d),
            _ => None,
        }
    }

    /// The ndarray of element type `T` for writing (copy-on-write, as
    /// [`Tensor::data_mut`]); a dtype error if the tensor holds another type.
    ///
    /// ```
    /// use braintrace_core::Tensor;
    /// let mut t = Tensor::zeros(&[2, 2], braintrace_core::DType::F32);
    /// t.array_mut::<f32>()?.fill(3.0);
    /// assert_eq!(t.to_vec_f64()?, vec![3.0; 4]);
    /// assert!(t.array_mut::<f64>().is_err());
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn array_mut<T: ArrayElement>(&mut self) -> Result<&mut ArrayD<T>> {
        const OP: &str = "Tensor::array_mut";
        let got = self.dtype();
        if got != T::dtype() {
            return Err(dtype_error(OP, T::dtype(), got, self.shape()));
        }
        let data = self.data_mut_for(OP)?;
        if T::array(data).is_none() {
            return Err(dtype_error(OP, T::dtype(), data.dtype(), data.shape()));
        }
        Ok(T::array_mut(data).expect("of type T: checked above"))
    }

    /// The concrete data by value: moved out without a copy when this handle
    /// is unique, cloned when it is shared. An error if symbolic.
    pub fn into_data(self) -> Result<ArrayData> {
        match Arc::try_unwrap(self.0) {
            Ok(Repr::Concrete(d)) => Ok(d),
            Ok(Repr::Symbolic(v)) => Err(Error::Symbolic {
                op: "Tensor::into_data".into(),
                shape: v.aval.shape().into(),
            }),
            Err(shared) => Tensor(shared).data_for("Tensor::into_data").cloned(),
        }
    }

    /// The ndarray of element type `T` by value (no copy when unique, as
    /// [`Tensor::into_data`]); a dtype error if the tensor holds another type.
    ///
    /// ```
    /// use braintrace_core::Tensor;
    /// let t = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
    /// let a = t.into_array::<f64>()?;
    /// assert_eq!(a.shape(), &[3]);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn into_array<T: ArrayElement>(self) -> Result<ArrayD<T>> {
        let got = self.dtype();
        if got != T::dtype() {
            return Err(dtype_error(
                "Tensor::into_array",
                T::dtype(),
                got,
                self.shape(),
            ));
        }
        // The dtype was checked: the data is of type `T`.
        T::into_array(self.into_data()?)
            .map_err(|d| dtype_error("Tensor::into_array", T::dtype(), d.dtype(), d.shape()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn ptr(t: &Tensor) -> *const f64 {
        match t.data().unwrap() {
            ArrayData::F64(a) => a.as_ptr(),
            _ => panic!("f64 expected"),
        }
    }

    #[test]
    fn data_mut_unique_writes_without_copy() {
        let mut t = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3]).unwrap();
        assert!(t.is_unique());
        let before = ptr(&t);
        t.array_mut::<f64>().unwrap()[[0]] = 7.0;
        assert_eq!(ptr(&t), before);
        assert_eq!(t.to_vec_f64().unwrap(), vec![7.0, 2.0, 3.0]);
        assert!(t.try_data_mut().is_some());
    }

    #[test]
    fn data_mut_shared_copies_on_write() {
        let mut t = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        let keep = t.clone();
        assert!(!t.is_unique());
        assert!(t.try_data_mut().is_none());
        t.array_mut::<f64>().unwrap()[[1]] = 9.0;
        assert_ne!(ptr(&t), ptr(&keep));
        assert_eq!(keep.to_vec_f64().unwrap(), vec![1.0, 2.0]);
        assert_eq!(t.to_vec_f64().unwrap(), vec![1.0, 9.0]);
        assert!(t.is_unique() && keep.is_unique());
    }

    #[test]
    fn into_array_moves_when_unique_and_copies_when_shared() {
        let t = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        let before = ptr(&t);
        let a = t.into_array::<f64>().unwrap();
        assert_eq!(a.as_ptr(), before);

        let t = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        let keep = t.clone();
        let a = t.into_array::<f64>().unwrap();
        assert_ne!(a.as_ptr(), ptr(&keep));
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), vec![1.0, 2.0]);
    }

    #[test]
    fn array_mut_wrong_dtype_is_an_error() {
        let mut t = Tensor::zeros(&[2], DType::F32);
        let e = t.array_mut::<f64>().unwrap_err().to_string();
        assert!(
            e.contains("Tensor::array_mut") && e.contains("f64") && e.contains("f32"),
            "{e}"
        );
        let e = t.into_array::<i64>().unwrap_err().to_string();
        assert!(e.contains("Tensor::into_array"), "{e}");
    }
}
