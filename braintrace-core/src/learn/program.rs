//! The per-step programs of a compiled learner, written as functions of
//! flat tensor lists so that they can be traced and run through `jit`,
//! and their results by name:
//!
//! * [`forward`](Program::forward)`(params, hidden, x, traces)` →
//!   [`Forward`]: evaluates the step, the hidden Jacobians `D` and the `Df`
//!   of every relation (the shared [`StepEval`]) and lets the algorithm's
//!   [`TraceRule`] update its traces;
//! * [`gradient`](Program::gradient)`(params, hidden, x, y, traces, c)` →
//!   [`Gradient`]: the learning signal (by perturbation, or by reverse mode
//!   through the step for the multi-step method), the in-step gradients
//!   and the algorithm's solve.
//!
//! Both read the step graph of an [`EtraceGraph`] through the hooked
//! evaluator ([`super::hooked`]). A staged program returns one flat list;
//! [`Forward`] and [`StepOut`] write and read it, so no caller counts
//! positions.

use super::algorithm::{
    Algorithm, Layout, NonTemporal, Pair, SolveIn, StepEval, TraceRule, VjpMethod,
};
use super::compiler::EtraceGraph;
use super::hooked::{eval_hooked, Hooks};
use super::shared::stack_last;
use crate::error::{Error, Result};
use crate::graph::{Graph, VarId};
use crate::tensor::Tensor;
use crate::transform::{jvp, vjp};
use std::collections::HashMap;
use std::sync::Arc;

/// The forward program's results.
pub(crate) struct Forward {
    /// The model's output.
    pub out: Tensor,
    /// The hidden states after the step.
    pub hidden: Vec<Tensor>,
    /// The program-carried traces after the step.
    pub traces: Vec<Tensor>,
    /// The algorithm's values for its learner-side state ([`super::algorithm::Update::extra`]).
    pub extra: Vec<Tensor>,
}

impl Forward {
    /// As one list: output, hidden, traces, extra.
    pub(crate) fn into_flat(self) -> Vec<Tensor> {
        let mut v =
            Vec::with_capacity(1 + self.hidden.len() + self.traces.len() + self.extra.len());
        v.push(self.out);
        v.extend(self.hidden);
        v.extend(self.traces);
        v.extend(self.extra);
        v
    }
    /// Read [`into_flat`](Self::into_flat)'s list back, with `nh` hidden
    /// states and `nt` traces.
    pub(crate) fn from_flat(mut v: Vec<Tensor>, nh: usize, nt: usize) -> Self {
        let extra = v.split_off(1 + nh + nt);
        let traces = v.split_off(1 + nh);
        let hidden = v.split_off(1);
        let out = v.pop().expect("the forward program returns an output");
        Forward {
            out,
            hidden,
            traces,
            extra,
        }
    }
}

/// The gradient program's results.
pub(crate) struct Gradient {
    /// The step's loss (a scalar).
    pub loss: Tensor,
    /// The gradients of [`Program::program_grads`]'s parameters, in order.
    pub grads: Vec<Tensor>,
    /// The algorithm's values for its learner-side state ([`super::algorithm::Solved::extra`]).
    pub extra: Vec<Tensor>,
}

/// How many tensors each part of a step's flat results holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCounts {
    pub hidden: usize,
    pub traces: usize,
    pub fwd_extra: usize,
    pub grads: usize,
}

/// One `etrace_grad` step's results, read by name from the staged
/// program's flat list (see [`StepOut::flat`]).
pub(crate) struct StepOut<'a> {
    pub hidden: &'a [Tensor],
    pub traces: &'a [Tensor],
    pub fwd_extra: &'a [Tensor],
    pub loss: &'a Tensor,
    pub grads: &'a [Tensor],
    pub grad_extra: &'a [Tensor],
}

