//! The fused sparse trace loop: one trace row of `S` states per stored
//! entry of a fixed CSR structure, gathered by the entry's output column.

use super::dense::split_rows;
use super::{KernelFloat, Operands, Solve, Store};

/// A sparse weight's structure, as the kernel reads it.
#[derive(Debug)]
pub(crate) struct SparseIdx {
    /// Input row of each stored entry.
    pub(crate) rows: Vec<usize>,
    /// Output column of each stored entry.
    pub(crate) cols: Vec<usize>,
    /// Inputs (`x`'s last axis).
    pub(crate) n_in: usize,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SpDims {
    pub(crate) batch: usize,
    pub(crate) nnz: usize,
    pub(crate) n_in: usize,
    pub(crate) o: usize,
    pub(crate) s: usize,
}

/// The sparse loop, on the public layouts: `e`: `(batch, nnz, s)`;
/// `grad`: `(nnz,)`; `x`: `(batch, n_in)`; `d`: `(batch, o, s, s)`; `df`,
/// `g`: `(batch, o, s)`; `scale`: `(nnz,)`. Stored entries are split into
/// blocks across `threads` as [`fused`] splits input rows.
pub(crate) fn sparse_fused<T: KernelFloat, E: Store<T>>(
    dims: SpDims,
    sp: &SparseIdx,
    e: &mut [E],
    grad: &mut [T],
    ops: Operands<'_, T>,
    solve: Solve,
    threads: usize,
) {
    let SpDims {
        batch, nnz, o, s, ..
    } = dims;
    if batch == 0 || nnz == 0 || o == 0 || s == 0 {
        return;
    }
    let ops = Operands {
        g: ops.g.filter(|_| solve != Solve::None),
        ..ops
    };
    let per = nnz.div_ceil(threads.clamp(1, nnz));
    let mut parts = split_rows(e, batch, nnz, s, per);
    if parts.len() == 1 {
        let part = parts.pop().expect("one block");
        sparse_block(dims, sp, ops, solve, 0, part, grad);
    } else {
        use rayon::prelude::*;
        parts
            .into_par_iter()
            .zip(grad.par_chunks_mut(per))
            .enumerate()
            .for_each(|(k, (part, grad))| sparse_block(dims, sp, ops, solve, k * per, part, grad));
    }
}

/// The stored entries `p0..p0 + grad.len()` of every sample.
pub(crate) fn sparse_block<T: KernelFloat, E: Store<T>>(
    dims: SpDims,
    sp: &SparseIdx,
    ops: Operands<'_, T>,
    solve: Solve,
    p0: usize,
    part: Vec<&mut [E]>,
    grad: &mut [T],
) {
    let SpDims { n_in, o: no, s, .. } = dims;
    let n = grad.len();
    let (rows, cols) = (&sp.rows[p0..p0 + n], &sp.cols[p0..p0 + n]);
    let scale = ops.scale.map(|sc| &sc[p0..p0 + n]);
    let mut new = vec![T::zero(); s];
    let mut cur = vec![T::zero(); s];
    for (b, piece) in part.into_iter().enumerate() {
        let db = &ops.d[b * no * s * s..(b + 1) * no * s * s];
        let dfb = &ops.df[b * no * s..(b + 1) * no * s];
        let gb = ops.g.map(|g| &g[b * no * s..(b + 1) * no * s]);
        let xb = ops.x.map(|x| &x[b * n_in..(b + 1) * n_in]);
        if s == 1 {
            for (j, (ev, gr)) in piece.iter_mut().zip(grad.iter_mut()).enumerate() {
                let c = cols[j];
                let xr = xb.map_or(T::one(), |x| x[rows[j]]);
                let inst = match scale {
                    Some(sc) => xr * dfb[c] * sc[j],
                    None => xr * dfb[c],
                };
                let old = ev.load();
                let v = E::flush(db[c] * old + inst);
                if let Some(gb) = gb {
                    let src = if solve == Solve::Before { old } else { v };
                    *gr = *gr + gb[c] * src;
                }
                *ev = E::store(v);
            }
            continue;
        }
        for (j, (ep, gr)) in piece.chunks_exact_mut(s).zip(grad.iter_mut()).enumerate() {
            let c = cols[j];
            let xr = xb.map_or(T::one(), |x| x[rows[j]]);
            let dm = &db[c * s * s..(c + 1) * s * s];
            let fv = &dfb[c * s..(c + 1) * s];
            for (cv, &ev) in cur.iter_mut().zip(ep.iter()) {
                *cv = ev.load();
            }
            for (a, nv) in new.iter_mut().enumerate() {
                let mut v = T::zero();
                for (cc, &ev) in cur.iter().enumerate() {
                    v = v + dm[a * s + cc] * ev;
                }
                let inst = match scale {
                    Some(sc) => xr * fv[a] * sc[j],
                    None => xr * fv[a],
                };
                *nv = E::flush(v + inst);
            }
            if let Some(gb) = gb {
                let src: &[T] = if solve == Solve::Before { &cur } else { &new };
                for (&gv, &v) in gb[c * s..(c + 1) * s].iter().zip(src) {
                    *gr = *gr + gv * v;
                }
            }
            for (ev, &v) in ep.iter_mut().zip(&new) {
                *ev = E::store(v);
            }
        }
    }
}
