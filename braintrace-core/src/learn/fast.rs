//! Fused, in-place D-RTRL trace kernels for the dense built-ins (`etp_mm`,
//! `etp_mv` without weight or bias transforms, as braintrace's fast path).
//!
//! One pass over each trace per step applies the hidden Jacobian, adds the
//! instantaneous term and accumulates the gradient, on buffers the learner
//! owns — no allocation per step:
//!
//! ```text
//! ε[b,i,o,a] ← Σ_c D[b,o,a,c] ε[b,i,o,c] + x[b,i] Df[b,o,a]      (bias: x = 1, no i)
//! ∇[i,o]    += Σ_{b,a} g[b,o,a] ε[b,i,o,a]                        (after the update for
//!                                                                 single-step, before it
//!                                                                 for multi-step)
//! ```
//!
//! The same numbers as the registered rules (`yw_to_w`, `xy_to_dw`,
//! `yw_to_w` as solve), checked by a test against the generic path.

use crate::error::{Error, Result};
use crate::etp::{ParamValue, Params};
use crate::tensor::{to_standard, ArrayData, Aval, DType, Tensor};
use num_traits::Float;
use std::collections::BTreeMap;

/// When, relative to the trace update, the gradient is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Solve {
    /// No gradient (a plain `update`).
    None,
    /// From the updated trace (single-step).
    After,
    /// From the trace before the update (multi-step).
    Before,
}

/// What a fused D-RTRL trace kernel computes; the kernel must equal the
/// primitive's registered rules (`yw_to_w`, `xy_to_dw` and the solve) for
/// every equation it [applies](FusedKernel::applies) to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FusedKind {
    /// Traces on the output axis, as a dense product `y = x @ W + b` or an
    /// element-wise weight `y = w` has them: the `weight` trace of a
    /// primitive with an input is `(B?, I, O, S)` with
    /// `ε[b,i,o,a] ← Σ_c D[b,o,a,c] ε[b,i,o,c] + x[b,i] Df[b,o,a]`, and its
    /// gradient `∇[i,o] += Σ_{b,a} g[b,o,a] ε[b,i,o,a]`; every other trace
    /// (a bias, or the weight of a primitive without input) is `(B?, O, S)`
    /// with `x = 1` and the gradient shaped `(O,)`. The parameters must have
    /// exactly these shapes (checked at compile: a learner runs the rules
    /// for an equation whose shapes differ).
    Dense,
}

/// A fused, in-place D-RTRL trace kernel registered for an ETP primitive,
/// beside its four rules. The learner runs it instead of the rules (one
/// pass over each trace per step, on buffers it owns) for the equations
/// `applies` accepts, when [`DRtrl::fast_paths`](super::DRtrl::fast_paths)
/// is on; every other equation runs through the rules — still correct,
/// just slower.
///
/// The built-in entries: `etp_mm` and `etp_mv` without weight or bias
/// transforms, `etp_elemwise` without `weight_fn`. A library registers its
/// own with [`inventory`]-style submission:
///
/// ```
/// use braintrace_core::learn::{FusedKernel, FusedKind};
/// braintrace_core::__private::inventory::submit! {
///     FusedKernel { primitive: "my_dense", kind: FusedKind::Dense, applies: |_| true }
/// }
/// assert!(braintrace_core::learn::fused_kernels().any(|k| k.primitive == "my_dense"));
/// ```
///
/// Check a new entry against the rule path with `fast_paths(false)`: both
/// must give the same gradients and traces to rounding.
#[derive(Debug)]
pub struct FusedKernel {
    /// The primitive's registered name.
    pub primitive: &'static str,
    /// What the kernel computes.
    pub kind: FusedKind,
    /// Whether the kernel equals the rules for an equation with these
    /// parameters (e.g. only without a weight transform).
    pub applies: fn(&Params) -> bool,
}

inventory::collect!(FusedKernel);

