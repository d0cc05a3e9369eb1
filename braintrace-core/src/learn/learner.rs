//! The online learner: [`compile`] a model with an algorithm, then
//! [`Learner::update`] one step at a time or [`Learner::etrace_grad`] over
//! a sequence, with memory constant in its length.

use super::algorithm::{Algorithm, Reduction, TraceState, VjpMethod};
use super::compiler::EtraceGraph;
use super::program::{Forward, Program, StepCounts, StepOut};
use super::rows::{fill, set_scalar, stack_scalars};
use super::state::{Model, ModelState, TensorDict};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{Aval, Tensor};
use crate::transform::{Jit, Staged};
use std::sync::{Arc, Mutex};

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
    /// The step program `etrace_grad` staged last, reused by the next call
    /// while the loss computes the same thing (and the shapes match).
    step: Option<StepCache>,
    /// How many times `etrace_grad` traced and staged its step program.
    step_traces: usize,
    /// One step's estimated work: who runs it ([`crate::threads::Work`]).
    work: crate::threads::Work,
}

/// A staged `etrace_grad` step and the loss it was traced with: the loss's
/// own graph for the avals it was called on inside the step.
struct StepCache {
    loss: Graph,
    loss_avals: [Aval; 2],
    staged: Staged,
}

/// `loss` traced alone on `avals` (prediction, target).
fn trace_loss<L>(loss: &L, avals: &[Aval; 2]) -> Result<Graph>
where
    L: Fn(&Tensor, &Tensor) -> Result<Tensor>,
{
    crate::transform::make_graph(|a: &[Tensor]| Ok(vec![loss(&a[0], &a[1])?]), avals)
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
        step: None,
        step_traces: 0,
        work,
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
        self.traces = self.program.rule.zeros();
        self.owned.reset()?;
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
    pub fn update(&mut self, x: &Tensor) -> Result<Tensor> {
        crate::threads::auto(self.work, || self.update_here(x))
    }

    fn update_here(&mut self, x: &Tensor) -> Result<Tensor> {
        let x = self.check_input("update", x)?;
        let f = self.run_forward(&x, self.state.hidden_values(), &self.traces)?;
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
        crate::threads::auto(self.work, || self.etrace_grad_here(xs, ys, loss, reduction))
    }

    fn etrace_grad_here<L>(
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
        let multi = self.program.algo.vjp_method() == VjpMethod::MultiStep;
        // The last call's step program, when this call's loss computes the
        // same thing on the same avals: tracing the loss alone is cheap,
        // tracing and staging the whole step is not (about 1 ms at hidden
        // 128, a tenth of the step time of 100 pp_prop steps).
        let reuse = match &self.step {
            Some(c) if !crate::graph::is_tracing() => trace_loss(&loss, &c.loss_avals)
                .ok()
                .filter(|g| g.same_computation(&c.loss))
                .map(|_| c.staged.clone()),
            _ => None,
        };
        // The avals the step's trace called the loss on.
        let loss_avals: Mutex<Option<[Aval; 2]>> = Mutex::new(None);
        let seen = &loss_avals;
        let loss_ref = &loss;
        let recorded = move |p: &Tensor, y: &Tensor| {
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some([p.aval(), y.aval()]);
            loss_ref(p, y)
        };
        // One program per step: the forward (step, D, Df, trace update) and
        // the gradient (learning signal, solve) traced together, so that
        // `jit` stages them once and runs them as one graph.
        let step_fn = Jit::new(move |a: &[Tensor]| {
            let (params, rest) = a.split_at(np);
            let (hidden, rest) = rest.split_at(nh);
            let (x, y, c) = (&rest[0], &rest[1], &rest[2]);
            let traces = &rest[3..3 + nt];
            let f = program.forward(params, hidden, x, traces)?;
            let solve_tr = if multi { traces } else { &f.traces[..] };
            let g = program.gradient(params, hidden, x, y, solve_tr, c, &recorded)?;
            Ok(StepOut::flat(f, g))
        });
        let prog_params = self.program.program_grads(np);
        let counts = StepCounts {
            hidden: nh,
            traces: nt,
            fwd_extra: self.program.rule.forward_extra(),
            grads: prog_params.len(),
        };
        let mut hidden = self.state.hidden_values().to_vec();
        let mut traces = self.traces.clone();
        // The algorithm's own traces are updated in place (see the error
        // contract above).
        self.owned.begin_grad(self.state.param_values())?;
        let mut sums: Vec<Option<Tensor>> = vec![None; np];
        let mut losses = Vec::with_capacity(t_len);
        let dtype = self.state.dtype();
        let mut done = 0;
        let outcome = (|| -> Result<()> {
            // Cast once (a no-op when the dtype matches), then take each
            // step's row straight from the array.
            let (xs, ys) = (xs.cast(dtype)?, ys.cast(dtype)?);
            // Steps in a row the last call's program ran. Once it has run
            // two, its outputs (the next hidden states and traces) have
            // been accepted as its inputs, and the other arguments keep
            // their avals (the parameters, rows of `xs` and `ys`, the
            // scalar correction): later steps are not checked here again
            // (`run` still checks every call).
            let mut accepted = 0usize;
            // The step's rows of `xs` and `ys` and its scalar, written in
            // place from the second step on, once the program has let go
            // of them (see `fill`); placeholders until the first step.
            let [mut x_t, mut y_t, mut c_t] = [(); 3].map(|_| Tensor::scalar_of(0.0, dtype));
            for t in 0..t_len {
                let n = self.running_index + t;
                let c = self.program.rule.scalar(n);
                fill(&mut x_t, &xs, t)?;
                fill(&mut y_t, &ys, t)?;
                set_scalar(&mut c_t, c, dtype);
                let mut args = Vec::with_capacity(np + nh + 3 + nt);
                args.extend_from_slice(self.state.param_values());
                args.extend_from_slice(&hidden);
                args.extend([x_t.clone(), y_t.clone(), c_t.clone()]);
                args.extend_from_slice(&traces);
                let outs = match &reuse {
                    Some(staged) if accepted >= 2 || staged.accepts(&args) => {
                        accepted += 1;
                        staged.run(args)?
                    }
                    _ => {
                        accepted = 0;
                        step_fn.call_owned(args)?
                    }
                };
                let out = StepOut::read(&outs, &counts)?;
                losses.push(out.loss.clone());
                self.owned.step(out.fwd_extra, Some(out.grad_extra))?;
                // Accumulated in place: the sum's buffer is the learner's
                // alone from the second step on (copy-on-write before that).
                for (&i, g) in prog_params.iter().zip(out.grads) {
                    match &mut sums[i] {
                        Some(a) => a.add_in_place(g)?,
                        s => *s = Some(g.clone()),
                    }
                }
                hidden = out.hidden.to_vec();
                traces = out.traces.to_vec();
                done = t + 1;
            }
            Ok(())
        })();
        if let Err(e) = outcome {
            // Keep the completed steps (hidden states, traces and counter
            // agree); drop this call's gradients.
            self.owned.drop_grads()?;
            self.state.replace_hidden(hidden);
            self.traces = traces;
            self.running_index += done;
            return Err(e);
        }
        self.step_traces += step_fn.trace_count();
        let traced = loss_avals.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(staged), Some(avals)) = (step_fn.staged(), traced) {
            // Keep what this call staged for the next one.
            self.step = trace_loss(&loss, &avals).ok().map(|g| StepCache {
                loss: g,
                loss_avals: avals,
                staged,
            });
        }
        for (p, g) in self.owned.take_grads(self.state.param_values())? {
            match &mut sums[p] {
                Some(a) => a.add_in_place(&g)?,
                s => *s = Some(g),
            }
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
                Some(mut s) => {
                    if scale != 1.0 {
                        s.mul_scalar_in_place(scale)?;
                    }
                    s
                }
                None => value.zeros_like(),
            };
            grads.insert(info.key.clone(), g);
        }
        let losses = stack_scalars(&losses, dtype)?;
        self.state.replace_hidden(hidden);
        self.traces = traces;
        self.running_index += t_len;
        Ok(EtraceGrads { grads, losses })
    }

    fn check_sequences(&self, xs: &Tensor, ys: &Tensor) -> Result<usize> {
        if xs.is_symbolic() || ys.is_symbolic() {
            return Err(Error::invalid(
                "etrace_grad",
                "xs and ys must be concrete tensors (etrace_grad runs eagerly)",
            ));
        }
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
