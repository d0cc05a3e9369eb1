//! Fused, in-place D-RTRL trace kernels for the built-in primitives (dense
//! `etp_mm` / `etp_mv`, `etp_elemwise`, sparse `etp_sp_mm` / `etp_sp_mv`,
//! LoRA `etp_lora_mm` / `etp_lora_mv`, channel-first `etp_conv`, with or
//! without their element-wise weight transforms), as braintrace's fast path.
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
//! `instant_drtrl`, and `yw_to_w` or `solve_drtrl` as solve), checked by
//! tests against the generic path.

use crate::error::{Error, Result};
use crate::etp::{
    apply_fn, ElemFn, EtpPrimitive, ParamType, ParamValue, Params, Role, Scale, TraceKernel,
};
use crate::kernels::pages;
use crate::prims::CsrStructure;
use crate::tensor::{to_standard, ArrayData, ArrayElement, Aval, DType, Tensor};
use num_traits::Float;
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// The kind of computation a fused kernel runs (the learner's side of a
/// declared [`TraceKernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusedKind {
    /// [`TraceKernel::Dense`].
    Dense,
    /// [`TraceKernel::Sparse`].
    Sparse,
    /// [`TraceKernel::Lora`].
    Lora,
    /// [`TraceKernel::Conv`].
    Conv,
}

impl FusedKind {
    pub(crate) fn of(k: &TraceKernel) -> Self {
        match k {
            TraceKernel::Dense { .. } => FusedKind::Dense,
            TraceKernel::Sparse { .. } => FusedKind::Sparse,
            TraceKernel::Lora { .. } => FusedKind::Lora,
            _ => FusedKind::Conv,
        }
    }
}

/// The transform of a trainable in `role` as the kernel scales it: an
/// [`ElemFn`] param, or a constant `c` read as the transform `c · W`;
/// `None` for the identity. An error when the param is unreadable.
pub(crate) fn scale_fn(
    kernel: &TraceKernel,
    role: &Role,
    params: &Params,
) -> Result<Option<ElemFn>> {
    match kernel.scale(role) {
        Scale::One => Ok(None),
        Scale::Fn(key) => elem_fn(params, &key),
        Scale::Param(key) => {
            let c = params.get::<f64>("D-RTRL fused kernel", &key)?;
            Ok(Some(ElemFn::new(
                &format!("{c} * w"),
                move |w: &Tensor| w.mul_scalar(c),
                move |w: &Tensor| w.ones_like().mul_scalar(c),
            )))
        }
    }
}

/// The transform under `key`: `None` when absent or `None`; an error when
/// the param holds something that is not a transform.
fn elem_fn(params: &Params, key: &str) -> Result<Option<ElemFn>> {
    match params.raw(key) {
        None | Some(ParamValue::None) => Ok(None),
        Some(v) => ElemFn::from_param(v).map(Some).ok_or_else(|| {
            Error::invalid(
                "D-RTRL fused kernel",
                format!("param `{key}` is not an element-wise transform"),
            )
        }),
    }
}

/// Whether the traces and parameters of a relation have the shapes
/// `kernel` is written for (`vs`: the hidden group's shape, batch
/// included; `keys`: the trace avals by trainable; `weights`: the parameter
/// avals). Every trace must be one the kernel names.
pub(crate) fn shapes_fit(
    kernel: &TraceKernel,
    x: Option<&Aval>,
    vs: &[usize],
    s: usize,
    keys: &[(String, Aval)],
    weights: &BTreeMap<String, Aval>,
    params: &Params,
) -> bool {
    let Some((&o, lead)) = vs.split_last() else {
        return false;
    };
    let bias_fits = |w: &Aval, trace: &Aval| -> bool {
        w.shape() == [o] && trace.shape() == [vs, &[s]].concat()
    };
    // x: (B?, I) with the hidden group's leading axes.
    let x_in = || -> Option<usize> {
        let (&i, xlead) = x?.shape().split_last()?;
        (xlead == lead).then_some(i)
    };
    // Every trace with its role and parameter aval.
    let Some(leaves) = keys
        .iter()
        .map(|(k, trace)| Some((kernel.role(k)?, weights.get(k)?, trace)))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    match kernel {
        TraceKernel::Dense { .. } => {
            leaves.iter().all(
                |(role, w, trace)| match x.filter(|_| *role == Role::Weight) {
                    Some(_) => {
                        let Some(i) = x_in() else {
                            return false;
                        };
                        let want = [lead, &[i, o, s]].concat();
                        w.shape() == [i, o] && trace.shape() == want
                    }
                    None => bias_fits(w, trace),
                },
            )
        }
        TraceKernel::Sparse { structure, .. } => {
            let Some(st) = params.raw(structure).and_then(CsrStructure::from_param) else {
                return false;
            };
            let Some(i) = x_in() else {
                return false;
            };
            st.shape == (i, o)
                && leaves.iter().all(|(role, w, trace)| match role {
                    Role::Weight => {
                        w.shape() == [st.nnz()] && trace.shape() == [lead, &[st.nnz(), s]].concat()
                    }
                    Role::Bias => bias_fits(w, trace),
                    _ => false,
                })
        }
        TraceKernel::Lora { lora_b, lora_a, .. } => {
            let Some(i) = x_in() else {
                return false;
            };
            let (Some(b), Some(a)) = (weights.get(lora_b), weights.get(lora_a)) else {
                return false;
            };
            let [bi, r] = b.shape() else {
                return false;
            };
            if *bi != i || a.shape() != [*r, o] {
                return false;
            }
            leaves.iter().all(|(role, w, trace)| match role {
                Role::LoraB => trace.shape() == [lead, &[i, o, s]].concat(),
                Role::LoraA => trace.shape() == [lead, &[*r, o, s]].concat(),
                Role::Bias => bias_fits(w, trace),
                Role::Weight => false,
            })
        }
        _ => {
            // Conv. vs = y: (B, O, so..); x: (B, C, si..) of the same rank.
            let (Some(x), true) = (x, vs.len() >= 3) else {
                return false;
            };
            let (xs, (b, och, so)) = (x.shape(), (vs[0], vs[1], &vs[2..]));
            if xs.len() != vs.len() || xs[0] != b {
                return false;
            }
            leaves.iter().all(|(role, w, trace)| match role {
                Role::Weight => {
                    let ws = w.shape();
                    ws.len() == vs.len()
                        && ws[0] == och
                        && ws[1] == xs[1]
                        && trace.shape() == [&[b], so, ws, &[s]].concat()
                }
                Role::Bias => w.shape() == [och] && trace.shape() == [vs, &[s]].concat(),
                _ => false,
            })
        }
    }
}

