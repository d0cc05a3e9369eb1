//! Operands of a fused loop broadcast along any of its axes (size-one
//! axes, or missing leading ones: `h[:, None, :]` in a loop over
//! `(B, I, O)`), and matrix products with a contraction of length one
//! (`x[..., :, None] @ d[..., None, :]`, an outer product), which are
//! element-wise products of two such operands and join the loop as one.
//!
//! A broadcast operand is filled into a block buffer block by block, as a
//! bias row is ([`fill_row`]): along the loop's fastest axis a run is
//! either one repeated element (the operand is broadcast along it) or a
//! contiguous run of the operand's elements, copied.

use super::*;

/// Most axes a fused loop with a broadcast operand may have (the walk keeps
/// its index on the stack).
pub(super) const MAX_SPREAD_RANK: usize = 8;

/// Whether `a` broadcasts to `out`: right-aligned, each of its axes of the
/// output's length or 1, and no more axes than [`MAX_SPREAD_RANK`].
pub(super) fn broadcasts_to(a: &[usize], out: &[usize]) -> bool {
    a.len() <= out.len()
        && out.len() <= MAX_SPREAD_RANK
        && a.iter()
            .rev()
            .zip(out.iter().rev())
            .all(|(&d, &o)| d == o || d == 1)
}

/// Whether equation `i` is a matrix product whose contraction has length
/// one, over operands of rank 2 or more of one float dtype:
/// `a (.., m, 1) @ b (.., 1, n)` is `a · b` broadcast to `(.., m, n)`,
/// element by element (one product per element; no sum), so it joins a
/// fused loop as a `mul` of two broadcast operands.
pub(super) fn outer_product(g: &Graph, i: usize) -> bool {
    let e = &g.eqns[i];
    if e.inputs.len() != 2 || e.outputs.len() != 1 || e.prim.planned() != Some(Planned::Matmul) {
        return false;
    }
    let (a, b, y) = (
        &g.avals[e.inputs[0]],
        &g.avals[e.inputs[1]],
        &g.avals[e.outputs[0]],
    );
    let r = y.ndim();
    (2..=MAX_SPREAD_RANK).contains(&r)
        && a.ndim() == r
        && b.ndim() == r
        && matches!(y.dtype(), DType::F32 | DType::F64)
        && a.dtype() == y.dtype()
        && b.dtype() == y.dtype()
        && a.shape()[r - 1] == 1
        && b.shape()[r - 2] == 1
        && broadcasts_to(a.shape(), y.shape())
        && broadcasts_to(b.shape(), y.shape())
}

/// How a fused loop runs equation `i`: an outer product as a `mul`, any
/// other by its primitive ([`core_kind`]).
pub(super) fn op_kind(g: &Graph, i: usize) -> OpKind {
    if outer_product(g, i) {
        OpKind::Binary(BinaryOp::Mul)
    } else {
        core_kind(g.eqns[i].prim.as_ref())
    }
}

/// Whether equation `i` multiplies two operands (a `mul`, or an outer
/// product): it may be folded into the `add` that alone reads it.
pub(super) fn is_product(g: &Graph, i: usize) -> bool {
    binary_op(g.eqns[i].prim.as_ref()) == Some(BinaryOp::Mul) || outer_product(g, i)
}

/// A broadcast operand of a loop: its walk in either memory order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Spread {
    c: Walk,
    f: Walk,
}

/// The loop's axes from fastest to slowest in one memory order: their
/// lengths, and the operand's steps along them in its own elements in that
/// order (0 along the axes it is broadcast along).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Walk {
    rank: usize,
    len: [usize; MAX_SPREAD_RANK],
    step: [usize; MAX_SPREAD_RANK],
}

impl Spread {
    /// The spread of an operand of shape `a` over a loop of shape `out`
    /// (`a` broadcasts to `out`, see [`broadcasts_to`]).
    pub(super) fn new(a: &[usize], out: &[usize]) -> Spread {
        let r = out.len();
        let mut full = vec![1; r - a.len()];
        full.extend_from_slice(a);
        let walk = |axes: &mut dyn Iterator<Item = usize>| {
            let mut w = Walk {
                rank: r,
                len: [1; MAX_SPREAD_RANK],
                step: [0; MAX_SPREAD_RANK],
            };
            let mut step = 1;
            for (j, k) in axes.enumerate() {
                w.len[j] = out[k];
                w.step[j] = if full[k] == 1 { 0 } else { step };
                step *= full[k];
            }
            w
        };
        Spread {
            c: walk(&mut (0..r).rev()),
            f: walk(&mut (0..r)),
        }
    }

