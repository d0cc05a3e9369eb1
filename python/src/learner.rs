//! The learners: the algorithms (`D_RTRL`, `pp_prop` / `ES_D_RTRL`),
//! `compile`, and the compiled `Learner` with braintrace's methods
//! (`update`, `etrace_grad`, `reset_state`, `explain`) plus parameter
//! access, a forward pass over a sequence, and save/load. The GIL is
//! released while Rust computes and taken again only to call a Python
//! model or loss (while they are traced).

use crate::array::{dict_in, dict_out, tensor_in, tensor_out};
use crate::error::{from_callback, to_py, IntoPyResult};
use crate::model::{model_in, AnyModel};
use crate::tensor::{dtype_from, PyTensor};
use braintrace_core::learn::{
    compile as compile_rs, rank_decay, step_values, Algorithm, DRtrl, InStepPaths, Learner,
    ModelState, NonTemporal, PpProp, Reduction, VjpMethod,
};
use braintrace_core::nn::io;
use braintrace_core::{Jit, Result, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::Arc;

/// An online learning algorithm with its options.
#[pyclass(name = "Algorithm", module = "braintrace_rs", frozen)]
pub struct PyAlgorithm {
    pub algo: Algorithm,
}

#[pymethods]
impl PyAlgorithm {
    fn __repr__(&self) -> String {
        format!("{:?}", self.algo)
    }
    /// `"d_rtrl"` or `"pp_prop"`.
    #[getter]
    fn name(&self) -> &'static str {
        self.algo.name()
    }
}

fn vjp(name: &str) -> PyResult<VjpMethod> {
    match name {
        "single-step" | "single_step" => Ok(VjpMethod::SingleStep),
        "multi-step" | "multi_step" => Ok(VjpMethod::MultiStep),
        other => Err(PyValueError::new_err(format!(
            "`vjp_method`: {other:?}; use \"single-step\" or \"multi-step\""
        ))),
    }
}

fn non_temporal(name: &str) -> PyResult<NonTemporal> {
    match name {
        "zero" => Ok(NonTemporal::Zero),
        "in_step" | "in-step" => Ok(NonTemporal::InStep),
        other => Err(PyValueError::new_err(format!(
            "`non_temporal`: {other:?}; use \"zero\" (braintrace's exact zeros) or \"in_step\""
        ))),
    }
}

fn in_step_paths(name: &str) -> PyResult<InStepPaths> {
    match name {
        "twice" => Ok(InStepPaths::Twice),
        "once" => Ok(InStepPaths::Once),
        other => Err(PyValueError::new_err(format!(
            "`in_step_paths`: {other:?}; use \"twice\" (braintrace's learning signal) or \"once\" (each in-step path counted once)"
        ))),
    }
}

/// D-RTRL: eligibility traces of parameter size, the hidden-to-hidden
/// Jacobian kept diagonal. `non_temporal="zero"` gives parameters without
/// a relation to a hidden state (a readout) braintrace's exact zeros;
/// `"in_step"` their in-step gradient (what training usually wants).
/// `in_step_paths="twice"` is braintrace's learning signal, which counts an
/// in-step path between two states of a group (an LSTM's c → h, a LIF's
/// current → voltage) twice; `"once"` counts it once (exact where D-RTRL
/// is).
#[pyfunction]
#[pyo3(name = "D_RTRL", signature = (vjp_method="single-step", non_temporal="zero", fast_paths=true, in_step_paths="twice"))]
pub fn d_rtrl(
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
    in_step_paths: &str,
) -> PyResult<PyAlgorithm> {
    let a = DRtrl::default()
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .in_step_paths(self::in_step_paths(in_step_paths)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: a.into() })
}

fn decay_of(v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if v.is_instance_of::<pyo3::types::PyInt>() {
        rank_decay(v.extract()?).py()
    } else {
        v.extract::<f64>().map_err(|_| {
            PyTypeError::new_err("`decay_or_rank`: expected a float decay or an int rank")
        })
    }
}

/// ES-D-RTRL / pp_prop with `decay_or_rank`: a float decay in [0, 1), an
/// int rank r (decay (r-1)/(r+1)), or a pair (input decay, output decay).
/// `in_step_paths` as for `D_RTRL`.
#[pyfunction]
#[pyo3(signature = (decay_or_rank, vjp_method="single-step", non_temporal="zero", fast_paths=true, in_step_paths="twice"))]
pub fn pp_prop(
    decay_or_rank: &Bound<'_, PyAny>,
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
    in_step_paths: &str,
) -> PyResult<PyAlgorithm> {
    let p = if let Ok(t) = decay_or_rank.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(PyValueError::new_err(
                "`decay_or_rank`: a pair (input decay, output decay)",
            ));
        }
        PpProp::decays(decay_of(&t.get_item(0)?)?, decay_of(&t.get_item(1)?)?)
    } else {
        PpProp::new(decay_of(decay_or_rank)?)
    }
    .py()?;
    let p = p
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .in_step_paths(self::in_step_paths(in_step_paths)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: p.into() })
}

