//! Model state: parameters and hidden states addressed by path, the
//! [`Model`] trait a recurrent network implements, and the [`StepCtx`] its
//! one-step function reads and writes.
//!
//! Paths follow braintrace's naming: a parameter *state* has a path such as
//! `rnn/Wz/weight` and holds one or more leaves (`weight`, `bias`); a leaf is
//! addressed by its *key*, the state path plus `/<leaf>` (`rnn/Wz/weight/bias`),
//! or the bare state path when the state holds a single array (`readout/W`).
//! Hidden states are addressed by their path (`rnn/h`) and carry a leading
//! batch axis once reset to a batch size.

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// Tensors keyed by parameter key (`rnn/Wz/weight/weight`) or hidden path.
pub type TensorDict = BTreeMap<String, Tensor>;

/// Join path segments with `/`, skipping empty ones.
pub fn join_path(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}/{name}"),
    }
}

/// One trainable leaf.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    /// The key gradients and optimisers use (`rnn/Wz/weight/bias`).
    pub key: String,
    /// The parameter state's path (`rnn/Wz/weight`).
    pub state_path: String,
    /// The leaf name inside the state (`bias`), `None` for a bare array.
    pub leaf: Option<String>,
}

/// One hidden state.
#[derive(Clone, Debug, PartialEq)]
pub struct HiddenInfo {
    /// Its path (`rnn/h`).
    pub path: String,
    /// The per-sample shape (without the batch axis).
    pub shape: Vec<usize>,
    /// The value every element starts from on a reset (0 unless declared
    /// with [`Init::hidden_filled`]: a synapse's available resources start at 1).
    pub fill: f64,
}

/// What a model declares when it is set up: its parameters with initial
/// values and its hidden states. Passed to [`Model::init`].
pub struct Init {
    dtype: DType,
    rng: crate::random::Rng,
    params: Vec<(ParamInfo, Tensor)>,
    hidden: Vec<HiddenInfo>,
}

impl Init {
    /// A declaration context for values of `dtype`, drawing from a seeded RNG.
    pub fn new(dtype: DType, seed: u64) -> Self {
        Init {
            dtype,
            rng: crate::random::Rng::seed(seed),
            params: Vec::new(),
            hidden: Vec::new(),
        }
    }
    /// The dtype parameters and states are created in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The random number generator initialisers draw from.
    pub fn rng(&mut self) -> &mut crate::random::Rng {
        &mut self.rng
    }
    /// Declare a leaf `leaf` of the parameter state `state_path` (or a bare
    /// array when `leaf` is `None`) with its initial value.
    pub fn param(&mut self, state_path: &str, leaf: Option<&str>, value: Tensor) -> Result<()> {
        let key = match leaf {
            Some(l) => join_path(state_path, l),
            None => state_path.to_string(),
        };
        if key.is_empty() {
            return Err(Error::invalid(
                "Init::param",
                "a parameter needs a non-empty path",
            ));
        }
        if self.params.iter().any(|(p, _)| p.key == key) {
            return Err(Error::invalid(
                "Init::param",
                format!("parameter `{key}` is declared twice"),
            ));
        }
        let value = value.cast(self.dtype)?;
        self.params.push((
            ParamInfo {
                key,
                state_path: state_path.to_string(),
                leaf: leaf.map(str::to_string),
            },
            value,
        ));
        Ok(())
    }
    /// Declare a hidden state with its per-sample shape (initialised to zeros).
    pub fn hidden(&mut self, path: &str, shape: &[usize]) -> Result<()> {
        self.hidden_filled(path, shape, 0.0)
    }
    /// Declare a hidden state whose every element starts from `fill`.
    pub fn hidden_filled(&mut self, path: &str, shape: &[usize], fill: f64) -> Result<()> {
        if path.is_empty() {
            return Err(Error::invalid(
                "Init::hidden",
                "a hidden state needs a non-empty path",
            ));
        }
        if self.hidden.iter().any(|h| h.path == path) {
            return Err(Error::invalid(
                "Init::hidden",
                format!("hidden state `{path}` is declared twice"),
            ));
        }
        self.hidden.push(HiddenInfo {
            path: path.to_string(),
            shape: shape.to_vec(),
            fill,
        });
        Ok(())
    }
}