    /// The runs of elements `[start, start + len)` (in `order`) of the
    /// loop, each where it starts in the operand's elements, into `runs`;
    /// `false` when there are more than [`Runs`] holds (`runs` then holds
    /// the first [`MAX_RUNS`]).
    pub(super) fn runs(&self, start: usize, len: usize, order: Order, runs: &mut Runs) -> bool {
        let w = match order {
            Order::C => &self.c,
            Order::F => &self.f,
        };
        let r = w.rank;
        runs.n = 0;
        runs.step = w.step[0];
        if len == 0 || r == 0 {
            return true;
        }
        let mut idx = [0usize; MAX_SPREAD_RANK];
        let (mut rem, mut off) = (start, 0);
        for (j, ix) in idx.iter_mut().enumerate().take(r) {
            *ix = rem % w.len[j];
            rem /= w.len[j];
            off += *ix * w.step[j];
        }
        let mut p = 0;
        while p < len {
            if runs.n == MAX_RUNS {
                return false;
            }
            let run = (w.len[0] - idx[0]).min(len - p);
            runs.at[runs.n] = (off, run);
            runs.n += 1;
            p += run;
            idx[0] += run;
            off += run * w.step[0];
            let mut j = 0;
            while j + 1 < r && idx[j] == w.len[j] {
                off -= idx[j] * w.step[j];
                idx[j] = 0;
                idx[j + 1] += 1;
                off += w.step[j + 1];
                j += 1;
            }
        }
        true
    }

    /// Elements `[start, start + dst.len())` (in `order`) of the loop, read
    /// from the operand's elements `src` (in the same order), into `dst`.
    /// `last`: the runs this buffer holds from the block before (an
    /// identical block is not written again; see [`Runs`]).
    pub(super) fn fill<T: Copy>(
        &self,
        dst: &mut [T],
        src: &[T],
        (start, order): (usize, Order),
        last: &mut Runs,
    ) {
        let mut runs = Runs::default();
        if !self.runs(start, dst.len(), order, &mut runs) {
            // Too many runs to remember: filled run by run.
            last.n = usize::MAX;
            self.fill_by_runs(dst, src, start, order);
            return;
        }
        if runs == *last {
            return;
        }
        let mut p = 0;
        for &(off, run) in &runs.at[..runs.n] {
            put_run(&mut dst[p..p + run], src, off, runs.step);
            p += run;
        }
        *last = runs;
    }

    /// [`Spread::fill`] without remembering the runs (any number).
    fn fill_by_runs<T: Copy>(&self, dst: &mut [T], src: &[T], start: usize, order: Order) {
        let mut p = 0;
        let mut runs = Runs::default();
        while p < dst.len() {
            // Up to `MAX_RUNS` runs at a time (the last may be cut short).
            let len = dst.len() - p;
            let ok = self.runs(start + p, len, order, &mut runs);
            let n = if ok { runs.n } else { MAX_RUNS };
            for &(off, run) in &runs.at[..n] {
                put_run(&mut dst[p..p + run], src, off, runs.step);
                p += run;
            }
        }
    }
}

/// Most runs a block's fill remembers ([`Runs`]).
const MAX_RUNS: usize = 16;

/// The runs of one block's fill of a broadcast operand, each `(offset in
/// the operand's elements, length)`, and the operand's step along the
/// runs: two blocks with the same runs hold the same elements, so a
/// buffer that holds them already (an operand broadcast along a middle
/// axis, `h[:, None, :]`, repeats its rows block after block) is not
/// written again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Runs {
    n: usize,
    step: usize,
    at: [(usize, usize); MAX_RUNS],
}

impl Default for Runs {
    /// No runs remembered (`n` matches no block's).
    fn default() -> Runs {
        Runs {
            n: usize::MAX,
            step: 0,
            at: [(0, 0); MAX_RUNS],
        }
    }
}

/// One run: `dst.len()` elements of `src` from `off` by `step` (0: one
/// element repeated).
fn put_run<T: Copy>(dst: &mut [T], src: &[T], off: usize, step: usize) {
    match step {
        0 => dst.fill(src[off]),
        1 => dst.copy_from_slice(&src[off..off + dst.len()]),
        s => {
            for (k, x) in dst.iter_mut().enumerate() {
                *x = src[off + k * s];
            }
        }
    }
}

/// The spreads of a group's broadcast operands over its loop of shape
/// `out`, in the order of `rows`: `None` for a trailing part of the loop's
/// shape (a row, filled by [`fill_row`]).
pub(super) fn spreads(g: &Graph, rows: &[(VarId, usize)], out: &[usize]) -> Vec<Option<Spread>> {
    rows.iter()
        .map(|&(v, _)| {
            let a = g.avals[v].shape();
            let row = a.len() < out.len() && a == &out[out.len() - a.len()..];
            (!row).then(|| Spread::new(a, out))
        })
        .collect()
}
