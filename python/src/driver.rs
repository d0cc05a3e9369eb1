//! The sequence driver from Python: `Learner.etrace_grad` with
//! braintrace's options (`mask`, per-step `weights`, `reduction`,
//! `chunk_size`, `return_outputs`, a loss with auxiliary values, several
//! target sequences, `loss_output`), `evolve`, `evaluate` and `etrace_of`,
//! mapped onto the library's `etrace_grad_with` / `EtraceOpts` /
//! `evolve` / `evaluate` / `etrace_of`. The losses (by name or a Python
//! function of Tensors) live here too. The `#[pymethods]` of `Learner`
//! (in `learner`) call these functions.

use crate::array::{dict_out, tensor_in, tensor_out};
use crate::error::{from_callback, to_py};
use crate::model::AnyModel;
use crate::tensor::PyTensor;
use braintrace_core::learn::{EtraceOpts, EtraceOut, EvolveOpts, Learner, Reduction};
use braintrace_core::{Result, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// A loss by name or a Python function of (prediction, *targets).
pub enum Loss {
    Mse,
    CrossEntropy,
    Py(Py<PyAny>),
}

/// The loss `l` names (`None`: the mean squared error).
pub fn loss_in(l: Option<&Bound<'_, PyAny>>) -> PyResult<Loss> {
    let Some(l) = l else { return Ok(Loss::Mse) };
    match l.extract::<String>().ok().as_deref() {
        Some("mse") => Ok(Loss::Mse),
        Some("cross_entropy" | "softmax_cross_entropy") => Ok(Loss::CrossEntropy),
        Some(other) => Err(PyValueError::new_err(format!(
            "`loss`: unknown name {other:?}; use \"mse\", \"cross_entropy\" or a function (prediction, *targets) -> Tensor"
        ))),
        None if l.is_callable() => Ok(Loss::Py(l.clone().unbind())),
        None => Err(PyTypeError::new_err(
            "`loss`: expected a name or a function (prediction, *targets) -> Tensor",
        )),
    }
}

/// A Python value returned as a Tensor (`what` names it in the error).
fn tensor_of(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    v.cast::<PyTensor>()
        .map(|t| t.get().t.clone())
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} must be a braintrace_rs.Tensor, got {}",
                v.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })
}

impl Loss {
    /// The built-in loss of `o` against `y`.
    pub fn builtin(&self, o: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self {
            // Mean squared error over every element.
            Loss::Mse => o.sub(y)?.square()?.mean_all(),
            // Softmax cross-entropy of logits (B, C) against targets (B, C),
            // summed over classes, averaged over the batch; rows of zeros
            // in the target contribute nothing (a mask).
            Loss::CrossEntropy => {
                let lse = o.exp()?.sum(&[1])?.log()?.expand_dims(1)?;
                let b = o.shape().first().copied().unwrap_or(1) as f64;
                y.mul(&lse.sub(o)?)?.sum_all()?.mul_scalar(1.0 / b)
            }
            Loss::Py(_) => unreachable!("a Python loss is called through `call`"),
        }
    }

