//! The learner's side of the fused, in-place D-RTRL trace kernels a
//! primitive declares ([`TraceKernel`]: dense, element-wise, sparse, LoRA,
//! channel-first conv, with or without element-wise transforms), as
//! braintrace's fast path: the buffers ([`FastTrace`]) and the arranging of
//! a step's operands; the loops are in `kernels::trace`, the choice and the
//! check of a pair's kernel in `kernel_check`.
//!
//! One pass over each trace per step applies the hidden Jacobian, adds the
//! instantaneous term and accumulates the gradient, on buffers the learner
//! owns — no allocation per step:
//!
//! ```text
//! ε[b,i,o,a] ← Σ_c D[b,o,a,c] ε[b,i,o,c] + x[b,i] Df[b,o,a] f'(W)[i,o]   (bias: x = 1, no i)
//! ∇[i,o]    += Σ_{b,a} g[b,o,a] ε[b,i,o,a]                        (after the update for
//!                                                                 single-step, before it
//!                                                                 for multi-step)
//! ```
//!
//! `f'(W)` (1 without a transform) is computed once per `etrace_grad` or
//! `update` call (the parameters are constant within one), as are LoRA's
//! input map `b_fn(B)` and its gradient map `dB = α G a_fn(A)ᵀ ⊙ b_fn'(B)`,
//! applied once to the gradient `G` accumulated over the call.
//!
//! The same numbers as the registered rules (`yw_to_w`, `xy_to_dw` or
//! `instant_drtrl`, and `yw_to_w` or `solve_drtrl` as solve): checked at
//! the first compile against the rules, and by tests against the generic
//! path.