/// Every registered fused kernel.
pub fn fused_kernels() -> impl Iterator<Item = &'static FusedKernel> {
    inventory::iter::<FusedKernel>.into_iter()
}

fn no_hooks(params: &Params) -> bool {
    let none = |k: &str| matches!(params.raw(k), None | Some(ParamValue::None));
    none("weight_fn") && none("bias_fn")
}

inventory::submit! { FusedKernel { primitive: "etp_mm", kind: FusedKind::Dense, applies: no_hooks } }
inventory::submit! { FusedKernel { primitive: "etp_mv", kind: FusedKind::Dense, applies: no_hooks } }
inventory::submit! { FusedKernel { primitive: "etp_elemwise", kind: FusedKind::Dense, applies: no_hooks } }

/// Whether the traces and parameters of a relation have the shapes `kind`
/// is written for (`vs`: the hidden group's shape, batch included; `keys`:
/// the trace avals by trainable; `weights`: the parameter avals).
pub(crate) fn shapes_fit(
    kind: FusedKind,
    x: Option<&Aval>,
    vs: &[usize],
    s: usize,
    keys: &[(String, Aval)],
    weights: &BTreeMap<String, Aval>,
) -> bool {
    match kind {
        FusedKind::Dense => {
            let Some((&o, lead)) = vs.split_last() else {
                return false;
            };
            keys.iter().all(|(k, trace)| {
                let Some(w) = weights.get(k) else {
                    return false;
                };
                match x.filter(|_| k == "weight") {
                    Some(x) => {
                        let Some((&i, xlead)) = x.shape().split_last() else {
                            return false;
                        };
                        let want = [lead, &[i, o, s]].concat();
                        xlead == lead && w.shape() == [i, o] && trace.shape() == want
                    }
                    None => w.shape() == [o] && trace.shape() == [vs, &[s]].concat(),
                }
            })
        }
    }
}

/// The fused kernel registered for an equation of `name` with `params`.
pub(crate) fn kernel_for(name: &str, params: &Params) -> Option<FusedKind> {
    fused_kernels()
        .find(|k| k.primitive == name && (k.applies)(params))
        .map(|k| k.kind)
}

/// A learner-owned trace buffer of one trainable of a fast pair.
#[derive(Clone, Debug)]
pub(crate) struct FastTrace {
    /// `weight` (has an input axis) or `bias`.
    pub has_input: bool,
    /// The trace, state-major: `(B?, I?, S, O)` in standard layout (the
    /// learner's public layout is `(B?, I?, O, S)`; the two are the same for
    /// one state per neuron). One state's row over the outputs is then
    /// contiguous, so the kernel vectorises over outputs for any `S`.
    pub data: ArrayData,
    /// The gradient accumulated since the last `take_grad`, shaped like the parameter.
    pub grad: ArrayData,
}

/// Zeros, allocated lazily by the OS (`calloc`): a large trace costs
/// nothing until the first step writes it.
fn zeros(dtype: DType, shape: &[usize]) -> Result<ArrayData> {
    let dim = ndarray::IxDyn(shape);
    match dtype {
        DType::F32 => Ok(ArrayData::F32(ndarray::ArrayD::zeros(dim))),
        DType::F64 => Ok(ArrayData::F64(ndarray::ArrayD::zeros(dim))),
        other => Err(Error::dtype(
            "D-RTRL fused dense kernel",
            format!("traces must be f32 or f64, got {other:?}"),
        )),
    }
}

