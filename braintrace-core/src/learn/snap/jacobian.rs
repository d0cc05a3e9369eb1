//! A hidden group's transition `h_{t−1} ↦ h_t` differentiated through
//! everything it computes, the recurrent mixing (the weight operations
//! D-RTRL holds fixed) included: SnAp's coupled per-position blocks
//! (n = 1) and its full within-sample Jacobian (n = 2). One JVP per
//! (state, position), its tangent one-hot at that position of every
//! sample at once (samples never mix).

use crate::error::{Error, Result};
use crate::learn::compiler::{EtraceGraph, HiddenGroup};
use crate::learn::hooked::{eval_hooked, Hooks};
use crate::learn::shared::stack_last;
use crate::tensor::{DType, Tensor};
use crate::transform::jvp;

/// How a hidden group's states split into samples and positions: a
/// leading batch axis when the state has two or more axes, the other
/// axes flattened into `q` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Positions {
    /// Samples (1 without a batch axis).
    pub batch: usize,
    /// Whether the states have a batch axis.
    pub batched: bool,
    /// Positions per sample.
    pub q: usize,
}

impl Positions {
    pub(crate) fn of(grp: &HiddenGroup) -> Self {
        let vs = &grp.varshape;
        let batched = vs.len() >= 2;
        let (batch, rest) = if batched { (vs[0], &vs[1..]) } else { (1, &vs[..]) };
        Positions {
            batch,
            batched,
            q: rest.iter().product(),
        }
    }
    /// `(B, Q)` or `(Q)`.
    fn flat(&self) -> Vec<usize> {
        if self.batched {
            vec![self.batch, self.q]
        } else {
            vec![self.q]
        }
    }
}

/// `(Q, Q)` identity, or one of its rows' broadcast shapes, in `dtype`.
pub(crate) fn eye(q: usize, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let mut v = vec![0.0; q * q];
    for i in 0..q {
        v[i * q + i] = 1.0;
    }
    Tensor::from_vec(v, shape)?.cast(dtype)
}

/// `cols[c][p][a] = ∂h_a/∂h_c[p]` for group `gi` at the step inputs
/// `inputs` (`params ++ hidden ++ [x]`), each shaped like the states.
pub(crate) fn columns(
    eg: &EtraceGraph,
    gi: usize,
    inputs: &[Tensor],
) -> Result<Vec<Vec<Vec<Tensor>>>> {
    let grp = &eg.groups()[gi];
    let pos = Positions::of(grp);
    let states = grp.states.clone();
    let np = eg.num_params();
    let g = eg.graph();
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
    let mut cols = Vec::with_capacity(states.len());
    for c in 0..states.len() {
        let mut per_p = Vec::with_capacity(pos.q);
        for p in 0..pos.q {
            let mut hot = vec![0.0; pos.batch * pos.q];
            for b in 0..pos.batch {
                hot[b * pos.q + p] = 1.0;
            }
            let hot = Tensor::from_vec(hot, &grp.varshape)?.cast(dtype)?;
            let tans: Vec<Tensor> = primals
                .iter()
                .enumerate()
                .map(|(k, h)| if k == c { hot.clone() } else { h.zeros_like() })
                .collect();
            per_p.push(jvp(f, &primals, &tans)?.1);
        }
        cols.push(per_p);
    }
    Ok(cols)
}

/// The per-position `S × S` diagonal blocks of the Jacobian,
/// `D[.., a, c] = ∂h_a[q]/∂h_c[q]`, stacked `(V.., S, S)` as the D-RTRL
/// rule reads it.
pub(crate) fn coupled(grp: &HiddenGroup, cols: &[Vec<Vec<Tensor>>]) -> Result<Tensor> {
    let pos = Positions::of(grp);
    let s = cols.len();
    let flat = pos.flat();
    let mut ident_shape = vec![pos.q, pos.q];
    if pos.batched {
        ident_shape.insert(0, 1);
    }
    let mut rows = Vec::with_capacity(s);
    for a in 0..s {
        let mut row = Vec::with_capacity(s);
        for col in cols.iter().take(s) {
            // (B, Q, P): column p of state c's block, then its diagonal.
            let t = stack_last(
                &col.iter()
                    .map(|t| t[a].reshape(&flat))
                    .collect::<Result<Vec<_>>>()?,
            )?;
            let id = eye(pos.q, &ident_shape, t.dtype())?;
            let diag = t.mul(&id)?.sum(&[t.ndim() - 1])?;
            row.push(diag.reshape(&grp.varshape)?);
        }
        rows.push(stack_last(&row)?);
    }
    let nd = rows[0].ndim() - 1;
    crate::ops::stack(&rows, nd)
}

/// The full within-sample Jacobian `J[.., m, m']` with `m = q·S + a`
/// (row: state `a` at position `q`) and `m' = p·S + c`: `(B, M, M)` or
/// `(M, M)`, `M = Q·S`.
pub(crate) fn full(grp: &HiddenGroup, cols: &[Vec<Vec<Tensor>>]) -> Result<Tensor> {
    let pos = Positions::of(grp);
    let s = cols.len();
    let m = pos.q * s;
    let mut flat_m = pos.flat();
    *flat_m.last_mut().expect("positions") = m;
    let mut columns = Vec::with_capacity(m);
    for p in 0..pos.q {
        for col in cols.iter().take(s) {
            let per_a = col[p]
                .iter()
                .map(|t| t.reshape(&pos.flat()))
                .collect::<Result<Vec<_>>>()?;
            columns.push(stack_last(&per_a)?.reshape(&flat_m)?);
        }
    }
    if columns.is_empty() {
        return Err(Error::invalid("SnAp", "a hidden group with no positions"));
    }
    stack_last(&columns)
}
