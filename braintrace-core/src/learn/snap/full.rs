//! SnAp-2 on an all-to-all neighbourhood: RTRL within each hidden group.
//! Each D-RTRL trace `(.., O, S)` of a (relation, group) pair widens to
//! `(.., O, M)`, `M = Q·S`: entry `m = q·S + a` holds `∂h_a[q]/∂θ[.., o]`.
//! The update `ε ← ε Jᵀ + δ_{o q} ι_a[.., o]` (`J` the full within-sample
//! Jacobian of [`super::jacobian::full`], `ι_a` the primitive's
//! `instant_drtrl` for state `a`) and the solve
//! `solve_drtrl(1, Σ_m g[m] ε[.., m])` reuse D-RTRL's per-primitive rules.

use super::jacobian::{columns, eye, full, Positions};
use super::SnAp;
use crate::error::{Error, Result};
use crate::etp::TensorMap;
use crate::learn::algorithm::{
    Layout, Pair, SolveIn, Solved, StepEval, TraceRule, TraceState, Update,
};
use crate::learn::compiler::EtraceGraph;
use crate::learn::drtrl::rule::{instant, param_grads, solve_leaves, trace_keys};
use crate::learn::shared::{add_maps, stack_last, weights};
use crate::learn::state::ModelState;
use crate::tensor::{Aval, Tensor};
use std::sync::Arc;

/// SnAp-2 planned for one compiled graph.
pub(crate) struct FullRule {
    eg: Arc<EtraceGraph>,
    pairs: Vec<Pair>,
    /// Per pair, the trace keys and their widened avals `(.., O, Q·S)`.
    keys: Vec<Vec<(String, Aval)>>,
    /// Per group, whether some pair uses it (its Jacobian is computed).
    used: Vec<bool>,
}

impl FullRule {
    pub(super) fn plan(_algo: &SnAp, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let mut keys = Vec::with_capacity(layout.pairs.len());
        let mut used = vec![false; eg.groups().len()];
        for pair in &layout.pairs {
            let grp = &eg.groups()[pair.group];
            let r = &eg.relations()[pair.rel];
            let pos = Positions::of(grp);
            let s = grp.num_state();
            if grp.varshape.len() > 2 {
                return Err(Error::invalid(
                    "compile (SnAp-2)",
                    format!(
                        "hidden group {:?} has states of shape {:?}: SnAp-2 takes states of shape (H) or (B, H)",
                        grp.hidden_paths, grp.varshape
                    ),
                ));
            }
            let mut wide = Vec::new();
            for (k, a) in trace_keys(eg, pair)? {
                let sh = a.shape();
                let n = sh.len();
                let anchored = n >= 2
                    && sh[n - 2] == pos.q
                    && sh[n - 1] == s
                    && (!pos.batched || sh[0] == pos.batch);
                if !anchored {
                    return Err(Error::shapes(
                        "compile (SnAp-2)",
                        [sh, grp.varshape.as_slice()],
                        format!(
                            "the `{k}` trace of {} does not end with the hidden group's position axis and its states, so SnAp-2 cannot widen it",
                            r.primitive.name()
                        ),
                    ));
                }
                let mut w = sh[..n - 1].to_vec();
                w.push(pos.q * s);
                wide.push((k, Aval::new(&w, a.dtype())));
            }
            used[pair.group] = true;
            keys.push(wide);
        }
        Ok(FullRule {
            eg: eg.clone(),
            pairs: layout.pairs.clone(),
            keys,
            used,
        })
    }

    /// `t` as `(B, N, M)` (or `(N, M)` without a batch axis).
    fn rows(t: &Tensor, pos: Positions) -> Result<Tensor> {
        let m = *t.shape().last().expect("trace");
        let n = t.size() / m / pos.batch;
        if pos.batched {
            t.reshape(&[pos.batch, n, m])
        } else {
            t.reshape(&[n, m])
        }
    }

    /// Each pair's traces, in [`zeros`](TraceRule::zeros) order.
    fn split<'a>(&self, traces: &'a [Tensor]) -> Vec<&'a [Tensor]> {
        let mut at = 0;
        self.keys
            .iter()
            .map(|k| {
                let v = &traces[at..at + k.len()];
                at += k.len();
                v
            })
            .collect()
    }
}

impl TraceRule for FullRule {
    fn zeros(&self) -> Vec<Tensor> {
        self.keys
            .iter()
            .flat_map(|k| k.iter().map(|(_, a)| Tensor::zeros_aval(a)))
            .collect()
    }