impl<'a> StepOut<'a> {
    /// The flat list of a step: hidden, traces, forward extra, loss,
    /// grads, gradient extra.
    pub(crate) fn flat(f: Forward, g: Gradient) -> Vec<Tensor> {
        let mut v = f.hidden;
        v.extend(f.traces);
        v.extend(f.extra);
        v.push(g.loss);
        v.extend(g.grads);
        v.extend(g.extra);
        v
    }
    /// Read [`flat`](Self::flat)'s list.
    pub(crate) fn read(v: &'a [Tensor], n: &StepCounts) -> Result<Self> {
        let fixed = n.hidden + n.traces + n.fwd_extra + 1 + n.grads;
        if v.len() < fixed {
            return Err(Error::invalid(
                "etrace_grad",
                format!(
                    "the step program returned {} results, expected at least {fixed}",
                    v.len()
                ),
            ));
        }
        let (hidden, v) = v.split_at(n.hidden);
        let (traces, v) = v.split_at(n.traces);
        let (fwd_extra, v) = v.split_at(n.fwd_extra);
        let (loss, v) = v.split_first().expect("length checked");
        let (grads, grad_extra) = v.split_at(n.grads);
        Ok(StepOut {
            hidden,
            traces,
            fwd_extra,
            loss,
            grads,
            grad_extra,
        })
    }
}

/// A compiled learner's per-step programs.
pub(crate) struct Program {
    pub eg: Arc<EtraceGraph>,
    pub algo: Algorithm,
    pub layout: Layout,
    /// The algorithm planned for this graph.
    pub rule: Box<dyn TraceRule>,
}

impl Program {
    pub(crate) fn new(eg: Arc<EtraceGraph>, algo: Algorithm) -> Result<Self> {
        let mut pairs = Vec::new();
        let mut x_vars = Vec::new();
        for r in eg.relations() {
            if let Some(xv) = r.x_var {
                if !x_vars.contains(&xv) {
                    x_vars.push(xv);
                }
            }
            for &gi in &r.groups {
                pairs.push(Pair {
                    rel: r.index,
                    group: gi,
                });
            }
        }
        let layout = Layout { pairs, x_vars };
        let rule = algo.config().plan(&eg, &layout)?;
        Ok(Program {
            eg,
            algo,
            layout,
            rule,
        })
    }

    fn graph(&self) -> &Graph {
        self.eg.graph()
    }

    /// Inputs of the step graph.
    fn step_inputs(params: &[Tensor], hidden: &[Tensor], x: &Tensor) -> Vec<Tensor> {
        let mut v = params.to_vec();
        v.extend_from_slice(hidden);
        v.push(x.clone());
        v
    }

    /// The equations held fixed when differentiating inside a step: the
    /// outputs of every ETP equation that is not gradient-enabled.
    fn boundary_vars(&self) -> Vec<VarId> {
        self.graph()
            .eqns()
            .iter()
            .filter(|e| {
                crate::etp::as_etp_eqn(&**e.prim())
                    .map(|q| !q.prim.is_gradient_enabled())
                    .unwrap_or(false)
            })
            .flat_map(|e| e.outputs().to_vec())
            .collect()
    }