/// A recurrent model: it declares its parameters and hidden states once and
/// computes one time step with [`Tensor`] ops and ETP ops.
///
/// The step reads parameters and old hidden states from the [`StepCtx`],
/// writes the new hidden states back and returns the step's output. It must
/// be a pure function of what it reads (it is traced into a graph).
pub trait Model {
    /// Declare parameters (with initial values) and hidden states.
    fn init(&self, init: &mut Init) -> Result<()>;
    /// Compute one step.
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor>;
    /// Compute one step on several inputs (braintrace's `update(*args)`):
    /// an input and a per-step modulator, two input streams of different
    /// widths. A learner compiled with several example inputs
    /// ([`compile_with`](super::compile_with)) calls this with them in
    /// order; with one input the learner calls [`step`](Self::step).
    ///
    /// The default takes one input and runs `step`; more are refused with
    /// an error naming the count. A model of several inputs overrides it
    /// (and may write its `step` as `self.step_inputs(ctx,
    /// std::slice::from_ref(x))`, which then refuses a single input).
    fn step_inputs(&self, ctx: &mut StepCtx, xs: &[Tensor]) -> Result<Tensor> {
        match xs {
            [x] => self.step(ctx, x),
            _ => Err(Error::invalid(
                "Model::step_inputs",
                format!(
                    "xs: this model's step takes 1 input, {} were given (a model of several inputs implements `Model::step_inputs`)",
                    xs.len()
                ),
            )),
        }
    }
}

/// What a [`Model::step`] reads and writes: parameter values, old hidden
/// values, and the new hidden values it sets.
pub struct StepCtx<'a> {
    params: &'a [ParamInfo],
    param_values: &'a [Tensor],
    hidden: &'a [HiddenInfo],
    hidden_values: &'a [Tensor],
    new_hidden: Vec<Option<Tensor>>,
}

impl<'a> StepCtx<'a> {
    /// A context over parameter and hidden values (in declaration order).
    pub fn new(
        params: &'a [ParamInfo],
        param_values: &'a [Tensor],
        hidden: &'a [HiddenInfo],
        hidden_values: &'a [Tensor],
    ) -> Self {
        StepCtx {
            params,
            param_values,
            hidden,
            hidden_values,
            new_hidden: vec![None; hidden.len()],
        }
    }
    /// The parameter declarations and their values, in declaration order
    /// (for a binding that hands the step to code that cannot borrow the
    /// context, such as a model written in Python).
    pub fn params(&self) -> (&'a [ParamInfo], &'a [Tensor]) {
        (self.params, self.param_values)
    }
    /// The hidden-state declarations and their old values, in declaration
    /// order.
    pub fn hidden_states(&self) -> (&'a [HiddenInfo], &'a [Tensor]) {
        (self.hidden, self.hidden_values)
    }
    /// The value of the parameter leaf `key` (`rnn/Wz/weight/weight`).
    pub fn param(&self, key: &str) -> Result<Tensor> {
        let i = find(
            self.params.iter().map(|p| p.key.as_str()),
            key,
            "parameter",
            "Model::step",
        )?;
        Ok(self.param_values[i].clone())
    }
    fn hidden_index(&self, path: &str) -> Result<usize> {
        find(
            self.hidden.iter().map(|h| h.path.as_str()),
            path,
            "hidden state",
            "Model::step",
        )
    }
    /// The old value of the hidden state `path`.
    pub fn hidden(&self, path: &str) -> Result<Tensor> {
        Ok(self.hidden_values[self.hidden_index(path)?].clone())
    }
    /// Set the new value of the hidden state `path` (same shape and dtype as
    /// the old one).
    pub fn set_hidden(&mut self, path: &str, value: Tensor) -> Result<()> {
        let i = self.hidden_index(path)?;
        let old = &self.hidden_values[i];
        if value.shape() != old.shape() || value.dtype() != old.dtype() {
            return Err(Error::shapes(
                "Model::step",
                [value.shape(), old.shape()],
                format!(
                    "hidden state `{path}` must keep its shape and dtype: new {} vs old {}",
                    value.aval(),
                    old.aval()
                ),
            ));
        }
        self.new_hidden[i] = Some(value);
        Ok(())
    }
    /// The new hidden values (old values where the step set none).
    pub fn into_new_hidden(self) -> Vec<Tensor> {
        self.new_hidden
            .into_iter()
            .zip(self.hidden_values)
            .map(|(n, o)| n.unwrap_or_else(|| o.clone()))
            .collect()
    }
}

/// The position of `name` among `names`, or an error from `op` listing them.
fn find<'s>(
    names: impl Iterator<Item = &'s str> + Clone,
    name: &str,
    what: &str,
    op: &str,
) -> Result<usize> {
    names.clone().position(|n| n == name).ok_or_else(|| {
        Error::invalid(
            op,
            format!("no {what} `{name}` (declared: {})", list(names)),
        )
    })
}

