//! The coupled hidden-to-hidden Jacobian (braintrace's
//! `recurrence_scope='coupled'`): per position `q` of a hidden group, the
//! `S × S` block `D[q, a, b] = ∂h_{q,a}/∂h^{t−1}_{q,b}` of the *whole*
//! step, recurrent weight operations included (the default, diagonal
//! scope cuts the paths through them).
//!
//! braintrace takes the blocks out of the full `(V·S) × (V·S)` Jacobian.
//! Here each column set is one JVP whose tangent is 1 at every position of
//! one colour: the positions that share their index past the batch axis
//! (all positions when the learner is unbatched). Samples of a batch do
//! not reach one another within a step, so a colour's positions never
//! reach one another either and each position reads its own diagonal
//! block: `S · V/B` JVPs instead of `V · S`.

use crate::error::Result;
use crate::learn::compiler::EtraceGraph;
use crate::learn::hooked::{eval_hooked, Hooks};
use crate::learn::shared::stack_last;
use crate::tensor::Tensor;
use crate::transform::jvp;

/// The coupled `D`, `(V.., S, S)`, of every group of `eg`, at the step
/// inputs `inputs` (parameters, hidden states, `x`).
pub(super) fn coupled_jacobians(eg: &EtraceGraph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let g = eg.graph();
    let np = eg.num_params();
    let mut out = Vec::with_capacity(eg.groups().len());
    for grp in eg.groups() {
        let states = grp.states.clone();
        let f = |hs: &[Tensor]| {
            let mut ins = inputs.to_vec();
            for (k, &s) in states.iter().enumerate() {
                ins[np + s] = hs[k].clone();
            }
            let (o, _) = eval_hooked(g, &ins, &Hooks::default())?;
            Ok(states.iter().map(|&s| o[1 + s].clone()).collect())
        };
        let primals: Vec<Tensor> = states.iter().map(|&s| inputs[np + s].clone()).collect();
        let dtype = primals[0].dtype();
        let vs = &grp.varshape;
        let size: usize = vs.iter().product();
        // The colour of each position: its flat index past the batch axis.
        let lead = match eg.batch() {
            Some(b) if vs.first() == Some(&b) => b,
            _ => 1,
        };
        let colours = size / lead.max(1);
        let masks: Vec<Tensor> = (0..colours)
            .map(|c| {
                let data = (0..size)
                    .map(|p| if p % colours == c { 1.0 } else { 0.0 })
                    .collect();
                Tensor::from_vec(data, vs)?.cast(dtype)
            })
            .collect::<Result<_>>()?;
        let s = states.len();
        // cols[b][a] = D[.., a, b], each (V..): one column set per state b,
        // summed over the colours.
        let mut cols: Vec<Vec<Tensor>> = Vec::with_capacity(s);
        for b in 0..s {
            let mut col: Vec<Tensor> = primals.iter().map(Tensor::zeros_like).collect();
            for m in &masks {
                let tans: Vec<Tensor> = primals
                    .iter()
                    .enumerate()
                    .map(|(k, p)| if k == b { m.clone() } else { p.zeros_like() })
                    .collect();
                let (_, out) = jvp(f, &primals, &tans)?;
                for (acc, o) in col.iter_mut().zip(&out) {
                    *acc = acc.add(&o.mul(m)?)?;
                }
            }
            cols.push(col);
        }
        // Rows D[.., a, :], stacked over b, then over a.
        let rows: Vec<Tensor> = (0..s)
            .map(|a| stack_last(&cols.iter().map(|c| c[a].clone()).collect::<Vec<_>>()))
            .collect::<Result<_>>()?;
        let nd = rows[0].ndim() - 1;
        out.push(crate::ops::stack(&rows, nd)?);
    }
    Ok(out)
}
