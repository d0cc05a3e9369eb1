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
            // copy through a flat iterator (ndarray's dynamic-rank
            // `as_standard_layout` goes element by element).
            Ok(match t.data()? {
                ArrayData::F32(a) if !a.is_standard_layout() => ArrayData::F32(
                    ndarray::ArrayD::from_shape_vec(a.raw_dim(), a.iter().copied().collect())
                        .map_err(|e| Error::invalid(op, e.to_string()))?,
                ),
                ArrayData::F64(a) if !a.is_standard_layout() => ArrayData::F64(
                    ndarray::ArrayD::from_shape_vec(a.raw_dim(), a.iter().copied().collect())
                        .map_err(|e| Error::invalid(op, e.to_string()))?,
                ),
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
                );
            }
            _ => return Err(Error::dtype(op, "traces must be f32 or f64")),
        }
        Ok(())
    }
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

#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    i: usize,
    o: usize,
    s: usize,
}

/// The loop. `e`: `(batch, i, o, s)`; `grad`: `(i, o)`; `x`: `(batch, i)`;
/// `d`: `(batch, o, s, s)`; `df`, `g`: `(batch, o, s)`.
#[allow(clippy::too_many_arguments)]
fn fused<T: Float>(
    dims: Dims,
    e: &mut [T],
    grad: &mut [T],
    x: Option<&[T]>,
    d: &[T],
    df: &[T],
    g: Option<&[T]>,
    solve: Solve,
) {
    let Dims {
        batch,
        i: ni,
        o: no,
        s,
    } = dims;
    let g = g.filter(|_| solve != Solve::None);
    // Input row outermost: the gradient row stays in L1 across the batch,
    // and D, Df, g (one row per sample) stay in cache across input rows.
    for i in 0..ni {
        for b in 0..batch {
            let db = &d[b * no * s * s..(b + 1) * no * s * s];
            let dfb = &df[b * no * s..(b + 1) * no * s];
            let gb = g.map(|g| &g[b * no * s..(b + 1) * no * s]);
            let xi = x.map(|x| x[b * ni + i]).unwrap_or_else(T::one);
            let row = &mut e[(b * ni + i) * no * s..(b * ni + i + 1) * no * s];
            let grow = &mut grad[i * no..(i + 1) * no];
            if s == 1 {
                // Exact-length slices and zipped iterators: no bounds checks,
                // so the loop vectorises.
                let (db, dfb) = (&db[..no], &dfb[..no]);
                let (row, grow) = (&mut row[..no], &mut grow[..no]);
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
                continue;
            }
            let mut new = [T::zero(); 8];
            let mut tmp = vec![T::zero(); if s > 8 { s } else { 0 }];
            for o in 0..no {
                let cell = &mut row[o * s..(o + 1) * s];
                let dm = &db[o * s * s..(o + 1) * s * s];
                let out: &mut [T] = if s <= 8 { &mut new[..s] } else { &mut tmp[..] };
                for a in 0..s {
                    let mut acc = xi * dfb[o * s + a];
                    for c in 0..s {
                        acc = acc + dm[a * s + c] * cell[c];
                    }
                    out[a] = acc;
                }
                if let Some(gb) = gb {
                    let src: &[T] = if solve == Solve::Before { cell } else { out };
                    let mut acc = T::zero();
                    for a in 0..s {
                        acc = acc + gb[o * s + a] * src[a];
                    }
                    grow[o] = grow[o] + acc;
                }
                for (c, &v) in cell.iter_mut().zip(out.iter()) {
                    *c = v;
                }
            }
        }
    }
}
