//! The online learner: [`compile`] a model with an algorithm, then
//! [`Learner::update`] one step at a time or [`Learner::etrace_grad`] over
//! a sequence, with memory constant in its length.

use super::algorithm::{Algorithm, Reduction, TraceState};
use super::compiler::EtraceGraph;
use super::program::{Forward, Program};
use super::state::{Model, ModelState, TensorDict};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::transform::Jit;
use std::sync::Arc;

mod driver;
mod evolve;
mod guard;
mod inspect;
mod opts;
pub use opts::{CompileOpts, EtraceOpts, EtraceOut, EvolveOpts, StepLoss};

mod resume;
pub use resume::LearnerSnapshot;

mod several;

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
    /// The traces the step programs carry (the algorithm's
    /// [`TraceRule::zeros`](super::algorithm::TraceRule::zeros) layout).
    traces: Vec<Tensor>,
    /// The traces and accumulators the algorithm keeps in the learner.
    owned: Box<dyn TraceState>,
    running_index: usize,
    forward: Jit<StepFn>,
    input_aval: crate::tensor::Aval,
    /// The compiled inputs (several are carried packed in `input_aval`).
    inputs: super::inputs::Inputs,
    /// The control-flow policy the step was analysed with.
    control_flow: super::ControlFlowPolicy,
    /// The step program `etrace_grad` staged last, reused by the next call
    /// while the loss computes the same thing (and the shapes match).
    step: Option<driver::StepCache>,
    /// How many times `etrace_grad` traced and staged its step program.
    step_traces: usize,
    /// One step's estimated work: who runs it ([`crate::threads::Work`]).
    work: crate::threads::Work,
    /// What a non-finite value written by a step does.
    non_finite: super::NonFinite,
    /// How many steps `NonFinite::Skip` dropped.
    skipped: usize,
}

/// Compile `model` for online learning with `algorithm`.
///
/// `state` holds the model's parameters (its hidden states are reset to
/// `batch_size`); `example_input` is one step's input (with the batch axis
/// when `batch_size` is given). Fails with a clear error when the model has
/// no hidden state, no ETP operation or no relation between the two.
/// [`compile_with`] takes several inputs per step and the options.
pub fn compile<M: Model>(
    model: M,
    state: ModelState,
    algorithm: impl Into<Algorithm>,
    example_input: &Tensor,
    batch_size: Option<usize>,
) -> Result<Learner<M>> {
    let opts = CompileOpts::default();
    compile_with(model, state, algorithm, &[example_input], batch_size, &opts)
}

/// [`compile`] with one example per input of the step and options
/// ([`CompileOpts`]: the control-flow policy).
///
/// With one example input the learner is [`compile`]'s. With several
/// (braintrace's `update(*args)`: an input and a modulator, two streams of
/// different widths) the model's [`Model::step_inputs`] gets them in
/// order, and the learner takes them through
/// [`update_inputs`](Learner::update_inputs),
/// [`etrace_grad_inputs`](Learner::etrace_grad_inputs),
/// [`evolve_inputs`](Learner::evolve_inputs) and
/// [`evaluate_inputs`](Learner::evaluate_inputs), each input checked
/// against its example (count, shape). With a batch size, every example
/// of one axis or more has it leading; a scalar input is shared by the
/// batch.
pub fn compile_with<M: Model>(
    model: M,
    mut state: ModelState,
    algorithm: impl Into<Algorithm>,
    example_inputs: &[&Tensor],
    batch_size: Option<usize>,
    opts: &CompileOpts,
) -> Result<Learner<M>> {
    let algorithm = algorithm.into();
    let inputs = super::inputs::Inputs::new("compile", example_inputs, batch_size)?;
    state.reset_hidden(batch_size)?;
    let x = inputs.pack_step("compile", example_inputs, state.dtype())?;
    let eg = Arc::new(EtraceGraph::analyse_with(
        &inputs.model(&model),
        &state,
        &x,
        &opts.control_flow,
    )?);
    eg.require_relations()?;
    let program = Arc::new(Program::new(eg, algorithm)?);
    let traces = program.rule.zeros();
    let owned = program.rule.state(&state)?;
    let work = super::work::step_work(&program.eg, &state, &traces, owned.as_ref());
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
        owned,
        running_index: 0,
        forward: Jit::new(forward),
        input_aval: x.aval(),
        inputs,
        control_flow: opts.control_flow.clone(),
        step: None,
        step_traces: 0,
        work,
        non_finite: super::NonFinite::Error,
        skipped: 0,
    })
}

