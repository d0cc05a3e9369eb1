//! numpy arrays in and out. In: a float32 or float64 `ndarray` is copied
//! once into the tensor (a `Tensor` owns its data, so the copy cannot be
//! avoided; a C-contiguous array is copied as one block, any other layout
//! element by element); a `Tensor` handle is taken as it is; anything else
//! (integer or bool arrays, lists, scalars) is refused with a `TypeError`
//! naming the argument. Out: a concrete tensor becomes a new numpy array,
//! moved without a copy when the tensor's buffer is not shared.

use crate::error::IntoPyResult;
use crate::tensor::PyTensor;
use braintrace_core::learn::TensorDict;
use braintrace_core::{ArrayData, Tensor};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods, ToPyArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `obj` (a numpy float array or a `Tensor`) as a tensor; `what` names the
/// argument in the error.
pub fn tensor_in(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(t.get().t.clone());
    }
    // `to_owned_array` copies under the GIL without taking a borrow flag
    // (cheaper than a readonly borrow for a copy made at once).
    if let Ok(a) = obj.cast::<PyArrayDyn<f32>>() {
        return Ok(Tensor::from_array(a.to_owned_array()));
    }
    if let Ok(a) = obj.cast::<PyArrayDyn<f64>>() {
        return Ok(Tensor::from_array(a.to_owned_array()));
    }
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Err(PyTypeError::new_err(format!(
            "`{what}`: numpy arrays of dtype {} are not accepted; pass float32 or float64",
            a.dtype()
        )));
    }
    Err(PyTypeError::new_err(format!(
        "`{what}`: expected a numpy float32/float64 array or a braintrace_rs.Tensor, got {}",
        obj.get_type().name()?
    )))
}

/// A concrete tensor as a numpy array (moved when unshared, else copied).
pub fn tensor_out<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    Ok(match t.into_data().py()? {
        ArrayData::F32(a) => PyArrayDyn::from_owned_array(py, a).into_any(),
        ArrayData::F64(a) => PyArrayDyn::from_owned_array(py, a).into_any(),
        ArrayData::I64(a) => PyArrayDyn::from_owned_array(py, a).into_any(),
        ArrayData::Bool(a) => a.to_pyarray(py).into_any(),
    })
}

/// A `{key: array}` mapping as tensors.
pub fn dict_in(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<TensorDict> {
    let d = obj.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!("`{what}`: expected a dict of arrays keyed by name"))
    })?;
    let mut out = TensorDict::new();
    for (k, v) in d.iter() {
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("`{what}`: keys must be strings")))?;
        let t = tensor_in(&v, &format!("{what}[{k:?}]"))?;
        out.insert(k, t);
    }
    Ok(out)
}

/// Tensors keyed by name as a dict of numpy arrays.
pub fn dict_out<'py>(py: Python<'py>, d: TensorDict) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (k, v) in d {
        out.set_item(k, tensor_out(py, v)?)?;
    }
    Ok(out)
}