impl FastTrace {
    pub(crate) fn new(
        has_input: bool,
        trace_shape: &[usize],
        param_shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        Ok(FastTrace {
            has_input,
            data: zeros(dtype, &swap_last2(trace_shape))?,
            grad: zeros(dtype, param_shape)?,
        })
    }
    /// Zero the trace.
    pub(crate) fn reset(&mut self) -> Result<()> {
        match &mut self.data {
            ArrayData::F32(a) => a.fill(0.0),
            ArrayData::F64(a) => a.fill(0.0),
            _ => {
                return Err(Error::dtype(
                    "D-RTRL fused dense kernel",
                    "traces must be f32 or f64",
                ))
            }
        }
        Ok(())
    }
    /// The trace as a tensor (a copy) in the public layout `(B?, I?, O, S)`.
    pub(crate) fn tensor(&self) -> Tensor {
        // One strided copy of the state-major buffer, axes swapped back.
        fn swapped<T: Clone>(a: &ndarray::ArrayD<T>) -> ndarray::ArrayD<T> {
            let mut v = a.view();
            let nd = v.ndim();
            if nd >= 2 {
                v.swap_axes(nd - 2, nd - 1);
            }
            to_standard(v)
        }
        Tensor::from_data(match &self.data {
            ArrayData::F32(a) => ArrayData::F32(swapped(a)),
            ArrayData::F64(a) => ArrayData::F64(swapped(a)),
            other => other.clone(),
        })
    }
    /// The accumulated gradient (a copy), and zero the accumulator.
    pub(crate) fn take_grad(&mut self) -> Result<Tensor> {
        let fresh = zeros(self.grad.dtype(), self.grad.shape())?;
        let g = std::mem::replace(&mut self.grad, fresh);
        Ok(Tensor::from_data(g))
    }

    /// One fused step. `x`: `(B?, I)` (ignored for a bias); `d`: `(B?, O, S, S)`;
    /// `df`: `(B?, O, S)`; `g`: `(B?, O, S)` when `solve` is not `None`.
    pub(crate) fn step(
        &mut self,
        x: Option<&Tensor>,
        d: &Tensor,
        df: &Tensor,
        g: Option<&Tensor>,
        solve: Solve,
    ) -> Result<()> {
        let op = "D-RTRL fused dense kernel";
        let dshape = d.shape().to_vec();
        let (o, s) = (dshape[dshape.len() - 3], dshape[dshape.len() - 1]);
        let batch: usize = dshape[..dshape.len() - 3].iter().product();
        if dshape.len() < 3 || df.ndim() < 2 {
            return Err(Error::shape(
                op,
                format!("D {dshape:?}, Df {:?}", df.shape()),
                "D must be (B?, O, S, S) and Df (B?, O, S)",
            ));
        }
        let tshape = swap_last2(self.data.shape());
        let i = if self.has_input {
            tshape[tshape.len() - 3]
        } else {
            1
        };
        if tshape.iter().product::<usize>() != batch * i * o * s {
            return Err(Error::shape(
                op,
                format!("trace {tshape:?}, D {dshape:?}"),
                "trace and D disagree",
            ));
        }
        let dt = self.data.dtype();
        let contiguous = |t: &Tensor| -> Result<ArrayData> {
            let t = t.cast(dt)?;
            // Row-major data as it is; otherwise one strided copy.
            Ok(match t.data()? {
                ArrayData::F32(a) if !a.is_standard_layout() => {
                    ArrayData::F32(to_standard(a.view()))
                }
                ArrayData::F64(a) if !a.is_standard_layout() => {
                    ArrayData::F64(to_standard(a.view()))
                }
                other => other.clone(),
            })
        };
        // State-major operands: D (B?, S, S, O), Df and g (B?, S, O).
        let nd = d.ndim();
        let mut dperm: Vec<usize> = (0..nd).collect();
        dperm.remove(nd - 3);
        dperm.push(nd - 3);
        let d = d.transpose(&dperm)?;
        let state_major = |t: &Tensor| -> Result<Tensor> {
            let n = t.ndim();
            let mut perm: Vec<usize> = (0..n).collect();
            perm.swap(n - 2, n - 1);
            t.transpose(&perm)
        };
        let df = state_major(df)?;
        let g = g.map(state_major).transpose()?;
        let g = g.as_ref();
        let (dd, dfd) = (contiguous(&d)?, contiguous(&df)?);
        let xd = match (self.has_input, x) {
            (true, Some(x)) => Some(contiguous(x)?),
            (true, None) => return Err(Error::invalid(op, "a weight trace needs x")),
            _ => None,
        };
        let gd = match g {
            Some(g) => Some(contiguous(g)?),
            None => None,
        };
        let dims = Dims { batch, i, o, s };
        let threads = if batch * i * o * s >= PAR_MIN_ELEMS {
            rayon::current_num_threads()
        } else {
            1
        };
        match (&mut self.data, &mut self.grad, &dd, &dfd) {
            (ArrayData::F32(e), ArrayData::F32(gr), ArrayData::F32(d), ArrayData::F32(df)) => {
                let xs = xd.as_ref().map(|a| slice32(a)).transpose()?;
                let gs = gd.as_ref().map(|a| slice32(a)).transpose()?;
                fused(
                    dims,
                    slice_mut(e)?,
                    slice_mut(gr)?,
                    xs,
                    std(d)?,
                    std(df)?,
                    gs,
                    solve,
                    threads,
                    0,
                );
            }
            (ArrayData::F64(e), ArrayData::F64(gr), ArrayData::F64(d), ArrayData::F64(df)) => {
                let xs = xd.as_ref().map(|a| slice64(a)).transpose()?;
                let gs = gd.as_ref().map(|a| slice64(a)).transpose()?;
                fused(
                    dims,
                    slice_mut(e)?,
                    slice_mut(gr)?,
                    xs,
                    std(d)?,
                    std(df)?,
                    gs,
                    solve,
                    threads,
                    0,
                );
            }
            _ => return Err(Error::dtype(op, "traces must be f32 or f64")),
        }
        Ok(())
    }
}

