//! A hidden group's transition `h_{t−1} ↦ h_t` differentiated through
//! everything it computes, the recurrent mixing (the weight operations
//! D-RTRL holds fixed) included: SnAp's coupled per-position blocks
//! (n = 1, and OSTL's coupled scope) and its full within-sample Jacobian
//! (n = 2). One tangent per (state, position), one-hot at that position of
//! every sample at once (samples never mix), the tangents of a state
//! batched into a few vmapped JVPs.

use crate::error::{Error, Result};
use crate::learn::compiler::{EtraceGraph, HiddenGroup};
use crate::learn::hooked::{eval_hooked, Hooks};
use crate::learn::shared::stack_last;
use crate::tensor::{DType, Tensor};
use crate::transform::{jvp_graph, make_graph, vmap};

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

/// How many tangents one batched JVP carries: chosen so that a batched
/// tangent holds about this many elements (a few MiB), few enough that the
/// step's intermediate values stay small, many enough that the tangent's
/// matrix products are large.
const CHUNK_ELEMS: usize = 1 << 19;

/// The tangents of a group's transition `h_{t−1} ↦ h_t`, for tangent
/// stacks `(K, V..)` on state `c` (zero on the other states of the group):
/// one vmapped JVP per chunk of `CHUNK_ELEMS / size` tangents, not one JVP
/// per tangent (the step is traced once per chunk, and its products with
/// the tangents are one product of `K` times the rows). `tangents(lo, hi)`
/// builds the stack of tangents `lo..hi` of `count`; `each(lo, hi, outs)`
/// receives, per state `a` of the group, `∂h_a · tangent`, `(hi − lo, V..)`.
pub(crate) fn batched_jvps(
    eg: &EtraceGraph,
    gi: usize,
    inputs: &[Tensor],
    c: usize,
    count: usize,
    tangents: impl Fn(usize, usize) -> Result<Tensor>,
    mut each: impl FnMut(usize, usize, &Tensor, Vec<Tensor>) -> Result<()>,
) -> Result<()> {
    let grp = &eg.groups()[gi];
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
    let step = make_graph(f, &crate::ops::avals(&primals))?;
    let size: usize = grp.varshape.iter().product();
    let k = (CHUNK_ELEMS / size.max(1)).clamp(1, count.max(1));
    let tangent_of = |t: &[Tensor]| {
        let tans: Vec<Option<Tensor>> = (0..primals.len())
            .map(|j| (j == c).then(|| t[0].clone()))
            .collect();
        let (outs, touts) = jvp_graph(&step, &primals, &tans)?;
        Ok(outs
            .iter()
            .zip(touts)
            .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
            .collect())
    };
    let batched = vmap(tangent_of, vec![Some(0)]);
    let mut lo = 0;
    while lo < count {
        let hi = (lo + k).min(count);
        let t = tangents(lo, hi)?;
        let outs = batched(std::slice::from_ref(&t))?;
        each(lo, hi, &t, outs)?;
        lo = hi;
    }
    Ok(())
}

/// `cols[c][a] = ∂h_a/∂h_c[p]` stacked over the positions `p`, `(Q, V..)`,
/// for group `gi` at the step inputs `inputs` (`params ++ hidden ++ [x]`):
/// the tangent of position `p` is one-hot at `p` in every sample at once.
pub(crate) fn columns(eg: &EtraceGraph, gi: usize, inputs: &[Tensor]) -> Result<Vec<Vec<Tensor>>> {
    let grp = &eg.groups()[gi];
    let pos = Positions::of(grp);
    let np = eg.num_params();
    let dtype = inputs[np + grp.states[0]].dtype();
    let s = grp.states.len();
    let mut shape = vec![0];
    shape.extend(&grp.varshape);
    let hot = |lo: usize, hi: usize| {
        let mut v = vec![0.0; (hi - lo) * pos.batch * pos.q];
        for (i, p) in (lo..hi).enumerate() {
            for b in 0..pos.batch {
                v[(i * pos.batch + b) * pos.q + p] = 1.0;
            }
        }
        let mut sh = shape.clone();
        sh[0] = hi - lo;
        Tensor::from_vec(v, &sh)?.cast(dtype)
    };
    let mut cols = Vec::with_capacity(s);
    for c in 0..s {
        let mut parts: Vec<Vec<Tensor>> = vec![Vec::new(); s];
        batched_jvps(eg, gi, inputs, c, pos.q, hot, |_, _, _, outs| {
            for (part, o) in parts.iter_mut().zip(outs) {
                part.push(o);
            }
            Ok(())
        })?;
        cols.push(
            parts
                .iter()
                .map(|p| {
                    if p.len() == 1 {
                        Ok(p[0].clone())
                    } else {
                        crate::ops::concat(p, 0)
                    }
                })
                .collect::<Result<Vec<_>>>()?,
        );
    }
    Ok(cols)
}

