//! D-RTRL's traces in the step program: their layout (one tensor per
//! trainable of each (relation, group) pair, shaped by the primitive's
//! `init_drtrl`), the trace update
//! `ε ← Σ_b D[a, b] ε[b] + Df[a] ∂y/∂θ` through the primitive's
//! `yw_to_w` and `instant_drtrl`, and the solve `Σ_a g[a] ε[a]` through
//! `solve_drtrl`. Pairs a fused kernel runs keep their traces in the
//! learner instead ([`super::fused`]); the program hands those kernels
//! their `x`, `D` and `Df`.

use super::fused::{DrtrlState, FusedIn};
use super::DRtrl;
use crate::error::{Error, Result};
use crate::etp::TensorMap;
use crate::graph::VarId;
use crate::learn::algorithm::{
    Layout, Pair, SolveIn, Solved, StepEval, TraceRule, TraceState, Update, VjpMethod,
};
use crate::learn::compiler::EtraceGraph;
use crate::learn::shared::{add_maps, last, reduce_to, stack_last, weights};
use crate::learn::state::ModelState;
use crate::kernels::trace::Storage;
use crate::tensor::{Aval, DType, Tensor};
use crate::transform::vmap;
use std::collections::HashMap;
use std::sync::Arc;

/// D-RTRL planned for one compiled graph.
pub(crate) struct DrtrlRule {
    eg: Arc<EtraceGraph>,
    pairs: Vec<Pair>,
    /// Per pair, the trace keys (sorted) and shapes.
    keys: Vec<Vec<(String, Aval)>>,
    /// Per pair, whether the fused kernel of [`crate::learn::fast`] runs it
    /// (its traces then live in the learner, not in the program).
    fast: Vec<bool>,
    multi: bool,
    /// The model's dtype: the rules' arithmetic and the fused kernels'.
    model_dtype: DType,
    /// The dtype of the traces the program carries (the rule path's
    /// `trace_dtype`: the model's or f32).
    program_dtype: DType,
    /// How the fused kernels' traces are stored (`trace_dtype`).
    storage: Storage,
}

