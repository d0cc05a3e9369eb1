//! The sequence driver, braintrace 0.2.6's `etrace_grad`: one staged
//! program per step (or per window of `chunk_size` steps), reused across
//! steps and across calls whose loss computes the same thing, with the
//! options of [`EtraceOpts`]: a mask and per-step weights seeding the
//! reverse pass (the gradient is linear in them, so they cost nothing),
//! several target sequences, per-step outputs and auxiliary values.

use super::guard::Written;
use super::opts::{EtraceOpts, EtraceOut, StepLoss};
use super::Learner;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::learn::algorithm::{Reduction, SolveIn, VjpMethod};
use crate::learn::hooked::{eval_hooked, Hooks};
use crate::learn::nonfinite::NonFinite;
use crate::learn::program::{Gradient, Program};
use crate::learn::rows::{fill, set_scalar, stack_scalars};
use crate::learn::state::{Model, TensorDict};
use crate::tensor::{Aval, Tensor};
use crate::transform::{Jit, Staged};
use std::sync::Mutex;

/// A staged step program and the loss it was traced with: the loss's own
/// graph for the avals it was called on, the window length and how many
/// auxiliary values it returns.
pub(super) struct StepCache {
    loss: Graph,
    loss_avals: Vec<Aval>,
    window: usize,
    aux: usize,
    staged: Staged,
}

/// `loss` traced alone on `avals` (prediction, targets...): its loss then
/// its auxiliary values.
fn trace_loss<L, R>(loss: &L, avals: &[Aval]) -> Result<Graph>
where
    L: Fn(&Tensor, &[Tensor]) -> Result<R>,
    R: StepLoss,
{
    crate::transform::make_graph(
        |a: &[Tensor]| {
            let (l, aux) = loss(&a[0], &a[1..])?.split();
            Ok(std::iter::once(l).chain(aux).collect())
        },
        avals,
    )
}

/// How many tensors each part of a step's flat results holds (`k` steps
/// per program run).
struct Counts {
    k: usize,
    aux: usize,
    hidden: usize,
    traces: usize,
    fwd_extra: usize,
    grads: usize,
}

/// One program run's results, read by name.
struct Run<'a> {
    outs: &'a [Tensor],
    aux: &'a [Tensor],
    hidden: &'a [Tensor],
    traces: &'a [Tensor],
    fwd_extra: &'a [Tensor],
    loss: &'a Tensor,
    grads: &'a [Tensor],
    grad_extra: &'a [Tensor],
}

impl<'a> Run<'a> {
    /// Layout: `k` outputs, `k·aux` auxiliary values, hidden, traces, `k`
    /// forward extras, the loss (`(*s)`, or `(k, *s)` for a window), the
    /// gradients, the gradient extra.
    fn read(v: &'a [Tensor], n: &Counts) -> Result<Self> {
        let fixed = n.k * (1 + n.aux + n.fwd_extra) + n.hidden + n.traces + 1 + n.grads;
        if v.len() < fixed {
            return Err(Error::invalid(
                "etrace_grad",
                format!(
                    "the step program returned {} results, expected at least {fixed}",
                    v.len()
                ),
            ));
        }
        let (outs, v) = v.split_at(n.k);
        let (aux, v) = v.split_at(n.k * n.aux);
        let (hidden, v) = v.split_at(n.hidden);
        let (traces, v) = v.split_at(n.traces);
        let (fwd_extra, v) = v.split_at(n.k * n.fwd_extra);
        let (loss, v) = v.split_first().expect("length checked");
        let (grads, grad_extra) = v.split_at(n.grads);
        Ok(Run {
            outs,
            aux,
            hidden,
            traces,
            fwd_extra,
            loss,
            grads,
            grad_extra,
        })
    }
}

/// The rows of one program run: row `t` of each sequence, or the `t`-th
/// window when the sequences are `(T/k, k, ...)`.
struct Rows {
    x: Tensor,
    ys: Vec<Tensor>,
    seed: Tensor,
    c: Tensor,
}

