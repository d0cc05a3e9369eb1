//! The per-step programs of a compiled learner, written as functions of
//! flat tensor lists so that they can be traced and run through `jit`:
//!
//! * `forward(params, hidden, x, traces) -> (out, new_hidden, new_traces)`:
//!   evaluates the step, the hidden Jacobians `D`, the `Df` of every
//!   relation and updates the traces (D-RTRL or pp_prop);
//! * `gradient(params, hidden, x, y, traces, c) -> (loss, grads)`: the
//!   learning signal (by perturbation, or by reverse mode through the step
//!   for the multi-step method) and the solve.
//!
//! Both read the step graph of an [`EtraceGraph`] through an evaluator that
//! can hold chosen variables fixed (cutting paths through weight ops), add a
//! perturbation right after chosen variables and record intermediates.

use super::algorithm::{Algorithm, NonTemporal, VjpMethod};
use super::compiler::EtraceGraph;
use crate::error::{Error, Result};
use crate::etp::TensorMap;
use crate::graph::{bind, Graph, VarId};
use crate::tensor::{Aval, Tensor};
use crate::transform::{jvp, vjp, vmap};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the hooked evaluator does besides evaluating.
#[derive(Default)]
struct Hooks {
    /// Variables whose value is given instead of computed.
    overrides: HashMap<VarId, Tensor>,
    /// Variables to which a perturbation is added where they are produced.
    perturb: HashMap<VarId, Tensor>,
    /// Variables whose values are wanted.
    record: Vec<VarId>,
}

/// Evaluate `g` on `inputs` with `hooks`; returns the outputs and the
/// recorded values.
fn eval_hooked(
    g: &Graph,
    inputs: &[Tensor],
    hooks: &Hooks,
) -> Result<(Vec<Tensor>, HashMap<VarId, Tensor>)> {
    let mut recorded: HashMap<VarId, Tensor> = HashMap::new();
    for (&v, t) in g.invars().iter().zip(inputs) {
        if hooks.record.contains(&v) {
            recorded.insert(v, t.clone());
        }
    }
    for (&v, t) in g.constvars().iter().zip(g.consts()) {
        if hooks.record.contains(&v) {
            recorded.insert(v, t.clone());
        }
    }
    let mut outs = g.eval_with(inputs, |e, ins| {
        let vals = if e.outputs().iter().all(|v| hooks.overrides.contains_key(v)) {
            e.outputs()
                .iter()
                .map(|v| hooks.overrides[v].clone())
                .collect()
        } else {
            bind(e.prim().clone(), ins)?
        };
        let mut res = Vec::with_capacity(vals.len());
        for (v, t) in e.outputs().iter().zip(vals) {
            let t = match hooks.perturb.get(v) {
                Some(p) => t.add(p)?,
                None => t,
            };
            if hooks.record.contains(v) {
                recorded.insert(*v, t.clone());
            }
            res.push(t);
        }
        Ok(res)
    })?;
    // A perturbed output that no equation produces (a state passed through).
    let produced: Vec<VarId> = g.eqns().iter().flat_map(|e| e.outputs().to_vec()).collect();
    for (o, v) in outs.iter_mut().zip(g.outvars()) {
        if let (Some(p), false) = (hooks.perturb.get(v), produced.contains(v)) {
            *o = o.add(p)?;
        }
    }
    Ok((outs, recorded))
}

/// Slice the trailing axis at `i` (dropping it).
fn last(t: &Tensor, i: usize) -> Result<Tensor> {
    t.index_axis(t.ndim() - 1, i)
}

/// `Σ a ⊙ b` over `terms` (at least one), left to right.
fn sum_of_products<'a>(
    mut terms: impl Iterator<Item = (&'a Tensor, &'a Tensor)>,
) -> Result<Tensor> {
    let (a, b) = terms
        .next()
        .ok_or_else(|| Error::invalid("learning step", "a sum of no products"))?;
    terms.try_fold(a.mul(b)?, |acc, (a, b)| acc.add(&a.mul(b)?))
}