    /// The forward program: the step, its [`StepEval`] and the
    /// algorithm's trace update.
    pub(crate) fn forward(
        &self,
        params: &[Tensor],
        hidden: &[Tensor],
        x: &Tensor,
        traces: &[Tensor],
    ) -> Result<Forward> {
        let eg = &*self.eg;
        let g = self.graph();
        let inputs = Self::step_inputs(params, hidden, x);
        let boundary = self.boundary_vars();
        let mut record = boundary.clone();
        record.extend(self.layout.x_vars.iter().copied());
        for r in eg.relations() {
            record.push(r.y_var);
        }
        let hooks = Hooks {
            record,
            ..Hooks::default()
        };
        let (outs, rec) = eval_hooked(g, &inputs, &hooks)?;
        let out = outs[0].clone();
        let new_hidden = outs[1..].to_vec();
        let fixed: HashMap<VarId, Tensor> = boundary.iter().map(|v| (*v, rec[v].clone())).collect();

        // Hidden-to-hidden Jacobians, (V, S, S) per group.
        let mut d_cols = Vec::with_capacity(eg.groups().len()); // [group][b][a]
        for grp in eg.groups() {
            let states = grp.states.clone();
            let f = |hs: &[Tensor]| {
                let mut ins = inputs.clone();
                for (k, &s) in states.iter().enumerate() {
                    ins[eg.num_params() + s] = hs[k].clone();
                }
                let h = Hooks {
                    overrides: fixed.clone(),
                    ..Hooks::default()
                };
                let (o, _) = eval_hooked(g, &ins, &h)?;
                Ok(states.iter().map(|&s| o[1 + s].clone()).collect())
            };
            let primals: Vec<Tensor> = states.iter().map(|&s| hidden[s].clone()).collect();
            let mut cols: Vec<Vec<Tensor>> = Vec::new(); // cols[b][a]
            for b in 0..states.len() {
                let tans: Vec<Tensor> = primals
                    .iter()
                    .enumerate()
                    .map(|(k, p)| {
                        if k == b {
                            p.ones_like()
                        } else {
                            p.zeros_like()
                        }
                    })
                    .collect();
                cols.push(jvp(f, &primals, &tans)?.1);
            }
            d_cols.push(cols);
        }
        // D stacked, (V, S, S) per group, for a rule that reads it so
        // (made here, before the Df, so that the staged program is the
        // one the plan's compiled groups were generated for).
        let stacked = self.rule.stacked();
        let mut ds = Vec::new();
        if stacked {
            for cols in &d_cols {
                let rows: Vec<Tensor> = (0..cols.len())
                    .map(|a| stack_last(&cols.iter().map(|c| c[a].clone()).collect::<Vec<_>>()))
                    .collect::<Result<_>>()?;
                let nd = rows[0].ndim() - 1;
                ds.push(crate::ops::stack(&rows, nd)?);
            }
        }

        // Df per pair: per state (V), and stacked (V, S) when asked.
        let mut dfs = Vec::new();
        let mut df_parts = Vec::with_capacity(self.layout.pairs.len());
        for pair in &self.layout.pairs {
            let r = &eg.relations()[pair.rel];
            let states = eg.groups()[pair.group].states.clone();
            let yv = r.y_var;
            let f = |y: &[Tensor]| {
                let mut ov = fixed.clone();
                ov.insert(yv, y[0].clone());
                let h = Hooks {
                    overrides: ov,
                    ..Hooks::default()
                };
                let (o, _) = eval_hooked(g, &inputs, &h)?;
                Ok(states.iter().map(|&s| o[1 + s].clone()).collect())
            };
            let y = rec[&yv].clone();
            let (_, t) = jvp(f, std::slice::from_ref(&y), &[y.ones_like()])?;
            if stacked {
                dfs.push(stack_last(&t)?);
            }
            df_parts.push(t);
        }

        let xs: HashMap<VarId, Tensor> = self
            .layout
            .x_vars
            .iter()
            .map(|v| (*v, rec[v].clone()))
            .collect();
        let step = StepEval {
            params,
            xs,
            d_cols,
            df: df_parts,
            d: ds,
            df_stacked: dfs,
        };
        let up = self.rule.update(&step, traces)?;
        Ok(Forward {
            out,
            hidden: new_hidden,
            traces: up.traces,
            extra: up.extra,
        })
    }

