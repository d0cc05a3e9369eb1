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
use crate::learn::compiler::{EtraceGraph, Relation};
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
    pub(crate) fn plan(algo: &DRtrl, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
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
                crate::learn::kernel_check::kernel_for(r, g, grp)?
            } else {
                None
            };
            let weights = crate::learn::shared::weight_avals(eg, pair.rel);
            let keys = trace_keys(eg, pair)?;
            let xa = r.x_var.map(|v| g.aval(v));
            fast.push(kernel.is_some_and(|k| {
                crate::learn::kernel_check::shapes_fit(&k, xa, &grp.varshape, s, &keys, &weights, &r.params)
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
                let inst = instant(r, x.clone(), df_a, &weights)?;
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
                    return Err(Error::shapes(
                        "D-RTRL trace update",
                        [new.shape(), old.shape()],
                        format!(
                            "{}'s rules must keep the `{k}` trace's shape: new (first) vs old (second)",
                            p.name()
                        ),
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
                let res = solve_leaves(r, g_a, eps_a, &weights)?;
                acc = Some(add_maps(acc, res)?);
            }
            out.extend(param_grads(r, &acc.unwrap_or_default(), params)?);
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
            let kind = crate::learn::kernel_check::declared(&rel.primitive, &rel.params)
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

    fn public_params(&self) -> Vec<Vec<usize>> {
        // Program-carried traces (pairs without a fused kernel) first,
        // then the fused ones; each pair's in key order.
        let of = |pi: usize| {
            let r = &self.eg.relations()[self.pairs[pi].rel];
            self.keys[pi]
                .iter()
                .map(|(k, _)| {
                    r.trainables
                        .iter()
                        .filter(|t| &t.name == k)
                        .map(|t| t.param)
                        .collect()
                })
                .collect::<Vec<Vec<usize>>>()
        };
        let n = self.pairs.len();
        let mut v: Vec<Vec<usize>> = (0..n).filter(|&pi| !self.fast[pi]).flat_map(of).collect();
        v.extend((0..n).filter(|&pi| self.fast[pi]).flat_map(of));
        v
    }

    fn explain(&self) -> Vec<String> {
        vec![format!(
            "fused trace kernels: {} of {} relation-group pairs",
            self.fused(),
            self.pairs.len()
        )]
    }
}

/// The D-RTRL trace keys of pair `pair` (the trainables the primitive's
/// `init_drtrl` gives a trace) and their avals `(.., S)`: an op without
/// `x` (element-wise) has a trace shaped like the hidden group.
pub(crate) fn trace_keys(eg: &EtraceGraph, pair: &Pair) -> Result<Vec<(String, Aval)>> {
    let g = eg.graph();
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
        .init_drtrl(xa.as_ref(), &y, &weights, s, &r.params)?;
    Ok(init
        .into_iter()
        .filter(|(k, _)| weights.contains_key(k))
        .map(|(k, t)| {
            let a = if r.x_var.is_none() {
                Aval::new(&vs, t.dtype())
            } else {
                t.aval()
            };
            (k, a)
        })
        .collect())
}

/// Relation `r`'s instantaneous trace term for one state, `Df[a] ∂y/∂θ`
/// through the primitive's `instant_drtrl` (per sample for a batched
/// primitive): one tensor per trainable, shaped like its trace without
/// the state axis.
pub(crate) fn instant(
    r: &Relation,
    x: Option<Tensor>,
    df_a: Tensor,
    weights: &TensorMap,
) -> Result<TensorMap> {
    let p = &r.primitive;
    if !p.is_batched() {
        return p.instant_drtrl(x.as_ref(), &df_a, weights, &r.params);
    }
    let x = x.ok_or_else(|| {
        Error::etp(p.name(), "D-RTRL", "a batched primitive needs an x operand")
    })?;
    let (w, prm, p2) = (weights.clone(), r.params.clone(), p.clone());
    let f = move |args: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(p2
            .instant_drtrl(Some(&args[0]), &args[1], &w, &prm)?
            .into_values()
            .collect())
    };
    let outs = vmap(f, vec![Some(0), Some(0)])(&[x, df_a])?;
    Ok(weights.keys().cloned().zip(outs).collect())
}

/// Relation `r`'s gradients for one state, `g[a] ε[a]` through the
/// primitive's `solve_drtrl` (per sample for a batched primitive).
pub(crate) fn solve_leaves(
    r: &Relation,
    g_a: Tensor,
    eps_a: TensorMap,
    weights: &TensorMap,
) -> Result<TensorMap> {
    let p = &r.primitive;
    if !p.is_batched() {
        return p.solve_drtrl(&g_a, &eps_a, weights, &r.params);
    }
    let keys: Vec<String> = eps_a.keys().cloned().collect();
    let (w, prm, p2) = (weights.clone(), r.params.clone(), p.clone());
    let f = move |args: &[Tensor]| -> Result<Vec<Tensor>> {
        let tr: TensorMap = keys.iter().cloned().zip(args[1..].iter().cloned()).collect();
        Ok(p2
            .solve_drtrl(&args[0], &tr, &w, &prm)?
            .into_values()
            .collect())
    };
    let mut args = vec![g_a];
    args.extend(eps_a.into_values());
    let outs = vmap(f, vec![Some(0); args.len()])(&args)?;
    Ok(weights.keys().cloned().zip(outs).collect())
}

/// The solve's per-trainable results `acc` as gradients of relation `r`'s
/// parameters, each reduced to its parameter's shape.
pub(crate) fn param_grads(
    r: &Relation,
    acc: &TensorMap,
    params: &[Tensor],
) -> Result<Vec<(usize, Tensor)>> {
    r.trainables
        .iter()
        .map(|t| {
            let gk = acc.get(&t.name).ok_or_else(|| {
                Error::etp(
                    r.primitive.name(),
                    "D-RTRL solve",
                    format!("rules returned no `{}`", t.name),
                )
            })?;
            Ok((t.param, reduce_to(gk, params[t.param].shape(), &t.param_key)?))
        })
        .collect()
}