/// The trace kernel an equation of `prim` with `params` declares (not yet
/// checked against its rules; see [`kernel_for`]).
pub(crate) fn declared(prim: &EtpPrimitive, params: &Params) -> Option<TraceKernel> {
    prim.trace_kernel(params)
}

/// The trace kernel the learner runs for pair (`r`, group `grp`): the
/// primitive's declared kernel, checked against its rules on random inputs
/// of the pair's shapes the first time (see [`super::kernel_check`]).
/// `Ok(None)`: none declared, or the pair's shapes are not the kernel's
/// (the rules run). An error, naming the primitive, when the declared
/// kernel disagrees with the rules: the compile fails rather than train
/// with a kernel that computes something else.
pub(crate) fn kernel_for(
    r: &super::Relation,
    g: &crate::graph::Graph,
    grp: &super::HiddenGroup,
) -> Result<Option<TraceKernel>> {
    match declared(&r.primitive, &r.params) {
        Some(k) => super::kernel_check::checked(r, g, grp, k),
        None => Ok(None),
    }
}

/// A sparse weight's structure, as the kernel reads it.
#[derive(Debug)]
struct SparseIdx {
    /// Input row of each stored entry.
    rows: Vec<usize>,
    /// Output column of each stored entry.
    cols: Vec<usize>,
    /// Inputs (`x`'s last axis).
    n_in: usize,
}

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
    /// Sparse weight: the public layout `(B?, nnz, S)`.
    pub data: ArrayData,
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
        other => Err(Error::dtype(
            "D-RTRL fused dense kernel",
            format!("traces must be f32 or f64, got {other:?}"),
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
    /// `index` the relation's trainables' parameter indices.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn for_leaf(
        kernel: &TraceKernel,
        key: &str,
        has_x: bool,
        trace_shape: &[usize],
        param_shape: &[usize],
        dtype: DType,
        params: &Params,
        index: &BTreeMap<String, usize>,
    ) -> Result<Self> {
        let op = "D-RTRL fused kernel";
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
        let mut t = FastTrace {
            has_input: has_x && role != Role::Bias,
            data: zeros(dtype, &row_shape(trace_shape))?,
            row: Blocked {
                n: trace_shape
                    .get(trace_shape.len().wrapping_sub(2))
                    .copied()
                    .unwrap_or(1),
                k: trace_shape.last().copied().unwrap_or(1),
            },
            grad: zeros(dtype, param_shape)?,
            sparse: None,
            hook,
            lora: None,
            conv: None,
            deps: vec![own],
            prep: Prepared::default(),
            blocked: [None, None, None],
        };
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
                t.data = zeros(dtype, trace_shape)?;
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
                    t.data = zeros(dtype, &[b, o * p * st])?;
                    t.row = Blocked { n: o * p, k: st };
                    t.grad = zeros(dtype, &[o * p])?;
                    (Vec::new(), p)
                } else {
                    let d = param_shape.len().checked_sub(2).ok_or_else(bad)?;
                    let (o, cu) = (param_shape[0], param_shape[1..].iter().product::<usize>());
                    let p = trace_shape[1..1 + d].iter().product::<usize>();
                    t.data = zeros(dtype, &[b, p, cu, o * st])?;
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
        let cur: Vec<Tensor> = self.deps.iter().map(|&i| params[i].clone()).collect();
        let same = self.prep.from.len() == cur.len()
            && self.prep.from.iter().zip(&cur).all(|(a, b)| a.ptr_eq(b));
        if same {
            return Ok(());
        }
        let dt = self.data.dtype();
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
        if self.sparse.is_some() {
            return Tensor::from_data(self.data.clone());
        }
        // The rows in the public order: (.., n, S).
        let mut shape = self.data.shape().to_vec();
        shape.pop();
        shape.extend([self.row.n, self.row.k]);
        let rows = Tensor::from_data(self.row.moved(&self.data, false, &shape));
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
    /// Zero the gradient accumulator, dropping its contents.
    pub(crate) fn drop_grad(&mut self) -> Result<()> {
        self.grad = zeros(self.grad.dtype(), self.grad.shape())?;
        Ok(())
    }
    /// The gradient accumulated since the last call (LoRA `lora_b`: mapped
    /// to `B` with the parameters of the last [`prepare`](Self::prepare),
    /// which must be those of the steps it accumulates), and zero the
    /// accumulator.
    pub(crate) fn take_grad(&mut self) -> Result<Tensor> {
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
        let Some(cv) = &self.conv else {
            return self.step_flat(x, d, df, g, solve);
        };
        let op = "D-RTRL fused conv kernel";
        let ds = d.shape().to_vec();
        let n = ds.len();
        if n < 5 {
            return Err(Error::shape(
                op,
                format!("D {ds:?}"),
                "D must be (B, O, so.., S, S)",
            ));
        }
        let (b, o, s, p) = (ds[0], ds[1], ds[n - 1], cv.positions);
        if ds[2..n - 2].iter().product::<usize>() != p {
            return Err(Error::shape(
                op,
                format!("D {ds:?}"),
                "D and the trace disagree",
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
            return Err(Error::shape(
                op,
                format!("D {dshape:?}, Df {:?}", df.shape()),
                "D must be (B?, O, S, S) and Df (B?, O, S)",
            ));
        }
        let (o, s) = (dshape[dshape.len() - 3], dshape[dshape.len() - 1]);
        let batch: usize = dshape[..dshape.len() - 3].iter().product();
        let dt = self.data.dtype();
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
                return Err(Error::shape(
                    "D-RTRL fused sparse kernel",
                    format!("trace, x, D, Df: {have:?} elements, want {want:?}"),
                    "trace, input, D and Df disagree",
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
            return Err(Error::shape(
                op,
                format!(
                    "trace rows of {} outputs x {} states, {t_len} elements; D {dshape:?}",
                    self.row.n, self.row.k,
                ),
                "trace and D disagree",
            ));
        }
        if let Some(sc) = &self.prep.scale {
            if sc.shape().iter().product::<usize>() != i * o {
                return Err(Error::shape(
                    op,
                    format!("f'(W) {:?}, trace {tshape:?}", sc.shape()),
                    "the transform's derivative must be shaped like the parameter",
                ));
            }
        }
        if g.is_some_and(|g| g.size() != df.size()) || df.size() != batch * o * s {
            return Err(Error::shape(
                op,
                format!(
                    "D {dshape:?}, Df {:?}, g {:?}",
                    df.shape(),
                    g.map(|g| g.shape().to_vec())
                ),
                "Df and g must be (B?, O, S) as D is (B?, O, S, S)",
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

/// Outputs per block of a fused dense row (8 `f32` lanes of AVX2).
const LANES: usize = 8;

/// How a fused dense row of `n` outputs with `k` values each lies in
/// memory (a trace row: `k = S` states; `D`'s rows: `k = S·S`; `Df`'s and
/// `g`'s: `k = S`): in blocks of [`LANES`] outputs, the last one possibly
/// narrower, one after the other; a block of width `w` holds its `k` runs
/// of `w` outputs, value by value. The outputs of one value within a block
/// are contiguous, so the kernel vectorises over outputs for any `S`, and
/// a row is read as one forward stream. (One `O`-long run per state, the
/// layout before, reads `S` places of memory at once: two runs streamed
/// 1.3–1.6× slower than one on this machine's memory-bound sizes.) With
/// `k = 1` it is the plain layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocked {
    n: usize,
    k: usize,
}

impl Blocked {
    /// Calls `f(at, public)` for every value: `at` its place in this
    /// layout, `public` in the public one (output-major, `k` values per
    /// output), in the order of `at`.
    #[inline]
    fn each(self, mut f: impl FnMut(usize, usize)) {
        let mut at = 0;
        for j in (0..self.n).step_by(LANES) {
            let w = LANES.min(self.n - j);
            for a in 0..self.k {
                for l in 0..w {
                    f(at, (j + l) * self.k + a);
                    at += 1;
                }
            }
        }
    }

    /// Rows in the public order (each `n·k` long) → rows in this layout.
    fn block_rows<T: Copy>(self, src: &[T], dst: &mut [T]) {
        let len = (self.n * self.k).max(1);
        for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
            self.each(|at, public| d[at] = s[public]);
        }
    }

    /// Rows in this layout → rows in the public order.
    fn unblock_rows<T: Copy>(self, src: &[T], dst: &mut [T]) {
        let len = (self.n * self.k).max(1);
        for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
            self.each(|at, public| d[public] = s[at]);
        }
    }

    /// A contiguous operand `a` whose rows are in the public order, in
    /// this layout: `a` itself when `k` is 1, else its rows moved into
    /// `buf`, which is written in place when it has `a`'s type and size
    /// (step after step: no allocation).
    fn put<'a>(self, a: &'a ArrayData, buf: &'a mut Option<ArrayData>) -> &'a ArrayData {
        if self.k <= 1 {
            return a;
        }
        fn rows<T: Copy>(
            lay: Blocked,
            src: &ndarray::ArrayD<T>,
            dst: Option<&mut ndarray::ArrayD<T>>,
        ) -> bool {
            let src = src.as_slice().expect("trace operands are contiguous");
            match dst
                .and_then(|d| d.as_slice_mut())
                .filter(|d| d.len() == src.len())
            {
                Some(d) => {
                    lay.block_rows(src, d);
                    true
                }
                None => false,
            }
        }
        let done = match (a, buf.as_mut()) {
            (ArrayData::F32(x), Some(ArrayData::F32(y))) => rows(self, x, Some(y)),
            (ArrayData::F64(x), Some(ArrayData::F64(y))) => rows(self, x, Some(y)),
            _ => false,
        };
        if !done {
            *buf = Some(self.moved(a, true, a.shape()));
        }
        buf.as_ref().expect("filled above")
    }

    /// A contiguous array's rows moved into this layout (`into`) or out of
    /// it into the public order, as a new array of `shape` (as many
    /// elements).
    fn moved(self, a: &ArrayData, into: bool, shape: &[usize]) -> ArrayData {
        fn rows<T: Copy>(
            lay: Blocked,
            a: &ndarray::ArrayD<T>,
            into: bool,
            shape: &[usize],
        ) -> ndarray::ArrayD<T> {
            let src = a
                .as_slice()
                .expect("trace rows and operands are contiguous");
            let mut out = src.to_vec();
            if into {
                lay.block_rows(src, &mut out);
            } else {
                lay.unblock_rows(src, &mut out);
            }
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), out)
                .expect("the shape holds the rows")
        }
        match a {
            ArrayData::F32(x) => ArrayData::F32(rows(self, x, into, shape)),
            ArrayData::F64(x) => ArrayData::F64(rows(self, x, into, shape)),
            other => other.clone(),
        }
    }
}

/// The float types the fused kernels run in.
trait KernelFloat: Float + Send + Sync + ArrayElement {}
impl KernelFloat for f32 {}
impl KernelFloat for f64 {}

/// `a`'s elements as `T`, in memory order; errors name kernel `op`.
fn slice<'a, T: KernelFloat>(op: &str, a: &'a ArrayData) -> Result<&'a [T]> {
    T::array(a)
        .ok_or_else(|| Error::dtype(op, "mixed dtypes"))?
        .as_slice()
        .ok_or_else(|| Error::invalid(op, "operand not contiguous"))
}

/// A trace buffer's elements as `T`, in memory order; errors name kernel
/// `op`.
fn slice_mut<'a, T: KernelFloat>(op: &str, a: &'a mut ArrayData) -> Result<&'a mut [T]> {
    T::array_mut(a)
        .ok_or_else(|| Error::dtype(op, "mixed dtypes"))?
        .as_slice_mut()
        .ok_or_else(|| Error::invalid(op, "trace buffer not contiguous"))
}