/// The dtype rule of every entry point that takes a float tensor from the
/// user (a step's input, a parameter, a hidden state, a gradient): `f32`
/// and `f64` are accepted (and cast to the model's dtype); integer and bool
/// tensors are refused with this one [`Error::DType`] naming `op` and the
/// argument `what`.
///
/// ```
/// use braintrace_core::learn::float_dtype;
/// use braintrace_core::DType;
/// assert!(float_dtype("ModelState::advance", "input `x`", DType::F64).is_ok());
/// let e = float_dtype("ModelState::advance", "input `x`", DType::I64).unwrap_err();
/// assert_eq!(
///     e.to_string(),
///     "ModelState::advance: dtype mismatch: input `x` is i64, expected f32 or f64 (a float tensor: cast to the model's dtype)"
/// );
/// ```
pub fn float_dtype(op: &str, what: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::dtype_with(
            op,
            what,
            DType::FLOATS,
            dtype,
            "a float tensor: cast to the model's dtype",
        ))
    }
}

/// `x` cast to `dtype` under the rule of [`float_dtype`].
pub fn float_input(op: &str, what: &str, x: &Tensor, dtype: DType) -> Result<Tensor> {
    float_dtype(op, what, x.dtype())?;
    x.cast(dtype)
}

/// Replace `slot` by `value` cast to `dtype`, refusing a change of shape, a
/// non-float dtype and a NaN or an infinity.
fn replace_checked(
    slot: &mut Tensor,
    value: &Tensor,
    dtype: DType,
    op: &str,
    what: &str,
    key: &str,
) -> Result<()> {
    if value.shape() != slot.shape() {
        return Err(Error::shapes(
            op,
            [value.shape(), slot.shape()],
            format!("{what} `{key}` keeps its shape: new (first) vs old (second)"),
        ));
    }
    let value = float_input(op, &format!("{what} `{key}`"), value, dtype)?;
    super::check_finite(op, what, key, &value)?;
    *slot = value;
    Ok(())
}

fn list<'s>(it: impl Iterator<Item = &'s str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// A model's parameter and hidden values, with their declarations.
#[derive(Clone, Debug)]
pub struct ModelState {
    dtype: DType,
    params: Vec<ParamInfo>,
    param_values: Vec<Tensor>,
    hidden: Vec<HiddenInfo>,
    hidden_values: Vec<Tensor>,
    batch: Option<usize>,
}

