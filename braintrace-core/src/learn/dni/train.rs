//! Fitting DNI's synthesiser (braintrace's `train_synthetic_gradient`):
//! the learner is driven window by window over a sequence, and after each
//! window the synthesiser takes one optimiser step on the regression of
//! its estimate at the window's entering hidden states against their
//! cotangent — the window's own losses and the synthesiser's estimate at
//! the window's exit, pushed back through the window (the bootstrapped
//! target). The model's parameters do not move; its hidden states and
//! traces advance as in `etrace_grad`.

use super::{last_entry, Dni, SyntheticGradient};
use crate::error::{Error, Result};
use crate::learn::shared::stack_last;
use crate::learn::{EtraceOpts, Learner, Model, Reduction, TensorDict};
use crate::tensor::Tensor;

const OP: &str = "train_synthetic_gradient";

/// Options of [`train_synthetic_gradient`] (braintrace's keywords).
///
/// ```
/// use braintrace_core::learn::SgTrainOpts;
/// let o = SgTrainOpts::new().chunk_size(4).lr(0.05).epochs(3);
/// assert_eq!((o.get_chunk_size(), o.get_epochs()), (4, 3));
/// ```
#[derive(Clone, Debug)]
pub struct SgTrainOpts {
    chunk_size: usize,
    lr: f64,
    epochs: usize,
    reset: bool,
    batch_size: Option<Option<usize>>,
}

impl Default for SgTrainOpts {
    fn default() -> Self {
        SgTrainOpts {
            chunk_size: 1,
            lr: 1e-2,
            epochs: 1,
            reset: true,
            batch_size: None,
        }
    }
}

impl SgTrainOpts {
    /// braintrace's defaults: windows of one step, learning rate 0.01, one
    /// epoch, the learner reset before each epoch at its own batch size.
    pub fn new() -> Self {
        Self::default()
    }
    /// Steps per window. It must be the window the learner will be driven
    /// with (`EtraceOpts::chunk_size`): the synthesiser predicts the future
    /// at a window's exit, and that future depends on the window's length.
    pub fn chunk_size(mut self, k: usize) -> Self {
        self.chunk_size = k;
        self
    }
    /// The learning rate of the built-in SGD step
    /// ([`train_synthetic_gradient`]; ignored by
    /// [`train_synthetic_gradient_with`]).
    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }
    /// Passes over the sequence.
    pub fn epochs(mut self, n: usize) -> Self {
        self.epochs = n;
        self
    }
    /// Whether the hidden states, traces and step counter are reset before
    /// each epoch (default `true`).
    pub fn reset(mut self, on: bool) -> Self {
        self.reset = on;
        self
    }
    /// The batch size of that reset (default: the learner's own).
    pub fn batch_size(mut self, b: Option<usize>) -> Self {
        self.batch_size = Some(b);
        self
    }
    /// Steps per window.
    pub fn get_chunk_size(&self) -> usize {
        self.chunk_size
    }
    /// Passes over the sequence.
    pub fn get_epochs(&self) -> usize {
        self.epochs
    }
}

/// Fit the synthesiser of a DNI learner with plain SGD
/// (`w ← w − lr · ∂err/∂w`, braintrace's default): see
/// [`train_synthetic_gradient_with`].
///
/// ```
/// use braintrace_core::learn::{compile, train_synthetic_gradient, Dni, ModelState, SgTrainOpts, SyntheticGradient};
/// use braintrace_core::nn::GruCell;
/// use braintrace_core::{DType, Tensor};
///
/// let dni = Dni::new();
/// let model = GruCell::new("rnn", 2, 3);
/// let state = ModelState::new(&model, DType::F64, 0, Some(1))?;
/// let mut learner = compile(model, state, dni.clone(), &Tensor::zeros(&[1, 2], DType::F64), Some(1))?;
/// dni.attach_synthesizer(SyntheticGradient::for_graph(learner.graph(), DType::F64)?);
/// let xs = Tensor::ones(&[4, 1, 2], DType::F64);
/// let loss = |o: &Tensor, _: &[Tensor]| o.square()?.sum_all();
/// let history = train_synthetic_gradient(&mut learner, &xs, &[], loss, &SgTrainOpts::new().chunk_size(2).epochs(2))?;
/// assert_eq!(history.len(), 2);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn train_synthetic_gradient<M, L>(
    learner: &mut Learner<M>,
    xs: &Tensor,
    ys: &[Tensor],
    loss: L,
    opts: &SgTrainOpts,
) -> Result<Vec<f64>>
where
    M: Model,
    L: Fn(&Tensor, &[Tensor]) -> Result<Tensor>,
{
    let lr = opts.lr;
    if !(lr.is_finite() && lr > 0.0) {
        return Err(Error::invalid(
            OP,
            format!("lr: must be finite and positive, got {lr}"),
        ));
    }
    train_synthetic_gradient_with(learner, xs, ys, loss, opts, |p, g| {
        let mut out = p.clone();
        for (k, d) in g {
            let v = out.get_mut(k).expect("a gradient of a parameter");
            *v = v.sub(&d.mul_scalar(lr)?)?;
        }
        Ok(out)
    })
}