/// The fused loop a step runs.
#[derive(Clone, Copy)]
enum Loop<'a> {
    Dense(Dims),
    Sparse(SpDims, &'a SparseIdx),
}

impl Loop<'_> {
    /// The name the loop's errors carry.
    fn name(&self) -> &'static str {
        match self {
            Loop::Dense(_) => "D-RTRL fused dense kernel",
            Loop::Sparse(..) => "D-RTRL fused sparse kernel",
        }
    }
}

/// A step's [`Operands`] as stored, before the float type is picked.
#[derive(Clone, Copy)]
struct Stored<'a> {
    x: Option<&'a ArrayData>,
    d: &'a ArrayData,
    df: &'a ArrayData,
    g: Option<&'a ArrayData>,
    scale: Option<&'a ArrayData>,
}

/// Run `kernel` on the trace `e` and the gradient `grad`, in their dtype.
fn run(
    kernel: Loop<'_>,
    e: &mut ArrayData,
    grad: &mut ArrayData,
    ops: Stored<'_>,
    solve: Solve,
    threads: usize,
) -> Result<()> {
    match e.dtype() {
        DType::F32 => run_typed::<f32>(kernel, e, grad, ops, solve, threads),
        DType::F64 => run_typed::<f64>(kernel, e, grad, ops, solve, threads),
        _ => Err(Error::dtype(kernel.name(), "traces must be f32 or f64")),
    }
}

