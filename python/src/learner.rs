//! `compile` and the compiled `Learner` with braintrace's methods
//! (`update`, `etrace_grad` with the driver's options, `evolve`,
//! `evaluate`, `etrace_of`, `reset_state`, `explain`) plus parameter
//! access, a forward pass over a sequence, and save/load. The algorithms
//! are built in `algos`, the driver's calls in `driver`. The GIL is
//! released while Rust computes and taken again only to call a Python
//! model or loss (while they are traced).

use crate::algos::{algorithm_in, three_factor};
use crate::array::{dict_in, dict_out, tensor_in, tensor_out};
use crate::driver::{self, GradArgs, Loss};
use crate::error::{to_py, IntoPyResult};
use crate::model::{model_in, AnyModel};
use crate::tensor::dtype_from;
use braintrace_core::learn::{
    compile as compile_rs, step_values, Learner, ModelState, NonFinite, Reduction,
};
use braintrace_core::nn::io;
use braintrace_core::{Jit, Result, Tensor};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::sync::Arc;

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

    /// Online gradients over a sequence (time-major: `xs` `(T, *input)`,
    /// `ys` `(T, *target)` or a tuple of several target sequences): per
    /// step the eligibility-trace gradient of `loss(output, *ys[t])`,
    /// weighted by `mask` (`(T,)`, or `(T, B)` for a per-sample loss) and
    /// per-step `weights` (`T` floats), reduced over time (`"mean"` divides
    /// by the total weight, `"sum"`). `loss` is `"mse"`, `"cross_entropy"`
    /// or a function of Tensors (traced, not called per step) returning the
    /// loss, or `(loss, aux)` with `has_aux=True`. `chunk_size=k` drives
    /// windows of `k` steps (multi-step learners). Returns `(grads,
    /// losses)`: a dict of arrays keyed by parameter key and the per-step
    /// losses (`loss_output="per_step"`; `"masked"`: weighted by mask and
    /// weights; `"scalar"`: the reduced objective, a float); then `aux` (a
    /// list of arrays stacked over the steps) with `has_aux`, then the
    /// outputs `(T, *output)` with `return_outputs`. Hidden states, traces
    /// and the step counter continue from where they are.
    #[pyo3(signature = (xs, ys, loss=None, reduction="mean", *, mask=None, weights=None, chunk_size=None, return_outputs=false, has_aux=false, loss_output="per_step"))]
    #[allow(clippy::too_many_arguments)]
    fn etrace_grad<'py>(
        &mut self,
        py: Python<'py>,
        xs: &Bound<'py, PyAny>,
        ys: &Bound<'py, PyAny>,
        loss: Option<Bound<'py, PyAny>>,
        reduction: &str,
        mask: Option<Bound<'py, PyAny>>,
        weights: Option<Bound<'py, PyAny>>,
        chunk_size: Option<usize>,
        return_outputs: bool,
        has_aux: bool,
        loss_output: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let args = GradArgs {
            loss: loss.as_ref(),
            reduction,
            mask: mask.as_ref(),
            weights: weights.as_ref(),
            chunk_size,
            return_outputs,
            has_aux,
            loss_output,
        };
        driver::etrace_grad(py, &mut self.inner, xs, ys, args)
    }

    /// Drive the model and its traces over `xs` `(T, *input)` without a
    /// gradient (braintrace's `etrace_evolve`): hidden states and traces end
    /// where `update` on every row would leave them. The step counter
    /// advances by `T` (by `T / chunk_size` with windows). Returns the
    /// outputs `(T, *output)` with `return_outputs`, else None.
    #[pyo3(signature = (xs, chunk_size=None, return_outputs=false))]
    fn evolve<'py>(
        &mut self,
        py: Python<'py>,
        xs: &Bound<'py, PyAny>,
        chunk_size: Option<usize>,
        return_outputs: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        driver::evolve(py, &mut self.inner, xs, chunk_size, return_outputs)
    }

    /// The outputs `(T, *output)` over `xs` `(T, *input)` from the current
    /// hidden states and parameters; the learner is left as it was (hidden
    /// states, traces, step counter).
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        xs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        driver::evaluate(py, &self.inner, xs)
    }

    /// The eligibility traces of one weight (new arrays): `weight_key` a
    /// parameter key (`"rnn/Wz/weight/weight"`) or its parameter state's
    /// path (`"rnn/Wz/weight"`). An empty list for a weight without a trace
    /// (a readout); a `ValueError` listing the keys for an unknown one.
    fn etrace_of<'py>(&self, py: Python<'py>, weight_key: &str) -> PyResult<Bound<'py, PyList>> {
        driver::etrace_of(py, &self.inner, weight_key)
    }

    /// ThreeFactor's standing modulator (a `ValueError` for another
    /// algorithm).
    #[getter]
    fn modulator(&self) -> PyResult<f64> {
        Ok(three_factor(self.inner.algorithm())?.modulator())
    }

    /// Set ThreeFactor's standing modulator (finite), read from the next
    /// step on; shared with the `Algorithm` the learner was compiled with.
    fn set_modulator(&self, modulator: f64) -> PyResult<()> {
        three_factor(self.inner.algorithm())?
            .set_modulator(modulator)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("`modulator`: {e}")))
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

    /// What a NaN or an infinity in an input or written by a step does:
    /// `"error"` (the default: a `ValueError` naming it, the learner
    /// unchanged), `"skip"` (the step is dropped and counted in
    /// `skipped`) or `"allow"` (no check, as braintrace).
    #[getter]
    fn non_finite(&self) -> &'static str {
        match self.inner.non_finite() {
            NonFinite::Error => "error",
            NonFinite::Skip => "skip",
            NonFinite::Allow => "allow",
        }
    }

    #[setter]
    fn set_non_finite(&mut self, policy: &str) -> PyResult<()> {
        let p = match policy {
            "error" => NonFinite::Error,
            "skip" => NonFinite::Skip,
            "allow" => NonFinite::Allow,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "`non_finite`: expected \"error\", \"skip\" or \"allow\", got {other:?}"
                )))
            }
        };
        self.inner.set_non_finite(p);
        Ok(())
    }

    /// Steps the `"skip"` policy has dropped since compile.
    #[getter]
    fn skipped(&self) -> usize {
        self.inner.skipped()
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
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        dict_out(py, self.inner.state().params())
    }

    /// Replace parameters (same shapes; cast to the learner's dtype);
    /// nothing changes if any is wrong.
    fn set_params(&mut self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = dict_in(params, "params")?;
        self.inner.state_mut().set_params(&p).py()
    }

    /// The hidden states, a dict of new arrays keyed by path.
    fn hidden<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
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
            inner.etrace_grad(&xs, &ys, |o, y| Loss::Mse.builtin(o, y), Reduction::Mean)?;
        }
        Ok(t0.elapsed().as_secs_f64())
    })
    .map_err(to_py)
}