/// `shape` with its last two axes swapped.
fn swap_last2(shape: &[usize]) -> Vec<usize> {
    let mut v = shape.to_vec();
    let n = v.len();
    if n >= 2 {
        v.swap(n - 2, n - 1);
    }
    v
}

fn slice_mut<T>(a: &mut ndarray::ArrayD<T>) -> Result<&mut [T]> {
    a.as_slice_mut()
        .ok_or_else(|| Error::invalid("D-RTRL fused dense kernel", "trace buffer not contiguous"))
}
fn std<T>(a: &ndarray::ArrayD<T>) -> Result<&[T]> {
    a.as_slice()
        .ok_or_else(|| Error::invalid("D-RTRL fused dense kernel", "operand not contiguous"))
}
fn slice32(a: &ArrayData) -> Result<&[f32]> {
    match a {
        ArrayData::F32(a) => std(a),
        _ => Err(Error::dtype("D-RTRL fused dense kernel", "mixed dtypes")),
    }
}
fn slice64(a: &ArrayData) -> Result<&[f64]> {
    match a {
        ArrayData::F64(a) => std(a),
        _ => Err(Error::dtype("D-RTRL fused dense kernel", "mixed dtypes")),
    }
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    i: usize,
    o: usize,
    s: usize,
}

/// Below this many trace elements per trainable a step runs on the calling
/// thread: splitting costs more than it saves.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// The loop, on state-major buffers. `e`: `(batch, i, s, o)`; `grad`:
/// `(i, o)`; `x`: `(batch, i)`; `d`: `(batch, s, s, o)`; `df`, `g`:
/// `(batch, s, o)`.
///
/// Input rows are split into as many blocks as `threads` (one block when it
/// is 1), run on the current rayon pool: each block owns its gradient rows
/// and, per sample, one contiguous run of trace rows, so no two threads
/// write the same memory and the result does not depend on the number of
/// threads. Within a block the trace is streamed in memory order (sample by
/// sample); the block's gradient rows stay in cache.
#[allow(clippy::too_many_arguments)]
fn fused<T: Float + Send + Sync>(
    dims: Dims,
    e: &mut [T],
    grad: &mut [T],
    x: Option<&[T]>,
    d: &[T],
    df: &[T],
    g: Option<&[T]>,
    solve: Solve,
    threads: usize,
    tile: usize,
) {
    let Dims {
        batch,
        i: ni,
        o: no,
        s,
    } = dims;
    if batch == 0 || ni == 0 || no == 0 || s == 0 {
        return;
    }
    let g = g.filter(|_| solve != Solve::None);
    let blocks = threads.clamp(1, ni);
    let rows_per = ni.div_ceil(blocks);
    let blocks = ni.div_ceil(rows_per);
    let row_len = no * s;
    // parts[k][b]: block k's trace rows of sample b.
    let mut parts: Vec<Vec<&mut [T]>> = (0..blocks).map(|_| Vec::with_capacity(batch)).collect();
    for sample in e.chunks_mut(ni * row_len) {
        for (k, piece) in sample.chunks_mut(rows_per * row_len).enumerate() {
            parts[k].push(piece);
        }
    }
    let ctx = Ctx {
        dims,
        rows_per,
        tile: if tile == 0 {
            tile_rows(no, std::mem::size_of::<T>())
        } else {
            tile
        },
        x,
        d,
        df,
        g,
        solve,
    };
    if blocks == 1 {
        let part = parts.pop().expect("one block");
        block(&ctx, 0, part, grad);
    } else {
        use rayon::prelude::*;
        parts
            .into_par_iter()
            .zip(grad.par_chunks_mut(rows_per * no))
            .enumerate()
            .for_each(|(k, (part, grad))| block(&ctx, k, part, grad));
    }
}