/// [`run`] in `T`: the operands borrowed as `T` slices, then the loop.
fn run_typed<'o, T: KernelFloat>(
    kernel: Loop<'_>,
    e: &mut ArrayData,
    grad: &mut ArrayData,
    ops: Stored<'o>,
    solve: Solve,
    threads: usize,
) -> Result<()> {
    let name = kernel.name();
    let (e, grad) = (slice_mut::<T>(name, e)?, slice_mut::<T>(name, grad)?);
    let borrow = |a: &'o ArrayData| slice::<T>(name, a);
    // Tiny operands flushed as the traces are (see `flush`): copies, only
    // when an operand has a tiny element.
    let mut kept = [Vec::new(), Vec::new(), Vec::new()];
    let [kd, kdf, kg] = &mut kept;
    let ops = Operands {
        x: ops.x.map(borrow).transpose()?,
        d: flushed(borrow(ops.d)?, kd),
        df: flushed(borrow(ops.df)?, kdf),
        g: ops.g.map(borrow).transpose()?.map(|g| flushed(g, kg)),
        scale: ops.scale.map(borrow).transpose()?,
    };
    match kernel {
        Loop::Dense(dims) => fused(dims, e, grad, ops, solve, threads),
        Loop::Sparse(dims, sp) => sparse_fused(dims, sp, e, grad, ops, solve, threads),
    }
    Ok(())
}

/// The read-only operands of one step.
#[derive(Clone, Copy)]
struct Operands<'a, T> {
    /// Dense `(batch, i)`; sparse `(batch, n_in)`.
    x: Option<&'a [T]>,
    /// Dense `(batch, o·s·s)`, rows laid out as [`Blocked`] says; sparse
    /// `(batch, o, s, s)`.
    d: &'a [T],
    /// Dense `(batch, o·s)`, rows as [`Blocked`]; sparse `(batch, o, s)`.
    df: &'a [T],
    /// As `df`.
    g: Option<&'a [T]>,
    /// `f'(W)`: dense `(i, o)`; sparse `(nnz,)`.
    scale: Option<&'a [T]>,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    i: usize,
    o: usize,
    s: usize,
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

/// Split `e` (`batch` samples of `rows × row_len`) into `rows_per`-row
/// blocks: `parts[k][b]` is block `k`'s run of sample `b`.
fn split_rows<T>(
    e: &mut [T],
    batch: usize,
    rows: usize,
    row_len: usize,
    rows_per: usize,
) -> Vec<Vec<&mut [T]>> {
    let blocks = rows.div_ceil(rows_per);
    let mut parts: Vec<Vec<&mut [T]>> = (0..blocks).map(|_| Vec::with_capacity(batch)).collect();
    for sample in e.chunks_mut(rows * row_len) {
        for (k, piece) in sample.chunks_mut(rows_per * row_len).enumerate() {
            parts[k].push(piece);
        }
    }
    parts
}

