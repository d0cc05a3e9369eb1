//! `braintrace_rs.Tensor`: a handle over a library tensor, concrete or
//! symbolic (inside a model's traced `step` or a traced loss), with the
//! core ops as methods and operators, and the module-level ops
//! (`braintrace_rs.ops`): ETP primitives (`etp_mm`, `etp_elemwise`, ...)
//! and the ops on several tensors.

use crate::array::{tensor_in, tensor_out};
use crate::error::IntoPyResult;
use braintrace_core::etp::ElemFn;
use braintrace_core::prims::{element_wise, matmul, Transforms};
use braintrace_core::{DType, Surrogate, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A tensor: concrete data, or a symbolic value while a step or loss is
/// traced. Arithmetic works with tensors, numpy arrays and Python numbers.
#[pyclass(name = "Tensor", module = "braintrace_rs", frozen)]
pub struct PyTensor {
    pub t: Tensor,
}

impl PyTensor {
    pub fn new(t: Tensor) -> Self {
        PyTensor { t }
    }
}

/// The other operand of a binary operator: a tensor (or array) or a number.
enum Operand {
    T(Tensor),
    S(f64),
}

fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Operand> {
    if let Ok(s) = obj.extract::<f64>() {
        if !obj.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(Operand::S(s));
        }
    }
    tensor_in(obj, "operand").map(Operand::T)
}

/// The name of a dtype as numpy spells it.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

/// A dtype from numpy's spelling (or a numpy dtype object's `str`).
pub fn dtype_from(name: &str) -> PyResult<DType> {
    match name {
        "float32" | "f32" | "<f4" => Ok(DType::F32),
        "float64" | "f64" | "<f8" => Ok(DType::F64),
        other => Err(PyTypeError::new_err(format!(
            "dtype {other:?} is not supported; use \"float32\" or \"float64\""
        ))),
    }
}

/// Axes given as an int or a sequence of ints, negative counting from the end.
fn axes(ndim: usize, a: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let raw: Vec<i64> = match a.extract::<i64>() {
        Ok(i) => vec![i],
        Err(_) => a.extract()?,
    };
    raw.into_iter().map(|i| axis(ndim, i)).collect()
}

fn axis(ndim: usize, i: i64) -> PyResult<usize> {
    let n = ndim as i64;
    let j = if i < 0 { i + n } else { i };
    if (0..n.max(1)).contains(&j) {
        Ok(j as usize)
    } else {
        Err(PyValueError::new_err(format!(
            "axis {i} is out of range for a tensor of rank {ndim}"
        )))
    }
}

/// A named element-wise transform (`tanh`, `softplus`, `square`, `exp`,
/// `sigmoid`, `relu`, `identity`).
pub fn elem_fn(name: Option<&str>) -> PyResult<Option<ElemFn>> {
    match name {
        None => Ok(None),
        Some(n) => ElemFn::builtin(n).map(Some).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown transform {n:?}; use one of identity, tanh, softplus, square, exp, sigmoid, relu"
            ))
        }),
    }
}