fn make_forward(program: Arc<Program>, np: usize, nh: usize) -> StepFn {
    Box::new(move |a: &[Tensor]| {
        Ok(program
            .forward(&a[..np], &a[np..np + nh], &a[np + nh], &a[np + nh + 1..])?
            .into_flat())
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
    /// A readable account of the compilation: the algorithm with its
    /// options, the algorithm's own lines — how many (relation, group)
    /// pairs run a fused trace kernel (D-RTRL: `fused trace kernels: 2 of
    /// 2 relation-group pairs`) or have their weight gradients accumulated
    /// by the learner (pp_prop: `fused dense gradients (pp_prop): 2 of 2
    /// relation-group pairs`) — then the compiler's analysis.
    pub fn explain(&self) -> String {
        let mut s = format!("algorithm: {:?}\n", self.program.algo);
        for line in self.program.rule.explain() {
            s += &line;
            s.push('\n');
        }
        s + &self.program.eg.explain()
    }
    /// The algorithm and its options (`learner.algorithm().name()`,
    /// `.get::<DRtrl>()`).
    pub fn algorithm(&self) -> &Algorithm {
        &self.program.algo
    }
    /// The eligibility traces (copies), flat: D-RTRL per relation and
    /// group, per trainable (those run by fused kernels last); pp_prop the
    /// input traces, then the output traces (`(V.., S)` per relation and
    /// group).
    pub fn traces(&self) -> Vec<Tensor> {
        self.program
            .rule
            .public(&self.traces, &*self.owned)
            .expect("the traces are in the layout the algorithm planned")
    }
    /// How many steps ran since compile or the last reset.
    pub fn running_index(&self) -> usize {
        self.running_index
    }
    /// How many times [`Learner::etrace_grad`] traced and staged its step
    /// program. A call reuses the previous call's program when its loss
    /// computes the same thing (the loss traced alone gives the same graph:
    /// the same ops, params and captured constants) on tensors of the same
    /// shapes; a loss that captures a different value, or arguments of
    /// other shapes, stages a new one.
    pub fn step_traces(&self) -> usize {
        self.step_traces
    }
    /// Reset hidden states to zeros with batch size `batch`, the traces to
    /// zeros and the step counter to 0. Another batch size than the
    /// compiled one analyses the step again at that size and reallocates
    /// the traces (braintrace's `reset_state(batch_size)`); the
    /// parameters are kept.
    pub fn reset_state(&mut self, batch: Option<usize>) -> Result<()> {
        if batch != self.state.batch() {
            return self.rebatch(batch);
        }
        self.state.reset_hidden(batch)?;
        self.traces = self.program.rule.zeros();
        self.owned.reset()?;
        self.running_index = 0;
        Ok(())
    }

    fn check_input(&self, op: &str, x: &Tensor) -> Result<Tensor> {
        if x.shape() != self.input_aval.shape() {
            return Err(Error::shapes(
                op,
                [x.shape(), self.input_aval.shape()],
                "each step's input x (first) must have the shape of the example input (second)",
            ));
        }
        x.cast(self.state.dtype())
    }

    /// Run the forward program.
    fn run_forward(&self, x: &Tensor, hidden: &[Tensor], traces: &[Tensor]) -> Result<Forward> {
        let mut args = self.state.param_values().to_vec();
        args.extend_from_slice(hidden);
        args.push(x.clone());
        args.extend_from_slice(traces);
        let outs = self.forward.call(&args)?;
        Ok(Forward::from_flat(outs, hidden.len(), traces.len()))
    }

    /// One step's estimated work, from which the learner chooses its
    /// threads (see [`crate::threads`]).
    pub fn work(&self) -> crate::threads::Work {
        self.work
    }

    /// One online step: the model's output; hidden states and traces advance.
    ///
    /// A NaN or an infinity in `x` or in what the step writes (hidden
    /// states, output, traces) is refused by default, with nothing changed
    /// ([`set_non_finite`](Self::set_non_finite)); under
    /// [`NonFinite::Skip`](super::NonFinite::Skip) the step is dropped and
    /// its (non-finite) output returned.
    pub fn update(&mut self, x: &Tensor) -> Result<Tensor> {
        self.inputs.require_one("update", "update_inputs")?;
        crate::threads::auto(self.work, || self.update_here(x))
    }

    fn update_here(&mut self, x: &Tensor) -> Result<Tensor> {
        let x = self.check_input("update", x)?;
        self.refuse_non_finite_input("update", &x)?;
        let f = self.run_forward(&x, self.state.hidden_values(), &self.traces)?;
        let written = guard::Written {
            out: std::slice::from_ref(&f.out),
            loss: None,
            hidden: &f.hidden,
            traces: &f.traces,
            extra: &f.extra,
            grads: &[],
            grad_params: &[],
            grad_extra: &[],
        };
        if let Some(e) = self.scan_written("update", self.running_index, &written)? {
            if self.non_finite == super::NonFinite::Skip {
                self.skipped += 1;
                return Ok(f.out);
            }
            return Err(e);
        }
        // The forward program (where errors surface) has run; the
        // algorithm's own traces then advance in place.
        self.owned.begin_update(self.state.param_values())?;
        self.owned.step(&f.extra, None)?;
        self.state.replace_hidden(f.hidden);
        self.traces = f.traces;
        self.running_index += 1;
        Ok(f.out)
    }

    /// Online gradients over a sequence: for each step `t`, advance the model
    /// on `xs[t]` and add the eligibility-trace gradient of
    /// `loss(output, ys[t])`; reduce over time by `reduction`. Hidden states,
    /// traces and the step counter continue from their current values (as in
    /// braintrace).
    ///
    /// Errors: an error in the first step leaves the learner unchanged —
    /// that is where shape, dtype and loss errors surface, since the step
    /// program is traced there. The traces are updated in place (they can be
    /// hundreds of megabytes; no copy is made), so an error in a later step
    /// (possible only from a value-dependent operation inside `loss`) leaves
    /// the learner at the last completed step: hidden states, traces and the
    /// step counter agree, and the gradients of that call are dropped.
    ///
    /// A NaN or an infinity in `xs`, `ys` or written by a step follows
    /// the learner's [`NonFinite`](super::NonFinite) policy (see
    /// [`set_non_finite`](Self::set_non_finite)).
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
        if ys.is_symbolic() || ys.ndim() == 0 {
            return Err(Error::shapes(
                "etrace_grad",
                [xs.shape().to_vec(), ys.shape().to_vec()],
                "xs and ys must be concrete time-major sequences (T, ...)",
            ));
        }
        let opts = EtraceOpts::new().reduction(reduction);
        let out =
            self.etrace_grad_with(xs, std::slice::from_ref(ys), |o, y| loss(o, &y[0]), &opts)?;
        Ok(EtraceGrads {
            grads: out.grads,
            losses: out.losses,
        })
    }
}