fn algorithm_in(a: &Bound<'_, PyAny>) -> PyResult<Algorithm> {
    if let Ok(p) = a.cast::<PyAlgorithm>() {
        return Ok(p.get().algo.clone());
    }
    match a.extract::<String>().ok().as_deref() {
        Some("d_rtrl" | "D_RTRL" | "d-rtrl") => Ok(DRtrl::default().into()),
        Some(n) if n.eq_ignore_ascii_case("pp_prop") || n.eq_ignore_ascii_case("es_d_rtrl") => {
            Err(PyValueError::new_err(format!(
                "`algorithm`: {n} needs its decay_or_rank: use braintrace_rs.pp_prop(decay_or_rank)"
            )))
        }
        // Every other algorithm by braintrace's name with its defaults
        // (`eprop`, `ostl_recurrent`, `uoro`, ...); an unknown name lists
        // the known ones.
        Some(other) => Algorithm::by_name(other)
            .map_err(|e| PyValueError::new_err(format!("`algorithm`: {e}"))),
        None => Err(PyTypeError::new_err(
            "`algorithm`: expected D_RTRL(...), pp_prop(...) or a name",
        )),
    }
}

type ForwardFn = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

/// A model compiled for online learning.
#[pyclass(name = "Learner", module = "braintrace_rs")]
pub struct PyLearner {
    pub inner: Learner<AnyModel>,
    /// The model's step, traced once per input shape, for `forward`.
    forward: Arc<Jit<ForwardFn>>,
}

/// Compile `model` for online learning with `algorithm`: `example_input` is
/// one step's input (with the batch axis when `batch_size` is given), its
/// dtype the learner's unless `dtype` says otherwise; the parameters are
/// drawn from `seed`, or taken from `params` (a dict of arrays). A Python
/// model's `step` is called here, once, while it is traced.
#[pyfunction]
#[pyo3(signature = (model, algorithm, example_input, batch_size=None, dtype=None, seed=0, params=None))]
#[allow(clippy::too_many_arguments)]
pub fn compile(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    algorithm: &Bound<'_, PyAny>,
    example_input: &Bound<'_, PyAny>,
    batch_size: Option<usize>,
    dtype: Option<&str>,
    seed: u64,
    params: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyLearner> {
    let m = model_in(model)?;
    let algo = algorithm_in(algorithm)?;
    let x = tensor_in(example_input, "example_input")?;
    let dt = match dtype {
        Some(d) => dtype_from(d)?,
        None => x.dtype(),
    };
    let params = params.map(|p| dict_in(p, "params")).transpose()?;
    let m2 = m.clone();
    let learner = py
        .detach(move || -> Result<Learner<AnyModel>> {
            // Unbatched first: `compile` checks the example input against
            // `batch_size` before it sizes the hidden states.
            let mut state = ModelState::new(&m2, dt, seed, None)?;
            if let Some(p) = &params {
                state.set_params(p)?;
            }
            compile_rs(m2, state, algo, &x, batch_size)
        })
        .map_err(to_py)?;
    Ok(PyLearner {
        forward: Arc::new(Jit::new(forward_fn(m, learner.state()))),
        inner: learner,
    })
}

/// The model's step as a function of (params, hidden, x) → (out, hidden).
fn forward_fn(m: AnyModel, s: &ModelState) -> ForwardFn {
    let (pi, hi) = (s.param_infos().to_vec(), s.hidden_infos().to_vec());
    Box::new(move |a: &[Tensor]| {
        let (np, nh) = (pi.len(), hi.len());
        let (out, h) = step_values(&m, &pi, &a[..np], &hi, &a[np..np + nh], &a[np + nh])?;
        let mut v = vec![out];
        v.extend(h);
        Ok(v)
    })
}

/// A loss by name or a Python function of (prediction, target).
enum Loss {
    Mse,
    CrossEntropy,
    Py(Py<PyAny>),
}

fn loss_in(l: &Bound<'_, PyAny>) -> PyResult<Loss> {
    match l.extract::<String>().ok().as_deref() {
        Some("mse") => Ok(Loss::Mse),
        Some("cross_entropy" | "softmax_cross_entropy") => Ok(Loss::CrossEntropy),
        Some(other) => Err(PyValueError::new_err(format!(
            "`loss`: unknown name {other:?}; use \"mse\", \"cross_entropy\" or a function (prediction, target) -> Tensor"
        ))),
        None if l.is_callable() => Ok(Loss::Py(l.clone().unbind())),
        None => Err(PyTypeError::new_err(
            "`loss`: expected a name or a function (prediction, target) -> Tensor",
        )),
    }
}

impl Loss {
    fn apply(&self, o: &Tensor, y: &Tensor) -> Result<Tensor> {
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
            Loss::Py(f) => Python::attach(|py| {
                let r = f
                    .call1(py, (PyTensor::new(o.clone()), PyTensor::new(y.clone())))
                    .and_then(|r| {
                        r.bind(py)
                            .cast::<PyTensor>()
                            .map(|t| t.get().t.clone())
                            .map_err(|_| PyTypeError::new_err("the loss must return a Tensor"))
                    });
                r.map_err(|e| from_callback("loss", e))
            }),
        }
    }
}

