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

/// The initialiser `name` with an optional `scale`: `zeros`, `constant`
/// (the value), `kaiming_normal` (variance numerator, default 2; untruncated,
/// `fan_in = shape[0]`), `orthogonal` (gain), `normal` (std), and
/// brainstate's variance-scaling ones `xavier_normal`, `xavier_uniform`,
/// `kaiming_uniform`, `kaiming_truncated_normal`, `lecun_normal`,
/// `lecun_uniform` (`scale` replaces the variance numerator), plus
/// `truncated_normal` (std, truncated to two std), `uniform` (`[0, scale)`,
/// default 1) and `identity` (the diagonal's value, default 1).
pub(crate) fn initializer(name: &str, scale: Option<f64>) -> PyResult<Initializer> {
    let vs = |i: Initializer| match (i, scale) {
        (
            Initializer::VarianceScaling {
                mode, distribution, ..
            },
            Some(s),
        ) => Initializer::VarianceScaling {
            scale: s,
            mode,
            distribution,
        },
        (i, _) => i,
    };
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
        "xavier_normal" => vs(Initializer::xavier_normal()),
        "xavier_uniform" => vs(Initializer::xavier_uniform()),
        "kaiming_uniform" => vs(Initializer::kaiming_uniform()),
        "kaiming_truncated_normal" => vs(Initializer::kaiming_truncated_normal()),
        "lecun_normal" => vs(Initializer::lecun_normal()),
        "lecun_uniform" => vs(Initializer::lecun_uniform()),
        "truncated_normal" => {
            let std = scale.unwrap_or(1.0);
            Initializer::TruncatedNormal {
                mean: 0.0,
                std,
                lower: -2.0 * std,
                upper: 2.0 * std,
            }
        }
        "uniform" => Initializer::Uniform {
            min: 0.0,
            max: scale.unwrap_or(1.0),
        },
        "identity" => Initializer::Identity {
            value: scale.unwrap_or(1.0),
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown initializer {other:?}; use one of {INITIALIZERS:?}"
            )))
        }
    })
}

/// The initialiser names [`initializer`] knows.
pub const INITIALIZERS: [&str; 14] = [
    "zeros",
    "constant",
    "kaiming_normal",
    "orthogonal",
    "normal",
    "xavier_normal",
    "xavier_uniform",
    "kaiming_uniform",
    "kaiming_truncated_normal",
    "lecun_normal",
    "lecun_uniform",
    "truncated_normal",
    "uniform",
    "identity",
];

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
    /// `normal` (std, default 1), and brainstate's `xavier_normal`,
    /// `xavier_uniform`, `kaiming_uniform`, `kaiming_truncated_normal`,
    /// `lecun_normal`, `lecun_uniform` (`scale` the variance numerator),
    /// `truncated_normal` (std), `uniform` (`[0, scale)`), `identity`.
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
    /// A `Dropout` layer's handle on its training flag.
    pub(crate) dropout: Option<braintrace_core::nn::Dropout>,
}

pub(crate) fn layer(m: impl Model + Send + Sync + 'static, kind: &'static str) -> Layer {
    Layer {
        model: AnyModel::Layer(Arc::new(m)),
        kind,
        dropout: None,
    }
}

