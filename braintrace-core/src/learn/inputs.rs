//! Several inputs per step (braintrace's `update(*args)` and
//! `etrace_grad(*inputs)`): the compiled input layout ([`Inputs`]) and how
//! the learner carries several inputs through its one-input step programs.
//!
//! A learner compiled with one example input runs the model's
//! [`Model::step`] on it, as always. With several, each step's inputs are
//! checked against the examples (count, shape, dtype), flattened and
//! concatenated into one vector; the traced step ([`Packed`]) slices them
//! back out and hands them to [`Model::step_inputs`]. The step programs,
//! the traces and the algorithms see one input, so every algorithm and
//! driver option works unchanged; the relations' `x` operands are the
//! model's own inputs (the slices), as in braintrace.

use super::algorithm::Reduction;
use super::bptt::{bptt_grad, Bptt};
use super::state::{Init, Model, ModelState, StepCtx};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// The inputs a learner was compiled with: each one's shape (with the
/// batch axis when there is one).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Inputs {
    shapes: Vec<Vec<usize>>,
}

/// `xs[i]` (or `xs` for one input), for messages.
fn name(i: usize, n: usize) -> String {
    if n == 1 {
        "x".to_string()
    } else {
        format!("xs[{i}]")
    }
}

/// A concrete tensor of a float dtype (or of `dtype`).
fn check_value(op: &str, what: &str, x: &Tensor, dtype: DType) -> Result<()> {
    if x.is_symbolic() {
        return Err(Error::invalid(
            op,
            format!("{what}: must be a concrete tensor"),
        ));
    }
    if !x.dtype().is_float() && x.dtype() != dtype {
        return Err(Error::dtype_with(
            op,
            what,
            DType::FLOATS,
            x.dtype(),
            format!("shape {:?}", x.shape()),
        ));
    }
    Ok(())
}

impl Inputs {
    /// The layout of `examples` (at least one, concrete); with a batch
    /// size, each example of one axis or more has it leading (a scalar
    /// input is shared by the batch).
    pub(crate) fn new(op: &str, examples: &[&Tensor], batch: Option<usize>) -> Result<Self> {
        if examples.is_empty() {
            return Err(Error::invalid(
                op,
                "example_inputs: at least one example input is needed (one per input of the step)",
            ));
        }
        let n = examples.len();
        for (i, x) in examples.iter().enumerate() {
            let which = if n == 1 {
                String::new()
            } else {
                format!("example_inputs[{i}]: ")
            };
            if x.is_symbolic() {
                return Err(Error::invalid(
                    op,
                    format!("{which}the example input must be a concrete tensor"),
                ));
            }
            if let (Some(b), Some(&x0)) = (batch, x.shape().first()) {
                if x0 != b {
                    return Err(Error::shapes(
                        op,
                        [x.shape()],
                        format!(
                            "{which}the example input's leading axis must be the batch size {b}"
                        ),
                    ));
                }
            }
        }
        Ok(Inputs {
            shapes: examples.iter().map(|x| x.shape().to_vec()).collect(),
        })
    }

    /// How many inputs a step takes.
    pub(crate) fn count(&self) -> usize {
        self.shapes.len()
    }

    /// Whether the inputs are carried packed (several of them).
    pub(crate) fn packed(&self) -> bool {
        self.shapes.len() > 1
    }

    /// The error of a single-input entry point on a learner of several
    /// inputs (`op` and the method that takes them).
    pub(crate) fn require_one(&self, op: &str, instead: &str) -> Result<()> {
        if self.packed() {
            return Err(Error::invalid(
                op,
                format!(
                    "this learner was compiled with {} example inputs: each step takes {} inputs; call `{instead}` with them",
                    self.count(),
                    self.count()
                ),
            ));
        }
        Ok(())
    }

    /// The count of `xs` against the compiled one.
    fn check_count(&self, op: &str, xs: &[&Tensor]) -> Result<()> {
        if xs.len() != self.count() {
            return Err(Error::invalid(
                op,
                format!(
                    "xs: {} input(s) given, but this learner was compiled with {} example input(s) (one per input of the step)",
                    xs.len(),
                    self.count()
                ),
            ));
        }
        Ok(())
    }

    /// One step's inputs checked against the examples (count, each one's
    /// shape and dtype) and packed into one vector of `dtype`. One input is
    /// only cast (the one-input entry points check it).
    pub(crate) fn pack_step(&self, op: &str, xs: &[&Tensor], dtype: DType) -> Result<Tensor> {
        self.check_count(op, xs)?;
        if !self.packed() {
            return xs[0].cast(dtype);
        }
        let n = self.count();
        for (i, (x, s)) in xs.iter().zip(&self.shapes).enumerate() {
            check_value(op, &name(i, n), x, dtype)?;
            if x.shape() != &s[..] {
                return Err(Error::shapes(
                    op,
                    [x.shape(), &s[..]],
                    format!(
                        "{}: each step's input (first) must have the shape of its example input (second)",
                        name(i, n)
                    ),
                ));
            }
        }
        let parts: Vec<Tensor> = xs
            .iter()
            .map(|x| x.cast(dtype)?.reshape(&[x.size()]))
            .collect::<Result<_>>()?;
        crate::ops::concat(&parts, 0)
    }

