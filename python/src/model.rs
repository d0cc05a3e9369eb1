//! Models: the native layers (`Layer`, built by `braintrace_rs.nn`), their
//! sequences, and models written in Python — any object with
//! `init(self, init)` and `step(self, ctx, x)`. A Python model is wrapped
//! in a Rust [`Model`] whose `init` and `step` call back into Python; the
//! learner calls `step` while it traces the model at compile, so Python is
//! not called per time step.
//!
//! The callbacks get their own `Init` and `StepCtx` objects: the `Init` is
//! moved into the Python object for the call and moved back after it (so
//! initialisers draw from the one generator), the `StepCtx` is a copy of
//! the context's handles (tensors are reference-counted) whose hidden
//! states set during the call are written back to the real context.

use crate::error::{from_callback, IntoPyResult};
use crate::tensor::{dtype_name, elem_fn, PyTensor};
use braintrace_core::learn::{HiddenInfo, Init, Model, ParamInfo, StepCtx};
use braintrace_core::nn::{
    ElementWiseParam, ExpSynapse, GruCell, Initializer, LeakyRateReadout, LifCell, Linear,
};
use braintrace_core::{Result, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// A model the learner can compile: a native layer, a sequence, or a
/// Python object.
#[derive(Clone)]
pub enum AnyModel {
    /// A layer of `braintrace::nn`.
    Layer(Arc<dyn Model + Send + Sync>),
    /// Models applied one after another (`nn::Chain`, n-ary).
    Seq(Vec<AnyModel>),
    /// A model written in Python.
    Py(Arc<Py<PyAny>>),
}

impl Model for AnyModel {
    fn init(&self, init: &mut Init) -> Result<()> {
        match self {
            AnyModel::Layer(m) => m.init(init),
            AnyModel::Seq(ms) => ms.iter().try_for_each(|m| m.init(init)),
            AnyModel::Py(obj) => py_init(obj, init),
        }
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        match self {
            AnyModel::Layer(m) => m.step(ctx, x),
            AnyModel::Seq(ms) => {
                let mut h = x.clone();
                for m in ms {
                    h = m.step(ctx, &h)?;
                }
                Ok(h)
            }
            AnyModel::Py(obj) => py_step(obj, ctx, x),
        }
    }
}

/// The model `obj` stands for: a `Layer`, an object whose `_native`
/// attribute is one (the `braintrace_rs.nn` classes), or a Python model.
pub fn model_in(obj: &Bound<'_, PyAny>) -> PyResult<AnyModel> {
    if let Ok(l) = obj.cast::<Layer>() {
        return Ok(l.get().model.clone());
    }
    if let Ok(n) = obj.getattr("_native") {
        if let Ok(l) = n.cast::<Layer>() {
            return Ok(l.get().model.clone());
        }
    }
    if obj.hasattr("init")? && obj.hasattr("step")? {
        return Ok(AnyModel::Py(Arc::new(obj.clone().unbind())));
    }
    Err(PyTypeError::new_err(format!(
        "`model`: expected a braintrace_rs.nn layer or an object with init(self, init) and step(self, ctx, x), got {}",
        obj.get_type().name()?
    )))
}

fn py_init(obj: &Py<PyAny>, init: &mut Init) -> Result<()> {
    Python::attach(|py| {
        let taken = std::mem::replace(init, Init::new(init.dtype(), 0));
        let cell = Py::new(
            py,
            PyInit {
                inner: Mutex::new(Some(taken)),
            },
        )
        .map_err(|e| from_callback("Model.init", e))?;
        let r = obj.call_method1(py, "init", (cell.clone_ref(py),));
        // Always take the `Init` back, whatever the callback did.
        if let Some(back) = lock(&cell.get().inner).take() {
            *init = back;
        }
        r.map(|_| ()).map_err(|e| from_callback("Model.init", e))
    })
}

fn py_step(obj: &Py<PyAny>, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
    let (params, param_values) = ctx.params();
    let (hidden, hidden_values) = ctx.hidden_states();
    let data = Arc::new(CtxData {
        params: params.to_vec(),
        param_values: param_values.to_vec(),
        hidden: hidden.to_vec(),
        hidden_values: hidden_values.to_vec(),
    });
    let new = Python::attach(|py| -> PyResult<Vec<Option<Tensor>>> {
        let c = Py::new(
            py,
            PyStepCtx {
                new: Mutex::new(vec![None; data.hidden.len()]),
                data: data.clone(),
            },
        )?;
        let out = obj.call_method1(py, "step", (c.clone_ref(py), PyTensor::new(x.clone())))?;
        let out = out
            .bind(py)
            .cast::<PyTensor>()
            .map_err(|_| PyTypeError::new_err("Model.step must return a braintrace_rs.Tensor"))?;
        let mut new = std::mem::take(&mut *lock(&c.get().new));
        new.push(Some(out.get().t.clone()));
        Ok(new)
    })
    .map_err(|e| from_callback("Model.step", e))?;
    let mut new = new;
    let out = new.pop().flatten().expect("the output was pushed last");
    for (h, v) in data.hidden.iter().zip(new) {
        if let Some(v) = v {
            ctx.set_hidden(&h.path, v)?;
        }
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a model declares in `init(self, init)`: parameters with their
/// initial values and hidden states. Valid only during that call.
#[pyclass(name = "Init", module = "braintrace_rs", frozen)]
pub struct PyInit {
    inner: Mutex<Option<Init>>,
}

impl PyInit {
    fn with<R>(&self, f: impl FnOnce(&mut Init) -> Result<R>) -> PyResult<R> {
        let mut g = lock(&self.inner);
        let init = g.as_mut().ok_or_else(|| {
            PyValueError::new_err("this Init is only valid during the model's init call")
        })?;
        f(init).py()
    }
}

fn initializer(name: &str, scale: Option<f64>) -> PyResult<Initializer> {
    Ok(match name {
        "zeros" => Initializer::Zeros,
        "constant" => Initializer::Constant(scale.unwrap_or(0.0)),
        "kaiming_normal" => Initializer::KaimingNormal {
            scale: scale.unwrap_or(2.0),
        },
        "orthogonal" => Initializer::Orthogonal {
            scale: scale.unwrap_or(1.0),
        },
        "normal" => Initializer::Normal {
            std: scale.unwrap_or(1.0),
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown initializer {other:?}; use zeros, constant, kaiming_normal, orthogonal or normal"
            )))
        }
    })
}