impl Layer {
    fn dropout_handle(&self) -> PyResult<&braintrace_core::nn::Dropout> {
        self.dropout.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "`training`: Layer({}) has no training mode (only Dropout has)",
                self.kind
            ))
        })
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
    /// A `Dropout` layer's mode: training (drops) or evaluating (the
    /// identity). A learner traces its step when it is compiled, so it
    /// keeps the mode the layer had then. Other layers have no mode.
    #[getter]
    fn training(&self) -> PyResult<bool> {
        self.dropout_handle().map(|d| d.training())
    }
    #[setter]
    fn set_training(&self, on: bool) -> PyResult<()> {
        self.dropout_handle().map(|d| d.set_training(on))
    }
    /// `x @ W + b` through `etp_mm`; parameter state `name/weight` with
    /// leaves `weight` `(in_size, out_size)` and `bias`; `w_mask` (an array
    /// broadcasting to the weight) multiplies the weight inside `etp_mm`.
    #[staticmethod]
    #[pyo3(signature = (in_size, out_size, name, bias=true, w_init=None, weight_fn=None, w_mask=None))]
    #[allow(clippy::too_many_arguments)]
    fn linear(
        in_size: usize,
        out_size: usize,
        name: &str,
        bias: bool,
        w_init: Option<(String, Option<f64>)>,
        weight_fn: Option<&str>,
        w_mask: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Layer> {
        let mut l = Linear::new(name, in_size, out_size);
        if let Some(m) = w_mask {
            l = l.with_mask(&crate::array::tensor_in(m, "w_mask")?).py()?;
        }
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
    /// An activation layer by brainstate's class name (`ReLU`, `GELU`,
    /// `LeakyReLU`, ...; case-insensitive) with its hyperparameters as
    /// keywords (`alpha`, `approximate`, `negative_slope`, `min_val`,
    /// `max_val`, `lambd`, `threshold`, `value`, `axis`/`dim`, `b`).
    #[staticmethod]
    #[pyo3(signature = (kind, **params))]
    fn activation(
        py: Python<'_>,
        kind: &str,
        params: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<Layer> {
        crate::blocks::activation(py, kind, params)
    }
    /// brainstate's `PReLU`: `num_parameters` trainable slopes (bare
    /// parameter `name/weight`) starting at `init`.
    #[staticmethod]
    #[pyo3(signature = (num_parameters, name, init=0.25))]
    fn prelu(num_parameters: usize, name: &str, init: f64) -> Layer {
        crate::blocks::prelu(num_parameters, init, name)
    }
    /// `LayerNorm`, `RMSNorm` or `GroupNorm` (`kind`) over `features` on the
    /// last axis (`num_groups` for `GroupNorm` only).
    #[staticmethod]
    #[pyo3(signature = (kind, features, name, eps=1e-6, num_groups=1, use_scale=true, use_bias=true))]
    fn norm(
        kind: &str,
        features: usize,
        name: &str,
        eps: f64,
        num_groups: usize,
        use_scale: bool,
        use_bias: bool,
    ) -> PyResult<Layer> {
        crate::blocks::norm(kind, features, name, eps, num_groups, use_scale, use_bias)
    }
    /// brainstate's `Dropout` with keep probability `prob` (in `(0, 1]`),
    /// its mask hashed with `seed`; training until `training` is set off.
    #[staticmethod]
    #[pyo3(signature = (prob, seed=0))]
    fn dropout(prob: f64, seed: u64) -> PyResult<Layer> {
        crate::blocks::dropout(prob, seed)
    }
    /// `MaxPool1d`, `MaxPool2d`, `AvgPool1d` or `AvgPool2d` (`kind`) over the
    /// spatial axes before the channel axis; `stride` defaults to the
    /// kernel, `padding` positions on both sides of each spatial axis.
    #[staticmethod]
    #[pyo3(signature = (kind, kernel_size, stride=None, padding=0))]
    fn pool(
        kind: &str,
        kernel_size: Vec<usize>,
        stride: Option<Vec<usize>>,
        padding: usize,
    ) -> PyResult<Layer> {
        crate::blocks::pool(kind, kernel_size, stride, padding)
    }
    /// brainstate's `Flatten`: per-sample axes `start_axis ..= end_axis` of
    /// a sample of rank `in_rank` merged into one.
    #[staticmethod]
    #[pyo3(signature = (in_rank, start_axis=0, end_axis=-1))]
    fn flatten(in_rank: usize, start_axis: isize, end_axis: isize) -> PyResult<Layer> {
        crate::blocks::flatten(in_rank, start_axis, end_axis)
    }
    /// brainstate's `Unflatten`: axis `axis` (negative from the end) split
    /// into `sizes`.
    #[staticmethod]
    fn unflatten(axis: isize, sizes: Vec<usize>) -> Layer {
        crate::blocks::unflatten(axis, sizes)
    }
    /// braintrace's `SignedWLinear`: `x @ (|W| * w_sign)`, bare weight
    /// `name/weight`.
    #[staticmethod]
    #[pyo3(signature = (in_size, out_size, name, w_sign=None, w_init=None))]
    fn signed_w_linear(
        in_size: usize,
        out_size: usize,
        name: &str,
        w_sign: Option<&Bound<'_, PyAny>>,
        w_init: Option<(String, Option<f64>)>,
    ) -> PyResult<Layer> {
        crate::blocks::signed_w_linear(in_size, out_size, name, w_sign, w_init)
    }
    /// braintrace's `ScaledWSLinear`: weight standardisation inside
    /// `etp_mm`, state `name/weight` with leaves `weight`, `bias`, `gain`.
    #[staticmethod]
    #[pyo3(signature = (in_size, out_size, name, bias=true, ws_gain=true, eps=1e-4, w_mask=None, w_init=None))]
    #[allow(clippy::too_many_arguments)]
    fn scaled_ws_linear(
        in_size: usize,
        out_size: usize,
        name: &str,
        bias: bool,
        ws_gain: bool,
        eps: f64,
        w_mask: Option<&Bound<'_, PyAny>>,
        w_init: Option<(String, Option<f64>)>,
    ) -> PyResult<Layer> {
        crate::blocks::scaled_ws_linear(in_size, out_size, name, bias, ws_gain, eps, w_mask, w_init)
    }
    /// braintrace's `SparseLinear` on the non-zero pattern of the dense
    /// `(n_in, n_out)` array `spar_mat` (its values the initial data):
    /// state `name/weight` with `weight` `(nnz,)` and, with `b_init`, `bias`.
    #[staticmethod]
    #[pyo3(signature = (spar_mat, name, b_init=None))]
    fn sparse_linear(
        spar_mat: &Bound<'_, PyAny>,
        name: &str,
        b_init: Option<(String, Option<f64>)>,
    ) -> PyResult<Layer> {
        crate::blocks::sparse_linear(spar_mat, name, b_init)
    }
    /// braintrace's `LoRA` without a base module: `(1/r) x @ A @ B`, state
    /// `name/weight` with leaves `lora_a`, `lora_b`.
    #[staticmethod]
    #[pyo3(signature = (in_features, lora_rank, out_features, name, kernel_init=None))]
    fn lora(
        in_features: usize,
        lora_rank: usize,
        out_features: usize,
        name: &str,
        kernel_init: Option<(String, Option<f64>)>,
    ) -> PyResult<Layer> {
        crate::blocks::lora(in_features, lora_rank, out_features, name, kernel_init)
    }
    /// braintrace's `Conv1d`/`Conv2d`/`Conv3d` (`dims` spatial axes) on
    /// `etp_conv`, channel-last unless `channel_first`; state `name/weight`
    /// with `weight` and, with `b_init`, `bias`.
    #[staticmethod]
    #[pyo3(signature = (dims, in_size, out_channels, kernel_size, name, stride, padding, lhs_dilation, rhs_dilation, groups=1, w_init=None, b_init=None, channel_first=false))]
    #[allow(clippy::too_many_arguments)]
    fn conv(
        dims: usize,
        in_size: Vec<usize>,
        out_channels: usize,
        kernel_size: Vec<usize>,
        name: &str,
        stride: Vec<usize>,
        padding: &Bound<'_, PyAny>,
        lhs_dilation: Vec<usize>,
        rhs_dilation: Vec<usize>,
        groups: usize,
        w_init: Option<(String, Option<f64>)>,
        b_init: Option<(String, Option<f64>)>,
        channel_first: bool,
    ) -> PyResult<Layer> {
        let o = crate::blocks::ConvOpts {
            stride,
            padding,
            lhs_dilation,
            rhs_dilation,
            groups,
            w_init,
            b_init,
            channel_first,
        };
        crate::blocks::conv(dims, in_size, out_channels, kernel_size, name, o)
    }
    /// braintrace's `GroupedLinear`: `num_groups` blocks of `in_features ->
    /// out_features`, state `name/weight` with `weight` `(G, K, N)`, `bias`.
    #[staticmethod]
    #[pyo3(signature = (num_groups, in_features, out_features, name, bias=true, w_init=None))]
    fn grouped_linear(
        num_groups: usize,
        in_features: usize,
        out_features: usize,
        name: &str,
        bias: bool,
        w_init: Option<(String, Option<f64>)>,
    ) -> PyResult<Layer> {
        crate::blocks::grouped_linear(num_groups, in_features, out_features, name, bias, w_init)
    }
    /// braintrace's `Embedding`: a trainable table `name/weight`
    /// `(num_embeddings, embedding_size)`, indices (floats holding integers)
    /// in.
    #[staticmethod]
    fn embedding(num_embeddings: usize, embedding_size: usize, name: &str) -> PyResult<Layer> {
        crate::blocks::embedding(num_embeddings, embedding_size, name)
    }
    /// `models` applied one after another (each a layer or Python model).
    #[staticmethod]
    fn sequential(models: Vec<Bound<'_, PyAny>>) -> PyResult<Layer> {
        let ms = models.iter().map(model_in).collect::<PyResult<Vec<_>>>()?;
        Ok(Layer {
            model: AnyModel::Seq(ms),
            kind: "Sequential",
            dropout: None,
        })
    }
}