impl ModelState {
    /// Declare `model`'s parameters (initialised from `seed`) and hidden
    /// states (zeros, with a leading batch axis when `batch` is given).
    pub fn new<M: Model + ?Sized>(
        model: &M,
        dtype: DType,
        seed: u64,
        batch: Option<usize>,
    ) -> Result<Self> {
        if !dtype.is_float() {
            return Err(Error::dtype_with(
                "ModelState::new",
                "dtype",
                DType::FLOATS,
                dtype,
                "the model state's dtype",
            ));
        }
        let mut init = Init::new(dtype, seed);
        model.init(&mut init)?;
        let (params, param_values) = init.params.into_iter().unzip();
        let mut s = ModelState {
            dtype,
            params,
            param_values,
            hidden: init.hidden,
            hidden_values: Vec::new(),
            batch,
        };
        s.reset_hidden(batch)?;
        Ok(s)
    }
    /// The dtype of every parameter and state.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The batch size hidden states were reset to.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }
    /// Parameter declarations, in declaration order.
    pub fn param_infos(&self) -> &[ParamInfo] {
        &self.params
    }
    /// Parameter values, parallel to [`ModelState::param_infos`].
    pub fn param_values(&self) -> &[Tensor] {
        &self.param_values
    }
    /// Hidden-state declarations, in declaration order.
    pub fn hidden_infos(&self) -> &[HiddenInfo] {
        &self.hidden
    }
    /// Hidden values, parallel to [`ModelState::hidden_infos`].
    pub fn hidden_values(&self) -> &[Tensor] {
        &self.hidden_values
    }
    /// All parameters keyed by leaf key.
    pub fn params(&self) -> TensorDict {
        self.params
            .iter()
            .zip(&self.param_values)
            .map(|(p, v)| (p.key.clone(), v.clone()))
            .collect()
    }
    /// All hidden states keyed by path.
    pub fn hidden(&self) -> TensorDict {
        self.hidden
            .iter()
            .zip(&self.hidden_values)
            .map(|(h, v)| (h.path.clone(), v.clone()))
            .collect()
    }
    fn param_index(&self, key: &str) -> Result<usize> {
        find(
            self.params.iter().map(|p| p.key.as_str()),
            key,
            "parameter",
            "ModelState",
        )
    }
    /// The value of parameter `key`.
    pub fn param(&self, key: &str) -> Result<&Tensor> {
        Ok(&self.param_values[self.param_index(key)?])
    }
    /// Replace parameter `key` (same shape, a float dtype, cast to the
    /// state's dtype; NaN and infinities are refused). Nothing changes on
    /// error.
    pub fn set_param(&mut self, key: &str, value: &Tensor) -> Result<()> {
        let i = self.param_index(key)?;
        replace_checked(
            &mut self.param_values[i],
            value,
            self.dtype,
            "ModelState::set_param",
            "parameter",
            key,
        )
    }
    /// Replace several parameters at once; nothing changes if any is wrong.
    pub fn set_params(&mut self, values: &TensorDict) -> Result<()> {
        let mut next = self.clone();
        for (k, v) in values {
            next.set_param(k, v)?;
        }
        *self = next;
        Ok(())
    }
    fn hidden_index(&self, path: &str) -> Result<usize> {
        find(
            self.hidden.iter().map(|h| h.path.as_str()),
            path,
            "hidden state",
            "ModelState",
        )
    }
    /// The current value of hidden state `path`.
    pub fn hidden_value(&self, path: &str) -> Result<&Tensor> {
        Ok(&self.hidden_values[self.hidden_index(path)?])
    }
    /// Replace hidden state `path` (same shape, a float dtype, cast to the
    /// state's dtype; NaN and infinities are refused). Nothing changes on
    /// error.
    pub fn set_hidden(&mut self, path: &str, value: &Tensor) -> Result<()> {
        let i = self.hidden_index(path)?;
        replace_checked(
            &mut self.hidden_values[i],
            value,
            self.dtype,
            "ModelState::set_hidden",
            "hidden state",
            path,
        )
    }
    /// Replace every hidden value (declaration order), as returned by a step.
    pub(crate) fn replace_hidden(&mut self, values: Vec<Tensor>) {
        debug_assert_eq!(values.len(), self.hidden_values.len());
        self.hidden_values = values;
    }
    /// Reset every hidden state to zeros, with a leading batch axis of size
    /// `batch` when given. A batch of 0, or one whose states do not fit in
    /// memory ([`Error::Allocation`] naming the state), is an error, and
    /// nothing changes.
    pub fn reset_hidden(&mut self, batch: Option<usize>) -> Result<()> {
        if batch == Some(0) {
            return Err(Error::invalid(
                "reset_hidden",
                "the batch size must be at least 1",
            ));
        }
        let values = self
            .hidden
            .iter()
            .map(|h| {
                let mut shape: Vec<usize> = batch.into_iter().collect();
                shape.extend_from_slice(&h.shape);
                let op = format!("ModelState::reset_hidden: hidden state `{}`", h.path);
                Tensor::try_full(&op, &shape, h.fill, self.dtype)
            })
            .collect::<Result<Vec<_>>>()?;
        self.batch = batch;
        self.hidden_values = values;
        Ok(())
    }
    /// Run one step of `model` eagerly: the output and the new hidden values
    /// (the state itself is not changed). `x` follows the rule of
    /// [`float_dtype`]: a float input is cast to the state's dtype, an
    /// integer or bool one is refused.
    pub fn step<M: Model + ?Sized>(&self, model: &M, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let x = float_input("ModelState::step", "input `x`", x, self.dtype)?;
        step_values(
            model,
            &self.params,
            &self.param_values,
            &self.hidden,
            &self.hidden_values,
            &x,
        )
    }
    /// Run one step and keep the new hidden values; returns the output.
    pub fn advance<M: Model + ?Sized>(&mut self, model: &M, x: &Tensor) -> Result<Tensor> {
        let (out, h) = self.step(model, x)?;
        self.hidden_values = h;
        Ok(out)
    }
}

/// Run `model.step` on explicit values (concrete or symbolic).
pub fn step_values<M: Model + ?Sized>(
    model: &M,
    params: &[ParamInfo],
    param_values: &[Tensor],
    hidden: &[HiddenInfo],
    hidden_values: &[Tensor],
    x: &Tensor,
) -> Result<(Tensor, Vec<Tensor>)> {
    let mut ctx = StepCtx::new(params, param_values, hidden, hidden_values);
    let out = model.step(&mut ctx, x)?;
    Ok((out, ctx.into_new_hidden()))
}
