//! The online learner: [`compile`] a model with an algorithm, then
//! [`Learner::update`] one step at a time or [`Learner::etrace_grad`] over
//! a sequence, with memory constant in its length.

use super::algorithm::{Algorithm, Reduction, VjpMethod};
use super::compiler::EtraceGraph;
use super::program::Program;
use super::state::{Model, ModelState, TensorDict};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::transform::Jit;
use std::sync::Arc;

/// Gradients keyed by parameter key and the per-step losses.
#[derive(Clone, Debug)]
pub struct EtraceGrads {
    /// One gradient per parameter leaf (`rnn/Wz/weight/weight`), shaped like it.
    pub grads: TensorDict,
    /// The loss of each step, `(T,)`.
    pub losses: Tensor,
}

type StepFn = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

/// A model compiled for online learning: its state, the analysis of its
/// step, its eligibility traces and the staged per-step programs.
pub struct Learner<M: Model> {
    model: M,
    state: ModelState,
    program: Arc<Program>,
    traces: Vec<Tensor>,
    running_index: usize,
    forward: Jit<StepFn>,
    input_aval: crate::tensor::Aval,
}

/// Compile `model` for online learning with `algorithm`.
///
/// `state` holds the model's parameters (its hidden states are reset to
/// `batch_size`); `example_input` is one step's input (with the batch axis
/// when `batch_size` is given). Fails with a clear error when the model has
/// no hidden state, no ETP operation or no relation between the two.
pub fn compile<M: Model>(
    model: M,
    mut state: ModelState,
    algorithm: impl Into<Algorithm>,
    example_input: &Tensor,
    batch_size: Option<usize>,
) -> Result<Learner<M>> {
    let algorithm = algorithm.into();
    if example_input.is_symbolic() {
        return Err(Error::invalid(
            "compile",
            "the example input must be a concrete tensor",
        ));
    }
    if let (Some(b), Some(&x0)) = (batch_size, example_input.shape().first()) {
        if x0 != b {
            return Err(Error::shape(
                "compile",
                format!("example input {:?}, batch_size {b}", example_input.shape()),
                "the example input's leading axis must be the batch size",
            ));
        }
    }
    state.reset_hidden(batch_size)?;
    let x = example_input.cast(state.dtype())?;
    let eg = Arc::new(EtraceGraph::analyse(&model, &state, &x)?);
    eg.require_relations()?;
    let program = Arc::new(Program::new(eg.clone(), algorithm, &x)?);
    let traces = program.layout.zeros(&algorithm, eg.graph());
    let forward = make_forward(
        program.clone(),
        state.param_values().len(),
        state.hidden_values().len(),
    );
    Ok(Learner {
        model,
        state,
        program,
        traces,
        running_index: 0,
        forward: Jit::new(forward),
        input_aval: x.aval(),
    })
}

fn make_forward(program: Arc<Program>, np: usize, nh: usize) -> StepFn {
    Box::new(move |a: &[Tensor]| {
        let (out, h, tr) =
            program.forward(&a[..np], &a[np..np + nh], &a[np + nh], &a[np + nh + 1..])?;
        let mut v = vec![out];
        v.extend(h);
        v.extend(tr);
        Ok(v)
    })
}

