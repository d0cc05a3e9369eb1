//! SnAp-1: D-RTRL's traces, rule and fused kernels, rolled with the
//! per-position blocks of the transition's full Jacobian instead of the
//! Jacobian with the recurrent mixing held fixed.

use super::jacobian::coupled;
use super::SnAp;
use crate::error::Result;
use crate::learn::algorithm::{
    Layout, SolveIn, Solved, StepEval, TraceRule, TraceState, Update,
};
use crate::learn::compiler::EtraceGraph;
use crate::learn::drtrl::rule::DrtrlRule;
use crate::learn::drtrl::DRtrl;
use crate::learn::state::ModelState;
use crate::tensor::Tensor;
use std::sync::Arc;

/// SnAp-1 planned for one compiled graph: a D-RTRL rule fed other `D`s.
pub(crate) struct CoupledRule {
    eg: Arc<EtraceGraph>,
    inner: DrtrlRule,
}

impl CoupledRule {
    pub(super) fn plan(algo: &SnAp, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Self> {
        let d = DRtrl::default()
            .vjp_method(algo.vjp_method)
            .non_temporal(algo.non_temporal);
        Ok(CoupledRule {
            eg: eg.clone(),
            inner: DrtrlRule::plan(&d, eg, layout)?,
        })
    }
}

impl TraceRule for CoupledRule {
    fn zeros(&self) -> Vec<Tensor> {
        self.inner.zeros()
    }
    fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
        self.inner.state(state)
    }
    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        let mut d = Vec::with_capacity(self.eg.groups().len());
        let mut d_cols = Vec::with_capacity(self.eg.groups().len());
        for (gi, grp) in self.eg.groups().iter().enumerate() {
            let dg = coupled(&self.eg, gi, step.inputs, self.eg.batch())?;
            // d_cols[b][a] = D[.., a, b].
            let s = grp.num_state();
            let mut cols = Vec::with_capacity(s);
            for b in 0..s {
                let col_b = dg.index_axis(dg.ndim() - 1, b)?;
                cols.push(
                    (0..s)
                        .map(|a| col_b.index_axis(col_b.ndim() - 1, a))
                        .collect::<Result<Vec<_>>>()?,
                );
            }
            d_cols.push(cols);
            d.push(dg);
        }
        let coupled = StepEval {
            params: step.params,
            inputs: step.inputs,
            xs: step.xs.clone(),
            d_cols,
            df: step.df.clone(),
            d,
            df_stacked: step.df_stacked.clone(),
        };
        self.inner.update(&coupled, traces)
    }
    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        self.inner.solve(s)
    }
    fn in_program(&self, pair: usize) -> bool {
        self.inner.in_program(pair)
    }
    fn stacked(&self) -> bool {
        true
    }
    fn forward_extra(&self) -> usize {
        self.inner.forward_extra()
    }
    fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
        self.inner.public(traces, state)
    }
    fn explain(&self) -> Vec<String> {
        let mut v = vec!["SnAp-1: D-RTRL traces rolled with the coupled per-position Jacobian blocks".to_string()];
        v.extend(self.inner.explain());
        v
    }
}