    /// Time-major sequences `(T, *example_i.shape)`, one per input, of one
    /// length `T`, checked and packed into `(T, Σ sizes)` of `dtype`. One
    /// input is only cast (the one-input entry points check it).
    pub(crate) fn pack_sequences(&self, op: &str, xs: &[&Tensor], dtype: DType) -> Result<Tensor> {
        self.check_count(op, xs)?;
        if !self.packed() {
            return xs[0].cast(dtype);
        }
        let n = self.count();
        let t_len = xs.first().and_then(|x| x.shape().first().copied());
        for (i, (x, s)) in xs.iter().zip(&self.shapes).enumerate() {
            check_value(op, &name(i, n), x, dtype)?;
            if x.ndim() == 0 || x.shape()[1..] != s[..] {
                return Err(Error::shapes(
                    op,
                    [x.shape(), &s[..]],
                    format!(
                        "{}: must be (T, *shape of example input {i}) (the example's shape second)",
                        name(i, n)
                    ),
                ));
            }
            if Some(x.shape()[0]) != t_len {
                return Err(Error::shapes(
                    op,
                    [xs[0].shape(), x.shape()],
                    format!(
                        "{}: must have as many steps as xs[0] (T = {}, axis 0)",
                        name(i, n),
                        t_len.unwrap_or(0)
                    ),
                ));
            }
        }
        let t = t_len.unwrap_or(0);
        let parts: Vec<Tensor> = xs
            .iter()
            .map(|x| {
                let per = x.shape()[1..].iter().product::<usize>();
                x.cast(dtype)?.reshape(&[t, per])
            })
            .collect::<Result<_>>()?;
        crate::ops::concat(&parts, 1)
    }

    /// The layout at batch size `new` (from `old`): a leading batch axis
    /// replaced (added when there was none, removed for `None`); a scalar
    /// input of a batched layout stays shared.
    pub(crate) fn rebatched(&self, old: Option<usize>, new: Option<usize>) -> Inputs {
        let shapes = self
            .shapes
            .iter()
            .map(|s| {
                let per = match old {
                    Some(_) if s.is_empty() => return s.clone(),
                    Some(_) => &s[1..],
                    None => &s[..],
                };
                new.into_iter().chain(per.iter().copied()).collect()
            })
            .collect();
        Inputs { shapes }
    }

    /// An input of zeros for every example (packed when there are
    /// several), of `dtype`.
    pub(crate) fn zeros(&self, dtype: DType) -> Result<Tensor> {
        if !self.packed() {
            return Ok(Tensor::zeros(&self.shapes[0], dtype));
        }
        let z: Vec<Tensor> = self
            .shapes
            .iter()
            .map(|s| Tensor::zeros(s, dtype))
            .collect();
        self.pack_step("compile", &z.iter().collect::<Vec<_>>(), dtype)
    }

    /// The model whose one-input step takes this layout: the model itself
    /// for one input, [`Packed`] for several.
    pub(crate) fn model<'a, M: Model + ?Sized>(&'a self, model: &'a M) -> Packed<'a, M> {
        Packed {
            model,
            shapes: &self.shapes,
        }
    }
}

/// A model of several inputs seen as a model of one packed input (see the
/// module's docs); with one input it is the model itself.
pub(crate) struct Packed<'a, M: ?Sized> {
    model: &'a M,
    shapes: &'a [Vec<usize>],
}

impl<M: Model + ?Sized> Model for Packed<'_, M> {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.model.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        if self.shapes.len() <= 1 {
            return self.model.step(ctx, x);
        }
        let mut parts = Vec::with_capacity(self.shapes.len());
        let mut at = 0;
        for s in self.shapes {
            let n: usize = s.iter().product();
            parts.push(x.slice_axis(0, at, at + n)?.reshape(s)?);
            at += n;
        }
        self.model.step_inputs(ctx, &parts)
    }
}

/// [`bptt_grad`] for a model of several inputs per step: `xs` holds one
/// time-major sequence per input (`(T, *input_i)`, one length), the model
/// runs [`Model::step_inputs`] on each step's row of them. The exact
/// gradient online learners of several inputs approximate.
pub fn bptt_grad_inputs<M, L>(
    model: &M,
    state: &ModelState,
    xs: &[&Tensor],
    ys: &Tensor,
    loss: L,
    reduction: Reduction,
) -> Result<Bptt>
where
    M: Model + ?Sized,
    L: Fn(&Tensor, &Tensor) -> Result<Tensor>,
{
    const OP: &str = "bptt_grad_inputs";
    let per_step: Vec<Tensor> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| {
            if x.ndim() == 0 {
                return Err(Error::shapes(
                    OP,
                    [x.shape()],
                    format!("xs[{i}]: must be a time-major sequence (T, ...)"),
                ));
            }
            x.index_axis0(0)
        })
        .collect::<Result<_>>()?;
    let inputs = Inputs::new(OP, &per_step.iter().collect::<Vec<_>>(), None)?;
    let packed = inputs.pack_sequences(OP, xs, state.dtype())?;
    if inputs.packed() {
        bptt_grad(&inputs.model(model), state, &packed, ys, loss, reduction)
    } else {
        bptt_grad(model, state, &packed, ys, loss, reduction)
    }
}