/// The per-position `S × S` diagonal blocks of group `gi`'s transition
/// Jacobian, recurrent weight operations included, `D[.., a, c] =
/// ∂h_a[q]/∂h_c[q]`, stacked `(V.., S, S)` as the D-RTRL rule reads it
/// (braintrace's `recurrence_scope='coupled'`).
///
/// Each tangent is 1 at every position of one colour: the positions that
/// share their index past the batch axis (`batch`, the learner's batch
/// size when the group's first axis is it; every position is its own
/// colour otherwise). Samples of a batch do not reach one another within
/// a step, so a colour's positions never reach one another either and
/// each position reads its own diagonal block from the colour's tangent:
/// `S · V/B` tangents instead of `V · S`, batched ([`batched_jvps`]).
pub(crate) fn coupled(
    eg: &EtraceGraph,
    gi: usize,
    inputs: &[Tensor],
    batch: Option<usize>,
) -> Result<Tensor> {
    let grp = &eg.groups()[gi];
    let np = eg.num_params();
    let dtype = inputs[np + grp.states[0]].dtype();
    let vs = &grp.varshape;
    let size: usize = vs.iter().product();
    let lead = match batch {
        Some(b) if vs.first() == Some(&b) => b,
        _ => 1,
    };
    let colours = size / lead.max(1);
    let mut shape = vec![0];
    shape.extend(vs);
    let masks = |lo: usize, hi: usize| {
        let mut v = vec![0.0; (hi - lo) * size];
        for (i, c) in (lo..hi).enumerate() {
            for p in (c..size).step_by(colours.max(1)) {
                v[i * size + p] = 1.0;
            }
        }
        let mut sh = shape.clone();
        sh[0] = hi - lo;
        Tensor::from_vec(v, &sh)?.cast(dtype)
    };
    let s = grp.states.len();
    // cols[b][a] = D[.., a, b], each (V..): the outputs masked by their
    // colour, summed over the colours.
    let mut cols: Vec<Vec<Tensor>> = Vec::with_capacity(s);
    for b in 0..s {
        let mut col: Vec<Option<Tensor>> = vec![None; s];
        batched_jvps(eg, gi, inputs, b, colours, masks, |_, _, m, outs| {
            for (acc, o) in col.iter_mut().zip(&outs) {
                let part = o.mul(m)?.sum(&[0])?;
                *acc = Some(match acc.take() {
                    Some(a) => a.add(&part)?,
                    None => part,
                });
            }
            Ok(())
        })?;
        cols.push(
            col.into_iter()
                .map(|c| c.ok_or_else(|| Error::invalid("coupled Jacobian", "a group with no positions")))
                .collect::<Result<_>>()?,
        );
    }
    // Rows D[.., a, :], stacked over b, then over a.
    let rows: Vec<Tensor> = (0..s)
        .map(|a| stack_last(&cols.iter().map(|c| c[a].clone()).collect::<Vec<_>>()))
        .collect::<Result<_>>()?;
    let nd = rows[0].ndim() - 1;
    crate::ops::stack(&rows, nd)
}

/// The full within-sample Jacobian `J[.., m, m']` with `m = q·S + a`
/// (row: state `a` at position `q`) and `m' = p·S + c`: `(B, M, M)` or
/// `(M, M)`, `M = Q·S`.
pub(crate) fn full(grp: &HiddenGroup, cols: &[Vec<Tensor>]) -> Result<Tensor> {
    let pos = Positions::of(grp);
    let s = cols.len();
    let m = pos.q * s;
    if m == 0 {
        return Err(Error::invalid("SnAp", "a hidden group with no positions"));
    }
    // cols[c][a]: (P, V..) -> (P, B.., Q); stacked over a, then flattened
    // to m = q·S + a: (P, B.., M); stacked over c after P and flattened to
    // m' = p·S + c: (P·S, B.., M); the column axis moved last.
    let mut pm = vec![pos.q];
    pm.extend(pos.flat());
    let mut per_c = Vec::with_capacity(s);
    for col in cols {
        let per_a = col
            .iter()
            .map(|t| t.reshape(&pm))
            .collect::<Result<Vec<_>>>()?;
        let mut flat_m = pm.clone();
        *flat_m.last_mut().expect("positions") = m;
        per_c.push(stack_last(&per_a)?.reshape(&flat_m)?);
    }
    let st = crate::ops::stack(&per_c, 1)?;
    let mut sh = vec![pos.q * s];
    sh.extend(&st.shape()[2..]);
    let st = st.reshape(&sh)?;
    let nd = st.ndim();
    let perm: Vec<usize> = (1..nd).chain(std::iter::once(0)).collect();
    st.transpose(&perm)
}