/// Stack on a new trailing axis.
fn stack_last(ts: &[Tensor]) -> Result<Tensor> {
    crate::ops::stack(ts, ts[0].ndim())
}

/// Sum leading axes until `t` has the shape `like`.
fn reduce_to(t: &Tensor, like: &[usize], what: &str) -> Result<Tensor> {
    let mut t = t.clone();
    if t.ndim() > like.len() {
        let axes: Vec<usize> = (0..t.ndim() - like.len()).collect();
        t = t.sum(&axes)?;
    }
    if t.shape() != like {
        return Err(Error::shape(
            "etrace solve",
            format!("{:?} vs parameter {:?}", t.shape(), like),
            format!("the gradient of `{what}` does not reduce to its parameter's shape"),
        ));
    }
    Ok(t)
}

fn add_maps(a: Option<TensorMap>, b: TensorMap) -> Result<TensorMap> {
    match a {
        None => Ok(b),
        Some(mut a) => {
            for (k, v) in b {
                let s = match a.remove(&k) {
                    Some(x) => x.add(&v)?,
                    None => v,
                };
                a.insert(k, s);
            }
            Ok(a)
        }
    }
}

/// One (relation, group) pair that carries traces.
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    pub rel: usize,
    pub group: usize,
}

/// Shapes and order of the flat trace list.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub pairs: Vec<Pair>,
    /// Distinct relation inputs (pp_prop's `x̄`), in first-use order.
    pub x_vars: Vec<VarId>,
    /// D-RTRL: per pair, the trace keys (sorted) and shapes.
    pub drtrl: Vec<Vec<(String, Aval)>>,
    /// pp_prop: per pair, the `f̄` aval.
    ///
    /// pp_prop keeps each pair's output trace as one tensor per state
    /// (`(V..)`, in the flat list one after the other), so a step reads
    /// and writes its states without slicing or stacking; the learner's
    /// public [`traces`](super::Learner::traces) stacks them as these avals
    /// say.
    pub pp_f: Vec<Aval>,
    /// D-RTRL: per pair, whether the fused kernel of [`super::fast`] runs it
    /// (its traces then live in the learner, not in the flat list).
    pub fast: Vec<bool>,
    /// pp_prop: per pair, whether the learner accumulates its weight
    /// gradients from `x̄` and the summed signal (a relation with a
    /// [`TraceKernel::Dense`](crate::etp::TraceKernel::Dense) kernel whose shapes fit):
    /// the gradient program then returns those two instead of calling
    /// `xy_to_dw`.
    pub pp_fast: Vec<bool>,
}

impl Layout {
    pub(crate) fn zeros(&self, algo: &Algorithm, graph: &Graph) -> Vec<Tensor> {
        match algo {
            Algorithm::DRtrl(_) => self
                .drtrl
                .iter()
                .zip(&self.fast)
                .filter(|(_, &f)| !f)
                .flat_map(|(keys, _)| keys.iter().map(|(_, a)| Tensor::zeros_aval(a)))
                .collect(),
            Algorithm::PpProp(_) => self
                .x_vars
                .iter()
                .map(|&v| Tensor::zeros_aval(graph.aval(v)))
                .chain(self.pp_f.iter().flat_map(|a| {
                    let (states, per) = pp_split(a);
                    (0..states).map(move |_| Tensor::zeros(per, a.dtype()))
                }))
                .collect(),
        }
    }

    /// pp_prop: where pair `pi`'s per-state output traces start in the flat
    /// list, and how many states it has.
    pub(crate) fn pp_states(&self, pi: usize) -> (usize, usize) {
        let states = |a: &Aval| pp_split(a).0;
        let at = self.x_vars.len() + self.pp_f[..pi].iter().map(states).sum::<usize>();
        (at, states(&self.pp_f[pi]))
    }