/// The loop. `e`: `(batch, i, o·s)`, rows laid out as [`Blocked`] says;
/// `grad`: `(i, o)`; operands as [`Operands`] says.
///
/// Input rows are split into as many blocks as `threads` (one block when it
/// is 1), run on the current rayon pool: each block owns its gradient rows
/// and, per sample, one contiguous run of trace rows, so no two threads
/// write the same memory and the result does not depend on the number of
/// threads. Within a block the trace is streamed in memory order, sample by
/// sample, each sample's rows in one run; the block's gradient rows are
/// read again for every sample (from L2 or L3: 1 MiB at `528 × 512`).
///
/// Long runs are what the hardware prefetchers need. Tiles of about 64 KiB
/// of gradient rows, each sample's rows of a tile streamed before the next
/// tile (so the gradient tile stayed in L1/L2), cut the runs to 64 KiB and
/// were slower on an AMD Zen 5 (L2 1 MiB; `bench_learn --floor`, one
/// thread, D-RTRL, ours over the trace floor): GRU 512×64 1.35–1.39× →
/// 0.94–0.98×, LIF 512×64 1.27–1.40× → 0.91–1.02×, GRU 512×16 1.34–1.37× →
/// 0.89–0.99×; hidden 128 (a tile there held 128 of 144 rows) unchanged.
fn fused<T: Float + Send + Sync>(
    dims: Dims,
    e: &mut [T],
    grad: &mut [T],
    ops: Operands<'_, T>,
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
    let ops = Operands {
        g: ops.g.filter(|_| solve != Solve::None),
        ..ops
    };
    let blocks = threads.clamp(1, ni);
    let rows_per = ni.div_ceil(blocks);
    let ctx = Ctx {
        dims,
        rows_per,
        ops,
        solve,
    };
    if blocks == 1 {
        // One block: each sample's rows are one run (in a list this thread
        // keeps, no allocation per step).
        crate::kernels::spare::with_slices(|part| {
            part.extend(e.chunks_mut(ni * no * s));
            block(&ctx, 0, part, grad);
        });
    } else {
        use rayon::prelude::*;
        split_rows(e, batch, ni, no * s, rows_per)
            .into_par_iter()
            .zip(grad.par_chunks_mut(rows_per * no))
            .enumerate()
            .for_each(|(k, (mut part, grad))| block(&ctx, k, &mut part, grad));
    }
}

/// What every block of one fused step reads.
struct Ctx<'a, T> {
    dims: Dims,
    rows_per: usize,
    ops: Operands<'a, T>,
    solve: Solve,
}

crate::kernels::avx2_dispatch!(
    /// Run block `k`, with AVX2 when the CPU has it (the same arithmetic —
    /// no fused multiply-adds are introduced — in 8 lanes instead of 4).
    fn block<T: Float>(ctx: &Ctx<'_, T>, k: usize, part: &mut [&mut [T]], grad: &mut [T]) => block_scaled_or_not
);

/// The block, compiled separately with and without a transform's
/// derivative (the loop without one stays as tight as it was).
#[inline(always)]
fn block_scaled_or_not<T: Float>(
    ctx: &Ctx<'_, T>,
    k: usize,
    part: &mut [&mut [T]],
    grad: &mut [T],
) {
    if ctx.ops.scale.is_some() {
        block_body::<T, true>(ctx, k, part, grad);
    } else {
        block_body::<T, false>(ctx, k, part, grad);
    }
}

#[inline(always)]
fn block_body<T: Float, const SCALED: bool>(
    ctx: &Ctx<'_, T>,
    k: usize,
    part: &mut [&mut [T]],
    grad: &mut [T],
) {
    let Dims {
        i: ni, o: no, s, ..
    } = ctx.dims;
    let Operands { x, d, df, g, scale } = ctx.ops;
    let solve = ctx.solve;
    let row_len = no * s;
    let i0 = k * ctx.rows_per;
    let rows = grad.len() / no;
    // The instantaneous term of a row with a transform: x Df f'(W)[i, :].
    let mut inst: Vec<T> = if SCALED {
        vec![T::zero(); row_len]
    } else {
        Vec::new()
    };
    for (b, piece) in part.iter_mut().enumerate() {
        let db = &d[b * no * s * s..(b + 1) * no * s * s];
        let dfb = &df[b * no * s..(b + 1) * no * s];
        let gb = g.map(|g| &g[b * no * s..(b + 1) * no * s]);
        for (ii, (row, grow)) in piece[..rows * row_len]
            .chunks_exact_mut(row_len)
            .zip(grad.chunks_exact_mut(no))
            .enumerate()
        {
            let xi = x.map(|x| x[b * ni + i0 + ii]).unwrap_or_else(T::one);
            let (xi, f): (T, &[T]) = match scale.filter(|_| SCALED) {
                Some(sc) => {
                    let srow = &sc[(i0 + ii) * no..(i0 + ii + 1) * no];
                    // Block by block, as `Blocked` lays the row out.
                    let mut at = 0;
                    for j in (0..no).step_by(LANES) {
                        let w = LANES.min(no - j);
                        for _ in 0..s {
                            for ((v, &f), &p) in inst[at..at + w]
                                .iter_mut()
                                .zip(&dfb[at..at + w])
                                .zip(&srow[j..j + w])
                            {
                                *v = xi * f * p;
                            }
                            at += w;
                        }
                    }
                    (T::one(), &inst)
                }
                None => (xi, dfb),
            };
            match s {
                1 => row1(row, grow, xi, db, f, gb, solve),
                2 => row2(row, grow, xi, db, f, gb, solve),
                _ => row_any(s, row, grow, xi, db, f, gb, solve),
            }
        }
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
                let v = flush(d * *e + xi * f);
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
                *e = flush(d * *e + xi * f);
            }
        }
        _ => {
            for (e, (&d, &f)) in row.iter_mut().zip(db.iter().zip(dfb)) {
                *e = flush(d * *e + xi * f);
            }
        }
    }
}