#[pymethods]
impl PyTensor {
    /// `exp x`, element-wise.
    fn exp(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.exp().py()?))
    }
    /// `log x`, element-wise.
    fn log(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.log().py()?))
    }
    /// `tanh x`, element-wise.
    fn tanh(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.tanh().py()?))
    }
    /// `1 / (1 + exp(-x))`, element-wise.
    fn sigmoid(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.sigmoid().py()?))
    }
    /// `max(x, 0)`, element-wise.
    fn relu(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.relu().py()?))
    }
    /// `log(1 + exp x)`, element-wise.
    fn softplus(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.softplus().py()?))
    }
    /// `x²`, element-wise.
    fn square(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.square().py()?))
    }
    /// `√x`, element-wise.
    fn sqrt(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.sqrt().py()?))
    }
    /// `|x|`, element-wise.
    fn abs(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.abs().py()?))
    }
    /// `sin x`, element-wise.
    fn sin(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.sin().py()?))
    }
    /// `cos x`, element-wise.
    fn cos(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.cos().py()?))
    }
    /// `1 / x`, element-wise.
    fn reciprocal(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.reciprocal().py()?))
    }
    /// The sum of all elements (a scalar).
    fn sum_all(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.sum_all().py()?))
    }
    /// The mean of all elements (a scalar).
    fn mean_all(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.mean_all().py()?))
    }
    /// The same values, with no gradient flowing through.
    fn stop_gradient(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.stop_gradient().py()?))
    }
    /// A tensor from a numpy float32/float64 array (copied once).
    #[new]
    fn py_new(array: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyTensor::new(tensor_in(array, "array")?))
    }
    /// The shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.t.shape())
    }
    /// The number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.t.ndim()
    }
    /// The dtype's name (`"float32"`, `"float64"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.t.dtype())
    }
    /// Whether this is a symbolic value of a trace (no data to read).
    #[getter]
    fn is_symbolic(&self) -> bool {
        self.t.is_symbolic()
    }
    /// The data as a new numpy array (an error for a symbolic tensor).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        tensor_out(py, self.t.clone())
    }
    /// numpy's array protocol: `np.asarray(tensor)`.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy;
        let a = tensor_out(py, self.t.clone())?;
        match dtype {
            Some(d) => a.call_method1("astype", (d,)),
            None => Ok(a),
        }
    }
    /// The value of a one-element tensor as a float.
    fn item(&self) -> PyResult<f64> {
        self.t.item().py()
    }
    fn __repr__(&self) -> String {
        let kind = if self.t.is_symbolic() {
            "symbolic"
        } else {
            "concrete"
        };
        format!(
            "Tensor(shape={:?}, dtype={}, {kind})",
            self.t.shape(),
            dtype_name(self.t.dtype())
        )
    }
    fn __len__(&self) -> PyResult<usize> {
        self.t
            .shape()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a scalar tensor"))
    }
    fn __add__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::add, Tensor::add_scalar)
    }
    fn __radd__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.__add__(o)
    }
    fn __sub__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::sub, Tensor::sub_scalar)
    }
    fn __rsub__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        match operand(o)? {
            Operand::T(t) => Ok(PyTensor::new(t.sub(&self.t).py()?)),
            Operand::S(s) => Ok(PyTensor::new(self.t.rsub_scalar(s).py()?)),
        }
    }
    fn __mul__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::mul, Tensor::mul_scalar)
    }
    fn __rmul__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.__mul__(o)
    }
    fn __truediv__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::div, Tensor::div_scalar)
    }
    fn __rtruediv__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        match operand(o)? {
            Operand::T(t) => Ok(PyTensor::new(t.div(&self.t).py()?)),
            Operand::S(s) => Ok(PyTensor::new(self.t.rdiv_scalar(s).py()?)),
        }
    }
    fn __pow__(&self, o: &Bound<'_, PyAny>, _m: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::pow, Tensor::pow_scalar)
    }
    fn __neg__(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.neg().py()?))
    }
    /// The plain matrix product (not an ETP primitive: no trace flows
    /// through it; use `ops.etp_mm` for a trainable weight).
    fn __matmul__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let other = tensor_in(o, "other")?;
        Ok(PyTensor::new(self.t.matmul(&other).py()?))
    }
    /// Element-wise maximum with a tensor or number.
    fn maximum(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::maximum, Tensor::max_scalar)
    }
    /// Element-wise minimum with a tensor or number.
    fn minimum(&self, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        bin(&self.t, o, Tensor::minimum, Tensor::min_scalar)
    }
    /// The sum over `axis` (an int or a sequence; all axes when `None`).
    #[pyo3(signature = (axis=None))]
    fn sum(&self, axis: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(match axis {
            None => self.t.sum_all().py()?,
            Some(a) => self.t.sum(&axes(self.t.ndim(), a)?).py()?,
        }))
    }
    /// The mean over `axis` (an int or a sequence; all axes when `None`).
    #[pyo3(signature = (axis=None))]
    fn mean(&self, axis: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(match axis {
            None => self.t.mean_all().py()?,
            Some(a) => self.t.mean(&axes(self.t.ndim(), a)?).py()?,
        }))
    }
    /// The same elements in `shape`.
    fn reshape(&self, shape: Vec<usize>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.reshape(&shape).py()?))
    }
    /// Axes permuted (reversed when `axes` is `None`).
    #[pyo3(signature = (axes=None))]
    fn transpose(&self, axes: Option<Vec<usize>>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(match axes {
            None => self.t.t().py()?,
            Some(p) => self.t.transpose(&p).py()?,
        }))
    }
    /// A new axis of size 1 at `axis`.
    fn expand_dims(&self, axis: i64) -> PyResult<PyTensor> {
        let a = axis_new(self.t.ndim(), axis)?;
        Ok(PyTensor::new(self.t.expand_dims(a).py()?))
    }
    /// Axes of size 1 removed.
    fn squeeze(&self, axis: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(
            self.t.squeeze(&axes(self.t.ndim(), axis)?).py()?,
        ))
    }
    /// The elements `start..end` along `axis`.
    fn slice_axis(&self, axis: i64, start: usize, end: usize) -> PyResult<PyTensor> {
        let a = self::axis(self.t.ndim(), axis)?;
        Ok(PyTensor::new(self.t.slice_axis(a, start, end).py()?))
    }
    /// Entry `i` along axis 0 (that axis removed).
    fn index(&self, i: usize) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.index_axis0(i).py()?))
    }
    /// Converted to `dtype` (`"float32"` or `"float64"`).
    fn astype(&self, dtype: &str) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.cast(dtype_from(dtype)?).py()?))
    }
    /// A spike `x > 0` (0/1 in x's dtype) whose gradient is a surrogate
    /// (the library's default, arctan with sharpness 2).
    fn spike(&self) -> PyResult<PyTensor> {
        Ok(PyTensor::new(self.t.spike(Surrogate::default()).py()?))
    }
}