    /// The loss of `o` against the targets `ys`, with its auxiliary values
    /// when `aux` (a Python loss then returns `(loss, aux)`, `aux` a Tensor
    /// or a sequence of them).
    fn call(&self, o: &Tensor, ys: &[Tensor], aux: bool) -> Result<(Tensor, Vec<Tensor>)> {
        let Loss::Py(f) = self else {
            return Ok((self.builtin(o, &ys[0])?, Vec::new()));
        };
        Python::attach(|py| {
            let r = (|| -> PyResult<(Tensor, Vec<Tensor>)> {
                let mut args = vec![PyTensor::new(o.clone())];
                args.extend(ys.iter().map(|y| PyTensor::new(y.clone())));
                let r = f.call1(py, PyTuple::new(py, args)?)?;
                let r = r.bind(py);
                if !aux {
                    return Ok((tensor_of(r, "the loss")?, Vec::new()));
                }
                let pair = r
                    .cast::<PyTuple>()
                    .ok()
                    .filter(|t| t.len() == 2)
                    .ok_or_else(|| {
                        PyTypeError::new_err("with has_aux=True the loss must return (loss, aux)")
                    })?;
                let l = tensor_of(&pair.get_item(0)?, "the loss")?;
                let a = pair.get_item(1)?;
                let aux = if a.cast::<PyTensor>().is_ok() {
                    vec![tensor_of(&a, "aux")?]
                } else if a.cast::<PyTuple>().is_ok() || a.cast::<PyList>().is_ok() {
                    a.try_iter()?
                        .enumerate()
                        .map(|(i, v)| tensor_of(&v?, &format!("aux[{i}]")))
                        .collect::<PyResult<_>>()?
                } else {
                    return Err(PyTypeError::new_err(
                        "aux must be a Tensor or a tuple/list of Tensors",
                    ));
                };
                Ok((l, aux))
            })();
            r.map_err(|e| from_callback("loss", e))
        })
    }
}

pub fn reduction(r: &str) -> PyResult<Reduction> {
    match r {
        "mean" => Ok(Reduction::Mean),
        "sum" => Ok(Reduction::Sum),
        other => Err(PyValueError::new_err(format!(
            "`reduction`: {other:?}; use \"mean\" or \"sum\""
        ))),
    }
}

/// What `etrace_grad` returns in the losses' place (braintrace's
/// `loss_output`).
#[derive(Clone, Copy)]
enum LossOutput {
    PerStep,
    Masked,
    Scalar,
}

fn loss_output(s: &str) -> PyResult<LossOutput> {
    match s {
        "per_step" => Ok(LossOutput::PerStep),
        "masked" => Ok(LossOutput::Masked),
        "scalar" => Ok(LossOutput::Scalar),
        other => Err(PyValueError::new_err(format!(
            "`loss_output`: {other:?}; use \"per_step\", \"masked\" or \"scalar\""
        ))),
    }
}

/// One target array, or a tuple/list of them (several target sequences).
fn targets(ys: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    if ys.cast::<PyTuple>().is_ok() || ys.cast::<PyList>().is_ok() {
        let v: Vec<Tensor> = ys
            .try_iter()?
            .enumerate()
            .map(|(i, y)| tensor_in(&y?, &format!("ys[{i}]")))
            .collect::<PyResult<_>>()?;
        if v.is_empty() {
            return Err(PyValueError::new_err(
                "`ys`: at least one target sequence is needed",
            ));
        }
        Ok(v)
    } else {
        Ok(vec![tensor_in(ys, "ys")?])
    }
}

/// Per-step weights: a sequence of floats or a 1-D float array.
fn step_weights(w: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    if let Ok(t) = tensor_in(w, "weights") {
        if t.ndim() != 1 {
            return Err(PyValueError::new_err(format!(
                "`weights`: one weight per step, a 1-D array; got shape {:?}",
                t.shape()
            )));
        }
        return t.to_vec_f64().map_err(to_py);
    }
    w.extract::<Vec<f64>>()
        .map_err(|_| PyTypeError::new_err("`weights`: expected a sequence of floats, one per step"))
}

/// The options of one `etrace_grad` call, as Python gave them.
pub struct GradArgs<'a, 'py> {
    pub loss: Option<&'a Bound<'py, PyAny>>,
    pub reduction: &'a str,
    pub mask: Option<&'a Bound<'py, PyAny>>,
    pub weights: Option<&'a Bound<'py, PyAny>>,
    pub chunk_size: Option<usize>,
    pub return_outputs: bool,
    pub has_aux: bool,
    pub loss_output: &'a str,
}