/// Fit the synthesiser of a DNI learner (braintrace's
/// `train_synthetic_gradient`), each step by `update(params, grads) → new
/// params` over [`SyntheticGradient::params`]' names (an optimiser's
/// `update`, e.g. `|p, g| adam.update(p, g)`; its state stays the
/// caller's, as braintrace leaves the auxiliary optimiser to the caller).
///
/// Per epoch: reset the learner (unless `opts.reset` is off), then for
/// each window of `chunk_size` steps of `xs` (and of each target sequence
/// of `ys`): note the hidden states `h^a`, run the window as
/// `etrace_grad_with(.., chunk_size)` does with `loss` (summed over its
/// steps; the gradients are dropped, the parameters untouched), and fit
/// the synthesiser at `h^a` to the cotangent `∂L_{≥a}/∂h^a` the window
/// returned (its own losses plus the synthesiser's estimate at its exit,
/// bootstrapped), one `update`; finally fit it at the last hidden states
/// to zero. Returns per epoch the mean of the regression errors
/// `Σ_g mean((ĝ_g − y_g)²)` (each before its update) over every window
/// and the final pair.
///
/// `loss` and `chunk_size` must be the ones the learner will be trained
/// with: the synthesiser predicts the future of that loss at the exits of
/// windows of that length.
///
/// Errors, before anything changes: a learner whose algorithm is not
/// [`Dni`], no synthesiser attached or one of other group shapes or dtype
/// (`synthesizer`), `chunk_size` 0 or not dividing the length, an empty or
/// wrongly shaped `xs`, a target sequence of another length, a learning
/// rate that is not finite and positive (`lr`). An error of the loss or of
/// `update` surfaces at the first window, after the reset.
pub fn train_synthetic_gradient_with<M, L, U>(
    learner: &mut Learner<M>,
    xs: &Tensor,
    ys: &[Tensor],
    loss: L,
    opts: &SgTrainOpts,
    mut update: U,
) -> Result<Vec<f64>>
where
    M: Model,
    L: Fn(&Tensor, &[Tensor]) -> Result<Tensor>,
    U: FnMut(&TensorDict, &TensorDict) -> Result<TensorDict>,
{
    let dni = learner.algorithm().get::<Dni>().cloned().ok_or_else(|| {
        Error::invalid(
            OP,
            format!(
                "learner: its algorithm is `{}`, not DNI (compile with Dni::new())",
                learner.algorithm().name()
            ),
        )
    })?;
    let sg = dni.synthesizer().ok_or_else(|| {
        Error::invalid(
            OP,
            "synthesizer: none attached; attach one with \
             Dni::attach_synthesizer(SyntheticGradient::for_graph(learner.graph(), dtype)?)",
        )
    })?;
    let shapes = SyntheticGradient::group_shapes(learner.graph());
    if !sg.fits(&shapes) {
        return Err(Error::invalid(
            OP,
            format!(
                "synthesizer: made for group shapes {:?}, the learner's hidden groups are {shapes:?}",
                sg.shapes()
            ),
        ));
    }
    let dtype = learner.state().dtype();
    if sg.dtype() != dtype {
        return Err(Error::dtype_with(
            OP,
            "synthesizer",
            [dtype],
            sg.dtype(),
            "the synthesiser's parameters must have the model's dtype",
        ));
    }
    let k = opts.chunk_size;
    if k == 0 {
        return Err(Error::invalid(
            OP,
            "chunk_size: must be at least 1 (1: windows of one step)",
        ));
    }
    let t_len = learner.checked_length(xs, ys)?;
    if t_len == 0 || !t_len.is_multiple_of(k) {
        return Err(Error::invalid(
            OP,
            format!(
                "chunk_size: {k} does not divide the sequence length {t_len} into whole windows \
                 (a ragged or empty window would fit the wrong target; trim xs to {} steps)",
                t_len - t_len % k
            ),
        ));
    }
    let batch = opts.batch_size.unwrap_or(learner.state().batch());
    let groups: Vec<Vec<usize>> = learner
        .graph()
        .groups()
        .iter()
        .map(|g| g.states.clone())
        .collect();
    let slabs = |h: &[Tensor]| -> Result<Vec<Tensor>> {
        groups
            .iter()
            .map(|s| stack_last(&s.iter().map(|&i| h[i].clone()).collect::<Vec<_>>()))
            .collect()
    };
    let mut fit = |entry: &[Tensor], target: &[Tensor]| -> Result<f64> {
        let mut sg = dni
            .synthesizer()
            .ok_or_else(|| Error::invalid(OP, "synthesizer: detached during training"))?;
        let (err, grads) = sg.regression(entry, target)?;
        let new = update(&sg.params(), &grads)?;
        sg.set_params(&new)?;
        dni.attach_synthesizer(sg);
        Ok(err)
    };
    let eopts = EtraceOpts::new().chunk_size(k).reduction(Reduction::Sum);
    let mut history = Vec::with_capacity(opts.epochs);
    for _ in 0..opts.epochs {
        if opts.reset {
            learner.reset_state(batch)?;
        }
        let mut errs = Vec::with_capacity(t_len / k + 1);
        for w in 0..t_len / k {
            let entry = slabs(learner.state().hidden_values())?;
            let xw = xs.slice_axis(0, w * k, (w + 1) * k)?;
            let yw: Vec<Tensor> = ys
                .iter()
                .map(|y| y.slice_axis(0, w * k, (w + 1) * k))
                .collect::<Result<_>>()?;
            learner.etrace_grad_with(&xw, &yw, &loss, &eopts)?;
            let target = slabs(&last_entry(learner.trace_state())?)?;
            errs.push(fit(&entry, &target)?);
        }
        let last = slabs(learner.state().hidden_values())?;
        let zeros: Vec<Tensor> = last.iter().map(Tensor::zeros_like).collect();
        errs.push(fit(&last, &zeros)?);
        history.push(errs.iter().sum::<f64>() / errs.len() as f64);
    }
    Ok(history)
}
