//! UORO's part of the step program: per hidden group with relations its
//! full within-sample Jacobian, per (relation, group) pair and state `a`
//! the primitive's instantaneous term `ι_a` (`instant_drtrl`), handed to
//! the learner's [`UoroState`](super::state::UoroState); the solve hands
//! over the learning signal per group.

use super::state::UoroState;
use super::Uoro;
use crate::error::Result;
use crate::learn::algorithm::{
    Layout, Pair, SolveIn, Solved, StepEval, TraceRule, TraceState, Update, VjpMethod,
};
use crate::learn::compiler::EtraceGraph;
use crate::learn::drtrl::rule::{instant, trace_keys};
use crate::learn::shared::{stack_last, weights};
use crate::learn::snap::jacobian::{columns, full};
use crate::learn::state::ModelState;
use crate::error::Error;
use crate::tensor::Tensor;
use std::sync::Arc;

/// UORO planned for one compiled graph.
pub(crate) struct UoroRule {
    eg: Arc<EtraceGraph>,
    pairs: Vec<Pair>,
    /// Per pair, its trainables' names (sorted, `instant_drtrl`'s keys).
    keys: Vec<Vec<String>>,
    /// The groups some pair reaches, in index order.
    groups: Vec<usize>,
    algo: Uoro,
}

impl UoroRule {
    pub(super) fn plan(algo: &Uoro, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let mut keys = Vec::with_capacity(layout.pairs.len());
        let mut groups = Vec::new();
        for pair in &layout.pairs {
            keys.push(trace_keys(eg, pair)?.into_iter().map(|(k, _)| k).collect());
            if !groups.contains(&pair.group) {
                groups.push(pair.group);
            }
        }
        groups.sort_unstable();
        Ok(UoroRule {
            eg: eg.clone(),
            pairs: layout.pairs.clone(),
            keys,
            groups,
            algo: algo.clone(),
        })
    }
}

impl TraceRule for UoroRule {
    fn zeros(&self) -> Vec<Tensor> {
        Vec::new()
    }

    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        Ok(Box::new(UoroState::new(
            self.eg.clone(),
            self.pairs.clone(),
            self.keys.clone(),
            self.groups.clone(),
            &self.algo,
            state.dtype(),
        )?))
    }

    fn update(&self, step: &StepEval<'_>, _traces: &[Tensor]) -> Result<Update> {
        let mut extra = Vec::with_capacity(self.forward_extra());
        for &gi in &self.groups {
            let grp = &self.eg.groups()[gi];
            extra.push(full(grp, &columns(&self.eg, gi, step.inputs)?)?);
        }
        for (pi, pair) in self.pairs.iter().enumerate() {
            let r = &self.eg.relations()[pair.rel];
            let w = weights(&self.eg, pair.rel, step.params);
            let x = r.x_var.map(|v| step.xs[&v].clone());
            for df_a in &step.df[pi] {
                let mut inst = instant(r, x.clone(), df_a.clone(), &w)?;
                for k in &self.keys[pi] {
                    extra.push(inst.remove(k).ok_or_else(|| {
                        Error::etp(
                            r.primitive.name(),
                            "UORO",
                            format!("instant_drtrl returned no `{k}`"),
                        )
                    })?);
                }
            }
        }
        Ok(Update {
            traces: Vec::new(),
            extra,
        })
    }

    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        let extra = self
            .groups
            .iter()
            .map(|&gi| {
                let grp = &self.eg.groups()[gi];
                stack_last(&grp.states.iter().map(|&i| s.signal[i].clone()).collect::<Vec<_>>())
            })
            .collect::<Result<_>>()?;
        Ok(Solved {
            grads: Vec::new(),
            extra,
        })
    }

    fn in_program(&self, _pair: usize) -> bool {
        false
    }

    fn forward_extra(&self) -> usize {
        self.groups.len()
            + self
                .pairs
                .iter()
                .zip(&self.keys)
                .map(|(p, k)| self.eg.groups()[p.group].num_state() * k.len())
                .sum::<usize>()
    }

    fn public(&self, _traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        Ok(state.tensors())
    }

    fn explain(&self) -> Vec<String> {
        vec![format!(
            "UORO: rank-1 factors s̃ θ̃ᵀ for {} hidden group(s), {} ({}, eps {})",
            self.groups.len(),
            match &self.algo.draws {
                Some(d) => format!("{d:?} given"),
                None => format!("seed {}", self.algo.seed),
            },
            if self.algo.vjp_method == VjpMethod::MultiStep {
                "multi-step"
            } else {
                "single-step"
            },
            self.algo.eps
        )]
    }
}