impl<M: Model> Learner<M> {
    /// Online gradients over a sequence with braintrace's options
    /// ([`EtraceOpts`]): for each step `t`, advance the model on `xs[t]`
    /// and add the eligibility-trace gradient of `w_t · Σ m_t ·
    /// loss(output, ys[..][t])`, where the loss gets row `t` of every
    /// target sequence in `ys` (any number, each `(T, ...)`, braintrace's
    /// several sequences), `m_t` is the mask's row and `w_t` the step's
    /// weight. Hidden states, traces and the step counter continue from
    /// their current values. The loss returns a [`Tensor`] or `(Tensor,
    /// Vec<Tensor>)` (the latter's values come back stacked in
    /// [`EtraceOut::aux`]).
    ///
    /// Errors: a wrong argument (a mask of the wrong shape, weights of the
    /// wrong length, a `chunk_size` of 0 or one that does not divide `T`,
    /// a window on a single-step learner, a target sequence of another
    /// length) is reported before anything runs, naming the argument, and
    /// changes nothing; the first step's errors (loss shapes) change
    /// nothing either; a later step's error keeps the completed steps (see
    /// [`etrace_grad`](Self::etrace_grad)).
    pub fn etrace_grad_with<L, R>(
        &mut self,
        xs: &Tensor,
        ys: &[Tensor],
        loss: L,
        opts: &EtraceOpts,
    ) -> Result<EtraceOut>
    where
        L: Fn(&Tensor, &[Tensor]) -> Result<R>,
        R: StepLoss,
    {
        self.inputs
            .require_one("etrace_grad", "etrace_grad_inputs")?;
        crate::threads::auto(self.work, || self.etrace_grad_here(xs, ys, loss, opts))
    }