fn reduction(r: &str) -> PyResult<Reduction> {
    match r {
        "mean" => Ok(Reduction::Mean),
        "sum" => Ok(Reduction::Sum),
        other => Err(PyValueError::new_err(format!(
            "`reduction`: {other:?}; use \"mean\" or \"sum\""
        ))),
    }
}

#[pymethods]
impl PyLearner {
    /// One online step on `x` (one step's input): the model's output; the
    /// hidden states and traces advance. The GIL is released meanwhile.
    fn update<'py>(
        &mut self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let x = tensor_in(x, "x")?;
        let inner = &mut self.inner;
        let out = py.detach(|| inner.update(&x)).map_err(to_py)?;
        tensor_out(py, out)
    }

    /// Online gradients over a sequence (`xs` `(T, *input)`, `ys`
    /// `(T, *target)`, time-major): per step the eligibility-trace gradient
    /// of `loss(output, ys[t])`, reduced over time (`"mean"` or `"sum"`).
    /// Returns `(grads, losses)`: a dict of arrays keyed by parameter key and
    /// the `(T,)` per-step losses. `loss` is `"mse"`, `"cross_entropy"` or a
    /// function of two Tensors (traced, not called per step).
    #[pyo3(signature = (xs, ys, loss=None, reduction="mean"))]
    fn etrace_grad<'py>(
        &mut self,
        py: Python<'py>,
        xs: &Bound<'py, PyAny>,
        ys: &Bound<'py, PyAny>,
        loss: Option<Bound<'py, PyAny>>,
        reduction: &str,
    ) -> PyResult<(Bound<'py, pyo3::types::PyDict>, Bound<'py, PyAny>)> {
        let (xs, ys) = (tensor_in(xs, "xs")?, tensor_in(ys, "ys")?);
        let loss = match &loss {
            Some(l) => loss_in(l)?,
            None => Loss::Mse,
        };
        let red = self::reduction(reduction)?;
        let inner = &mut self.inner;
        let r = py
            .detach(|| inner.etrace_grad(&xs, &ys, |o, y| loss.apply(o, y), red))
            .map_err(to_py)?;
        Ok((dict_out(py, r.grads)?, tensor_out(py, r.losses)?))
    }

    /// Reset hidden states and traces to zeros and the step counter to 0
    /// (`batch_size`: the compiled one by default; another one analyses the
    /// step again at that size and reallocates the traces).
    #[pyo3(signature = (batch_size=None))]
    fn reset_state(&mut self, batch_size: Option<usize>) -> PyResult<()> {
        let b = batch_size.or(self.inner.state().batch());
        self.inner.reset_state(b).py()
    }

    /// A readable account of the compilation.
    fn explain(&self) -> String {
        self.inner.explain()
    }

    /// Steps since compile or the last reset.
    #[getter]
    fn running_index(&self) -> usize {
        self.inner.running_index()
    }

    /// The compiled batch size (None when unbatched).
    #[getter]
    fn batch_size(&self) -> Option<usize> {
        self.inner.state().batch()
    }

    /// The learner's dtype.
    #[getter]
    fn dtype(&self) -> &'static str {
        crate::tensor::dtype_name(self.inner.state().dtype())
    }

    /// The parameter keys, in declaration order.
    fn param_keys(&self) -> Vec<String> {
        self.inner
            .state()
            .param_infos()
            .iter()
            .map(|p| p.key.clone())
            .collect()
    }

    /// The parameters, a dict of new arrays keyed by parameter key.
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        dict_out(py, self.inner.state().params())
    }

    /// Replace parameters (same shapes; cast to the learner's dtype);
    /// nothing changes if any is wrong.
    fn set_params(&mut self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = dict_in(params, "params")?;
        self.inner.state_mut().set_params(&p).py()
    }

    /// The hidden states, a dict of new arrays keyed by path.
    fn hidden<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        dict_out(py, self.inner.state().hidden())
    }

    /// Replace the hidden state `path` (same shape).
    fn set_hidden(&mut self, path: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = tensor_in(value, "value")?;
        self.inner.state_mut().set_hidden(path, &v).py()
    }

    /// Run the model over `xs` `(T, B, *input)` from zero hidden states with
    /// the current parameters, without learning (the learner is not
    /// changed): the outputs `(T, B, *output)`. The step is traced once per
    /// input shape and reused.
    fn forward<'py>(&self, py: Python<'py>, xs: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let xs = tensor_in(xs, "xs")?;
        let s = self.inner.state();
        let f = self.forward.clone();
        let (params, infos, dt) = (
            s.param_values().to_vec(),
            s.hidden_infos().to_vec(),
            s.dtype(),
        );
        let out = py
            .detach(move || -> Result<Tensor> {
                let xs = xs.cast(dt)?;
                if xs.ndim() < 2 {
                    return Err(braintrace_core::Error::shapes(
                        "Learner.forward",
                        [xs.shape()],
                        "xs must be (T, B, *input)",
                    ));
                }
                let b = xs.shape()[1];
                let mut hidden: Vec<Tensor> = infos
                    .iter()
                    .map(|h| {
                        let mut sh = vec![b];
                        sh.extend_from_slice(&h.shape);
                        Tensor::zeros(&sh, dt)
                    })
                    .collect();
                let mut outs = Vec::with_capacity(xs.shape()[0]);
                for t in 0..xs.shape()[0] {
                    let mut args = params.clone();
                    args.extend(hidden.iter().cloned());
                    args.push(xs.index_axis0(t)?);
                    let mut r = f.call_owned(args)?;
                    hidden = r.split_off(1);
                    outs.push(r.pop().expect("the output"));
                }
                braintrace_core::stack(&outs, 0)
            })
            .map_err(to_py)?;
        tensor_out(py, out)
    }

    /// Save the parameters to a safetensors file (readable by the
    /// `safetensors` Python package).
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let s = self.inner.state();
        py.detach(|| io::save_params(s, &path)).map_err(to_py)
    }

    /// Load parameters from a safetensors file (every key must be one of
    /// the model's, of its shape); nothing changes on error.
    fn load(&mut self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let s = self.inner.state_mut();
        py.detach(|| io::load_params(s, &path)).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!(
            "Learner({}, batch_size={:?}, dtype={})",
            self.inner.algorithm().name(),
            self.inner.state().batch(),
            crate::tensor::dtype_name(self.inner.state().dtype())
        )
    }
}

