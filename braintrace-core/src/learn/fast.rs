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
use crate::tensor::{ArrayData, DType, Tensor};
use num_traits::Float;

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

/// Whether the dense fast path applies to an equation of `name` with `params`.
pub(crate) fn applies(name: &str, params: &Params) -> bool {
    let no_hook = |k: &str| matches!(params.raw(k), None | Some(ParamValue::None));
    matches!(name, "etp_mm" | "etp_mv") && no_hook("weight_fn") && no_hook("bias_fn")
}

/// A learner-owned trace buffer of one trainable of a fast pair.
#[derive(Clone, Debug)]
pub(crate) struct FastTrace {
    /// `weight` (has an input axis) or `bias`.
    pub has_input: bool,
    /// The trace, `(B?, I?, O, S)`, standard layout.
    pub data: ArrayData,
    /// The gradient accumulated since the last `take_grad`, shaped like the parameter.
    pub grad: ArrayData,
}

fn zeros(dtype: DType, shape: &[usize]) -> Result<ArrayData> {
    Ok(Tensor::zeros(shape, dtype).data()?.clone())
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
            data: zeros(dtype, trace_shape)?,
            grad: zeros(dtype, param_shape)?,
        })
    }
    /// Zero the trace.
    pub(crate) fn reset(&mut self) -> Result<()> {
        let shape = self.data.shape().to_vec();
        self.data = zeros(self.data.dtype(), &shape)?;
        Ok(())
    }
    /// The trace as a tensor (a copy).
    pub(crate) fn tensor(&self) -> Tensor {
        Tensor::from_data(self.data.clone())
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
        let tshape = self.data.shape().to_vec();
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
            // Already row-major data is shared, not copied; otherwise one
            // strided copy (ndarray's dynamic-rank `as_standard_layout` goes
            // element by element through a dynamic index).
            Ok(match t.data()? {
                ArrayData::F32(a) if !a.is_standard_layout() => ArrayData::F32(standard(a)),
                ArrayData::F64(a) if !a.is_standard_layout() => ArrayData::F64(standard(a)),
                other => other.clone(),
            })
        };
        let (dd, dfd) = (contiguous(d)?, contiguous(df)?);
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
                );
            }
            _ => return Err(Error::dtype(op, "traces must be f32 or f64")),
        }
        Ok(())
    }
}

/// A row-major copy of `a` (the inner loop runs over ndarray's chosen
/// innermost axis, not through a dynamic index per element).
fn standard<T: Copy + num_traits::Zero>(a: &ndarray::ArrayD<T>) -> ndarray::ArrayD<T> {
    let mut out = ndarray::ArrayD::zeros(a.raw_dim());
    out.assign(a);
    out
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

/// The loop. `e`: `(batch, i, o, s)`; `grad`: `(i, o)`; `x`: `(batch, i)`;
/// `d`: `(batch, o, s, s)`; `df`, `g`: `(batch, o, s)`.
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
    let run = |k: usize, part: Vec<&mut [T]>, grad: &mut [T]| {
        let i0 = k * rows_per;
        for (b, piece) in part.into_iter().enumerate() {
            let db = &d[b * no * s * s..(b + 1) * no * s * s];
            let dfb = &df[b * no * s..(b + 1) * no * s];
            let gb = g.map(|g| &g[b * no * s..(b + 1) * no * s]);
            for (ii, (row, grow)) in piece
                .chunks_exact_mut(row_len)
                .zip(grad.chunks_exact_mut(no))
                .enumerate()
            {
                let xi = x.map(|x| x[b * ni + i0 + ii]).unwrap_or_else(T::one);
                match s {
                    1 => row1(row, grow, xi, db, dfb, gb, solve),
                    2 => row2(row, grow, xi, db, dfb, gb, solve),
                    _ => row_any(s, row, grow, xi, db, dfb, gb, solve),
                }
            }
        }
    };
    if blocks == 1 {
        let part = parts.pop().expect("one block");
        run(0, part, grad);
    } else {
        use rayon::prelude::*;
        parts
            .into_par_iter()
            .zip(grad.par_chunks_mut(rows_per * no))
            .enumerate()
            .for_each(|(k, (part, grad))| run(k, part, grad));
    }
}

/// One trace row, one state per neuron: `D` is diagonal.
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
fn row2<T: Float>(
    row: &mut [T],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let cells = row
        .chunks_exact_mut(2)
        .zip(db.chunks_exact(4))
        .zip(dfb.chunks_exact(2));
    match gb {
        Some(gb) => {
            for (((cell, dm), f), (gr, gv)) in cells.zip(grow.iter_mut().zip(gb.chunks_exact(2))) {
                let (c0, c1) = (cell[0], cell[1]);
                let n0 = dm[0] * c0 + dm[1] * c1 + xi * f[0];
                let n1 = dm[2] * c0 + dm[3] * c1 + xi * f[1];
                let (s0, s1) = if solve == Solve::Before {
                    (c0, c1)
                } else {
                    (n0, n1)
                };
                *gr = *gr + gv[0] * s0 + gv[1] * s1;
                cell[0] = n0;
                cell[1] = n1;
            }
        }
        None => {
            for ((cell, dm), f) in cells {
                let (c0, c1) = (cell[0], cell[1]);
                cell[0] = dm[0] * c0 + dm[1] * c1 + xi * f[0];
                cell[1] = dm[2] * c0 + dm[3] * c1 + xi * f[1];
            }
        }
    }
}

/// One trace row, any number of states per neuron.
#[allow(clippy::too_many_arguments)]
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
    let mut out = vec![T::zero(); s];
    for (o, cell) in row.chunks_exact_mut(s).enumerate() {
        let dm = &db[o * s * s..(o + 1) * s * s];
        for (a, slot) in out.iter_mut().enumerate() {
            let mut acc = xi * dfb[o * s + a];
            for (c, &v) in cell.iter().enumerate() {
                acc = acc + dm[a * s + c] * v;
            }
            *slot = acc;
        }
        if let Some(gb) = gb {
            let src: &[T] = if solve == Solve::Before { cell } else { &out };
            let mut acc = T::zero();
            for (a, &v) in src.iter().enumerate() {
                acc = acc + gb[o * s + a] * v;
            }
            grow[o] = grow[o] + acc;
        }
        cell.copy_from_slice(&out);
    }
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
        let at = |b: usize, i: usize, o: usize, a: usize| ((b * ni + i) * no + o) * s + a;
        for b in 0..batch {
            for i in 0..ni {
                let xi = x.map_or(1.0, |x| x[b * ni + i]);
                for o in 0..no {
                    for a in 0..s {
                        let mut v = xi * df[(b * no + o) * s + a];
                        for c in 0..s {
                            v += d[((b * no + o) * s + a) * s + c] * old[at(b, i, o, c)];
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
                            grad[i * no + o] += g[(b * no + o) * s + a] * src;
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
                for threads in [1, 2, 3, 4, 8] {
                    let (mut e, mut gk) = (e0.clone(), g0.clone());
                    pool.install(|| {
                        fused(dims, &mut e, &mut gk, xo, &d, &df, Some(&g), solve, threads)
                    });
                    for (a, b) in e.iter().zip(&er).chain(gk.iter().zip(&gr)) {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{dims:?} {solve:?} threads {threads}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