    /// pp_prop: the flat trace list with each pair's states stacked on a
    /// trailing axis, as [`pp_f`](Self::pp_f) describes them.
    pub(crate) fn pp_public(&self, traces: &[Tensor]) -> Result<Vec<Tensor>> {
        let nx = self.x_vars.len();
        let mut v = traces[..nx].to_vec();
        for pi in 0..self.pp_f.len() {
            let (at, s) = self.pp_states(pi);
            v.push(stack_last(&traces[at..at + s])?);
        }
        Ok(v)
    }
}

/// A pp_prop output trace's `(V.., S)` aval: its number of states `S` and
/// the shape `V..` of each state's tensor.
fn pp_split(a: &Aval) -> (usize, &[usize]) {
    let (&states, per) = a.shape().split_last().expect("(V.., S)");
    (states, per)
}

/// A compiled learner's per-step programs.
pub(crate) struct Program {
    pub eg: Arc<EtraceGraph>,
    pub algo: Algorithm,
    pub layout: Layout,
}

impl Program {
    pub(crate) fn new(eg: Arc<EtraceGraph>, algo: Algorithm, x: &Tensor) -> Result<Self> {
        let g = eg.graph();
        let mut pairs = Vec::new();
        let mut x_vars = Vec::new();
        let mut drtrl = Vec::new();
        let mut pp_f = Vec::new();
        let mut fast = Vec::new();
        let mut pp_fast = Vec::new();
        for r in eg.relations() {
            if let Some(xv) = r.x_var {
                if !x_vars.contains(&xv) {
                    x_vars.push(xv);
                }
            }
            for &gi in &r.groups {
                let grp = &eg.groups()[gi];
                let s = grp.num_state();
                pairs.push(Pair {
                    rel: r.index,
                    group: gi,
                });
                let kernel = match algo {
                    Algorithm::DRtrl(d) if d.fast_paths => super::fast::kernel_for(r, g, grp)?,
                    _ => None,
                };
                let y = g.aval(r.y_var).clone();
                let weights: BTreeMap<String, Aval> = r
                    .trainables
                    .iter()
                    .map(|t| (t.name.clone(), g.aval(g.invars()[t.param]).clone()))
                    .collect();
                let mut vs = grp.varshape.clone();
                vs.push(s);
                match algo {
                    Algorithm::DRtrl(_) => {
                        let xa = r.x_var.map(|v| g.aval(v).clone());
                        let init =
                            r.primitive
                                .init_drtrl(xa.as_ref(), &y, &weights, s, &r.params)?;
                        let keys: Vec<(String, Aval)> = init
                            .into_iter()
                            .filter(|(k, _)| weights.contains_key(k))
                            .map(|(k, t)| {
                                // An op without x (element-wise) has a trace
                                // shaped like the hidden group (batch included).
                                let a = if r.x_var.is_none() {
                                    Aval::new(&vs, t.dtype())
                                } else {
                                    t.aval()
                                };
                                (k, a)
                            })
                            .collect();
                        let xa = r.x_var.map(|v| g.aval(v));
                        fast.push(kernel.is_some_and(|k| {
                            super::fast::shapes_fit(
                                &k,
                                xa,
                                &grp.varshape,
                                s,
                                &keys,
                                &weights,
                                &r.params,
                            )
                        }));
                        drtrl.push(keys);
                        pp_fast.push(false);
                    }
                    Algorithm::PpProp(_) => {
                        let xa = r.x_var.map(|v| g.aval(v).clone());
                        let init = r
                            .primitive
                            .init_pp(xa.as_ref(), &y, &weights, s, &r.params)?;
                        let ys = y.shape();
                        let ok = ys == grp.varshape.as_slice()
                            || (r.x_var.is_none() && grp.varshape.ends_with(ys));
                        if !ok {
                            return Err(Error::shape(
                                "compile (pp_prop)",
                                format!("y {ys:?} vs hidden group {:?}", grp.varshape),
                                format!(
                                    "pp_prop needs the output of {} to have the hidden group's shape",
                                    r.primitive.name()
                                ),
                            ));
                        }
                        pp_f.push(Aval::new(&vs, init.dtype()));
                        fast.push(false);
                        let dense = matches!(algo, Algorithm::PpProp(pp) if pp.fast_paths)
                            && super::fast::kernel_for(r, g, grp)?
                                .as_ref()
                                .map(super::fast::FusedKind::of)
                                == Some(super::fast::FusedKind::Dense)
                            && super::pp_fast::transforms_readable(
                                r,
                                &r.trainables
                                    .iter()
                                    .map(|t| t.name.as_str())
                                    .collect::<Vec<_>>(),
                            );
                        let xa = r.x_var.map(|v| g.aval(v));
                        pp_fast.push(
                            dense && super::pp_fast::shapes_fit(r, xa, &grp.varshape, &weights),
                        );
                    }
                }
            }
        }
        let _ = x;
        Ok(Program {
            eg,
            algo,
            layout: Layout {
                pairs,
                x_vars,
                drtrl,
                pp_f,
                fast,
                pp_fast,
            },
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

    /// The forward program: `(out, new_hidden, new_traces, fast_inputs)`.
    #[allow(clippy::type_complexity)]
    pub(crate) fn forward(
        &self,
        params: &[Tensor],
        hidden: &[Tensor],
        x: &Tensor,
        traces: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>, Vec<Tensor>)> {
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
        // D-RTRL reads D stacked, (V, S, S); pp_prop reads its columns.
        let drtrl = matches!(self.algo, Algorithm::DRtrl(_));
        let mut ds = Vec::with_capacity(eg.groups().len());
        if drtrl {
            for cols in &d_cols {
                let rows: Vec<Tensor> = (0..cols.len())
                    .map(|a| stack_last(&cols.iter().map(|c| c[a].clone()).collect::<Vec<_>>()))
                    .collect::<Result<_>>()?;
                let nd = rows[0].ndim() - 1;
                ds.push(crate::ops::stack(&rows, nd)?);
            }
        }

        // Df per pair: per state (V), and stacked (V, S) for D-RTRL.
        let mut dfs = Vec::with_capacity(self.layout.pairs.len());
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
            if drtrl {
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
        let new_traces = match &self.algo {
            Algorithm::DRtrl(_) => self.drtrl_update(params, traces, &ds, &dfs, &xs)?,
            Algorithm::PpProp(pp) => {
                self.pp_update(pp.decay_x, pp.decay_f, traces, &d_cols, &df_parts, &xs)?
            }
        };
        let fast = self.fast_inputs(&ds, &dfs, &xs);
        Ok((out, new_hidden, new_traces, fast))
    }

    fn weights(&self, rel: usize, params: &[Tensor]) -> TensorMap {
        self.eg.relations()[rel]
            .trainables
            .iter()
            .map(|t| (t.name.clone(), params[t.param].clone()))
            .collect()
    }

    /// Split the flat D-RTRL traces into one map per pair (empty for the
    /// pairs the fused kernels run).
    fn drtrl_maps(&self, traces: &[Tensor]) -> Vec<TensorMap> {
        let mut it = traces.iter();
        self.layout
            .drtrl
            .iter()
            .zip(&self.layout.fast)
            .map(|(keys, &fast)| {
                if fast {
                    return TensorMap::new();
                }
                keys.iter()
                    .map(|(k, _)| (k.clone(), it.next().expect("layout").clone()))
                    .collect()
            })
            .collect()
    }

    /// What the fused kernels need from the forward program, per fast pair:
    /// `x` (or a placeholder), `D` of its group and its `Df`.
    fn fast_inputs(
        &self,
        ds: &[Tensor],
        dfs: &[Tensor],
        xs: &HashMap<VarId, Tensor>,
    ) -> Vec<Tensor> {
        let mut v = Vec::new();
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            if !self.layout.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            v.push(
                r.x_var
                    .map(|xv| xs[&xv].clone())
                    .unwrap_or_else(|| Tensor::scalar(0.0)),
            );
            v.push(ds[pair.group].clone());
            v.push(dfs[pi].clone());
        }
        v
    }

    fn drtrl_update(
        &self,
        params: &[Tensor],
        traces: &[Tensor],
        ds: &[Tensor],
        dfs: &[Tensor],
        xs: &HashMap<VarId, Tensor>,
    ) -> Result<Vec<Tensor>> {
        let maps = self.drtrl_maps(traces);
        let mut out = Vec::with_capacity(traces.len());
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            if self.layout.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            let p = &r.primitive;
            let s = self.eg.groups()[pair.group].num_state();
            let d = &ds[pair.group];
            let eps = &maps[pi];
            let weights = self.weights(pair.rel, params);
            let x = r.x_var.map(|v| xs[&v].clone());
            let keys: Vec<String> = eps.keys().cloned().collect();
            let mut per_a: Vec<TensorMap> = Vec::with_capacity(s);
            for a in 0..s {
                let d_a = d.index_axis(d.ndim() - 2, a)?; // (V, S) over b
                let mut acc: Option<TensorMap> = None;
                for b in 0..s {
                    let factor = last(&d_a, b)?;
                    let eps_b: TensorMap = eps
                        .iter()
                        .map(|(k, t)| Ok((k.clone(), last(t, b)?)))
                        .collect::<Result<_>>()?;
                    acc = Some(add_maps(acc, p.yw_to_w(&factor, &eps_b, &r.params)?)?);
                }
                let df_a = last(&dfs[pi], a)?;
                let inst = if p.is_batched() {
                    let x = x.clone().ok_or_else(|| {
                        Error::etp(p.name(), "D-RTRL", "a batched primitive needs an x operand")
                    })?;
                    let (w, prm) = (weights.clone(), r.params.clone());
                    let f = move |args: &[Tensor]| -> Result<Vec<Tensor>> {
                        Ok(p.instant_drtrl(Some(&args[0]), &args[1], &w, &prm)?
                            .into_values()
                            .collect())
                    };
                    let outs = vmap(f, vec![Some(0), Some(0)])(&[x, df_a])?;
                    let inst_keys: Vec<String> = weights.keys().cloned().collect();
                    inst_keys.into_iter().zip(outs).collect()
                } else {
                    p.instant_drtrl(x.as_ref(), &df_a, &weights, &r.params)?
                };
                per_a.push(add_maps(acc, inst)?);
            }
            for k in &keys {
                let parts: Vec<Tensor> = per_a
                    .iter()
                    .map(|m| {
                        m.get(k).cloned().ok_or_else(|| {
                            Error::etp(
                                p.name(),
                                "D-RTRL trace update",
                                format!("rules returned no `{k}`"),
                            )
                        })
                    })
                    .collect::<Result<_>>()?;
                let new = stack_last(&parts)?;
                let old = &eps[k];
                if new.shape() != old.shape() {
                    return Err(Error::shape(
                        "D-RTRL trace update",
                        format!("{:?} vs trace {:?}", new.shape(), old.shape()),
                        format!("{}'s rules must keep the `{k}` trace's shape", p.name()),
                    ));
                }
                out.push(new.cast(old.dtype())?);
            }
        }
        Ok(out)
    }

    /// `ε_x ← α_x ε_x + x`; per state `a`,
    /// `ε_f[a] ← α_f Σ_c D[a, c] ε_f[c] + (1 − α_f) Df[a]` — element-wise
    /// products of same-shape operands (`d_cols[group][c][a]` is
    /// `D[..., a, c]`), which the planned executor fuses into one loop.
    #[allow(clippy::type_complexity)]
    fn pp_update(
        &self,
        ax: f64,
        af: f64,
        traces: &[Tensor],
        d_cols: &[Vec<Vec<Tensor>>],
        df_parts: &[Vec<Tensor>],
        xs: &HashMap<VarId, Tensor>,
    ) -> Result<Vec<Tensor>> {
        let mut out = Vec::with_capacity(traces.len());
        for (i, v) in self.layout.x_vars.iter().enumerate() {
            out.push(traces[i].mul_scalar(ax)?.add(&xs[v])?);
        }
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            let (at, s) = self.layout.pp_states(pi);
            let fc = &traces[at..at + s];
            let cols = &d_cols[pair.group];
            for a in 0..s {
                let acc = sum_of_products((0..s).map(|c| (&cols[c][a], &fc[c])))?;
                let df = &df_parts[pi][a];
                out.push(acc.mul_scalar(af)?.add(&df.mul_scalar(1.0 - af)?)?);
            }
        }
        Ok(out)
    }

    /// How many stacked learning signals [`gradient`](Self::gradient)
    /// returns: one per hidden group for D-RTRL, none for pp_prop.
    pub(crate) fn signal_groups(&self) -> usize {
        match self.algo {
            Algorithm::DRtrl(_) => self.eg.groups().len(),
            Algorithm::PpProp(_) => 0,
        }
    }

    /// The gradient program: `(loss, grads, signals, pp_rows)` with the
    /// gradients of the parameters [`program_grads`](Self::program_grads)
    /// lists, the learning signal per group stacked `(V.., S)` (D-RTRL
    /// only; pp_prop returns none) and, per pp_prop pair with
    /// [`Layout::pp_fast`], its `x̄` and summed signal. `traces` are the
    /// traces after this step for the single-step method and before it for
    /// the multi-step method; `c` is pp_prop's bias correction (a scalar;
    /// ignored by D-RTRL).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(crate) fn gradient<L>(
        &self,
        params: &[Tensor],
        hidden: &[Tensor],
        x: &Tensor,
        y: &Tensor,
        traces: &[Tensor],
        c: &Tensor,
        loss: &L,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>, Vec<Tensor>)>
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
                return Err(Error::shape(
                    "etrace_grad",
                    format!("loss {:?}", l.shape()),
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
        let signal_src = match method {
            VjpMethod::SingleStep => d_perturb,
            VjpMethod::MultiStep => d_hidden_in,
        };
        // Stacked per group for D-RTRL (its solve and fused kernels);
        // pp_prop reads the per-state signals.
        let signals: Vec<Tensor> = eg
            .groups()
            .iter()
            .take(self.signal_groups())
            .map(|grp| {
                stack_last(
                    &grp.states
                        .iter()
                        .map(|&s| signal_src[s].clone())
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Result<_>>()?;
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
        let mut pp_rows = Vec::new();
        let solved = match &self.algo {
            Algorithm::DRtrl(_) => self.drtrl_solve(params, traces, &signals)?,
            Algorithm::PpProp(_) => self.pp_solve(params, traces, signal_src, c, &mut pp_rows)?,
        };
        for (i, t) in solved {
            addg(i, t)?;
        }
        let grads = self
            .program_grads(np)
            .into_iter()
            .map(|i| grads[i].take().unwrap_or_else(|| params[i].zeros_like()))
            .collect();
        Ok((l, grads, signals, pp_rows))
    }

    /// The parameters (of `np`) whose per-step gradient the gradient
    /// program returns, in order; every other parameter's gradient comes
    /// from the learner's fused paths alone, or is zero — no zero tensor is
    /// made and added per step for them.
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
            if self.layout.fast[pi] || self.layout.pp_fast[pi] {
                continue;
            }
            for t in &self.eg.relations()[pair.rel].trainables {
                on[t.param] = true;
            }
        }
        (0..np).filter(|&i| on[i]).collect()
    }

    fn drtrl_solve(
        &self,
        params: &[Tensor],
        traces: &[Tensor],
        signals: &[Tensor],
    ) -> Result<Vec<(usize, Tensor)>> {
        let maps = self.drtrl_maps(traces);
        let mut out = Vec::new();
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            if self.layout.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            let p = &r.primitive;
            let s = self.eg.groups()[pair.group].num_state();
            let weights = self.weights(pair.rel, params);
            let eps = &maps[pi];
            let sig = &signals[pair.group];
            let mut acc: Option<TensorMap> = None;
            for a in 0..s {
                let g_a = last(sig, a)?;
                let eps_a: TensorMap = eps
                    .iter()
                    .map(|(k, t)| Ok((k.clone(), last(t, a)?)))
                    .collect::<Result<_>>()?;
                let res = if p.is_batched() {
                    let keys: Vec<String> = eps_a.keys().cloned().collect();
                    let (w, prm) = (weights.clone(), r.params.clone());
                    let ks = keys.clone();
                    let f = move |args: &[Tensor]| -> Result<Vec<Tensor>> {
                        let tr: TensorMap =
                            ks.iter().cloned().zip(args[1..].iter().cloned()).collect();
                        Ok(p.solve_drtrl(&args[0], &tr, &w, &prm)?
                            .into_values()
                            .collect())
                    };
                    let mut args = vec![g_a];
                    args.extend(eps_a.values().cloned());
                    let outs = vmap(f, vec![Some(0); args.len()])(&args)?;
                    let wkeys: Vec<String> = weights.keys().cloned().collect();
                    wkeys.into_iter().zip(outs).collect()
                } else {
                    p.solve_drtrl(&g_a, &eps_a, &weights, &r.params)?
                };
                acc = Some(add_maps(acc, res)?);
            }
            let acc = acc.unwrap_or_default();
            for t in &r.trainables {
                let gk = acc.get(&t.name).ok_or_else(|| {
                    Error::etp(
                        p.name(),
                        "D-RTRL solve",
                        format!("rules returned no `{}`", t.name),
                    )
                })?;
                out.push((
                    t.param,
                    reduce_to(gk, params[t.param].shape(), &t.param_key)?,
                ));
            }
        }
        Ok(out)
    }

    /// `signals`: the learning signal per hidden state.
    fn pp_solve(
        &self,
        params: &[Tensor],
        traces: &[Tensor],
        signals: &[Tensor],
        c: &Tensor,
        rows: &mut Vec<Tensor>,
    ) -> Result<Vec<(usize, Tensor)>> {
        let mut out = Vec::new();
        for (pi, pair) in self.layout.pairs.iter().enumerate() {
            let r = &self.eg.relations()[pair.rel];
            let (at, s) = self.layout.pp_states(pi);
            let states = &self.eg.groups()[pair.group].states;
            // Σ_a ε_f[a] · signal[a], over the group's states.
            let gsum = sum_of_products((0..s).map(|a| (&traces[at + a], &signals[states[a]])))?;
            let gsum = gsum.div(c)?;
            let x = match r.x_var {
                Some(v) => {
                    let i = self
                        .layout
                        .x_vars
                        .iter()
                        .position(|&u| u == v)
                        .expect("layout");
                    Some(traces[i].clone())
                }
                None => None,
            };
            if self.layout.pp_fast[pi] {
                // The learner accumulates `x̄ᵀ gsum` over a chunk of steps
                // (see `pp_fast`); `x̄` is a placeholder without input.
                rows.push(x.unwrap_or_else(|| Tensor::scalar(0.0)));
                rows.push(gsum);
                continue;
            }
            let weights = self.weights(pair.rel, params);
            let res = r
                .primitive
                .xy_to_dw(x.as_ref(), &gsum, &weights, &r.params)?;
            for t in &r.trainables {
                let gk = res.get(&t.name).ok_or_else(|| {
                    Error::etp(
                        r.primitive.name(),
                        "pp_prop solve",
                        format!("xy_to_dw returned no `{}`", t.name),
                    )
                })?;
                out.push((
                    t.param,
                    reduce_to(gk, params[t.param].shape(), &t.param_key)?,
                ));
            }
        }
        Ok(out)
    }
}