    fn state(&self, _state: &ModelState) -> Result<Box<dyn TraceState>> {
        Ok(Box::new(NoState))
    }

    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        // Jᵀ per used group.
        let mut jt: Vec<Option<Tensor>> = Vec::with_capacity(self.used.len());
        for (gi, grp) in self.eg.groups().iter().enumerate() {
            jt.push(if self.used[gi] {
                let j = full(grp, &columns(&self.eg, gi, step.inputs)?)?;
                let nd = j.ndim();
                let mut perm: Vec<usize> = (0..nd).collect();
                perm.swap(nd - 1, nd - 2);
                Some(j.transpose(&perm)?)
            } else {
                None
            });
        }
        let mut out = Vec::with_capacity(traces.len());
        for ((pi, pair), eps) in self.pairs.iter().enumerate().zip(self.split(traces)) {
            let grp = &self.eg.groups()[pair.group];
            let pos = Positions::of(grp);
            let s = grp.num_state();
            let r = &self.eg.relations()[pair.rel];
            let w = weights(&self.eg, pair.rel, step.params);
            let x = r.x_var.map(|v| step.xs[&v].clone());
            let jt = jt[pair.group].as_ref().expect("used group");
            // ι per state, stacked (.., O, S), per key.
            let mut per_a: Vec<TensorMap> = Vec::with_capacity(s);
            for a in 0..s {
                per_a.push(instant(r, x.clone(), step.df[pi][a].clone(), &w)?);
            }
            for ((k, aval), e) in self.keys[pi].iter().zip(eps) {
                let rec = Self::rows(e, pos)?.matmul(jt)?.reshape(aval.shape())?;
                let parts = per_a
                    .iter()
                    .map(|m| {
                        m.get(k).cloned().ok_or_else(|| {
                            Error::etp(
                                r.primitive.name(),
                                "SnAp-2 trace update",
                                format!("instant_drtrl returned no `{k}`"),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let inst = stack_last(&parts)?; // (.., O, S)
                let n = inst.ndim();
                let inst = inst.expand_dims(n - 1)?; // (.., O, 1, S)
                let id = eye(pos.q, &[pos.q, pos.q, 1], inst.dtype())?;
                let inst = inst.mul(&id)?.reshape(aval.shape())?;
                out.push(rec.add(&inst)?.cast(aval.dtype())?);
            }
        }
        Ok(Update {
            traces: out,
            extra: Vec::new(),
        })
    }

    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        let mut grads = Vec::new();
        for ((pi, pair), eps) in self.pairs.iter().enumerate().zip(self.split(s.traces)) {
            let grp = &self.eg.groups()[pair.group];
            let pos = Positions::of(grp);
            let r = &self.eg.relations()[pair.rel];
            let w = weights(&self.eg, pair.rel, s.params);
            // The group's signal as (B, M, 1), m = q·S + a.
            let sig = stack_last(
                &grp.states
                    .iter()
                    .map(|&i| s.signal[i].clone())
                    .collect::<Vec<_>>(),
            )?;
            let m = pos.q * grp.num_state();
            let sig = if pos.batched {
                sig.reshape(&[pos.batch, m, 1])?
            } else {
                sig.reshape(&[m, 1])?
            };
            let mut eff = TensorMap::new();
            for ((k, aval), e) in self.keys[pi].iter().zip(eps) {
                let sh = aval.shape();
                let summed = Self::rows(e, pos)?.matmul(&sig)?;
                eff.insert(k.clone(), summed.reshape(&sh[..sh.len() - 1])?);
            }
            let ones = Tensor::ones(&grp.varshape, sig.dtype());
            let acc = add_maps(None, solve_leaves(r, ones, eff, &w)?)?;
            grads.extend(param_grads(r, &acc, s.params)?);
        }
        
        Ok(Solved {
            grads,
            extra: Vec::new(),
        })
    }

    fn in_program(&self, _pair: usize) -> bool {
        true
    }

    fn forward_extra(&self) -> usize {
        0
    }

    fn public(&self, traces: &[Tensor], _state: &dyn TraceState) -> Result<Vec<Tensor>> {
        Ok(traces.to_vec())
    }

    fn explain(&self) -> Vec<String> {
        vec![format!(
            "SnAp-2: RTRL within each hidden group ({} relation-group pairs, traces widened to Q·S)",
            self.pairs.len()
        )]
    }
}

/// SnAp-2 keeps every trace in the program.
struct NoState;

impl TraceState for NoState {}
