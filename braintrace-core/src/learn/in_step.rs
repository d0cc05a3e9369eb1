//! The single-step learning signal with in-step paths counted once
//! ([`InStepPaths::Once`](super::InStepPaths::Once)).
//!
//! In a hidden group where one state is computed from another in the same
//! step (an LSTM's `h' = o ⊙ φ(c')`), the trace of the second state already
//! holds the path through the first: its `Df` is the total derivative of
//! `h'` with respect to the relation's output, through `c'`. The
//! single-step learning signal `g = ∂L/∂p` (a perturbation `p` added where
//! each state is produced) is a total derivative too: `g_c` contains the
//! path `c' → h' → L`. The solve `Σ_s g_s · ε_s` then counts the path
//! `W → c' → h' → L` twice — once in `g_c · ε_c` and once in `g_h · ε_h`.
//!
//! Counting it once takes the partial signal instead: the derivative of the
//! loss with respect to each state with the other states of its group held
//! fixed. With `J` the in-step Jacobian between a group's states, each
//! computed from the others' values (`J[s ← s']`, the other states cut), the
//! total signal is `g = ĝ + Jᵀ g` along the group's in-step edges, so
//!
//! ```text
//! ĝ = g − Jᵀ g
//! ```
//!
//! `Jᵀ g` is one reverse pass per such group: the step evaluated with every
//! state of the group replaced, after it is computed, by a given value
//! ([`Hooks::cut`]), the states as computed differentiated with respect to
//! those values. Paths through other groups and through weight ops are not
//! in `J` (the weight ops' outputs are held fixed, as in `D` and `Df`), so
//! their part of the signal stays total, as the relations' traces need.

use super::compiler::EtraceGraph;
use super::hooked::{eval_hooked, Hooks};
use crate::error::Result;
use crate::graph::VarId;
use crate::tensor::Tensor;
use crate::transform::vjp;
use std::collections::{HashMap, HashSet};

/// The states (indices into the model's hidden states) of each group of
/// `eg` in which one state is computed from another inside the step, not
/// through a variable of `boundary` (the outputs of weight ops, held fixed).
/// Only states an equation produces are listed (a state passed through
/// unchanged has no in-step part). Groups without such a path are left
/// out, so the correction costs nothing for them.
pub(crate) fn groups_with_in_step_paths(
    eg: &EtraceGraph,
    boundary: &HashSet<VarId>,
) -> Vec<Vec<usize>> {
    let g = eg.graph();
    let produced: HashSet<VarId> = g
        .eqns()
        .iter()
        .flat_map(|e| e.outputs().iter().copied())
        .collect();
    let mut found = Vec::new();
    for grp in eg.groups() {
        let states: Vec<usize> = grp
            .states
            .iter()
            .copied()
            .filter(|&s| produced.contains(&eg.hidden_out_var(s)))
            .collect();
        if states.len() < 2 {
            continue;
        }
        let vars: Vec<VarId> = states.iter().map(|&s| eg.hidden_out_var(s)).collect();
        let linked = vars.iter().any(|&src| {
            let mut reach: HashSet<VarId> = HashSet::from([src]);
            for e in g.eqns() {
                if e.inputs().iter().any(|v| reach.contains(v)) {
                    reach.extend(e.outputs().iter().filter(|o| !boundary.contains(o)));
                }
            }
            vars.iter().any(|v| *v != src && reach.contains(v))
        });
        if linked {
            found.push(states);
        }
    }
    found
}

/// The partial learning signal `ĝ = g − Jᵀ g` (see the module docs) from
/// the total one `total` (one per hidden state), for the groups `groups`
/// ([`groups_with_in_step_paths`]); `inputs` are the step graph's inputs
/// and `fixed` the values of the weight ops' outputs.
pub(crate) fn partial_signal(
    eg: &EtraceGraph,
    inputs: &[Tensor],
    fixed: &HashMap<VarId, Tensor>,
    groups: &[Vec<usize>],
    total: &[Tensor],
) -> Result<Vec<Tensor>> {
    let g = eg.graph();
    let mut signal = total.to_vec();
    // The states as the step computes them (the primal point of `J`).
    let all: Vec<VarId> = groups
        .iter()
        .flatten()
        .map(|&s| eg.hidden_out_var(s))
        .collect();
    let plain = Hooks {
        overrides: fixed.clone(),
        record: all,
        ..Hooks::default()
    };
    let (_, values) = eval_hooked(g, inputs, &plain)?;
    for states in groups {
        let vars: Vec<VarId> = states.iter().map(|&s| eg.hidden_out_var(s)).collect();
        let computed = |given: &[Tensor]| {
            let hooks = Hooks {
                overrides: fixed.clone(),
                cut: vars.iter().copied().zip(given.iter().cloned()).collect(),
                record: vars.clone(),
                ..Hooks::default()
            };
            let (_, rec) = eval_hooked(g, inputs, &hooks)?;
            Ok(vars.iter().map(|v| rec[v].clone()).collect())
        };
        let primals: Vec<Tensor> = vars.iter().map(|v| values[v].clone()).collect();
        let (_, pull) = vjp(computed, &primals)?;
        let cts: Vec<Tensor> = states.iter().map(|&s| total[s].clone()).collect();
        let jt_g = pull.apply(&cts)?;
        for (&s, d) in states.iter().zip(&jt_g) {
            signal[s] = signal[s].sub(d)?;
        }
    }
    Ok(signal)
}
