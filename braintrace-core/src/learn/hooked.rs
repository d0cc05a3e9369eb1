//! The hooked evaluator the step programs read a step through: it
//! evaluates the step graph while holding chosen variables fixed (cutting
//! paths through weight ops), adding a perturbation right after chosen
//! variables and recording intermediates.

use crate::error::Result;
use crate::graph::{bind, Graph, VarId};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// What the hooked evaluator does besides evaluating.
#[derive(Default)]
pub(crate) struct Hooks {
    /// Variables whose value is given instead of computed.
    pub overrides: HashMap<VarId, Tensor>,
    /// Variables to which a perturbation is added where they are produced.
    pub perturb: HashMap<VarId, Tensor>,
    /// Variables whose value is replaced by the given one after their
    /// equation has computed it: the computed value is what `record`
    /// returns for them, and everything downstream sees the given one (a
    /// cut between a variable and its uses).
    pub cut: HashMap<VarId, Tensor>,
    /// Variables whose values are wanted.
    pub record: Vec<VarId>,
}

/// Evaluate `g` on `inputs` with `hooks`; returns the outputs and the
/// recorded values.
pub(crate) fn eval_hooked(
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
            let t = match hooks.cut.get(v) {
                Some(c) => c.clone(),
                None => t,
            };
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