#[pymethods]
impl PyInit {
    /// The dtype parameters are created in (`"float32"` or `"float64"`).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        self.with(|i| Ok(dtype_name(i.dtype())))
    }
    /// Declare the leaf `leaf` of the parameter state `path` (a bare array
    /// when `leaf` is None) with its initial value (an array or a Tensor,
    /// cast to the model's dtype). Its key is `path/leaf` (or `path`).
    #[pyo3(signature = (path, value, leaf=None))]
    fn param(&self, path: &str, value: &Bound<'_, PyAny>, leaf: Option<&str>) -> PyResult<()> {
        let v = crate::array::tensor_in(value, "value")?;
        self.with(|i| i.param(path, leaf, v))
    }
    /// Declare a hidden state with its per-sample shape (zeros at reset).
    fn hidden(&self, path: &str, shape: Vec<usize>) -> PyResult<()> {
        self.with(|i| i.hidden(path, &shape))
    }
    /// Draw initial values of `shape` from the model's seeded generator:
    /// `zeros`, `constant` (value `scale`), `kaiming_normal` (variance
    /// `scale / shape[0]`, default 2), `orthogonal` (gain, default 1),
    /// `normal` (std, default 1).
    #[pyo3(signature = (initializer, shape, scale=None))]
    fn draw(&self, initializer: &str, shape: Vec<usize>, scale: Option<f64>) -> PyResult<PyTensor> {
        let ini = self::initializer(initializer, scale)?;
        self.with(|i| {
            let dt = i.dtype();
            ini.draw(&shape, dt, i.rng())
        })
        .map(PyTensor::new)
    }
}