/// What every block of one fused step reads.
struct Ctx<'a, T> {
    dims: Dims,
    rows_per: usize,
    tile: usize,
    x: Option<&'a [T]>,
    d: &'a [T],
    df: &'a [T],
    g: Option<&'a [T]>,
    solve: Solve,
}

/// Run block `k`, with AVX2 when the CPU has it (the same arithmetic — no
/// fused multiply-adds are introduced — in 8 lanes instead of 4).
fn block<T: Float>(ctx: &Ctx<'_, T>, k: usize, part: Vec<&mut [T]>, grad: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above), the only
            // requirement of a `target_feature` function.
            unsafe { block_avx2(ctx, k, part, grad) };
            return;
        }
    }
    block_body(ctx, k, part, grad);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_avx2<T: Float>(ctx: &Ctx<'_, T>, k: usize, part: Vec<&mut [T]>, grad: &mut [T]) {
    block_body(ctx, k, part, grad);
}

/// Gradient rows per tile: the tile's rows of the gradient (at most about
/// 64 KiB) stay in cache while every sample's trace rows of the tile stream
/// through once.
fn tile_rows(no: usize, elem: usize) -> usize {
    (65536 / (no * elem).max(1)).max(1)
}

#[inline(always)]
fn block_body<T: Float>(ctx: &Ctx<'_, T>, k: usize, mut part: Vec<&mut [T]>, grad: &mut [T]) {
    let Dims {
        i: ni, o: no, s, ..
    } = ctx.dims;
    let (x, d, df, g, solve) = (ctx.x, ctx.d, ctx.df, ctx.g, ctx.solve);
    let row_len = no * s;
    let i0 = k * ctx.rows_per;
    let rows = grad.len() / no;
    let tile = ctx.tile.max(1);
    let mut t0 = 0;
    while t0 < rows {
        let t1 = (t0 + tile).min(rows);
        let gtile = &mut grad[t0 * no..t1 * no];
        for (b, piece) in part.iter_mut().enumerate() {
            let db = &d[b * no * s * s..(b + 1) * no * s * s];
            let dfb = &df[b * no * s..(b + 1) * no * s];
            let gb = g.map(|g| &g[b * no * s..(b + 1) * no * s]);
            for (ii, (row, grow)) in piece[t0 * row_len..t1 * row_len]
                .chunks_exact_mut(row_len)
                .zip(gtile.chunks_exact_mut(no))
                .enumerate()
            {
                let xi = x.map(|x| x[b * ni + i0 + t0 + ii]).unwrap_or_else(T::one);
                match s {
                    1 => row1(row, grow, xi, db, dfb, gb, solve),
                    2 => row2(row, grow, xi, db, dfb, gb, solve),
                    _ => row_any(s, row, grow, xi, db, dfb, gb, solve),
                }
            }
        }
        t0 = t1;
    }
}