/// `Learner.etrace_grad`: `(grads, losses)`, then `aux` (a list of arrays,
/// each stacked over the steps) when `has_aux`, then the outputs when
/// `return_outputs`.
pub fn etrace_grad<'py>(
    py: Python<'py>,
    inner: &mut Learner<AnyModel>,
    xs: &Bound<'py, PyAny>,
    ys: &Bound<'py, PyAny>,
    a: GradArgs<'_, 'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    let xs = tensor_in(xs, "xs")?;
    let ys = targets(ys)?;
    let loss = loss_in(a.loss)?;
    if !matches!(loss, Loss::Py(_)) {
        if ys.len() != 1 {
            return Err(PyValueError::new_err(format!(
                "`ys`: {} target sequences; a built-in loss takes one (write the loss in Python for several)",
                ys.len()
            )));
        }
        if a.has_aux {
            return Err(PyValueError::new_err(
                "`has_aux`: a built-in loss has no auxiliary values",
            ));
        }
    }
    let mut opts = EtraceOpts::new()
        .reduction(reduction(a.reduction)?)
        .outputs(a.return_outputs);
    if let Some(m) = a.mask {
        opts = opts.mask(&tensor_in(m, "mask")?);
    }
    if let Some(w) = a.weights {
        opts = opts.weights(&step_weights(w)?);
    }
    if let Some(k) = a.chunk_size {
        opts = opts.chunk_size(k);
    }
    let lo = loss_output(a.loss_output)?;
    let has_aux = a.has_aux;
    let out: EtraceOut = py
        .detach(|| {
            if has_aux {
                inner.etrace_grad_with(&xs, &ys, |o, y| loss.call(o, y, true), &opts)
            } else {
                inner.etrace_grad_with(&xs, &ys, |o, y| Ok(loss.call(o, y, false)?.0), &opts)
            }
        })
        .map_err(to_py)?;
    let mut items: Vec<Bound<'py, PyAny>> = vec![dict_out(py, out.grads)?.into_any()];
    items.push(match lo {
        LossOutput::PerStep => tensor_out(py, out.losses)?,
        LossOutput::Masked => tensor_out(py, out.masked)?,
        LossOutput::Scalar => out.objective.into_pyobject(py)?.into_any(),
    });
    if has_aux {
        let aux = out
            .aux
            .into_iter()
            .map(|t| tensor_out(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        items.push(PyList::new(py, aux)?.into_any());
    }
    if let Some(o) = out.outputs {
        items.push(tensor_out(py, o)?);
    }
    PyTuple::new(py, items)
}

/// `Learner.evolve`: the outputs when `return_outputs`, else None.
pub fn evolve<'py>(
    py: Python<'py>,
    inner: &mut Learner<AnyModel>,
    xs: &Bound<'py, PyAny>,
    chunk_size: Option<usize>,
    return_outputs: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let xs = tensor_in(xs, "xs")?;
    let mut opts = EvolveOpts::new().outputs(return_outputs);
    if let Some(k) = chunk_size {
        opts = opts.chunk_size(k);
    }
    let out = py.detach(|| inner.evolve(&xs, &opts)).map_err(to_py)?;
    out.map(|o| tensor_out(py, o)).transpose()
}

/// `Learner.evaluate`: the outputs over `xs` from the current hidden
/// states; the learner does not change.
pub fn evaluate<'py>(
    py: Python<'py>,
    inner: &Learner<AnyModel>,
    xs: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let xs = tensor_in(xs, "xs")?;
    let out = py.detach(|| inner.evaluate(&xs)).map_err(to_py)?;
    tensor_out(py, out)
}

/// `Learner.etrace_of`: the eligibility traces of one weight (copies).
pub fn etrace_of<'py>(
    py: Python<'py>,
    inner: &Learner<AnyModel>,
    weight_key: &str,
) -> PyResult<Bound<'py, PyList>> {
    let ts = inner.etrace_of(weight_key).map_err(to_py)?;
    let arrays = ts
        .into_iter()
        .map(|t| tensor_out(py, t))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, arrays)
}