use super::custom_trace::{check_saved, CustomLeaf};
use crate::error::{Error, Result};
use crate::etp::{apply_fn, ElemFn, ParamType, Params, Role, TraceKernel};
use crate::kernels::pages;
use crate::kernels::trace::{
    run, Blocked, Dims, Loop, SpDims, SparseIdx, Storage, Stored, TraceBuf,
};
use crate::prims::CsrStructure;
use crate::tensor::{to_standard, ArrayData, DType, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use crate::kernels::trace::Solve;

pub(crate) use super::kernel_kind::{elem_fn, scale_fn, FusedKind};

/// A LoRA leaf's role.
#[derive(Clone, Debug)]
enum LoraLeaf {
    /// `lora_a`: input `α (x b_fn(B))`; `deps[1]` is `B`.
    A { alpha: f64, b_fn: Option<ElemFn> },
    /// `lora_b`: the effective weight's trace, its gradient mapped to `B`;
    /// `deps[1]` is `A`.
    B {
        alpha: f64,
        a_fn: Option<ElemFn>,
        b_fn: Option<ElemFn>,
    },
}

/// A convolution leaf's geometry.
#[derive(Clone, Debug)]
struct ConvLeaf {
    /// The equation's params.
    params: Params,
    /// The kernel's spatial shape.
    ks: Vec<usize>,
    /// The parameter's shape: `(O, C, ks..)` or `(O,)`.
    param_shape: Vec<usize>,
    /// Output positions.
    positions: usize,
    /// The trace's public shape.
    public: Vec<usize>,
}

/// What a leaf derives from the parameters once per call.
#[derive(Clone, Debug, Default)]
struct Prepared {
    /// The parameters it was derived from (held, so that an in-place
    /// change copies them first and the identity check below is sound).
    from: Vec<Tensor>,
    /// `f'(W)` of the leaf's transform, contiguous, in the trace's dtype.
    scale: Option<ArrayData>,
    /// LoRA `lora_a`: `b_fn(B)`.
    input_map: Option<Tensor>,
    /// LoRA `lora_b`: `a_fn(A)` and `b_fn'(B)`.
    grad_map: Option<(Tensor, Option<Tensor>)>,
}

/// A learner-owned trace buffer of one trainable of a fast pair.
#[derive(Clone, Debug)]
pub(crate) struct FastTrace {
    /// Whether the trace has an input axis (a weight with `x`).
    pub has_input: bool,
    /// The trace. Dense: `(B?, I?, O·S)`, each row of `O` outputs × `S`
    /// states laid out as [`Blocked`] says (the learner's public layout is
    /// `(B?, I?, O, S)`; the two are the same for one state per neuron).
    /// Sparse weight: the public layout `(B?, nnz, S)`. Stored in the
    /// algorithm's trace precision (`trace_dtype`), computed with in the
    /// gradient's dtype.
    pub data: TraceBuf,
    /// A dense trace row's layout (`n` outputs, `k = S` states).
    row: Blocked,
    /// The gradient accumulated since the last `take_grad`, shaped like the
    /// parameter (LoRA `lora_b`: like the effective weight, `(I, O)`).
    pub grad: ArrayData,
    /// A sparse weight's structure.
    sparse: Option<Arc<SparseIdx>>,
    /// The transform whose derivative scales the instantaneous term.
    hook: Option<ElemFn>,
    /// A LoRA `lora_a` / `lora_b` leaf.
    lora: Option<LoraLeaf>,
    /// A convolution leaf. Weight: the buffer is `(B, P, C·U, S, O)` (a
    /// dense weight trace per sample and position) and the gradient
    /// `(C·U, O)`; bias: a dense bias trace over `O·P` outputs, `(B, S, O·P)`,
    /// and the gradient `(O·P,)`.
    conv: Option<ConvLeaf>,
    /// The parameters (indices) the leaf derives its per-call values from;
    /// the first is its own.
    deps: Vec<usize>,
    prep: Prepared,
    /// A step's `D`, `Df` and `g` moved into the [`Blocked`] layout (more
    /// than one state), kept from step to step ([`Blocked::put`]).
    blocked: [Option<ArrayData>; 3],
    /// A hand-written kernel's leaf ([`TraceKernel::Custom`]): every method
    /// below hands over to it (`data` and `grad` are then unused).
    custom: Option<Box<CustomLeaf>>,
}

/// Zeros, allocated lazily by the OS (`calloc`): a large trace costs
/// nothing until the first step writes it, and is then backed by huge
/// pages where the OS grants them ([`pages::advise_huge`]).
fn zeros(dtype: DType, shape: &[usize]) -> Result<ArrayData> {
    fn advised<T: Clone + num_traits::Zero>(dim: ndarray::IxDyn) -> ndarray::ArrayD<T> {
        let mut a = ndarray::ArrayD::zeros(dim);
        if let Some(s) = a.as_slice_memory_order_mut() {
            pages::advise_huge(s);
        }
        a
    }
    let dim = ndarray::IxDyn(shape);
    match dtype {
        DType::F32 => Ok(ArrayData::F32(advised(dim))),
        DType::F64 => Ok(ArrayData::F64(advised(dim))),
        other => Err(Error::dtype_with(
            "D-RTRL fused dense kernel",
            "the trace",
            DType::FLOATS,
            other,
            format!("shape {shape:?}"),
        )),
    }
}

/// A tensor's data in `dt`, row-major (one strided copy when it is not).
fn contiguous(t: &Tensor, dt: DType) -> Result<ArrayData> {
    contiguous_t(t, dt)?.data().cloned()
}

/// A step's operand in `dt`, row-major: `t` itself (a handle, no copy)
/// when it already is, else a row-major copy. (A copy of each operand per
/// relation and step made a GRU D-RTRL step at hidden 128, batch 16 take
/// 0.101 ms instead of 0.091.)
fn contiguous_t(t: &Tensor, dt: DType) -> Result<Tensor> {
    let t = t.cast(dt)?;
    let fixed = match t.data()? {
        ArrayData::F32(a) if !a.is_standard_layout() => Some(ArrayData::F32(to_standard(a.view()))),
        ArrayData::F64(a) if !a.is_standard_layout() => Some(ArrayData::F64(to_standard(a.view()))),
        _ => None,
    };
    Ok(fixed.map_or(t, Tensor::from_data))
}

impl FastTrace {
    /// The buffer of trainable `key` of a relation run by `kernel`:
    /// `trace_shape` in the public layout, `param_shape` the parameter's,
    /// `dtype` the model's (the gradient's and the kernels' arithmetic),
    /// `storage` the trace's, `index` the relation's trainables' parameter
    /// indices.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn for_leaf(
        kernel: &TraceKernel,
        key: &str,
        has_x: bool,
        trace_shape: &[usize],
        param_shape: &[usize],
        dtype: DType,
        storage: Storage,
        params: &Params,
        index: &BTreeMap<String, usize>,
    ) -> Result<Self> {
        let op = "D-RTRL fused kernel";
        if !storage.fits(dtype) {
            return Err(Error::invalid(
                op,
                format!(
                    "{} traces for a {} model: f64 models keep f64 or f32 traces, f32 models f32 or bf16",
                    storage.name(),
                    dtype.name()
                ),
            ));
        }
        let own = *index
            .get(key)
            .ok_or_else(|| Error::invalid(op, format!("no trainable `{key}`")))?;
        let other = |k: &str| -> Result<usize> {
            index
                .get(k)
                .copied()
                .ok_or_else(|| Error::invalid(op, format!("no trainable `{k}`")))
        };
        let role = kernel
            .role(key)
            .ok_or_else(|| Error::invalid(op, format!("the trace kernel names no `{key}`")))?;
        let kind = FusedKind::of(kernel);
        let hook = scale_fn(kernel, &role, params)?;
        let custom = match kernel {
            TraceKernel::Custom(k) => Some(Box::new(CustomLeaf::new(
                k,
                key,
                trace_shape,
                param_shape,
                dtype,
                storage,
                params,
                index,
            )?)),
            _ => None,
        };
        // A custom leaf keeps its own buffers: these stay empty.
        let (data_shape, grad_shape) = match custom {
            Some(_) => (vec![0], vec![0]),
            None => (row_shape(trace_shape), param_shape.to_vec()),
        };
        let mut t = FastTrace {
            has_input: has_x && role != Role::Bias,
            data: TraceBuf::zeros(storage, &data_shape),
            row: Blocked {
                n: trace_shape
                    .get(trace_shape.len().wrapping_sub(2))
                    .copied()
                    .unwrap_or(1),
                k: trace_shape.last().copied().unwrap_or(1),
            },
            grad: zeros(dtype, &grad_shape)?,
            sparse: None,
            hook,
            lora: None,
            conv: None,
            deps: vec![own],
            prep: Prepared::default(),
            blocked: [None, None, None],
            custom,
        };
        if t.custom.is_some() {
            return Ok(t);
        }
        match (kind, &role) {
            (FusedKind::Sparse, Role::Weight) => {
                let TraceKernel::Sparse { structure, .. } = kernel else {
                    return Err(Error::invalid(op, "not a sparse kernel"));
                };
                let st = params
                    .raw(structure)
                    .and_then(CsrStructure::from_param)
                    .ok_or_else(|| {
                        Error::invalid(op, format!("no readable `{structure}` param"))
                    })?;
                t.sparse = Some(Arc::new(SparseIdx {
                    rows: st.rows(),
                    cols: st.indices.clone(),
                    n_in: st.shape.0,
                }));
                // The public layout: one entry's states side by side.
                t.data = TraceBuf::zeros(storage, trace_shape);
            }
            (FusedKind::Lora, Role::LoraA | Role::LoraB) => {
                let TraceKernel::Lora {
                    lora_b,
                    lora_a,
                    alpha,
                    a_fn,
                    b_fn,
                    ..
                } = kernel
                else {
                    return Err(Error::invalid(op, "not a LoRA kernel"));
                };
                let alpha = params.get::<f64>(op, alpha)?;
                let read = |k: &Option<String>| match k {
                    Some(k) => elem_fn(params, k),
                    None => Ok(None),
                };
                let b_fn = read(b_fn)?;
                if role == Role::LoraA {
                    t.lora = Some(LoraLeaf::A { alpha, b_fn });
                    t.deps.push(other(lora_b)?);
                } else {
                    let n = trace_shape.len();
                    if n < 3 {
                        return Err(Error::invalid(op, "a lora_b trace is (B?, I, O, S)"));
                    }
                    t.grad = zeros(dtype, &trace_shape[n - 3..n - 1])?;
                    t.lora = Some(LoraLeaf::B {
                        alpha,
                        a_fn: read(a_fn)?,
                        b_fn,
                    });
                    t.deps.push(other(lora_a)?);
                }
            }
            (FusedKind::Conv, _) => {
                let n = trace_shape.len();
                let (b, st) = (trace_shape[0], trace_shape[n - 1]);
                let bad = || Error::invalid(op, "conv trace and parameter shapes disagree");
                let (ks, positions) = if role == Role::Bias {
                    let o = *param_shape.first().ok_or_else(bad)?;
                    let p = trace_shape[2..n - 1].iter().product::<usize>();
                    t.data = TraceBuf::zeros(storage, &[b, o * p * st]);
                    t.row = Blocked { n: o * p, k: st };
                    t.grad = zeros(dtype, &[o * p])?;
                    (Vec::new(), p)
                } else {
                    let d = param_shape.len().checked_sub(2).ok_or_else(bad)?;
                    let (o, cu) = (param_shape[0], param_shape[1..].iter().product::<usize>());
                    let p = trace_shape[1..1 + d].iter().product::<usize>();
                    t.data = TraceBuf::zeros(storage, &[b, p, cu, o * st]);
                    t.row = Blocked { n: o, k: st };
                    t.grad = zeros(dtype, &[cu, o])?;
                    (param_shape[2..].to_vec(), p)
                };
                t.conv = Some(ConvLeaf {
                    params: params.clone(),
                    ks,
                    param_shape: param_shape.to_vec(),
                    positions,
                    public: trace_shape.to_vec(),
                });
            }
            _ => {}
        }
        Ok(t)
    }

    /// Derive the per-call values from the current parameters (a no-op
    /// when they are the tensors of the last call).
    pub(crate) fn prepare(&mut self, params: &[Tensor]) -> Result<()> {
        if let Some(c) = &mut self.custom {
            return c.prepare(params);
        }
        let cur: Vec<Tensor> = self.deps.iter().map(|&i| params[i].clone()).collect();
        let same = self.prep.from.len() == cur.len()
            && self.prep.from.iter().zip(&cur).all(|(a, b)| a.ptr_eq(b));
        if same {
            return Ok(());
        }
        let dt = self.grad.dtype();
        let scale = match &self.hook {
            Some(f) => {
                let dv = f.derivative(&cur[0])?;
                let dv = match &self.conv {
                    // Kernel: (O, C, ks..) -> (C·U, O).
                    Some(cv) if self.has_input => {
                        let o = cv.param_shape[0];
                        dv.reshape(&[o, dv.size() / o.max(1)])?.t()?
                    }
                    // Bias: (O,) spread over the positions, (O·P,).
                    Some(cv) => dv
                        .reshape(&[dv.size(), 1])?
                        .mul(&Tensor::ones(&[1, cv.positions], dv.dtype()))?,
                    None => dv,
                };
                Some(contiguous(&dv, dt)?)
            }
            None => None,
        };
        let (mut input_map, mut grad_map) = (None, None);
        match &self.lora {
            Some(LoraLeaf::A { b_fn, .. }) => input_map = Some(apply_fn(b_fn, &cur[1])?),
            Some(LoraLeaf::B { a_fn, b_fn, .. }) => {
                let af = apply_fn(a_fn, &cur[1])?;
                let db = match b_fn {
                    Some(f) => Some(f.derivative(&cur[0])?),
                    None => None,
                };
                grad_map = Some((af, db));
            }
            None => {}
        }
        self.prep = Prepared {
            from: cur,
            scale,
            input_map,
            grad_map,
        };
        Ok(())
    }

    /// The trace buffer's size in bytes.
    pub(crate) fn trace_bytes(&self) -> usize {
        if let Some(c) = &self.custom {
            return c.trace_bytes();
        }
        self.data.shape().iter().product::<usize>() * self.data.storage().size_bytes()
    }

    /// Zero the trace.
    pub(crate) fn reset(&mut self) -> Result<()> {
        if let Some(c) = &mut self.custom {
            return c.reset();
        }
        self.data.fill_zero();
        Ok(())
    }
    /// The trace as a tensor (a copy; bf16 widened to f32) in the public
    /// layout `(B?, I?, O, S)`.
    pub(crate) fn tensor(&self) -> Tensor {
        if let Some(c) = &self.custom {
            return c.tensor();
        }
        let data = self.data.widened();
        if self.sparse.is_some() {
            return Tensor::from_data(data);
        }
        // The rows in the public order: (.., n, S).
        let mut shape = self.data.shape().to_vec();
        shape.pop();
        shape.extend([self.row.n, self.row.k]);
        let rows = Tensor::from_data(self.row.moved(&data, false, &shape));
        match &self.conv {
            // Weight (B, P, CU, O, S) -> (B, P, O, CU, S) = (B, so.., O, C, ks.., S).
            Some(cv) if self.has_input => rows
                .transpose(&[0, 1, 3, 2, 4])
                .and_then(|t| t.reshape(&cv.public))
                .expect("the public shape has the buffer's size"),
            // Bias (B, O·P, S) = (B, O, so.., S).
            Some(cv) => rows
                .reshape(&cv.public)
                .expect("the public shape has the buffer's size"),
            None => rows,
        }
    }
    /// The trace buffer as it is kept (a copy; bf16 widened to f32,
    /// exactly), for a checkpoint.
    pub(crate) fn raw(&self) -> Tensor {
        if let Some(c) = &self.custom {
            return c.tensor();
        }
        Tensor::from_data(self.data.widened())
    }
    /// Whether `r` fits [`raw`](Self::raw)'s shape and dtype (`i`: the
    /// trace's position, for the message).
    pub(crate) fn check_raw(&self, i: usize, r: &Tensor) -> Result<()> {
        if let Some(c) = &self.custom {
            return c.check_raw(i, r);
        }
        check_saved(i, r, self.data.widened_dtype(), self.data.shape())
    }
    /// Replace the trace buffer by `r` (checked by [`check_raw`](Self::check_raw)).
    pub(crate) fn set_raw(&mut self, r: &Tensor) -> Result<()> {
        if let Some(c) = &mut self.custom {
            return c.set_raw(r);
        }
        self.data = TraceBuf::from_widened(
            self.data.storage(),
            r.data_for("Learner::resume")?,
            "Learner::resume",
        )?;
        Ok(())
    }
    /// Zero the gradient accumulator, dropping its contents.
    pub(crate) fn drop_grad(&mut self) -> Result<()> {
        if let Some(c) = &mut self.custom {
            return c.drop_grad();
        }
        self.grad = zeros(self.grad.dtype(), self.grad.shape())?;
        Ok(())
    }
    /// The gradient accumulated since the last call (LoRA `lora_b`: mapped
    /// to `B` with the parameters of the last [`prepare`](Self::prepare),
    /// which must be those of the steps it accumulates), and zero the
    /// accumulator.
    pub(crate) fn take_grad(&mut self) -> Result<Tensor> {
        if let Some(c) = &mut self.custom {
            return c.take_grad();
        }
        let fresh = zeros(self.grad.dtype(), self.grad.shape())?;
        let g = Tensor::from_data(std::mem::replace(&mut self.grad, fresh));
        match &self.lora {
            Some(LoraLeaf::B { alpha, .. }) => {
                let (af, db) = self.prep.grad_map.as_ref().ok_or_else(|| {
                    Error::invalid("D-RTRL fused LoRA kernel", "gradient taken before prepare")
                })?;
                let g = g.matmul(&af.t()?)?.mul_scalar(*alpha)?;
                match db {
                    Some(db) => g.mul(db),
                    None => Ok(g),
                }
            }
            _ => match &self.conv {
                Some(cv) if self.has_input => g.t()?.reshape(&cv.param_shape),
                Some(cv) => g
                    .reshape(&[g.size() / cv.positions.max(1), cv.positions])?
                    .sum(&[1]),
                None => Ok(g),
            },
        }
    }

    /// One fused step: a convolution's operands arranged per position, then
    /// [`step_flat`](Self::step_flat).
    pub(crate) fn step(
        &mut self,
        x: Option<&Tensor>,
        d: &Tensor,
        df: &Tensor,
        g: Option<&Tensor>,
        solve: Solve,
    ) -> Result<()> {
        if let Some(c) = &mut self.custom {
            return c.step(x, d, df, g, solve);
        }
        let Some(cv) = &self.conv else {
            return self.step_flat(x, d, df, g, solve);
        };
        let op = "D-RTRL fused conv kernel";
        let ds = d.shape().to_vec();
        let n = ds.len();
        if n < 5 {
            return Err(Error::shapes(op, [&ds], "D must be (B, O, so.., S, S)"));
        }
        let (b, o, s, p) = (ds[0], ds[1], ds[n - 1], cv.positions);
        if ds[2..n - 2].iter().product::<usize>() != p {
            return Err(Error::shapes(
                op,
                [&ds],
                format!("D and the trace ({p} output positions) disagree"),
            ));
        }
        if !self.has_input {
            // The bias: a dense bias trace over O·P outputs.
            let g = g.map(|g| g.reshape(&[b, o * p, s])).transpose()?;
            return self.step_flat(
                None,
                &d.reshape(&[b, o * p, s, s])?,
                &df.reshape(&[b, o * p, s])?,
                g.as_ref(),
                solve,
            );
        }
        // The kernel: a dense weight trace per sample and position, over the
        // patches (B·P, C·U) and the output channels.
        let x = x.ok_or_else(|| Error::invalid(op, "a kernel trace needs x"))?;
        let pt = crate::prims::conv::default_layout_patches(&cv.params, x, &cv.ks)?;
        let cu = pt.shape()[1];
        let xp = pt.transpose(&[0, 2, 1])?.reshape(&[b * p, cu])?;
        let per_pos = |t: &Tensor, tail: &[usize]| -> Result<Tensor> {
            let t = t.reshape(&[&[b, o, p][..], tail].concat())?;
            let mut perm = vec![0, 2, 1];
            perm.extend((0..tail.len()).map(|k| 3 + k));
            t.transpose(&perm)?
                .reshape(&[&[b * p, o][..], tail].concat())
        };
        let g = g.map(|g| per_pos(g, &[s])).transpose()?;
        self.step_flat(
            Some(&xp),
            &per_pos(d, &[s, s])?,
            &per_pos(df, &[s])?,
            g.as_ref(),
            solve,
        )
    }

    /// One fused step. `x`: `(B?, I)` (ignored for a bias); `d`: `(B?, O, S, S)`;
    /// `df`: `(B?, O, S)`; `g`: `(B?, O, S)` when `solve` is not `None`.
    fn step_flat(
        &mut self,
        x: Option<&Tensor>,
        d: &Tensor,
        df: &Tensor,
        g: Option<&Tensor>,
        solve: Solve,
    ) -> Result<()> {
        let op = "D-RTRL fused dense kernel";
        let dshape = d.shape();
        if dshape.len() < 3 || df.ndim() < 2 {
            return Err(Error::shapes(
                op,
                [dshape, df.shape()],
                "D must be (B?, O, S, S) and Df (B?, O, S)",
            ));
        }
        let (o, s) = (dshape[dshape.len() - 3], dshape[dshape.len() - 1]);
        let batch: usize = dshape[..dshape.len() - 3].iter().product();
        let dt = self.grad.dtype();
        // LoRA `lora_a`: the input is `α (x b_fn(B))`.
        let lora_x;
        let x = match (&self.lora, x) {
            (Some(LoraLeaf::A { alpha, .. }), Some(x)) => {
                let bf = self.prep.input_map.as_ref().ok_or_else(|| {
                    Error::invalid("D-RTRL fused LoRA kernel", "step before prepare")
                })?;
                lora_x = x.matmul(bf)?.mul_scalar(*alpha)?;
                Some(&lora_x)
            }
            (_, x) => x,
        };
        let xd = match (self.has_input, x) {
            (true, Some(x)) => Some(contiguous_t(x, dt)?),
            (true, None) => return Err(Error::invalid(op, "a weight trace needs x")),
            _ => None,
        };
        let threads_for = |n: usize| {
            if n >= crate::threads::split_threshold(
                PAR_MIN_ELEMS,
                PAR_MIN_ELEMS,
                PAR_MIN_ELEMS_OUTSIDE,
            ) {
                rayon::current_num_threads()
            } else {
                1
            }
        };
        if let Some(sp) = self.sparse.clone() {
            // Public layouts: D (B?, O, S, S), Df and g (B?, O, S), gathered by column.
            let nnz = sp.cols.len();
            let dims = SpDims {
                batch,
                nnz,
                n_in: sp.n_in,
                o,
                s,
            };
            let want = [
                batch * nnz * s,
                batch * sp.n_in,
                batch * o * s * s,
                batch * o * s,
            ];
            let have = [
                self.data.shape().iter().product::<usize>(),
                xd.as_ref().map_or(0, |a| a.size()),
                d.shape().iter().product(),
                df.shape().iter().product(),
            ];
            let scale_ok = self
                .prep
                .scale
                .as_ref()
                .is_none_or(|a| a.shape().iter().product::<usize>() == nnz);
            let g_ok = g.is_none_or(|g| g.shape().iter().product::<usize>() == batch * o * s);
            if want != have || !scale_ok || !g_ok || sp.rows.len() != nnz {
                return Err(Error::shapes(
                    "D-RTRL fused sparse kernel",
                    [
                        self.data.shape(),
                        xd.as_ref().map_or(&[][..], |a| a.shape()),
                        d.shape(),
                        df.shape(),
                    ],
                    format!(
                        "the trace, input x, D and Df disagree: {have:?} elements, want {want:?}"
                    ),
                ));
            }
            let (dd, dfd) = (contiguous_t(d, dt)?, contiguous_t(df, dt)?);
            let gd = g.map(|g| contiguous_t(g, dt)).transpose()?;
            let threads = threads_for(batch * nnz * s);
            let ops = Stored {
                x: xd.as_ref().map(|x| x.data()).transpose()?,
                d: dd.data()?,
                df: dfd.data()?,
                g: gd.as_ref().map(|g| g.data()).transpose()?,
                scale: self.prep.scale.as_ref(),
            };
            let kernel = Loop::Sparse(dims, &sp);
            return run(kernel, &mut self.data, &mut self.grad, ops, solve, threads);
        }
        let tshape = self.data.shape();
        let i = if self.has_input {
            tshape[tshape.len().saturating_sub(2)]
        } else {
            1
        };
        let t_len = tshape.iter().product::<usize>();
        if self.row != (Blocked { n: o, k: s }) || t_len != batch * i * o * s {
            return Err(Error::shapes(
                op,
                [tshape, dshape],
                format!(
                    "the trace (first; rows of {} outputs x {} states) and D (second) disagree",
                    self.row.n, self.row.k,
                ),
            ));
        }
        if let Some(sc) = &self.prep.scale {
            if sc.shape().iter().product::<usize>() != i * o {
                return Err(Error::shapes(
                    op,
                    [sc.shape(), tshape],
                    "the transform's derivative f'(W) (first) must be shaped like the parameter of the trace (second)",
                ));
            }
        }
        if g.is_some_and(|g| g.size() != df.size()) || df.size() != batch * o * s {
            let mut shapes = vec![dshape, df.shape()];
            shapes.extend(g.map(|g| g.shape()));
            return Err(Error::shapes(
                op,
                shapes,
                "Df (second) and g (third, if any) must be (B?, O, S) as D (first) is (B?, O, S, S)",
            ));
        }
        // The operands' rows in the trace's layout: D's `S·S` values per
        // output, Df's and g's `S` (in the trace's buffers for them).
        let (dd, dfd) = (contiguous_t(d, dt)?, contiguous_t(df, dt)?);
        let gd = g.map(|g| contiguous_t(g, dt)).transpose()?;
        let [bd, bdf, bg] = &mut self.blocked;
        let d_rows = Blocked { n: o, k: s * s }.put(dd.data()?, bd);
        let df_rows = self.row.put(dfd.data()?, bdf);
        let g_rows = match &gd {
            Some(g) => Some(self.row.put(g.data()?, bg)),
            None => None,
        };
        let dims = Dims { batch, i, o, s };
        let threads = threads_for(batch * i * o * s);
        let ops = Stored {
            x: xd.as_ref().map(|x| x.data()).transpose()?,
            d: d_rows,
            df: df_rows,
            g: g_rows,
            scale: self.prep.scale.as_ref(),
        };
        run(
            Loop::Dense(dims),
            &mut self.data,
            &mut self.grad,
            ops,
            solve,
            threads,
        )
    }
}

/// A public trace shape `(.., O, S)` as rows: `(.., O·S)`.
fn row_shape(shape: &[usize]) -> Vec<usize> {
    let mut v = shape.to_vec();
    let n = v.len();
    if n >= 2 {
        let s = v.pop().unwrap_or(1);
        v[n - 2] *= s;
    }
    v
}

/// Below this many trace elements per trainable a step runs on the calling
/// thread: splitting costs more than it saves. That is when the learner
/// runs on one of the pool's threads (`rayon::ThreadPool::install`).
const PAR_MIN_ELEMS: usize = 1 << 16;

/// The same for a learner called from outside the pool (see
/// [`split_threshold`](crate::threads::split_threshold)). Measured with
/// `bench_learn`, GRU D-RTRL, two threads from the main thread against one
/// thread, medians of 3 alternating rounds: hidden 128, batch 16 (295 K
/// elements per trainable) split: 0.141 against 0.109 ms/step; 512×16
/// (4.3 M) split: 2.29 against 2.60.
const PAR_MIN_ELEMS_OUTSIDE: usize = 1 << 21;