/// One trace row, two states per neuron (LIF: `i`, `v`): `D` is 2 × 2.
/// Every operand is laid out as [`Blocked`] says: per block of `w`
/// outputs, `row` = `[e₀ | e₁]`, `db` = `[D₀₀ | D₀₁ | D₁₀ | D₁₁]`, `dfb`
/// and `gb` = `[·₀ | ·₁]`.
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
    let before = solve == Solve::Before;
    // Full blocks through exact chunks (each loop one vector wide), then
    // the narrower last block.
    let full = no - no % LANES;
    let (row, row_r) = row.split_at_mut(2 * full);
    let (grow, grow_r) = grow.split_at_mut(full);
    let (db, db_r) = db[..4 * no].split_at(4 * full);
    let (dfb, dfb_r) = dfb[..2 * no].split_at(2 * full);
    let blocks = row
        .chunks_exact_mut(2 * LANES)
        .zip(grow.chunks_exact_mut(LANES))
        .zip(db.chunks_exact(4 * LANES))
        .zip(dfb.chunks_exact(2 * LANES));
    match gb {
        Some(gb) => {
            let (gb, gb_r) = gb[..2 * no].split_at(2 * full);
            for ((((e, gr), d), f), g) in blocks.zip(gb.chunks_exact(2 * LANES)) {
                pair(e, gr, xi, d, f, Some(g), before);
            }
            pair(row_r, grow_r, xi, db_r, dfb_r, Some(gb_r), before);
        }
        None => {
            for (((e, gr), d), f) in blocks {
                pair(e, gr, xi, d, f, None, before);
            }
            pair(row_r, grow_r, xi, db_r, dfb_r, None, before);
        }
    }
}

/// [`row2`]'s block: `grow.len()` outputs, the operands laid out as
/// [`Blocked`] says.
#[inline(always)]
fn pair<T: Float>(
    e: &mut [T],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    before: bool,
) {
    let w = grow.len();
    let (e0, e1) = e.split_at_mut(w);
    let (e0, e1) = (&mut e0[..w], &mut e1[..w]);
    let (d00, d01, d10, d11) = (
        &db[..w],
        &db[w..2 * w],
        &db[2 * w..3 * w],
        &db[3 * w..4 * w],
    );
    let (f0, f1) = (&dfb[..w], &dfb[w..2 * w]);
    match gb {
        Some(gb) => {
            let (g0, g1) = (&gb[..w], &gb[w..2 * w]);
            for o in 0..w {
                let (c0, c1) = (e0[o], e1[o]);
                let n0 = flush(d00[o] * c0 + d01[o] * c1 + xi * f0[o]);
                let n1 = flush(d10[o] * c0 + d11[o] * c1 + xi * f1[o]);
                let (s0, s1) = if before { (c0, c1) } else { (n0, n1) };
                grow[o] = grow[o] + g0[o] * s0 + g1[o] * s1;
                e0[o] = n0;
                e1[o] = n1;
            }
        }
        None => {
            for o in 0..w {
                let (c0, c1) = (e0[o], e1[o]);
                e0[o] = flush(d00[o] * c0 + d01[o] * c1 + xi * f0[o]);
                e1[o] = flush(d10[o] * c0 + d11[o] * c1 + xi * f1[o]);
            }
        }
    }
}

/// One trace row, any number of states per neuron, laid out as [`row2`]'s.
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
    for j in (0..no).step_by(LANES) {
        let w = LANES.min(no - j);
        let (e, o, d) = (
            &row[s * j..s * (j + w)],
            &mut out[s * j..s * (j + w)],
            &db[s * s * j..s * s * (j + w)],
        );
        for a in 0..s {
            let acc = &mut o[a * w..(a + 1) * w];
            for c in 0..s {
                let dm = &d[(a * s + c) * w..(a * s + c + 1) * w];
                for ((v, &dv), &ev) in acc.iter_mut().zip(dm).zip(&e[c * w..(c + 1) * w]) {
                    *v = *v + dv * ev;
                }
            }
        }
        if let Some(gb) = gb {
            let src: &[T] = if solve == Solve::Before { e } else { o };
            let gj = &gb[s * j..s * (j + w)];
            for a in 0..s {
                for ((gr, &gv), &v) in grow[j..j + w]
                    .iter_mut()
                    .zip(&gj[a * w..(a + 1) * w])
                    .zip(&src[a * w..(a + 1) * w])
                {
                    *gr = *gr + gv * v;
                }
            }
        }
    }
    for (e, &v) in row.iter_mut().zip(&out) {
        *e = flush(v);
    }
}

/// `v`, or zero when it is tiny: below `√(smallest normal)`, about
/// 1.1e-19 in f32 and 1.5e-154 in f64 (NaN is kept).
///
/// A trace that no input refreshes decays geometrically (a LIF neuron
/// whose presynaptic partner stays silent), and so do `D`'s surrogate
/// derivatives far below threshold. Once products of such values are
/// subnormal, every one takes a microcode assist on x86: LIF D-RTRL,
/// hidden 128, batch 64, five 100-step calls in a row ran at 5.3 ms/step
/// against 0.86 ms with the CPU flushing subnormals (1.0 ms for the first
/// call alone). Flushing only the subnormal results still left it at
/// 1.45× the flushing CPU: the products `D·ε` and `g·ε` of small normal
/// values are subnormal themselves. Below `√(smallest normal)` no
/// product of two operands that both passed this flush is subnormal.
/// The fused trace kernels (dense and sparse) flush the traces they
/// write and their operands `D`, `Df` and `g` ([`flushed`]). XLA on the
/// CPU runs with subnormals flushed to zero; values this small are far
/// below the resolution of any sum they enter (f32: 1e-19 against gradients of
/// order 1e-3 and a relative precision of 1e-7). A compare and a select
/// per element, in a loop bound by memory.
#[inline(always)]
fn flush<T: Float>(v: T) -> T {
    if v.abs() < tiny() {
        T::zero()
    } else {
        v
    }
}

/// The threshold of [`flush`] (a constant once inlined).
#[inline(always)]
fn tiny<T: Float>() -> T {
    T::min_positive_value().sqrt()
}