/// The values a step reads: parameters and the old hidden states.
struct CtxData {
    params: Vec<ParamInfo>,
    param_values: Vec<Tensor>,
    hidden: Vec<HiddenInfo>,
    hidden_values: Vec<Tensor>,
}

/// What `step(self, ctx, x)` reads and writes: parameter values, old hidden
/// values, and the new hidden values it sets.
#[pyclass(name = "StepCtx", module = "braintrace_rs", frozen)]
pub struct PyStepCtx {
    data: Arc<CtxData>,
    new: Mutex<Vec<Option<Tensor>>>,
}

impl PyStepCtx {
    fn ctx(&self) -> StepCtx<'_> {
        let d = &self.data;
        StepCtx::new(&d.params, &d.param_values, &d.hidden, &d.hidden_values)
    }
    /// Run a native model's step on this context, keeping the hidden states
    /// it sets.
    fn run(&self, m: &AnyModel, x: &Tensor) -> PyResult<Tensor> {
        let mut c = self.ctx();
        let out = m.step(&mut c, x).py()?;
        let new = c.into_new_hidden();
        let mut mine = lock(&self.new);
        for (i, (n, o)) in new.into_iter().zip(&self.data.hidden_values).enumerate() {
            if !n.ptr_eq(o) {
                mine[i] = Some(n);
            }
        }
        Ok(out)
    }
}

#[pymethods]
impl PyStepCtx {
    /// The value of the parameter leaf `key` (`"rnn/Wz/weight/weight"`).
    fn param(&self, key: &str) -> PyResult<PyTensor> {
        self.ctx().param(key).py().map(PyTensor::new)
    }
    /// The old value of the hidden state `path`.
    fn hidden(&self, path: &str) -> PyResult<PyTensor> {
        self.ctx().hidden(path).py().map(PyTensor::new)
    }
    /// Set the new value of the hidden state `path` (its shape and dtype).
    fn set_hidden(&self, path: &str, value: &Bound<'_, PyTensor>) -> PyResult<()> {
        let v = value.get().t.clone();
        self.ctx().set_hidden(path, v.clone()).py()?;
        let i = self
            .data
            .hidden
            .iter()
            .position(|h| h.path == path)
            .expect("set_hidden found it");
        lock(&self.new)[i] = Some(v);
        Ok(())
    }
}

/// A native layer (or sequence) of the library; `braintrace_rs.nn`'s
/// classes hold one. Its `init` and `step` can be called from a Python
/// model's own `init` and `step`.
#[pyclass(name = "Layer", module = "braintrace_rs", frozen)]
pub struct Layer {
    pub model: AnyModel,
    kind: &'static str,
}

pub(crate) fn layer(m: impl Model + Send + Sync + 'static, kind: &'static str) -> Layer {
    Layer {
        model: AnyModel::Layer(Arc::new(m)),
        kind,
    }
}