fn axis_new(ndim: usize, i: i64) -> PyResult<usize> {
    axis(ndim + 1, i)
}

fn bin(
    t: &Tensor,
    o: &Bound<'_, PyAny>,
    tt: fn(&Tensor, &Tensor) -> braintrace_core::Result<Tensor>,
    ts: fn(&Tensor, f64) -> braintrace_core::Result<Tensor>,
) -> PyResult<PyTensor> {
    Ok(PyTensor::new(match operand(o)? {
        Operand::T(other) => tt(t, &other).py()?,
        Operand::S(s) => ts(t, s).py()?,
    }))
}

fn tensors(xs: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Tensor>> {
    xs.try_iter()?
        .enumerate()
        .map(|(i, x)| tensor_in(&x?, &format!("{what}[{i}]")))
        .collect()
}

/// `x @ weight_fn(weight) (+ bias_fn(bias))` as the ETP primitive
/// `etp_mm` (x `(B, I)`) or `etp_mv` (x `(I,)`): the op a model's trainable
/// weights go through so that eligibility traces flow to them.
#[pyfunction]
#[pyo3(signature = (x, weight, bias=None, weight_fn=None, bias_fn=None))]
pub fn etp_mm(
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    weight_fn: Option<&str>,
    bias_fn: Option<&str>,
) -> PyResult<PyTensor> {
    let x = tensor_in(x, "x")?;
    let w = tensor_in(weight, "weight")?;
    let b = bias.map(|b| tensor_in(b, "bias")).transpose()?;
    let t = Transforms {
        weight_fn: elem_fn(weight_fn)?,
        bias_fn: elem_fn(bias_fn)?,
        ..Transforms::default()
    };
    Ok(PyTensor::new(matmul(&x, &w, b.as_ref(), &t).py()?))
}

/// `weight_fn(weight)` as the ETP primitive `etp_elemwise`: an element-wise
/// trainable (a decay, a time constant) with its own trace.
#[pyfunction]
#[pyo3(signature = (weight, weight_fn=None))]
pub fn etp_elemwise(weight: &Bound<'_, PyAny>, weight_fn: Option<&str>) -> PyResult<PyTensor> {
    let w = tensor_in(weight, "weight")?;
    Ok(PyTensor::new(element_wise(&w, elem_fn(weight_fn)?).py()?))
}

/// The tensors joined along an existing `axis` (default: the last).
#[pyfunction]
#[pyo3(signature = (xs, axis=-1))]
pub fn concat(xs: &Bound<'_, PyAny>, axis: i64) -> PyResult<PyTensor> {
    let v = tensors(xs, "xs")?;
    let nd = v.first().map_or(1, Tensor::ndim);
    let a = self::axis(nd, axis)?;
    Ok(PyTensor::new(braintrace_core::concat(&v, a).py()?))
}

/// The tensors stacked along a new `axis` (default 0).
#[pyfunction]
#[pyo3(signature = (xs, axis=0))]
pub fn stack(xs: &Bound<'_, PyAny>, axis: i64) -> PyResult<PyTensor> {
    let v = tensors(xs, "xs")?;
    let nd = v.first().map_or(0, Tensor::ndim);
    let a = axis_new(nd, axis)?;
    Ok(PyTensor::new(braintrace_core::stack(&v, a).py()?))
}

/// A tensor from a numpy float array (copied once).
#[pyfunction]
pub fn tensor(array: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    PyTensor::py_new(array)
}