impl<M: Model> Learner<M> {
    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }
    /// The model's parameters and hidden states.
    pub fn state(&self) -> &ModelState {
        &self.state
    }
    /// Mutable access to the parameters (for an optimiser step). Shapes
    /// cannot change through [`ModelState::set_param`].
    pub fn state_mut(&mut self) -> &mut ModelState {
        &mut self.state
    }
    /// The compiler's analysis: hidden groups, relations, diagnostics.
    pub fn graph(&self) -> &EtraceGraph {
        &self.program.eg
    }
    /// A readable account of the compilation.
    pub fn explain(&self) -> String {
        format!(
            "algorithm: {:?}\n{}",
            self.program.algo,
            self.program.eg.explain()
        )
    }
    /// The algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.program.algo
    }
    /// The eligibility traces, flat (D-RTRL: per relation and group, per
    /// trainable; pp_prop: the input traces, then the output traces).
    pub fn traces(&self) -> &[Tensor] {
        &self.traces
    }
    /// How many steps ran since compile or the last reset.
    pub fn running_index(&self) -> usize {
        self.running_index
    }
    /// Reset hidden states to zeros with batch size `batch` (which must be the
    /// compiled one), the traces to zeros and the step counter to 0.
    pub fn reset_state(&mut self, batch: Option<usize>) -> Result<()> {
        if batch != self.state.batch() {
            return Err(Error::invalid(
                "reset_state",
                format!(
                    "the learner was compiled for batch size {:?}; got {batch:?} (compile again for another batch size)",
                    self.state.batch()
                ),
            ));
        }
        self.state.reset_hidden(batch)?;
        self.traces = self
            .program
            .layout
            .zeros(&self.program.algo, self.program.eg.graph());
        self.running_index = 0;
        Ok(())
    }

    fn check_input(&self, op: &str, x: &Tensor) -> Result<Tensor> {
        if x.shape() != self.input_aval.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "x {:?} vs compiled {:?}",
                    x.shape(),
                    self.input_aval.shape()
                ),
                "each step's input must have the shape of the example input",
            ));
        }
        x.cast(self.state.dtype())
    }

    fn run_forward(
        &self,
        x: &Tensor,
        hidden: &[Tensor],
        traces: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let mut args = self.state.param_values().to_vec();
        args.extend_from_slice(hidden);
        args.push(x.clone());
        args.extend_from_slice(traces);
        let outs = self.forward.call(&args)?;
        let nh = hidden.len();
        Ok((
            outs[0].clone(),
            outs[1..1 + nh].to_vec(),
            outs[1 + nh..].to_vec(),
        ))
    }

    /// One online step: the model's output; hidden states and traces advance.
    pub fn update(&mut self, x: &Tensor) -> Result<Tensor> {
        let x = self.check_input("update", x)?;
        let (out, h, tr) = self.run_forward(&x, self.state.hidden_values(), &self.traces)?;
        self.state.replace_hidden(h);
        self.traces = tr;
        self.running_index += 1;
        Ok(out)
    }

    /// Online gradients over a sequence: for each step `t`, advance the model
    /// on `xs[t]` and add the eligibility-trace gradient of
    /// `loss(output, ys[t])`; reduce over time by `reduction`. Hidden states,
    /// traces and the step counter continue from their current values (as in
    /// braintrace); on error nothing is changed.
    ///
    /// `xs` and `ys` are time-major: `(T, *input)` and `(T, *target)`.
    pub fn etrace_grad<L>(
        &mut self,
        xs: &Tensor,
        ys: &Tensor,
        loss: L,
        reduction: Reduction,
    ) -> Result<EtraceGrads>
    where
        L: Fn(&Tensor, &Tensor) -> Result<Tensor>,
    {
        let t_len = self.check_sequences(xs, ys)?;
        let program = self.program.clone();
        let np = self.state.param_values().len();
        let nh = self.state.hidden_values().len();
        let nt = self.traces.len();
        let loss_ref = &loss;
        let grad_fn = Jit::new(move |a: &[Tensor]| {
            let (params, rest) = a.split_at(np);
            let (hidden, rest) = rest.split_at(nh);
            let (x, y, c) = (&rest[0], &rest[1], &rest[2]);
            let traces = &rest[3..3 + nt];
            let (l, g) = program.gradient(params, hidden, x, y, traces, c, loss_ref)?;
            let mut v = vec![l];
            v.extend(g);
            Ok(v)
        });
        let mut hidden = self.state.hidden_values().to_vec();
        let mut traces = self.traces.clone();
        let mut sums: Vec<Option<Tensor>> = vec![None; np];
        let mut losses = Vec::with_capacity(t_len);
        let dtype = self.state.dtype();
        for t in 0..t_len {
            let n = self.running_index + t;
            let x = xs.index_axis0(t)?.cast(dtype)?;
            let y = ys.index_axis0(t)?.cast(dtype)?;
            let (_, new_h, new_tr) = self.run_forward(&x, &hidden, &traces)?;
            let c = match &self.program.algo {
                Algorithm::PpProp(pp) => pp.correction(n),
                Algorithm::DRtrl(_) => 1.0,
            };
            let c = Tensor::scalar(c).cast(dtype)?;
            let solve_traces = match self.program.algo.vjp_method() {
                VjpMethod::SingleStep => &new_tr,
                VjpMethod::MultiStep => &traces,
            };
            let mut args = self.state.param_values().to_vec();
            args.extend_from_slice(&hidden);
            args.extend([x, y, c]);
            args.extend_from_slice(solve_traces);
            let outs = grad_fn.call(&args)?;
            losses.push(outs[0].clone());
            for (s, g) in sums.iter_mut().zip(&outs[1..]) {
                *s = Some(match s.take() {
                    Some(a) => a.add(g)?,
                    None => g.clone(),
                });
            }
            hidden = new_h;
            traces = new_tr;
        }
        let scale = match reduction {
            Reduction::Mean => 1.0 / (t_len.max(1) as f64),
            Reduction::Sum => 1.0,
        };
        let mut grads = TensorDict::new();
        for ((info, value), s) in self
            .state
            .param_infos()
            .iter()
            .zip(self.state.param_values())
            .zip(sums)
        {
            let g = match s {
                Some(s) => s.mul_scalar(scale)?,
                None => value.zeros_like(),
            };
            grads.insert(info.key.clone(), g);
        }
        let losses = if losses.is_empty() {
            Tensor::zeros(&[0], dtype)
        } else {
            crate::ops::stack(&losses, 0)?
        };
        self.state.replace_hidden(hidden);
        self.traces = traces;
        self.running_index += t_len;
        Ok(EtraceGrads { grads, losses })
    }

    fn check_sequences(&self, xs: &Tensor, ys: &Tensor) -> Result<usize> {
        if xs.ndim() == 0 || ys.ndim() == 0 {
            return Err(Error::shape(
                "etrace_grad",
                format!("xs {:?}, ys {:?}", xs.shape(), ys.shape()),
                "xs and ys must be time-major sequences (T, ...)",
            ));
        }
        if xs.shape()[0] != ys.shape()[0] {
            return Err(Error::shape(
                "etrace_grad",
                format!("xs {:?}, ys {:?}", xs.shape(), ys.shape()),
                "xs and ys must have the same number of steps (axis 0)",
            ));
        }
        if &xs.shape()[1..] != self.input_aval.shape() {
            return Err(Error::shape(
                "etrace_grad",
                format!(
                    "xs {:?} vs compiled input {:?}",
                    xs.shape(),
                    self.input_aval.shape()
                ),
                "xs must be (T, *example_input.shape)",
            ));
        }
        if xs.dtype() != self.state.dtype() && !xs.dtype().is_float() {
            return Err(Error::dtype(
                "etrace_grad",
                format!("xs must be floating point, got {:?}", xs.dtype()),
            ));
        }
        Ok(xs.shape()[0])
    }
}
