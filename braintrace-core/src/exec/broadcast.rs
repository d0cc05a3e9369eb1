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
    if e.inputs.len() != 2 || e.outputs.len() != 1 || e.prim.planned() != Some(Planned::Matmul)
    {
        return false;
    }
    let (a, b, y) = (
        &g.avals[e.inputs[0]],
        &g.avals[e.inputs[1]],
        &g.avals[e.outputs[0]],
    );
    let r = y.ndim();
    r >= 2
        && r <= MAX_SPREAD_RANK
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

/// A broadcast operand of a loop over `out`: the steps, in its own
/// elements, along each of the loop's axes, with its elements in
/// row-major (`c`) or column-major (`f`) order (0 along the axes it is
/// broadcast along).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Spread {
    out: Vec<usize>,
    c: Vec<usize>,
    f: Vec<usize>,
}

impl Spread {
    /// The spread of an operand of shape `a` over a loop of shape `out`
    /// (`a` broadcasts to `out`, see [`broadcasts_to`]).
    pub(super) fn new(a: &[usize], out: &[usize]) -> Spread {
        let r = out.len();
        let mut full = vec![1; r - a.len()];
        full.extend_from_slice(a);
        let mut c = vec![0; r];
        let mut step = 1;
        for k in (0..r).rev() {
            c[k] = if full[k] == 1 { 0 } else { step };
            step *= full[k];
        }
        let mut f = vec![0; r];
        step = 1;
        for k in 0..r {
            f[k] = if full[k] == 1 { 0 } else { step };
            step *= full[k];
        }
        Spread {
            out: out.to_vec(),
            c,
            f,
        }
    }

    /// Elements `[start, start + dst.len())` (in `order`) of the loop, read
    /// from the operand's elements `src` (in the same order), into `dst`.
    pub(super) fn fill<T: Copy>(&self, dst: &mut [T], src: &[T], start: usize, order: Order) {
        let r = self.out.len();
        if dst.is_empty() {
            return;
        }
        // Axis `j`-th fastest of the walk, and the operand's step along it.
        let (axis, steps): (fn(usize, usize) -> usize, &[usize]) = match order {
            Order::C => (|r, j| r - 1 - j, &self.c),
            Order::F => (|_, j| j, &self.f),
        };
        let mut idx = [0usize; MAX_SPREAD_RANK];
        let mut rem = start;
        for (j, ix) in idx.iter_mut().enumerate().take(r) {
            let n = self.out[axis(r, j)];
            *ix = rem % n;
            rem /= n;
        }
        let (n0, s0) = (self.out[axis(r, 0)], steps[axis(r, 0)]);
        let mut p = 0;
        while p < dst.len() {
            let run = (n0 - idx[0]).min(dst.len() - p);
            let off: usize = (0..r).map(|j| idx[j] * steps[axis(r, j)]).sum();
            let d = &mut dst[p..p + run];
            match s0 {
                0 => d.fill(src[off]),
                1 => d.copy_from_slice(&src[off..off + run]),
                s => {
                    for (k, x) in d.iter_mut().enumerate() {
                        *x = src[off + k * s];
                    }
                }
            }
            p += run;
            idx[0] += run;
            let mut j = 0;
            while j + 1 < r && idx[j] == self.out[axis(r, j)] {
                idx[j] = 0;
                idx[j + 1] += 1;
                j += 1;
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