/// Seconds `n` calls of `learner.update(x)` take inside Rust (no Python
/// between them): the reference of `bench/overhead.py`.
#[pyfunction]
pub fn _time_update(
    py: Python<'_>,
    learner: &mut PyLearner,
    x: &Bound<'_, PyAny>,
    n: usize,
) -> PyResult<f64> {
    let x = tensor_in(x, "x")?;
    let inner = &mut learner.inner;
    py.detach(|| {
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            inner.update(&x)?;
        }
        Ok(t0.elapsed().as_secs_f64())
    })
    .map_err(to_py)
}

/// Seconds `n` calls of `learner.etrace_grad(xs, ys, "mse")` take inside
/// Rust: the reference of `bench/overhead.py`.
#[pyfunction]
pub fn _time_etrace_grad(
    py: Python<'_>,
    learner: &mut PyLearner,
    xs: &Bound<'_, PyAny>,
    ys: &Bound<'_, PyAny>,
    n: usize,
) -> PyResult<f64> {
    let (xs, ys) = (tensor_in(xs, "xs")?, tensor_in(ys, "ys")?);
    let inner = &mut learner.inner;
    py.detach(|| {
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            inner.etrace_grad(&xs, &ys, |o, y| Loss::Mse.apply(o, y), Reduction::Mean)?;
        }
        Ok(t0.elapsed().as_secs_f64())
    })
    .map_err(to_py)
}
