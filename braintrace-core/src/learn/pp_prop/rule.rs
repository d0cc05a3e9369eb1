//! pp_prop's traces in the step program: the input traces `x̄` (one per
//! distinct relation input) then, per (relation, group) pair, its output
//! trace `f̄` as one tensor per state (`(V..)`, one after the other, so a
//! step reads and writes its states without slicing or stacking; the
//! public [`traces`](crate::learn::Learner::traces) stacks them to
//! `(V.., S)`). The update `x̄ ← α_x x̄ + x`,
//! `f̄[a] ← α_f Σ_c D[a, c] f̄[c] + (1 − α_f) Df[a]`, and the solve
//! `xy_to_dw(x̄, Σ_a f̄[a] g[a] / c)`, or, for a dense relation whose
//! gradient the learner accumulates ([`super::dense`]), its `x̄` and summed
//! signal.

use super::dense::{DenseRows, PpState};
use super::PpProp;
use crate::error::{Error, Result};
use crate::learn::algorithm::{
    Layout, Pair, SolveIn, Solved, StepEval, TraceRule, TraceState, Update,
};
use crate::learn::compiler::EtraceGraph;
use crate::learn::pp_fast::{transform_of, Leaf};
use crate::learn::shared::{reduce_to, stack_last, sum_of_products, weights};
use crate::learn::state::ModelState;
use crate::graph::VarId;
use crate::tensor::{Aval, DType, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// pp_prop planned for one compiled graph.
pub(crate) struct PpRule {
    eg: Arc<EtraceGraph>,
    pairs: Vec<Pair>,
    x_vars: Vec<VarId>,
    /// Per pair, the `f̄` aval `(V.., S)`.
    f_avals: Vec<Aval>,
    /// Per pair, whether the learner accumulates its weight gradients from
    /// `x̄` and the summed signal (a relation with a
    /// [`TraceKernel::Dense`](crate::etp::TraceKernel::Dense) kernel whose
    /// shapes fit): the solve then returns those two instead of calling
    /// `xy_to_dw`.
    dense: Vec<bool>,
    algo: PpProp,
    /// The model's dtype (the arithmetic) and the traces' in the program
    /// (`trace_dtype`: the model's or f32).
    model_dtype: DType,
    program_dtype: DType,
}

/// An output trace's `(V.., S)` aval: its number of states `S` and the
/// shape `V..` of each state's tensor.
fn split(a: &Aval) -> (usize, &[usize]) {
    let (&states, per) = a.shape().split_last().expect("(V.., S)");
    (states, per)
}

impl PpRule {
    pub(crate) fn plan(algo: &PpProp, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let g = eg.graph();
        let model_dtype = eg
            .relations()
            .first()
            .map_or(DType::F32, |r| g.aval(r.y_var).dtype());
        let program_dtype =
            algo.trace_dtype
                .program_dtype("pp_prop trace_dtype", "pp_prop", model_dtype)?;
        let mut f_avals = Vec::with_capacity(layout.pairs.len());
        let mut dense = Vec::with_capacity(layout.pairs.len());
        for pair in &layout.pairs {
            let r = &eg.relations()[pair.rel];
            let grp = &eg.groups()[pair.group];
            let s = grp.num_state();
            let y = g.aval(r.y_var).clone();
            let weights = crate::learn::shared::weight_avals(eg, pair.rel);
            let mut vs = grp.varshape.clone();
            vs.push(s);
            let xa = r.x_var.map(|v| g.aval(v).clone());
            let init = r
                .primitive
                .init_pp(xa.as_ref(), &y, &weights, s, &r.params)?;
            let ys = y.shape();
            let ok = ys == grp.varshape.as_slice()
                || (r.x_var.is_none() && grp.varshape.ends_with(ys));
            if !ok {
                return Err(Error::shapes(
                    "compile (pp_prop)",
                    [ys, grp.varshape.as_slice()],
                    format!(
                        "pp_prop needs the output y of {} (first) to have the hidden group's shape (second)",
                        r.primitive.name()
                    ),
                ));
            }
            f_avals.push(Aval::new(&vs, init.dtype()));
            let is_dense = algo.fast_paths
                && crate::learn::kernel_check::kernel_for(r, g, grp)?
                    .as_ref()
                    .map(crate::learn::fast::FusedKind::of)
                    == Some(crate::learn::fast::FusedKind::Dense)
                && crate::learn::pp_fast::transforms_readable(
                    r,
                    &r.trainables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>(),
                );
            let xa = r.x_var.map(|v| g.aval(v));
            dense.push(
                is_dense && crate::learn::pp_fast::shapes_fit(r, xa, &grp.varshape, &weights),
            );
        }
        Ok(PpRule {
            eg: eg.clone(),
            pairs: layout.pairs.clone(),
            x_vars: layout.x_vars.clone(),
            f_avals,
            dense,
            algo: *algo,
            model_dtype,
            program_dtype,
        })
    }

    /// Where pair `pi`'s per-state output traces start in the program's
    /// trace list, and how many states it has.
    fn states(&self, pi: usize) -> (usize, usize) {
        let states = |a: &Aval| split(a).0;
        let at = self.x_vars.len() + self.f_avals[..pi].iter().map(states).sum::<usize>();
        (at, states(&self.f_avals[pi]))
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
        for (i, v) in self.x_vars.iter().enumerate() {
            out.push(traces[i].mul_scalar(ax)?.add(&xs[v])?);
        }
        for (pi, pair) in self.pairs.iter().enumerate() {
            let (at, s) = self.states(pi);
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
        for (pi, pair) in self.pairs.iter().enumerate() {
            let r = &self.eg.relations()[pair.rel];
            let (at, s) = self.states(pi);
            let states = &self.eg.groups()[pair.group].states;
            // Σ_a ε_f[a] · signal[a], over the group's states.
            let gsum = sum_of_products((0..s).map(|a| (&traces[at + a], &signals[states[a]])))?;
            let gsum = gsum.div(c)?;
            let x = match r.x_var {
                Some(v) => {
                    let i = self
                        .x_vars
                        .iter()
                        .position(|&u| u == v)
                        .expect("layout");
                    Some(traces[i].clone())
                }
                None => None,
            };
            if self.dense[pi] {
                // The learner accumulates `x̄ᵀ gsum` over a chunk of steps
                // (see `pp_fast`); `x̄` is a placeholder without input.
                DenseRows {
                    x: x.unwrap_or_else(|| Tensor::scalar(0.0)),
                    g: gsum,
                }
                .push_to(rows);
                continue;
            }
            let weights = weights(&self.eg, pair.rel, params);
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

impl PpRule {
    /// The program's traces in the model's dtype (`trace_dtype` F32 on an
    /// f64 model: stored as f32, computed with in f64).
    fn in_model(&self, traces: &[Tensor]) -> Result<Vec<Tensor>> {
        traces.iter().map(|t| t.cast(self.model_dtype)).collect()
    }
}

impl TraceRule for PpRule {
    fn zeros(&self) -> Vec<Tensor> {
        let g = self.eg.graph();
        self.x_vars
            .iter()
            .map(|&v| Tensor::zeros(g.aval(v).shape(), self.program_dtype))
            .chain(self.f_avals.iter().flat_map(|a| {
                let (states, per) = split(a);
                (0..states).map(move |_| Tensor::zeros(per, self.program_dtype))
            }))
            .collect()
    }

    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        // The leaves of every pair whose gradients the learner accumulates.
        let pairs = self
            .pairs
            .iter()
            .zip(&self.dense)
            .filter(|(_, &f)| f)
            .map(|(pair, _)| {
                let r = &self.eg.relations()[pair.rel];
                r.trainables
                    .iter()
                    .map(|t| Leaf {
                        param: t.param,
                        has_input: crate::learn::pp_fast::has_input(r, &t.name),
                        transform: transform_of(r, &t.name).flatten(),
                    })
                    .collect()
            })
            .collect();
        Ok(Box::new(PpState::new(pairs, state.dtype())))
    }

    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        let (ax, af) = (self.algo.decay_x, self.algo.decay_f);
        let traces = self.in_model(traces)?;
        let new = self.pp_update(ax, af, &traces, &step.d_cols, &step.df, &step.xs)?;
        let new = new
            .iter()
            .map(|t| t.cast(self.program_dtype))
            .collect::<Result<_>>()?;
        Ok(Update {
            traces: new,
            extra: Vec::new(),
        })
    }

    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        let mut rows = Vec::new();
        let traces = self.in_model(s.traces)?;
        let grads = self.pp_solve(s.params, &traces, s.signal, s.scalar, &mut rows)?;
        Ok(Solved { grads, extra: rows })
    }

    fn in_program(&self, pair: usize) -> bool {
        !self.dense[pair]
    }

    fn forward_extra(&self) -> usize {
        0
    }

    fn scalar(&self, n: usize) -> f64 {
        self.algo.correction(n)
    }

    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        let nx = self.x_vars.len();
        let mut v = traces[..nx].to_vec();
        for pi in 0..self.f_avals.len() {
            let (at, s) = self.states(pi);
            v.push(stack_last(&traces[at..at + s])?);
        }
        v.extend(state.tensors());
        Ok(v)
    }

    fn public_params(&self) -> Vec<Vec<usize>> {
        // The input traces (shared by every relation reading that input),
        // then one output trace per pair.
        let rels = self.eg.relations();
        let params = |r: &crate::learn::Relation| r.trainables.iter().map(|t| t.param).collect::<Vec<_>>();
        let mut v: Vec<Vec<usize>> = self
            .x_vars
            .iter()
            .map(|&xv| {
                rels.iter()
                    .filter(|r| r.x_var == Some(xv))
                    .flat_map(params)
                    .collect()
            })
            .collect();
        v.extend(self.pairs.iter().map(|p| params(&rels[p.rel])));
        v
    }

    fn explain(&self) -> Vec<String> {
        vec![format!(
            "fused dense gradients (pp_prop): {} of {} relation-group pairs",
            self.dense.iter().filter(|&&f| f).count(),
            self.pairs.len()
        )]
    }
}
