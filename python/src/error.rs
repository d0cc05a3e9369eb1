//! The one mapping from the library's `Error` to Python exceptions:
//! `TypeError` for dtypes (and arity), `MemoryError` for allocation,
//! `ValueError` for everything else (shapes, axes, values, names), each
//! carrying the Rust message. A Python exception raised inside a callback
//! (a model's `init`/`step`, a loss) travels through the Rust call as an
//! `Error` and comes out as the original exception.

use braintrace_core::Error;
use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::PyErr;
use std::cell::RefCell;

thread_local! {
    /// The Python exception a callback raised on this thread, with the text
    /// of the `Error` that stands for it inside Rust. Rust code runs a
    /// callback on the thread that called into it (the GIL is released
    /// around Rust compute, never handed to another thread), so the error
    /// that comes back out belongs to the same thread.
    static PENDING: RefCell<Option<(String, PyErr)>> = const { RefCell::new(None) };
}

/// Stand a Python exception raised in a callback in for a Rust `Error`
/// (`op` names the callback); [`to_py`] gives the exception back.
pub fn from_callback(op: &str, e: PyErr) -> Error {
    let reason = format!("the Python callback raised {e}");
    let err = Error::invalid(op, reason);
    let text = err.to_string();
    PENDING.with(|p| *p.borrow_mut() = Some((text, e)));
    err
}

/// The Python exception for `e`.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    // The callback's own exception when `e` is (or wraps) the error that
    // stood for it; a stale one (its error swallowed on the way) is dropped.
    if let Some((text, err)) = PENDING.with(|p| p.borrow_mut().take()) {
        if msg.contains(&text) {
            return err;
        }
    }
    match innermost(&e) {
        Error::DType { .. } | Error::Arity { .. } => PyTypeError::new_err(msg),
        Error::Allocation { .. } => PyMemoryError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// The error an ETP primitive's error wraps, all the way in.
fn innermost(e: &Error) -> &Error {
    match e {
        Error::Etp { source, .. } => innermost(source),
        other => other,
    }
}

/// `Result<T>` into `PyResult<T>` through [`to_py`].
pub trait IntoPyResult<T> {
    /// Map the error to its Python exception.
    fn py(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPyResult<T> for braintrace_core::Result<T> {
    fn py(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