    /// The gradient program: the loss, the gradients of the parameters
    /// [`program_grads`](Self::program_grads) lists and the algorithm's
    /// values for its learner-side state. `traces` are the traces after
    /// this step for the single-step method and before it for the
    /// multi-step method; `c` is the step's scalar
    /// ([`TraceRule::scalar`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gradient<L>(
        &self,
        params: &[Tensor],
        hidden: &[Tensor],
        x: &Tensor,
        y: &Tensor,
        traces: &[Tensor],
        c: &Tensor,
        loss: &L,
    ) -> Result<Gradient>
    where
        L: Fn(&Tensor, &Tensor) -> Result<Tensor>,
    {
        let eg = &*self.eg;
        let g = self.graph();
        let (np, nh) = (params.len(), hidden.len());
        let hid_out: Vec<VarId> = (0..nh).map(|j| eg.hidden_out_var(j)).collect();
        let f = |a: &[Tensor]| {
            let mut perturb: HashMap<VarId, Tensor> = HashMap::new();
            for (j, &v) in hid_out.iter().enumerate() {
                let p = a[np + nh + j].clone();
                let p = match perturb.remove(&v) {
                    Some(q) => q.add(&p)?,
                    None => p,
                };
                perturb.insert(v, p);
            }
            let h = Hooks {
                perturb,
                ..Hooks::default()
            };
            let ins = Self::step_inputs(&a[..np], &a[np..np + nh], x);
            let (o, _) = eval_hooked(g, &ins, &h)?;
            let l = loss(&o[0], y)?;
            if !l.shape().is_empty() {
                return Err(Error::shapes(
                    "etrace_grad",
                    [l.shape()],
                    "the loss function must return a scalar",
                ));
            }
            Ok(vec![l])
        };
        let mut primals = params.to_vec();
        primals.extend_from_slice(hidden);
        primals.extend(hidden.iter().map(Tensor::zeros_like));
        let (vals, pull) = vjp(f, &primals)?;
        let l = vals[0].clone();
        let cts = pull.apply(&[l.ones_like()])?;
        let d_params = &cts[..np];
        let d_hidden_in = &cts[np..np + nh];
        let d_perturb = &cts[np + nh..];
        let method = self.algo.vjp_method();
        let signal = match method {
            VjpMethod::SingleStep => d_perturb,
            VjpMethod::MultiStep => d_hidden_in,
        };
        let mut grads: Vec<Option<Tensor>> = vec![None; np];
        let mut addg = |i: usize, t: Tensor| -> Result<()> {
            grads[i] = Some(match grads[i].take() {
                Some(o) => o.add(&t)?,
                None => t,
            });
            Ok(())
        };
        match method {
            VjpMethod::MultiStep => {
                for (i, d) in d_params.iter().enumerate() {
                    addg(i, d.clone())?;
                }
            }
            VjpMethod::SingleStep => {
                if self.algo.non_temporal() == NonTemporal::InStep {
                    for i in eg.params_without_relation() {
                        addg(i, d_params[i].clone())?;
                    }
                }
            }
        }
        let solved = self.rule.solve(&SolveIn {
            params,
            traces,
            signal,
            scalar: c,
        })?;
        for (i, t) in solved.grads {
            addg(i, t)?;
        }
        let grads = self
            .program_grads(np)
            .into_iter()
            .map(|i| grads[i].take().unwrap_or_else(|| params[i].zeros_like()))
            .collect();
        Ok(Gradient {
            loss: l,
            grads,
            extra: solved.extra,
        })
    }

    /// The parameters (of `np`) whose per-step gradient the gradient
    /// program returns, in order; every other parameter's gradient comes
    /// from the learner's trace state alone, or is zero — no zero tensor
    /// is made and added per step for them.
    pub(crate) fn program_grads(&self, np: usize) -> Vec<usize> {
        let single = self.algo.vjp_method() == VjpMethod::SingleStep;
        if !single {
            return (0..np).collect();
        }
        let mut on = vec![false; np];
        if self.algo.non_temporal() == NonTemporal::InStep {
            for i in self.eg.params_without_relation() {
                on[i] = true;
            }
        }
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            if !self.rule.in_program(pi) {
                continue;
            }
            for t in &self.eg.relations()[pair.rel].trainables {
                on[t.param] = true;
            }
        }
        (0..np).filter(|&i| on[i]).collect()
    }
}
