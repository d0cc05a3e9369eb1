//! A fused group as the code generator sees it: its ops with operands
//! resolved to the loop's inputs and earlier values ([`resolve`]), the key
//! its compiled loop is cached under ([`key`]), and its constants.

use super::super::{Fused, OpKind, Operand};
use crate::ops::Surrogate;
use crate::tensor::DType;
use std::fmt::Write as _;

/// Most inputs (external and broadcast) and outputs of a compiled group:
/// the executor passes a block's operand pointers in arrays of these
/// sizes (on the stack, no allocation per block).
pub(in crate::exec) const MAX_INS: usize = 32;
pub(in crate::exec) const MAX_OUTS: usize = 16;

/// Where an op's operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Src {
    /// Loop input `i`: an external input, or a broadcast buffer (after the
    /// inputs, scalars then rows, as the executor fills them).
    In(usize),
    /// The value of op `j`.
    Val(usize),
}

/// A group ready to be lowered: ops with resolved operands, and per
/// output, the op whose value it is.
pub(super) struct Resolved {
    pub dtype: DType,
    pub n_ins: usize,
    pub ops: Vec<(OpKind, Vec<Src>)>,
    pub outs: Vec<usize>,
}

/// The group with operands resolved to inputs and earlier values; `None`
/// for a group the generator does not compile: an op with a kernel of its
/// own (a primitive's [`Elementwise`](crate::graph::Elementwise)), a dtype
/// other than `f32`/`f64`, a single op (its block kernel is as fast), or
/// more operands than the executor passes.
pub(super) fn resolve(f: &Fused) -> Option<Resolved> {
    let n_in = f.inputs.len();
    let n_bcast = f.scalars.len() + f.rows.len();
    let n_ins = n_in + n_bcast;
    if !matches!(f.dtype, DType::F32 | DType::F64)
        || f.ops.len() < 2
        || n_ins > MAX_INS
        || f.outputs.len() > MAX_OUTS
    {
        return None;
    }
    let mut buf_val: Vec<Option<usize>> = vec![None; f.nbufs];
    let mut out_val: Vec<Option<usize>> = vec![None; f.outputs.len()];
    let mut ops = Vec::with_capacity(f.ops.len());
    for (j, op) in f.ops.iter().enumerate() {
        if op.kind == OpKind::Eqn {
            return None;
        }
        // Surrogates the generator has no loop for run on the block kernels.
        if let OpKind::Surrogate(g) = &op.kind {
            surrogate_kind(g)?;
        }
        let srcs = op
            .operands
            .iter()
            .map(|o| match *o {
                Operand::Input(i) => Some(Src::In(i)),
                Operand::Buf(b) => match buf_val.get(b).copied().flatten() {
                    Some(v) => Some(Src::Val(v)),
                    None if b < n_bcast => Some(Src::In(n_in + b)),
                    None => None,
                },
                Operand::Out(o) => out_val.get(o).copied().flatten().map(Src::Val),
            })
            .collect::<Option<Vec<_>>>()?;
        match op.dst {
            Operand::Buf(b) => *buf_val.get_mut(b)? = Some(j),
            Operand::Out(o) => *out_val.get_mut(o)? = Some(j),
            Operand::Input(_) => return None,
        }
        ops.push((op.kind, srcs));
    }
    let outs = out_val.into_iter().collect::<Option<Vec<_>>>()?;
    (!outs.is_empty()).then_some(Resolved {
        dtype: f.dtype,
        n_ins,
        ops,
        outs,
    })
}

/// The group's identity in the cache of compiled loops: dtype, operand
/// counts, each op's kind and operands, and which op writes each output.
/// Constants are not part of it: the loop reads them from an argument (a
/// pp_prop decay, a mean's divisor), so groups that differ only there
/// share one compiled loop.
pub(super) fn key(r: &Resolved) -> String {
    let mut k = format!("{:?}:in{}/out{}:", r.dtype, r.n_ins, r.outs.len());
    for (kind, srcs) in &r.ops {
        match kind {
            OpKind::Unary(u) => write!(k, "u{u:?}"),
            OpKind::Binary(b) => write!(k, "b{b:?}"),
            OpKind::Scalar(o, _) => write!(k, "s{o:?}"),
            OpKind::MulAdd => write!(k, "MulAdd"),
            OpKind::ScaleAdd(_) => write!(k, "ScaleAdd"),
            OpKind::Surrogate(g) => write!(k, "g{}", surrogate_kind(g).unwrap_or("?")),
            OpKind::Eqn => write!(k, "eqn"),
        }
        .expect("writing to a String");
        k.push('(');
        for s in srcs {
            match s {
                Src::In(i) => write!(k, "i{i},"),
                Src::Val(v) => write!(k, "v{v},"),
            }
            .expect("writing to a String");
        }
        k.push_str(");");
    }
    for o in &r.outs {
        write!(k, "o{o},").expect("writing to a String");
    }
    k
}

/// A surrogate's kind (its parameters are constants); `None` for the
/// kinds the generator has no loop for.
fn surrogate_kind(g: &Surrogate) -> Option<&'static str> {
    match g {
        Surrogate::Arctan { .. } => Some("Arctan"),
        Surrogate::Sigmoid { .. } => Some("Sigmoid"),
        Surrogate::ReluGrad { .. } => Some("ReluGrad"),
        _ => None,
    }
}

/// How many constants op `kind` reads from the constants argument.
pub(super) fn n_constants(kind: &OpKind) -> usize {
    match kind {
        OpKind::Scalar(..) | OpKind::ScaleAdd(_) => 1,
        OpKind::Surrogate(_) => 2,
        _ => 0,
    }
}

/// The group's constants in op order (a scalar op's, a scaled add's, a
/// surrogate's two), converted to the group's float type as the block
/// kernels convert them (`T::from`, NaN where it fails).
pub(in crate::exec) fn constants<T: num_traits::Float>(f: &Fused) -> Vec<T> {
    let mut out = Vec::new();
    for op in &f.ops {
        match op.kind {
            OpKind::Scalar(_, v) | OpKind::ScaleAdd(v) => {
                out.push(T::from(v).unwrap_or_else(T::nan))
            }
            OpKind::Surrogate(g) => out.extend(g.constants::<T>()),
            _ => {}
        }
    }
    out
}