    pub(super) fn etrace_grad_here<L, R>(
        &mut self,
        xs: &Tensor,
        ys: &[Tensor],
        loss: L,
        opts: &EtraceOpts,
    ) -> Result<EtraceOut>
    where
        L: Fn(&Tensor, &[Tensor]) -> Result<R>,
        R: StepLoss,
    {
        let t_len = self.check_inputs(xs, ys)?;
        let k = opts.window("etrace_grad", t_len)?;
        let multi = self.program.algo.vjp_method() == VjpMethod::MultiStep;
        if k > 1 && !multi {
            return Err(Error::invalid(
                "etrace_grad",
                format!(
                    "chunk_size: windows of {k} steps need the multi-step VJP method (this learner's algorithm is single-step; use chunk_size 1, or evolve, which takes windows on either)"
                ),
            ));
        }
        let dtype = self.state.dtype();
        let (seeds, loss_shape, total) = opts.seeds(t_len, dtype)?;
        let ys_named: Vec<String> = (0..ys.len()).map(|i| format!("ys[{i}]")).collect();
        let mut inputs: Vec<(&str, &Tensor)> = vec![("xs", xs)];
        inputs.extend(ys_named.iter().map(String::as_str).zip(ys));
        self.refuse_non_finite_inputs("etrace_grad", &inputs)?;
        // A bootstrapped rule (DNI) runs every call as windows, and its
        // step programs take its estimator as inputs.
        let boot = self.program.rule.bootstrapped();
        let windowed = k > 1 || boot;
        let prog_inputs = self.program.rule.program_inputs()?;
        let program = self.program.clone();
        let np = self.state.param_values().len();
        let nh = self.state.hidden_values().len();
        let nt = self.traces.len();
        let ny = ys.len();
        let n_aux: Mutex<Option<usize>> = Mutex::new(None);
        let reuse = match &self.step {
            // (Only for as many target sequences: the loss is traced on the
            // cached avals, and a loss reading `y[0]` must not see none.)
            Some(c)
                if c.window == k && c.loss_avals.len() == 1 + ny && !crate::graph::is_tracing() =>
            {
                trace_loss(&loss, &c.loss_avals)
                    .ok()
                    .filter(|g| g.same_computation(&c.loss))
                    .map(|_| (c.staged.clone(), c.aux))
            }
            _ => None,
        };
        let loss_avals: Mutex<Option<Vec<Aval>>> = Mutex::new(None);
        let (seen, loss_ref, aux_seen) = (&loss_avals, &loss, &n_aux);
        // The loss of one step's output: the loss alone (with the avals it
        // was called on recorded), then the auxiliary values.
        let call = move |o: &Tensor, y: &[Tensor]| -> Result<(Tensor, Vec<Tensor>)> {
            let mut avals = vec![o.aval()];
            avals.extend(y.iter().map(Tensor::aval));
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(avals);
            Ok(loss_ref(o, y)?.split())
        };
        let step_fn = Jit::new(move |a: &[Tensor]| {
            let (params, rest) = a.split_at(np);
            let (hidden, rest) = rest.split_at(nh);
            let (x, rest) = rest.split_first().expect("the step's input");
            let (y, rest) = rest.split_at(ny);
            let (c, seed) = (&rest[0], &rest[1]);
            let (traces, ins) = rest[2..].split_at(nt);
            let (v, na) = if !windowed {
                step_program(
                    &program,
                    params,
                    hidden,
                    x,
                    y,
                    c,
                    seed,
                    traces,
                    &call,
                    R::AUX,
                )?
            } else {
                window_program(
                    &program,
                    params,
                    hidden,
                    x,
                    y,
                    c,
                    seed,
                    traces,
                    ins,
                    &call,
                    R::AUX,
                    k,
                )?
            };
            *aux_seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(na);
            Ok(v)
        });
        let prog_params = self.program.program_grads(np);
        let fwd_extra = self.program.rule.forward_extra();

        // Time-major sequences as windows `(T/k, k, ...)` when k > 1.
        let windows = |s: &Tensor| -> Result<Tensor> {
            let s = s.cast(dtype)?;
            if !windowed {
                return Ok(s);
            }
            let mut shape = vec![t_len / k, k];
            shape.extend_from_slice(&s.shape()[1..]);
            s.reshape(&shape)
        };
        let xs_w = windows(xs)?;
        let ys_w: Vec<Tensor> = ys.iter().map(windows).collect::<Result<_>>()?;
        let seeds_w = windows(&seeds)?;
        let runs = t_len / k;

        let mut hidden = self.state.hidden_values().to_vec();
        let mut traces = self.traces.clone();
        self.owned.begin_grad(self.state.param_values())?;
        let mut sums: Vec<Option<Tensor>> = vec![None; np];
        let mut losses = Vec::with_capacity(t_len);
        let mut outs = Vec::new();
        let mut auxs: Vec<Vec<Tensor>> = Vec::new();
        let mut skipped: Vec<usize> = Vec::new();
        let mut done = 0;
        let outcome = (|| -> Result<()> {
            let mut accepted = 0usize;
            let z = || Tensor::scalar_of(0.0, dtype);
            let mut rows = Rows {
                x: z(),
                ys: vec![z(); ny],
                seed: z(),
                c: z(),
            };
            for w in 0..runs {
                // The step counter counts the steps taken (not the skipped).
                let n = self.running_index + done;
                fill(&mut rows.x, &xs_w, w)?;
                for (r, s) in rows.ys.iter_mut().zip(&ys_w) {
                    fill(r, s, w)?;
                }
                fill(&mut rows.seed, &seeds_w, w)?;
                set_scalar(&mut rows.c, self.program.rule.scalar(n), dtype);
                let mut args = Vec::with_capacity(np + nh + 3 + ny + nt);
                args.extend_from_slice(self.state.param_values());
                args.extend_from_slice(&hidden);
                args.push(rows.x.clone());
                args.extend(rows.ys.iter().cloned());
                args.extend([rows.c.clone(), rows.seed.clone()]);
                args.extend_from_slice(&traces);
                args.extend(prog_inputs.iter().cloned());
                let (res, na) = match &reuse {
                    Some((staged, na)) if accepted >= 2 || staged.accepts(&args) => {
                        accepted += 1;
                        (staged.run(args)?, *na)
                    }
                    _ => {
                        accepted = 0;
                        let r = step_fn.call_owned(args)?;
                        let na = n_aux.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(0);
                        (r, na)
                    }
                };
                let counts = Counts {
                    k,
                    aux: na,
                    hidden: nh,
                    traces: nt,
                    fwd_extra,
                    grads: prog_params.len(),
                };
                let run = Run::read(&res, &counts)?;
                let written = Written {
                    out: run.outs,
                    loss: Some(run.loss),
                    hidden: run.hidden,
                    traces: run.traces,
                    extra: run.fwd_extra,
                    grads: run.grads,
                    grad_params: &prog_params,
                    grad_extra: run.grad_extra,
                };
                let dropped = match self.scan_written("etrace_grad", w * k, &written)? {
                    None => false,
                    Some(_) if self.non_finite == NonFinite::Skip => true,
                    Some(e) => return Err(e),
                };
                if dropped {
                    // The step's loss, outputs and auxiliary values are
                    // reported; its state and gradient are not taken.
                    self.skipped += 1;
                    skipped.push(w * k);
                } else {
                    // A window solves with the traces at its start: the first
                    // step carries the gradient, the others advance the traces.
                    for j in 0..k {
                        let fe = &run.fwd_extra[j * fwd_extra..(j + 1) * fwd_extra];
                        self.owned.step(fe, (j == 0).then_some(run.grad_extra))?;
                    }
                    for (&i, g) in prog_params.iter().zip(run.grads) {
                        match &mut sums[i] {
                            Some(a) => a.add_in_place(g)?,
                            s => *s = Some(g.clone()),
                        }
                    }
                    // In place (the lists keep their length): no new list
                    // per step.
                    hidden.clone_from_slice(run.hidden);
                    traces.clone_from_slice(run.traces);
                    done += 1;
                }
                if !windowed {
                    losses.push(run.loss.clone());
                } else {
                    for j in 0..k {
                        losses.push(run.loss.index_axis0(j)?);
                    }
                }
                if opts.outputs {
                    outs.extend(run.outs.iter().cloned());
                }
                if na > 0 {
                    auxs.resize(na, Vec::new());
                    for j in 0..k {
                        for (a, v) in auxs.iter_mut().zip(&run.aux[j * na..(j + 1) * na]) {
                            a.push(v.clone());
                        }
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = outcome {
            self.owned.drop_grads()?;
            self.state.replace_hidden(hidden);
            self.traces = traces;
            self.running_index += done;
            return Err(e);
        }
        self.step_traces += step_fn.trace_count();
        let traced = loss_avals.lock().unwrap_or_else(|e| e.into_inner()).take();
        let na = n_aux.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(staged), Some(avals), Some(na)) = (step_fn.staged(), traced, na) {
            self.step = trace_loss(&loss, &avals).ok().map(|g| StepCache {
                loss: g,
                loss_avals: avals,
                window: k,
                aux: na,
                staged,
            });
        }
        for (p, g) in self.owned.take_grads(self.state.param_values())? {
            match &mut sums[p] {
                Some(a) => a.add_in_place(&g)?,
                s => *s = Some(g),
            }
        }
        let denom = match opts.reduction {
            Reduction::Mean => total.max(1.0),
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
                    if denom != 1.0 {
                        s.mul_scalar_in_place(1.0 / denom)?;
                    }
                    s
                }
                None => value.zeros_like(),
            };
            grads.insert(info.key.clone(), g);
        }
        let losses = if loss_shape.is_empty() {
            stack_scalars(&losses, dtype)?
        } else if losses.is_empty() {
            let mut s = vec![0];
            s.extend_from_slice(&loss_shape);
            Tensor::zeros(&s, dtype)
        } else {
            crate::ops::stack(&losses, 0)?
        };
        // A skipped step's loss is reported as computed but weighs nothing.
        let masked = if skipped.is_empty() {
            losses.mul(&seeds)?
        } else {
            let mut kept = vec![true; t_len];
            for &t in &skipped {
                kept[t..t + k].iter_mut().for_each(|v| *v = false);
            }
            let (l, s) = (losses.to_vec_f64()?, seeds.to_vec_f64()?);
            let row = (l.len() / t_len.max(1)).max(1);
            let v: Vec<f64> = l
                .iter()
                .zip(&s)
                .enumerate()
                .map(|(i, (l, s))| if kept[i / row] { l * s } else { 0.0 })
                .collect();
            Tensor::from_vec(v, losses.shape())?.cast(dtype)?
        };
        let objective = masked.to_vec_f64()?.iter().sum::<f64>() / denom;
        let outputs = if opts.outputs {
            Some(stack_or_empty(&outs)?)
        } else {
            None
        };
        let aux = auxs
            .iter()
            .map(|a| stack_or_empty(a))
            .collect::<Result<_>>()?;
        self.state.replace_hidden(hidden);
        self.traces = traces;
        self.running_index += done;
        Ok(EtraceOut {
            grads,
            losses,
            masked,
            objective,
            outputs,
            aux,
            skipped,
        })
    }

    /// `xs` `(T, *input)` and every target sequence `(T, ...)`; the length.
    pub(super) fn check_inputs(&self, xs: &Tensor, ys: &[Tensor]) -> Result<usize> {
        const OP: &str = "etrace_grad";
        if xs.is_symbolic() || ys.iter().any(Tensor::is_symbolic) {
            return Err(Error::invalid(
                OP,
                "xs and ys must be concrete tensors (etrace_grad runs eagerly)",
            ));
        }
        if xs.ndim() == 0 || &xs.shape()[1..] != self.input_aval.shape() {
            return Err(Error::shapes(
                OP,
                [xs.shape().to_vec(), self.input_aval.shape().to_vec()],
                "xs must be (T, *example_input.shape)",
            ));
        }
        let t_len = xs.shape()[0];
        for (i, y) in ys.iter().enumerate() {
            if y.ndim() == 0 || y.shape()[0] != t_len {
                return Err(Error::shapes(
                    OP,
                    [xs.shape().to_vec(), y.shape().to_vec()],
                    format!(
                        "ys[{i}]: must be a time-major sequence with the same number of steps as xs (T = {t_len}, axis 0)"
                    ),
                ));
            }
        }
        if xs.dtype() != self.state.dtype() && !xs.dtype().is_float() {
            return Err(Error::dtype_with(
                OP,
                "xs",
                crate::tensor::DType::FLOATS,
                xs.dtype(),
                format!("shape {:?}", xs.shape()),
            ));
        }
        Ok(t_len)
    }
}

/// Tensors stacked on a new leading axis (`(0,)` when there are none).
pub(super) fn stack_or_empty(v: &[Tensor]) -> Result<Tensor> {
    if v.is_empty() {
        return Ok(Tensor::zeros(&[0], crate::tensor::DType::F64));
    }
    crate::ops::stack(v, 0)
}

type LossCall<'a> = dyn Fn(&Tensor, &[Tensor]) -> Result<(Tensor, Vec<Tensor>)> + 'a;

/// One step's program (traced): the forward and the gradient traced
/// together; the flat list [`Run::read`] reads and the number of auxiliary
/// values.
#[allow(clippy::too_many_arguments)]
fn step_program(
    program: &Program,
    params: &[Tensor],
    hidden: &[Tensor],
    x: &Tensor,
    y: &[Tensor],
    c: &Tensor,
    seed: &Tensor,
    traces: &[Tensor],
    loss: &LossCall<'_>,
    with_aux: bool,
) -> Result<(Vec<Tensor>, usize)> {
    let multi = program.algo.vjp_method() == VjpMethod::MultiStep;
    let f = program.forward(params, hidden, x, traces)?;
    let solve_tr = if multi { traces } else { &f.traces[..] };
    let g = program.gradient(params, hidden, x, solve_tr, c, seed, &|o: &Tensor| {
        Ok(loss(o, y)?.0)
    })?;
    // Auxiliary values from the step's output (outside the reverse pass).
    let aux = if with_aux {
        loss(&f.out, y)?.1
    } else {
        Vec::new()
    };
    let na = aux.len();
    let mut v = vec![f.out];
    v.extend(aux);
    v.extend(f.hidden);
    v.extend(f.traces);
    v.extend(f.extra);
    push_gradient(&mut v, g);
    Ok((v, na))
}

fn push_gradient(v: &mut Vec<Tensor>, g: Gradient) {
    v.push(g.loss);
    v.extend(g.grads);
    v.extend(g.extra);
}

/// A window of `k` steps (traced, multi-step method): the forward `k`
/// times (the traces advance `k` times); the gradient of `Σ_j seed_j ·
/// loss_j` by reverse mode through the `k` steps with respect to the
/// parameters and the window's entering hidden states, solved with the
/// traces at the window's start. A bootstrapped rule's estimate at the
/// exit hidden states (from `ins`) goes back through the same reverse pass
/// a second time: added to the parameters without a relation (a relation's
/// trace already carries its credit beyond the window), and with the
/// first pass's to the entering hidden states' cotangents, which end the
/// gradient's extra values (see `TraceRule::bootstrapped`).
#[allow(clippy::too_many_arguments)]
fn window_program(
    program: &Program,
    params: &[Tensor],
    hidden: &[Tensor],
    xw: &Tensor,
    yw: &[Tensor],
    c: &Tensor,
    seedw: &Tensor,
    traces: &[Tensor],
    ins: &[Tensor],
    loss: &LossCall<'_>,
    with_aux: bool,
    k: usize,
) -> Result<(Vec<Tensor>, usize)> {
    let (np, nh) = (params.len(), hidden.len());
    let boot = program.rule.bootstrapped();
    let xj: Vec<Tensor> = (0..k).map(|j| xw.index_axis0(j)).collect::<Result<_>>()?;
    let yj: Vec<Vec<Tensor>> = (0..k)
        .map(|j| yw.iter().map(|y| y.index_axis0(j)).collect())
        .collect::<Result<_>>()?;
    let mut h = hidden.to_vec();
    let mut tr = traces.to_vec();
    let (mut outs, mut extras) = (Vec::with_capacity(k), Vec::new());
    for x in &xj {
        let f = program.forward(params, &h, x, &tr)?;
        outs.push(f.out);
        extras.extend(f.extra);
        h = f.hidden;
        tr = f.traces;
    }
    let g = program.eg.graph();
    let obj = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let (p, h0) = a.split_at(np);
        let mut h = h0.to_vec();
        let mut ls = Vec::with_capacity(k);
        for (x, y) in xj.iter().zip(&yj) {
            let mut ins = p.to_vec();
            ins.extend(h);
            ins.push(x.clone());
            let (o, _) = eval_hooked(g, &ins, &Hooks::default())?;
            let l = loss(&o[0], y)?.0;
            if l.shape() != &seedw.shape()[1..] {
                return Err(Error::shapes(
                    "etrace_grad",
                    [l.shape().to_vec(), seedw.shape()[1..].to_vec()],
                    "the loss must have the shape of the mask's row (a scalar without a mask)",
                ));
            }
            ls.push(l);
            h = o[1..].to_vec();
        }
        let mut out = vec![crate::ops::stack(&ls, 0)?];
        if boot {
            out.extend(h);
        }
        Ok(out)
    };
    let mut primals = params.to_vec();
    primals.extend_from_slice(hidden);
    let (vals, pull) = crate::transform::vjp(obj, &primals)?;
    let mut seeds = vec![seedw.cast(vals[0].dtype())?];
    seeds.extend(vals[1..].iter().map(Tensor::zeros_like));
    let cts = pull.apply(&seeds)?;
    let solved = program.rule.solve(&SolveIn {
        params,
        traces,
        signal: &cts[np..np + nh],
        scalar: c,
    })?;
    let mut grads: Vec<Tensor> = cts[..np].to_vec();
    for (i, t) in solved.grads {
        grads[i] = grads[i].add(&t)?;
    }
    let mut extra = solved.extra;
    if boot {
        let mut exit = vec![vals[0].zeros_like()];
        exit.extend(program.rule.exit_cotangent(&h, ins)?);
        let future = pull.apply(&exit)?;
        for i in program.eg.params_without_relation() {
            grads[i] = grads[i].add(&future[i])?;
        }
        for j in np..np + nh {
            extra.push(cts[j].add(&future[j])?);
        }
    }
    let mut aux = Vec::new();
    if with_aux {
        for (o, y) in outs.iter().zip(&yj) {
            aux.extend(loss(o, y)?.1);
        }
    }
    let na = aux.len() / k;
    let mut v = outs;
    v.extend(aux);
    v.extend(h);
    v.extend(tr);
    v.extend(extras);
    let grads = program
        .program_grads(np)
        .into_iter()
        .map(|i| grads[i].clone())
        .collect();
    push_gradient(
        &mut v,
        Gradient {
            loss: vals[0].clone(),
            grads,
            extra,
        },
    );
    Ok((v, na))
}