#[pymethods]
impl Layer {
    /// Declare the layer's parameters and hidden states.
    fn init(&self, init: &Bound<'_, PyInit>) -> PyResult<()> {
        init.get().with(|i| self.model.init(i))
    }
    /// One step of the layer on `x`, reading and writing `ctx`.
    fn step(&self, ctx: &Bound<'_, PyStepCtx>, x: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let x = crate::array::tensor_in(x, "x")?;
        ctx.get().run(&self.model, &x).map(PyTensor::new)
    }
    fn __repr__(&self) -> String {
        format!("Layer({})", self.kind)
    }
    /// `x @ W + b` through `etp_mm`; parameter state `name/weight` with
    /// leaves `weight` `(in_size, out_size)` and `bias`.
    #[staticmethod]
    #[pyo3(signature = (in_size, out_size, name, bias=true, w_init=None, weight_fn=None))]
    fn linear(
        in_size: usize,
        out_size: usize,
        name: &str,
        bias: bool,
        w_init: Option<(String, Option<f64>)>,
        weight_fn: Option<&str>,
    ) -> PyResult<Layer> {
        let mut l = Linear::new(name, in_size, out_size);
        if !bias {
            l = l.without_bias();
        }
        if let Some((n, s)) = w_init {
            l = l.with_init(initializer(&n, s)?);
        }
        l.weight_fn = elem_fn(weight_fn)?;
        Ok(layer(l, "Linear"))
    }
    /// braintrace's `GRUCell`: hidden state `name/h`, weights `Wz`, `Wr`, `Wh`.
    #[staticmethod]
    fn gru_cell(in_size: usize, out_size: usize, name: &str) -> Layer {
        layer(GruCell::new(name, in_size, out_size), "GRUCell")
    }
    /// A LIF cell with current `i` and voltage `v` (decays `beta`, `gamma`,
    /// threshold `v_th`), recurrent weights `rec`; returns its spikes.
    #[staticmethod]
    fn lif(in_size: usize, out_size: usize, beta: f64, gamma: f64, v_th: f64, name: &str) -> Layer {
        layer(
            LifCell::new(name, in_size, out_size, beta, gamma, v_th),
            "LIF",
        )
    }
    /// braintrace's `LeakyRateReadout`: `r' = decay·r + x @ W`, decay
    /// `exp(-dt/tau)` unless `decay` is given.
    #[staticmethod]
    #[pyo3(signature = (in_size, out_size, name, tau=5.0, dt=1.0, decay=None))]
    fn leaky_rate_readout(
        in_size: usize,
        out_size: usize,
        name: &str,
        tau: f64,
        dt: f64,
        decay: Option<f64>,
    ) -> Layer {
        let mut l = LeakyRateReadout::new(name, in_size, out_size, tau, dt);
        if let Some(d) = decay {
            l.decay = d;
        }
        layer(l, "LeakyRateReadout")
    }
    /// The library's `ExpSynapse`: `g' = exp(-dt/tau)·g + x`, no parameters
    /// (braintrace's `Expon`, brainpy.state's, is `spiking("Expon", ...)`).
    #[staticmethod]
    fn exp_synapse(size: usize, name: &str, tau: f64, dt: f64) -> Layer {
        layer(ExpSynapse::new(name, size, tau, dt), "ExpSynapse")
    }
    /// An element-wise trainable `weight_fn(w)` through `etp_elemwise`;
    /// its step returns the value (the input is ignored).
    #[staticmethod]
    #[pyo3(signature = (shape, name, weight_fn=None))]
    fn element_wise(shape: Vec<usize>, name: &str, weight_fn: Option<&str>) -> PyResult<Layer> {
        Ok(layer(
            ElementWiseParam::new(name, &shape, elem_fn(weight_fn)?),
            "ElementWiseParam",
        ))
    }
    /// A recurrent cell of the zoo by braintrace's class name (`kind`:
    /// `VanillaRNNCell`, `MGUCell`, `LSTMCell`, `URLSTMCell`,
    /// `MinimalRNNCell`, `MiniGRU`, `MiniLSTM`, `CFNCell`, `LRUCell`).
    #[staticmethod]
    fn rnn_cell(kind: &str, in_size: usize, out_size: usize, name: &str) -> PyResult<Layer> {
        crate::zoo::rnn_cell(kind, in_size, out_size, name)
    }
    /// A spiking neuron, synapse or short-term plasticity layer by kind
    /// (`IF`, `LIFNeuron`, `ALIF`, `Expon`, `Alpha`, `DualExpon`, `STD`, `STP`).
    #[staticmethod]
    #[pyo3(signature = (kind, size, name, tau, tau2=0.0, u=0.0, dt=1.0))]
    fn spiking(
        kind: &str,
        size: usize,
        name: &str,
        tau: f64,
        tau2: f64,
        u: f64,
        dt: f64,
    ) -> PyResult<Layer> {
        crate::zoo::spiking(kind, size, name, tau, tau2, u, dt)
    }
    /// `models` applied one after another (each a layer or Python model).
    #[staticmethod]
    fn sequential(models: Vec<Bound<'_, PyAny>>) -> PyResult<Layer> {
        let ms = models.iter().map(model_in).collect::<PyResult<Vec<_>>>()?;
        Ok(Layer {
            model: AnyModel::Seq(ms),
            kind: "Sequential",
        })
    }
}