/// `v`, or its elements [`flush`]ed into `keep` when one is tiny and not
/// zero (one pass without branches to find out; the copy only then).
fn flushed<'a, T: Float>(v: &'a [T], keep: &'a mut Vec<T>) -> &'a [T] {
    let tiny = tiny::<T>();
    let any = v
        .iter()
        .fold(false, |any, &x| any | ((x.abs() < tiny) & (x != T::zero())));
    if !any {
        return v;
    }
    keep.clear();
    keep.extend(v.iter().map(|&x| flush(x)));
    keep
}

#[derive(Clone, Copy, Debug)]
struct SpDims {
    batch: usize,
    nnz: usize,
    n_in: usize,
    o: usize,
    s: usize,
}

/// The sparse loop, on the public layouts: `e`: `(batch, nnz, s)`;
/// `grad`: `(nnz,)`; `x`: `(batch, n_in)`; `d`: `(batch, o, s, s)`; `df`,
/// `g`: `(batch, o, s)`; `scale`: `(nnz,)`. Stored entries are split into
/// blocks across `threads` as [`fused`] splits input rows.
fn sparse_fused<T: Float + Send + Sync>(
    dims: SpDims,
    sp: &SparseIdx,
    e: &mut [T],
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
fn sparse_block<T: Float>(
    dims: SpDims,
    sp: &SparseIdx,
    ops: Operands<'_, T>,
    solve: Solve,
    p0: usize,
    part: Vec<&mut [T]>,
    grad: &mut [T],
) {
    let SpDims { n_in, o: no, s, .. } = dims;
    let n = grad.len();
    let (rows, cols) = (&sp.rows[p0..p0 + n], &sp.cols[p0..p0 + n]);
    let scale = ops.scale.map(|sc| &sc[p0..p0 + n]);
    let mut new = vec![T::zero(); s];
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
                let old = *ev;
                let v = flush(db[c] * old + inst);
                if let Some(gb) = gb {
                    let src = if solve == Solve::Before { old } else { v };
                    *gr = *gr + gb[c] * src;
                }
                *ev = v;
            }
            continue;
        }
        for (j, (ep, gr)) in piece.chunks_exact_mut(s).zip(grad.iter_mut()).enumerate() {
            let c = cols[j];
            let xr = xb.map_or(T::one(), |x| x[rows[j]]);
            let dm = &db[c * s * s..(c + 1) * s * s];
            let fv = &dfb[c * s..(c + 1) * s];
            for (a, nv) in new.iter_mut().enumerate() {
                let mut v = T::zero();
                for (cc, &ev) in ep.iter().enumerate() {
                    v = v + dm[a * s + cc] * ev;
                }
                let inst = match scale {
                    Some(sc) => xr * fv[a] * sc[j],
                    None => xr * fv[a],
                };
                *nv = flush(v + inst);
            }
            if let Some(gb) = gb {
                let src: &[T] = if solve == Solve::Before { ep } else { &new };
                for (&gv, &v) in gb[c * s..(c + 1) * s].iter().zip(src) {
                    *gr = *gr + gv * v;
                }
            }
            ep.copy_from_slice(&new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Values below `√(smallest normal)` become zero, others (and NaN,
    /// infinities) stay; an operand without tiny elements is not copied.
    #[test]
    fn flush_zeroes_tiny_values_only() {
        for v in [1e-20f32, -1e-20, 1e-30, f32::MIN_POSITIVE, 1e-40, -1e-44] {
            assert_eq!(flush(v), 0.0, "{v:e}");
        }
        for v in [2e-19f32, -1e-10, 1.0, f32::INFINITY, f32::MAX] {
            assert_eq!(flush(v), v, "{v:e}");
        }
        assert!(flush(f32::NAN).is_nan());
        assert_eq!(flush(1e-160f64), 0.0);
        assert_eq!(flush(1e-150f64), 1e-150);
        let mut keep = Vec::new();
        let plain = [0.0f32, 1.0, -2e-19, 3.0];
        assert!(std::ptr::eq(flushed(&plain, &mut keep), &plain[..]));
        let some = [0.0f32, 1.0, 1e-25, 3.0];
        assert_eq!(flushed(&some, &mut keep), &[0.0, 1.0, 0.0, 3.0]);
    }

    /// A trace that no input refreshes decays to exact zeros, never
    /// through subnormals (which cost a microcode assist per multiply),
    /// and its gradient products stay normal on the way.
    #[test]
    fn a_decaying_trace_reaches_zero_without_subnormals() {
        let no = 19;
        let d: Vec<f32> = (0..no).map(|o| 0.3 + 0.03 * o as f32).collect();
        let f = vec![0.0f32; no];
        let g = vec![1e-3f32; no];
        let mut row = vec![1.0f32; no];
        let mut grow = vec![0.0f32; no];
        for step in 0..400 {
            row1(&mut row, &mut grow, 0.0, &d, &f, Some(&g), Solve::After);
            for (o, v) in row.iter().chain(&grow).enumerate() {
                assert!(!v.is_subnormal(), "step {step}, element {o}: {v:e}");
            }
        }
        assert!(row.iter().all(|&v| v == 0.0), "{row:?}");
        // Two states per neuron, as LIF lays them out.
        // D = [[0.3, 0.3], [0.3, 0.3]] per neuron (eigenvalues 0.6, 0).
        let d2 = vec![0.3f32; 4 * no];
        let (f2, g2) = (vec![0.0f32; 2 * no], vec![1e-3f32; 2 * no]);
        let mut row = vec![1.0f32; 2 * no];
        for step in 0..400 {
            row2(&mut row, &mut grow, 0.0, &d2, &f2, Some(&g2), Solve::Before);
            for (o, v) in row.iter().chain(&grow).enumerate() {
                assert!(!v.is_subnormal(), "pair, step {step}, element {o}: {v:e}");
            }
        }
        assert!(row.iter().all(|&v| v == 0.0), "{row:?}");
        // The sparse loop, one and two states per stored entry, with a
        // tiny operand in `D` (flushed when the operands are borrowed).
        for s in [1, 2] {
            let (no, nnz, n_in) = (3, 5, 4);
            let sp = SparseIdx {
                rows: vec![0, 1, 1, 2, 3],
                cols: vec![0, 2, 1, 0, 2],
                n_in,
            };
            let dims = SpDims {
                batch: 1,
                nnz,
                n_in,
                o: no,
                s,
            };
            let mut d = vec![0.6f32 / s as f32; no * s * s];
            d[0] = 1e-30;
            let (df, g, x) = (
                vec![0.0f32; no * s],
                vec![1e-3f32; no * s],
                vec![1.0f32; n_in],
            );
            let stored = |v: &[f32]| {
                ArrayData::F32(
                    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[v.len()]), v.to_vec())
                        .unwrap(),
                )
            };
            let (d, df, g, x) = (stored(&d), stored(&df), stored(&g), stored(&x));
            let mut e = stored(&vec![1.0f32; nnz * s]);
            let mut grad = stored(&vec![0.0f32; nnz]);
            for step in 0..300 {
                let ops = Stored {
                    x: Some(&x),
                    d: &d,
                    df: &df,
                    g: Some(&g),
                    scale: None,
                };
                run(
                    Loop::Sparse(dims, &sp),
                    &mut e,
                    &mut grad,
                    ops,
                    Solve::After,
                    1,
                )
                .unwrap();
                for v in e.to_vec_f64().iter().chain(&grad.to_vec_f64()) {
                    assert!(
                        !(*v as f32).is_subnormal(),
                        "sparse, {s} states, step {step}: {v:e}"
                    );
                }
            }
            assert!(
                e.to_vec_f64().iter().all(|&v| v == 0.0),
                "sparse, {s} states"
            );
        }
    }

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
        scale: Option<&[f64]>,
        solve: Solve,
    ) {
        let Dims {
            batch,
            i: ni,
            o: no,
            s,
        } = dims;
        // Public layouts: e (b, i, o, a), D (b, o, a, c), Df and g (b, o, a).
        let old = e.to_vec();
        let at = |b: usize, i: usize, o: usize, a: usize| ((b * ni + i) * no + o) * s + a;
        let dat = |b: usize, a: usize, c: usize, o: usize| ((b * no + o) * s + a) * s + c;
        let fat = |b: usize, a: usize, o: usize| (b * no + o) * s + a;
        for b in 0..batch {
            for i in 0..ni {
                let xi = x.map_or(1.0, |x| x[b * ni + i]);
                for o in 0..no {
                    for a in 0..s {
                        let mut v = xi * df[fat(b, a, o)] * scale.map_or(1.0, |s| s[i * no + o]);
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
    fn blocked_rows_are_blocks_of_lanes_outputs_value_by_value() {
        // 10 outputs x 2 values: a full block of 8, then one of 2.
        let lay = Blocked { n: 10, k: 2 };
        let public: Vec<(usize, usize)> = (0..10).flat_map(|o| [(o, 0), (o, 1)]).collect();
        let mut got = public.clone();
        lay.block_rows(&public, &mut got);
        let mut want: Vec<(usize, usize)> = (0..8).map(|o| (o, 0)).collect();
        want.extend((0..8).map(|o| (o, 1)));
        want.extend([(8, 0), (9, 0), (8, 1), (9, 1)]);
        assert_eq!(LANES, 8);
        assert_eq!(got, want);
        let mut back = got.clone();
        lay.unblock_rows(&got, &mut back);
        assert_eq!(back, public);
        // Several rows, each on its own; one value per output is the identity.
        let rows: Vec<usize> = (0..3 * 10 * 2).collect();
        let mut moved = rows.clone();
        lay.block_rows(&rows, &mut moved);
        assert_eq!(
            moved[20..40],
            moved[..20].iter().map(|v| v + 20).collect::<Vec<_>>()[..]
        );
        let plain = Blocked { n: 13, k: 1 };
        let v: Vec<usize> = (0..26).collect();
        let mut w = vec![0; 26];
        plain.block_rows(&v, &mut w);
        assert_eq!(v, w);
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
            // Outputs over one block wide, with a narrower last block.
            (2, 3, 11, 2, true),
            (1, 2, 19, 3, true),
            (2, 4, 17, 1, true),
            (3, 1, 9, 2, false),
        ] {
            for (solve, scaled) in [Solve::None, Solve::After, Solve::Before]
                .into_iter()
                .flat_map(|s| [(s, false), (s, true)])
            {
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
                let scale = draw(ni * no);
                let xo = has_x.then_some(&x[..]);
                let sc = scaled.then_some(&scale[..]);
                let (mut er, mut gr) = (e0.clone(), g0.clone());
                reference(dims, &mut er, &mut gr, xo, &d, &df, &g, sc, solve);
                // The kernel's operands, laid out as `Blocked` says.
                let lay = |k: usize, v: &[f64]| {
                    let mut out = v.to_vec();
                    Blocked { n: no, k }.block_rows(v, &mut out);
                    out
                };
                let (eb, d, df, g) = (lay(s, &e0), lay(s * s, &d), lay(s, &df), lay(s, &g));
                for threads in [1, 2, 3, 4, 8] {
                    let (mut e, mut gk) = (eb.clone(), g0.clone());
                    pool.install(|| {
                        fused(
                            dims,
                            &mut e,
                            &mut gk,
                            Operands {
                                x: xo,
                                d: &d,
                                df: &df,
                                g: Some(&g),
                                scale: sc,
                            },
                            solve,
                            threads,
                        )
                    });
                    let mut ep = e.clone();
                    Blocked { n: no, k: s }.unblock_rows(&e, &mut ep);
                    for (a, b) in ep.iter().zip(&er).chain(gk.iter().zip(&gr)) {
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