impl DrtrlRule {
    pub(super) fn plan(algo: &DRtrl, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let g = eg.graph();
        let op = "D-RTRL trace_dtype";
        let model_dtype = eg
            .relations()
            .first()
            .map_or(crate::tensor::DType::F32, |r| g.aval(r.y_var).dtype());
        let storage = algo.trace_dtype.storage(op, model_dtype)?;
        let mut program_dtype = model_dtype;
        let mut keys_all = Vec::with_capacity(layout.pairs.len());
        let mut fast = Vec::with_capacity(layout.pairs.len());
        for pair in &layout.pairs {
            let r = &eg.relations()[pair.rel];
            let grp = &eg.groups()[pair.group];
            let s = grp.num_state();
            let kernel = if algo.fast_paths {
                crate::learn::fast::kernel_for(r, g, grp)?
            } else {
                None
            };
            let y = g.aval(r.y_var).clone();
            let weights = crate::learn::shared::weight_avals(eg, pair.rel);
            let mut vs = grp.varshape.clone();
            vs.push(s);
            let xa = r.x_var.map(|v| g.aval(v).clone());
            let init = r
                .primitive
                .init_drtrl(xa.as_ref(), &y, &weights, s, &r.params)?;
            let keys: Vec<(String, Aval)> = init
                .into_iter()
                .filter(|(k, _)| weights.contains_key(k))
                .map(|(k, t)| {
                    // An op without x (element-wise) has a trace shaped
                    // like the hidden group (batch included).
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
                crate::learn::fast::shapes_fit(&k, xa, &grp.varshape, s, &keys, &weights, &r.params)
            }));
            if !fast.last().copied().unwrap_or(false) {
                program_dtype =
                    algo.trace_dtype
                        .program_dtype(op, r.primitive.name(), model_dtype)?;
            }
            keys_all.push(keys);
        }
        Ok(DrtrlRule {
            eg: eg.clone(),
            pairs: layout.pairs.clone(),
            keys: keys_all,
            fast,
            multi: algo.vjp_method == VjpMethod::MultiStep,
            model_dtype,
            program_dtype,
            storage,
        })
    }

    /// Split the flat D-RTRL traces into one map per pair (empty for the
    /// pairs the fused kernels run), in the model's dtype.
    fn drtrl_maps(&self, traces: &[Tensor]) -> Result<Vec<TensorMap>> {
        let mut it = traces.iter();
        self.keys
            .iter()
            .zip(&self.fast)
            .map(|(keys, &fast)| {
                if fast {
                    return Ok(TensorMap::new());
                }
                keys.iter()
                    .map(|(k, _)| {
                        let t = it.next().expect("layout");
                        Ok((k.clone(), t.cast(self.model_dtype)?))
                    })
                    .collect()
            })
            .collect()
    }

    /// The new traces of the pairs the rules run, per state `a`:
    /// `Σ_b yw_to_w(D[a, b], ε[b]) + instant_drtrl(x, Df[a])`, stacked on
    /// the trailing state axis (`ds` per group, `dfs` per pair).
    fn drtrl_update(
        &self,
        params: &[Tensor],
        traces: &[Tensor],
        ds: &[Tensor],
        dfs: &[Tensor],
        xs: &HashMap<VarId, Tensor>,
    ) -> Result<Vec<Tensor>> {
        let maps = self.drtrl_maps(traces)?;
        let mut out = Vec::with_capacity(traces.len());
        for (pi, pair) in self.pairs.iter().enumerate() {
            if self.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            let p = &r.primitive;
            let s = self.eg.groups()[pair.group].num_state();
            let d = &ds[pair.group];
            let eps = &maps[pi];
            let weights = weights(&self.eg, pair.rel, params);
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
                // Stored in the program's trace dtype (`trace_dtype`).
                out.push(new.cast(self.program_dtype)?);
            }
        }
        Ok(out)
    }

    fn drtrl_solve(
        &self,
        params: &[Tensor],
        traces: &[Tensor],
        signals: &[Tensor],
    ) -> Result<Vec<(usize, Tensor)>> {
        let maps = self.drtrl_maps(traces)?;
        let mut out = Vec::new();
        for (pi, pair) in self.pairs.iter().enumerate() {
            if self.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            let p = &r.primitive;
            let s = self.eg.groups()[pair.group].num_state();
            let weights = weights(&self.eg, pair.rel, params);
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

    /// How many pairs the fused kernels run.
    fn fused(&self) -> usize {
        self.fast.iter().filter(|&&f| f).count()
    }
}

impl TraceRule for DrtrlRule {
    fn zeros(&self) -> Vec<Tensor> {
        self.keys
            .iter()
            .zip(&self.fast)
            .filter(|(_, &f)| !f)
            .flat_map(|(keys, _)| {
                keys.iter()
                    .map(|(_, a)| Tensor::zeros(a.shape(), self.program_dtype))
            })
            .collect()
    }

    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        let eg = &self.eg;
        let mut fast = Vec::new();
        for (pi, pair) in self.pairs.iter().enumerate() {
            if !self.fast[pi] {
                continue;
            }
            let rel = &eg.relations()[pair.rel];
            let kind = crate::learn::fast::declared(&rel.primitive, &rel.params)
                .ok_or_else(|| Error::etp(rel.primitive.name(), "compile", "no fused kernel"))?;
            fast.push(DrtrlState::pair(
                kind,
                rel,
                pair.group,
                &self.keys[pi],
                self.storage,
                state.param_values(),
            )?);
        }
        Ok(Box::new(DrtrlState::new(fast, self.multi)))
    }

    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        let (ds, dfs) = (&step.d, &step.df_stacked);
        let new = self.drtrl_update(step.params, traces, ds, dfs, &step.xs)?;
        // What the fused kernels read, per fast pair.
        let mut extra = Vec::with_capacity(3 * self.fused());
        for (pi, pair) in self.pairs.iter().enumerate() {
            if !self.fast[pi] {
                continue;
            }
            let r = &self.eg.relations()[pair.rel];
            FusedIn {
                x: r.x_var
                    .map(|xv| step.xs[&xv].clone())
                    .unwrap_or_else(|| Tensor::scalar(0.0)),
                d: ds[pair.group].clone(),
                df: dfs[pi].clone(),
            }
            .push_to(&mut extra);
        }
        Ok(Update { traces: new, extra })
    }

    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        // The learning signal stacked per group, (V.., S): the solve's and
        // the fused kernels' operand.
        let signals: Vec<Tensor> = self
            .eg
            .groups()
            .iter()
            .map(|grp| {
                stack_last(
                    &grp.states
                        .iter()
                        .map(|&i| s.signal[i].clone())
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Result<_>>()?;
        let grads = self.drtrl_solve(s.params, s.traces, &signals)?;
        Ok(Solved {
            grads,
            extra: signals,
        })
    }

    fn in_program(&self, pair: usize) -> bool {
        !self.fast[pair]
    }

    fn stacked(&self) -> bool {
        true
    }

    fn forward_extra(&self) -> usize {
        3 * self.fused()
    }

    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        let mut v = traces.to_vec();
        v.extend(state.tensors());
        Ok(v)
    }

    fn explain(&self) -> Vec<String> {
        vec![format!(
            "fused trace kernels: {} of {} relation-group pairs",
            self.fused(),
            self.pairs.len()
        )]
    }
}
