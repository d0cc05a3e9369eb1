//! The optimisers (`SGD`, `Adam`) and `clip_grad_norm`, stepping a
//! learner's parameters with a dict of gradients; and safetensors files of
//! a dict of arrays.

use crate::array::{dict_in, dict_out};
use crate::error::{to_py, IntoPyResult};
use crate::learner::PyLearner;
use braintrace_core::nn::io;
use braintrace_core::nn::optim::{clip_grad_norm as clip_rs, Adam as AdamRs, Optimizer, Sgd};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Mutex;

fn step_with(
    py: Python<'_>,
    opt: &Mutex<dyn Optimizer + Send>,
    learner: &mut PyLearner,
    grads: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let g = dict_in(grads, "grads")?;
    let state = learner.inner.state_mut();
    py.detach(|| {
        let mut o = opt.lock().unwrap_or_else(|e| e.into_inner());
        o.step(state, &g)
    })
    .map_err(to_py)
}

/// Stochastic gradient descent with optional momentum and weight decay.
#[pyclass(name = "SGD", module = "braintrace_rs", frozen)]
pub struct PySgd {
    pub(crate) inner: Mutex<Sgd>,
}

#[pymethods]
impl PySgd {
    #[new]
    #[pyo3(signature = (lr, momentum=0.0, weight_decay=0.0))]
    fn new(lr: f64, momentum: f64, weight_decay: f64) -> PyResult<Self> {
        let sgd = Sgd::new(lr)
            .and_then(|s| s.momentum(momentum))
            .and_then(|s| s.weight_decay(weight_decay))
            .map_err(crate::error::to_py)?;
        Ok(PySgd {
            inner: Mutex::new(sgd),
        })
    }
    /// Update `learner`'s parameters with `grads` (a dict keyed by
    /// parameter key); nothing changes on error.
    fn step(
        &self,
        py: Python<'_>,
        learner: &mut PyLearner,
        grads: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        step_with(py, &self.inner, learner, grads)
    }
}

/// Adam (betas 0.9, 0.999 and eps 1e-8 by default).
#[pyclass(name = "Adam", module = "braintrace_rs", frozen)]
pub struct PyAdam {
    pub(crate) inner: Mutex<AdamRs>,
}

#[pymethods]
impl PyAdam {
    #[new]
    #[pyo3(signature = (lr, betas=(0.9, 0.999), eps=1e-8))]
    fn new(lr: f64, betas: (f64, f64), eps: f64) -> PyResult<Self> {
        let adam = AdamRs::new(lr)
            .and_then(|a| a.betas(betas.0, betas.1))
            .and_then(|a| a.eps(eps))
            .map_err(crate::error::to_py)?;
        Ok(PyAdam {
            inner: Mutex::new(adam),
        })
    }
    /// Update `learner`'s parameters with `grads` (a dict keyed by
    /// parameter key); nothing changes on error.
    fn step(
        &self,
        py: Python<'_>,
        learner: &mut PyLearner,
        grads: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        step_with(py, &self.inner, learner, grads)
    }
}

/// Scale all gradients together so that their global L2 norm is at most
/// `max_norm`: `(clipped grads, norm before clipping)`.
#[pyfunction]
pub fn clip_grad_norm<'py>(
    py: Python<'py>,
    grads: &Bound<'py, PyAny>,
    max_norm: f64,
) -> PyResult<(Bound<'py, PyDict>, f64)> {
    let g = dict_in(grads, "grads")?;
    let (c, n) = py.detach(|| clip_rs(&g, max_norm)).py()?;
    Ok((dict_out(py, c)?, n))
}

/// Write a dict of arrays as a safetensors file.
#[pyfunction]
pub fn save_safetensors(path: std::path::PathBuf, tensors: &Bound<'_, PyAny>) -> PyResult<()> {
    let d = dict_in(tensors, "tensors")?;
    io::save_safetensors(path, &d).py()
}

/// Read a safetensors file as a dict of arrays.
#[pyfunction]
pub fn load_safetensors(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let d = io::load_safetensors(path).py()?;
    dict_out(py, d)
}