/// One trace row, one state per neuron: `D` is diagonal.
#[inline(always)]
fn row1<T: Float>(
    row: &mut [T],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = row.len();
    // Exact-length slices and zipped iterators: no bounds checks, so the
    // loop vectorises.
    let (db, dfb, grow) = (&db[..no], &dfb[..no], &mut grow[..no]);
    match (gb, solve) {
        (Some(gb), Solve::After) => {
            for (((e, gr), (&d, &f)), &gv) in row
                .iter_mut()
                .zip(grow.iter_mut())
                .zip(db.iter().zip(dfb))
                .zip(&gb[..no])
            {
                let v = d * *e + xi * f;
                *e = v;
                *gr = *gr + gv * v;
            }
        }
        (Some(gb), Solve::Before) => {
            for (((e, gr), (&d, &f)), &gv) in row
                .iter_mut()
                .zip(grow.iter_mut())
                .zip(db.iter().zip(dfb))
                .zip(&gb[..no])
            {
                *gr = *gr + gv * *e;
                *e = d * *e + xi * f;
            }
        }
        _ => {
            for (e, (&d, &f)) in row.iter_mut().zip(db.iter().zip(dfb)) {
                *e = d * *e + xi * f;
            }
        }
    }
}

/// One trace row, two states per neuron (LIF: `i`, `v`): `D` is 2 × 2.
/// `row` = `[e₀ (O) | e₁ (O)]`, `db` = `[D₀₀ | D₀₁ | D₁₀ | D₁₁]`.
#[inline(always)]
fn row2<T: Float>(
    row: &mut [T],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = grow.len();
    let (e0, e1) = row.split_at_mut(no);
    let (e0, e1, grow) = (&mut e0[..no], &mut e1[..no], &mut grow[..no]);
    let (d00, d01, d10, d11) = (
        &db[..no],
        &db[no..2 * no],
        &db[2 * no..3 * no],
        &db[3 * no..4 * no],
    );
    let (f0, f1) = (&dfb[..no], &dfb[no..2 * no]);
    match gb {
        Some(gb) => {
            let (g0, g1) = (&gb[..no], &gb[no..2 * no]);
            let before = solve == Solve::Before;
            for o in 0..no {
                let (c0, c1) = (e0[o], e1[o]);
                let n0 = d00[o] * c0 + d01[o] * c1 + xi * f0[o];
                let n1 = d10[o] * c0 + d11[o] * c1 + xi * f1[o];
                let (s0, s1) = if before { (c0, c1) } else { (n0, n1) };
                grow[o] = grow[o] + g0[o] * s0 + g1[o] * s1;
                e0[o] = n0;
                e1[o] = n1;
            }
        }
        None => {
            for o in 0..no {
                let (c0, c1) = (e0[o], e1[o]);
                e0[o] = d00[o] * c0 + d01[o] * c1 + xi * f0[o];
                e1[o] = d10[o] * c0 + d11[o] * c1 + xi * f1[o];
            }
        }
    }
}

