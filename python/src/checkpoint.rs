//! A learner's checkpoint from Python: `save_checkpoint` /
//! `restore_checkpoint` (a file, written atomically), `checkpoint_bytes` /
//! `restore_checkpoint_bytes` (the same bytes in memory, for an object
//! store) and `load_checkpoint` (a file's contents as arrays, to look at).
//! A checkpoint holds the parameters, hidden states, eligibility traces,
//! step counter and the optimiser's state, so a run resumed from it ends
//! with the bits of an uninterrupted one.

use crate::array::dict_out;
use crate::error::{to_py, IntoPyResult};
use crate::learner::PyLearner;
use crate::optim::{PyAdam, PySgd};
use braintrace_core::nn::checkpoint::Checkpoint;
use braintrace_core::nn::optim::{Optimizer, Sgd};
use braintrace_core::Result;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Run `f` on the optimiser `opt` (`SGD`, `Adam` or `None`: a plain SGD
/// that keeps no state, so a checkpoint saved without an optimiser is
/// restored without one).
fn with_opt<R>(
    opt: Option<&Bound<'_, PyAny>>,
    f: impl FnOnce(&mut dyn Optimizer) -> PyResult<R>,
) -> PyResult<R> {
    match opt {
        None => f(&mut Sgd::new(1.0).map_err(to_py)?),
        Some(o) => {
            if let Ok(s) = o.cast::<PySgd>() {
                let mut g = s.get().inner.lock().unwrap_or_else(|e| e.into_inner());
                f(&mut *g)
            } else if let Ok(a) = o.cast::<PyAdam>() {
                let mut g = a.get().inner.lock().unwrap_or_else(|e| e.into_inner());
                f(&mut *g)
            } else {
                Err(PyTypeError::new_err(
                    "`optimizer`: expected braintrace_rs.SGD, braintrace_rs.Adam or None",
                ))
            }
        }
    }
}

fn capture(
    learner: &PyLearner,
    opt: &dyn Optimizer,
    counters: Option<BTreeMap<String, u64>>,
) -> Checkpoint {
    let mut c = Checkpoint::capture_learner(&learner.inner, opt);
    for (k, v) in counters.unwrap_or_default() {
        c.counters.insert(format!("user/{k}"), v);
    }
    c
}

fn user_counters(c: &Checkpoint) -> BTreeMap<String, u64> {
    c.counters
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("user/").map(|n| (n.to_string(), *v)))
        .collect()
}

/// Save `learner` (parameters, hidden states, traces, step counter) and
/// `optimizer`'s state to `path`, atomically: a crash while saving leaves
/// the previous file whole. `counters`: whole numbers of the caller's
/// (an update count) kept with it.
#[pyfunction]
#[pyo3(signature = (learner, path, optimizer=None, counters=None))]
pub fn save_checkpoint(
    py: Python<'_>,
    learner: &PyLearner,
    path: PathBuf,
    optimizer: Option<&Bound<'_, PyAny>>,
    counters: Option<BTreeMap<String, u64>>,
) -> PyResult<()> {
    let c = with_opt(optimizer, |o| Ok(capture(learner, o, counters)))?;
    py.detach(|| c.save(&path)).map_err(to_py)
}

/// The bytes [`save_checkpoint`] would write.
#[pyfunction]
#[pyo3(signature = (learner, optimizer=None, counters=None))]
pub fn checkpoint_bytes<'py>(
    py: Python<'py>,
    learner: &PyLearner,
    optimizer: Option<&Bound<'py, PyAny>>,
    counters: Option<BTreeMap<String, u64>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let c = with_opt(optimizer, |o| Ok(capture(learner, o, counters)))?;
    let bytes = py.detach(|| c.to_bytes()).map_err(to_py)?;
    Ok(PyBytes::new(py, &bytes))
}

fn restore(
    py: Python<'_>,
    learner: &mut PyLearner,
    optimizer: Option<&Bound<'_, PyAny>>,
    read: impl FnOnce() -> Result<Checkpoint> + Send,
) -> PyResult<BTreeMap<String, u64>> {
    let c = py.detach(read).map_err(to_py)?;
    let inner = &mut learner.inner;
    with_opt(optimizer, |o| c.restore_learner(inner, o).py())?;
    Ok(user_counters(&c))
}

/// Put a checkpoint file back into `learner` and `optimizer` (compiled
/// from the same model, with the same algorithm, batch size and dtype;
/// the optimiser of the kind saved). Returns the caller's counters.
/// Nothing changes on error (`ValueError` naming what differs).
#[pyfunction]
#[pyo3(signature = (learner, path, optimizer=None))]
pub fn restore_checkpoint(
    py: Python<'_>,
    learner: &mut PyLearner,
    path: PathBuf,
    optimizer: Option<&Bound<'_, PyAny>>,
) -> PyResult<BTreeMap<String, u64>> {
    restore(py, learner, optimizer, move || Checkpoint::load(&path))
}

/// [`restore_checkpoint`] from bytes given by [`checkpoint_bytes`].
#[pyfunction]
#[pyo3(signature = (learner, data, optimizer=None))]
pub fn restore_checkpoint_bytes(
    py: Python<'_>,
    learner: &mut PyLearner,
    data: &[u8],
    optimizer: Option<&Bound<'_, PyAny>>,
) -> PyResult<BTreeMap<String, u64>> {
    let data = data.to_vec();
    restore(py, learner, optimizer, move || {
        Checkpoint::from_bytes(&data)
    })
}

/// A checkpoint file's contents: a dict with `params`, `hidden`, `optim`
/// and `extra` (dicts of arrays), `counters` (whole numbers, the library's
/// and the caller's under `user/`), `labels` (text) and `optimizer` (its kind).
#[pyfunction]
pub fn load_checkpoint(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let c = py.detach(move || Checkpoint::load(&path)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("params", dict_out(py, c.params)?)?;
    d.set_item("hidden", dict_out(py, c.hidden)?)?;
    d.set_item("optim", dict_out(py, c.optim.tensors)?)?;
    d.set_item("extra", dict_out(py, c.extra)?)?;
    let mut counters = c.counters;
    for (k, v) in c.optim.counters {
        counters.insert(format!("optim/{k}"), v);
    }
    d.set_item("counters", counters)?;
    d.set_item("labels", c.labels)?;
    d.set_item("optimizer", c.optim.kind)?;
    Ok(d)
}