/// One trace row, any number of states per neuron (state-major, as [`row2`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row_any<T: Float>(
    s: usize,
    row: &mut [T],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = grow.len();
    let mut out: Vec<T> = dfb[..s * no].iter().map(|&f| xi * f).collect();
    for a in 0..s {
        let acc = &mut out[a * no..(a + 1) * no];
        for c in 0..s {
            let dm = &db[(a * s + c) * no..(a * s + c + 1) * no];
            for ((v, &dv), &ev) in acc.iter_mut().zip(dm).zip(&row[c * no..(c + 1) * no]) {
                *v = *v + dv * ev;
            }
        }
    }
    if let Some(gb) = gb {
        let src: &[T] = if solve == Solve::Before { row } else { &out };
        for a in 0..s {
            for ((gr, &gv), &v) in grow
                .iter_mut()
                .zip(&gb[a * no..(a + 1) * no])
                .zip(&src[a * no..(a + 1) * no])
            {
                *gr = *gr + gv * v;
            }
        }
    }
    row.copy_from_slice(&out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The update written as the formula, element by element.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        dims: Dims,
        e: &mut [f64],
        grad: &mut [f64],
        x: Option<&[f64]>,
        d: &[f64],
        df: &[f64],
        g: &[f64],
        solve: Solve,
    ) {
        let Dims {
            batch,
            i: ni,
            o: no,
            s,
        } = dims;
        let old = e.to_vec();
        let at = |b: usize, i: usize, o: usize, a: usize| ((b * ni + i) * s + a) * no + o;
        let dat = |b: usize, a: usize, c: usize, o: usize| ((b * s + a) * s + c) * no + o;
        let fat = |b: usize, a: usize, o: usize| (b * s + a) * no + o;
        for b in 0..batch {
            for i in 0..ni {
                let xi = x.map_or(1.0, |x| x[b * ni + i]);
                for o in 0..no {
                    for a in 0..s {
                        let mut v = xi * df[fat(b, a, o)];
                        for c in 0..s {
                            v += d[dat(b, a, c, o)] * old[at(b, i, o, c)];
                        }
                        e[at(b, i, o, a)] = v;
                    }
                    if solve != Solve::None {
                        for a in 0..s {
                            let src = if solve == Solve::Before {
                                old[at(b, i, o, a)]
                            } else {
                                e[at(b, i, o, a)]
                            };
                            grad[i * no + o] += g[fat(b, a, o)] * src;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernel_equals_the_formula_on_one_and_several_threads() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for &(batch, ni, no, s, has_x) in &[
            (2, 5, 3, 1, true),
            (3, 7, 4, 2, true),
            (1, 4, 5, 3, true),
            (2, 1, 6, 2, false),
            (4, 2, 3, 1, true),
            (2, 9, 2, 4, true),
        ] {
            for solve in [Solve::None, Solve::After, Solve::Before] {
                let dims = Dims {
                    batch,
                    i: ni,
                    o: no,
                    s,
                };
                let mut draw = |n: usize| -> Vec<f64> {
                    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
                };
                let e0 = draw(batch * ni * no * s);
                let g0 = draw(ni * no);
                let x = draw(batch * ni);
                let d = draw(batch * no * s * s);
                let df = draw(batch * no * s);
                let g = draw(batch * no * s);
                let xo = has_x.then_some(&x[..]);
                let (mut er, mut gr) = (e0.clone(), g0.clone());
                reference(dims, &mut er, &mut gr, xo, &d, &df, &g, solve);
                for (threads, tile) in [(1, 0), (2, 0), (3, 1), (4, 2), (8, 0), (1, 3)] {
                    let (mut e, mut gk) = (e0.clone(), g0.clone());
                    pool.install(|| {
                        fused(
                            dims,
                            &mut e,
                            &mut gk,
                            xo,
                            &d,
                            &df,
                            Some(&g),
                            solve,
                            threads,
                            tile,
                        )
                    });
                    for (a, b) in e.iter().zip(&er).chain(gk.iter().zip(&gr)) {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{dims:?} {solve:?} threads {threads} tile {tile}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
