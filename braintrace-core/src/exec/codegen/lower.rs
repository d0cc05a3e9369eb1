//! A resolved group lowered to one Cranelift function: a loop over the
//! block's elements that computes every op of an element (of a vector of
//! elements) in turn, all values in registers, and stores the outputs.
//!
//! Signature: `fn(ins: *const *const T, outs: *const *mut T, c: *const T,
//! n: usize)`. Three loops, each the same ops on a value type: [`unroll`]
//! vectors per iteration (the copies interleaved op by op, so that the
//! latency chains of `exp` overlap), then one vector, then one element.
//! Cranelift's x86 backend has 128-bit vectors (4 `f32`, 2 `f64`).

use super::key::{n_constants, Resolved, Src};
use super::math::{Callee, Emit};
use crate::exec::OpKind;
use crate::ops::{BinaryOp, ScalarOp, Surrogate, UnaryOp};
use crate::tensor::DType;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, BlockArg, InstBuilder, MemFlagsData, Signature, Type, Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Vectors per iteration of the main loop (`BRAINTRACE_CODEGEN_UNROLL`,
/// 1 to 8, to measure; default 1).
fn unroll() -> usize {
    static U: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *U.get_or_init(|| {
        std::env::var("BRAINTRACE_CODEGEN_UNROLL")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|u| (1..=8).contains(u))
            .unwrap_or(1)
    })
}

/// The Rust functions the group calls lane by lane.
pub(super) fn callees(r: &Resolved) -> Vec<Callee> {
    let f64 = r.dtype == DType::F64;
    let mut out = Vec::new();
    for (kind, _) in &r.ops {
        let c = match *kind {
            OpKind::Unary(u) if !inline_unary(u, f64) => Callee::Unary(u, f64),
            OpKind::Binary(BinaryOp::Pow) | OpKind::Scalar(ScalarOp::Pow, _) => Callee::Pow(f64),
            OpKind::Surrogate(Surrogate::Sigmoid { .. }) if f64 => {
                Callee::Unary(UnaryOp::Exp, true)
            }
            _ => continue,
        };
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Whether unary `u` is emitted inline (else called).
fn inline_unary(u: UnaryOp, f64: bool) -> bool {
    match u {
        UnaryOp::Neg
        | UnaryOp::Relu
        | UnaryOp::Sqrt
        | UnaryOp::Abs
        | UnaryOp::Square
        | UnaryOp::Reciprocal
        | UnaryOp::Step
        | UnaryOp::Sign => true,
        UnaryOp::Exp | UnaryOp::Sigmoid | UnaryOp::Tanh => !f64,
        UnaryOp::Log
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Softplus
        | UnaryOp::Atan
        | UnaryOp::Erf => false,
    }
}

/// The loop's signature (`ptr` is the target's pointer type).
pub(super) fn signature(sig: &mut Signature, ptr: Type) {
    for _ in 0..4 {
        sig.params.push(AbiParam::new(ptr));
    }
}

/// Emit the group's loop into `b`'s function (its signature set by
/// [`signature`]); `calls` holds the imported callees.
pub(super) fn lower(
    r: &Resolved,
    func: &mut cranelift_codegen::ir::Function,
    fctx: &mut FunctionBuilderContext,
    calls: &[(Callee, cranelift_codegen::ir::FuncRef)],
    cfg: cranelift_codegen::isa::TargetFrontendConfig,
) {
    let ptr = cfg.pointer_type();
    let (lane, vec) = match r.dtype {
        DType::F64 => (types::F64, types::F64X2),
        _ => (types::F32, types::F32X4),
    };
    let size = i64::from(lane.bytes());
    let width = i64::from(vec.lane_count());
    let mut b = FunctionBuilder::new(func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let p = b.block_params(entry).to_vec();
    let (ins_p, outs_p, c_p, n) = (p[0], p[1], p[2], p[3]);
    let flags = MemFlagsData::new().with_notrap();
    let psize = i32::from(ptr.bytes() as u8);
    let ins: Vec<Value> = (0..r.n_ins)
        .map(|i| b.ins().load(ptr, flags, ins_p, psize * i as i32))
        .collect();
    let outs: Vec<Value> = (0..r.outs.len())
        .map(|o| b.ins().load(ptr, flags, outs_p, psize * o as i32))
        .collect();
    let n_c: usize = r.ops.iter().map(|(k, _)| n_constants(k)).sum();
    let consts: Vec<Value> = (0..n_c)
        .map(|k| b.ins().load(lane, flags, c_p, (size as i32) * k as i32))
        .collect();
    let zero = b.ins().iconst(ptr, 0);

    // Loops: (value type, elements per iteration, copies per iteration).
    let u = unroll();
    let stages = [(vec, width * u as i64, u), (vec, width, 1), (lane, 1, 1)];
    let heads: Vec<_> = stages.iter().map(|_| b.create_block()).collect();
    let bodies: Vec<_> = stages.iter().map(|_| b.create_block()).collect();
    let exit = b.create_block();
    for &h in &heads {
        b.append_block_param(h, ptr);
    }
    b.ins().jump(heads[0], &[BlockArg::Value(zero)]);
    for (s, &(ty, step, copies)) in stages.iter().enumerate() {
        let (head, body) = (heads[s], bodies[s]);
        let next = heads.get(s + 1).copied().unwrap_or(exit);
        b.switch_to_block(head);
        let i = b.block_params(head)[0];
        // `n - i >= step`: `i <= n` always, so no overflow.
        let left = b.ins().isub(n, i);
        let go = b
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, left, step);
        let next_args: Vec<BlockArg> = if next == exit {
            vec![]
        } else {
            vec![BlockArg::Value(i)]
        };
        b.ins().brif(go, body, &[], next, &next_args);
        b.switch_to_block(body);
        b.seal_block(body);
        let off = b.ins().imul_imm_u(i, size);
        let addr = |b: &mut FunctionBuilder, base: Value| b.ins().iadd(base, off);
        let in_addr: Vec<Value> = ins.iter().map(|&v| addr(&mut b, v)).collect();
        let out_addr: Vec<Value> = outs.iter().map(|&v| addr(&mut b, v)).collect();
        let vbytes = (size * i64::from(ty.lane_count())) as i32;
        let mut e = Emit {
            b: &mut b,
            ty,
            calls,
        };
        // Constants as values of `ty`, once per loop body.
        let cs: Vec<Value> = consts.iter().map(|&c| e.splat(c)).collect();
        let mut loaded: Vec<Option<Vec<Value>>> = vec![None; r.n_ins];
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(r.ops.len());
        let mut ci = 0;
        for (kind, srcs) in &r.ops {
            let args: Vec<Vec<Value>> = srcs
                .iter()
                .map(|s| match *s {
                    Src::Val(j) => vals[j].clone(),
                    Src::In(k) => loaded[k]
                        .get_or_insert_with(|| {
                            (0..copies)
                                .map(|u| e.b.ins().load(ty, flags, in_addr[k], vbytes * u as i32))
                                .collect()
                        })
                        .clone(),
                })
                .collect();
            let c = &cs[ci..ci + n_constants(kind)];
            ci += n_constants(kind);
            let v = (0..copies)
                .map(|u| {
                    let a: Vec<Value> = args.iter().map(|x| x[u]).collect();
                    op(&mut e, kind, &a, c)
                })
                .collect();
            vals.push(v);
        }
        for (o, &j) in r.outs.iter().enumerate() {
            for (u, &v) in vals[j].iter().enumerate() {
                b.ins().store(flags, v, out_addr[o], vbytes * u as i32);
            }
        }
        let i2 = b.ins().iadd_imm_u(i, step);
        b.ins().jump(head, &[BlockArg::Value(i2)]);
        b.seal_block(head);
    }
    b.switch_to_block(exit);
    b.seal_block(exit);
    b.ins().return_(&[]);
    b.finalize(cfg);
}

/// One op on one value of the loop's type, as its block kernel computes it.
fn op(e: &mut Emit, kind: &OpKind, a: &[Value], c: &[Value]) -> Value {
    let f64 = e.ty.lane_type() == types::F64;
    match *kind {
        OpKind::Unary(u) if !inline_unary(u, f64) => e.call(Callee::Unary(u, f64), a),
        OpKind::Unary(u) => unary(e, u, a[0]),
        OpKind::Binary(BinaryOp::Add) => e.add(a[0], a[1]),
        OpKind::Binary(BinaryOp::Sub) => e.sub(a[0], a[1]),
        OpKind::Binary(BinaryOp::Mul) => e.mul(a[0], a[1]),
        OpKind::Binary(BinaryOp::Div) => e.div(a[0], a[1]),
        OpKind::Binary(BinaryOp::Max) => e.max(a[0], a[1]),
        OpKind::Binary(BinaryOp::Min) => e.min(a[0], a[1]),
        OpKind::Binary(BinaryOp::Pow) => e.call(Callee::Pow(f64), a),
        OpKind::Scalar(o, _) => {
            let s = c[0];
            match o {
                ScalarOp::Add => e.add(a[0], s),
                ScalarOp::Mul => e.mul(a[0], s),
                ScalarOp::Div => e.div(a[0], s),
                ScalarOp::RSub => e.sub(s, a[0]),
                ScalarOp::RDiv => e.div(s, a[0]),
                ScalarOp::Pow => e.call(Callee::Pow(f64), &[a[0], s]),
                ScalarOp::Max => e.max(a[0], s),
                ScalarOp::Min => e.min(a[0], s),
            }
        }
        // The product rounded before the sum, as `mul_add_block`.
        OpKind::MulAdd => {
            let p = e.mul(a[0], a[1]);
            e.add(p, a[2])
        }
        OpKind::ScaleAdd(_) => {
            let p = e.mul(a[0], c[0]);
            e.add(p, a[1])
        }
        OpKind::Surrogate(g) => match g {
            Surrogate::Arctan { .. } => e.arctan_grad(a[0], c[0], c[1]),
            Surrogate::Sigmoid { .. } => e.sigmoid_grad(a[0], c[0]),
            Surrogate::ReluGrad { .. } => e.relu_grad(a[0], c[0], c[1]),
            _ => unreachable!("resolve refuses the surrogates without a loop"),
        },
        OpKind::Eqn => unreachable!("resolve refuses kernels of their own"),
    }
}

/// An inline unary op (see [`inline_unary`]): `UnaryOp::apply`, or
/// `fastmath` in `f32`.
fn unary(e: &mut Emit, u: UnaryOp, x: Value) -> Value {
    match u {
        UnaryOp::Neg => e.neg(x),
        UnaryOp::Abs => e.abs(x),
        UnaryOp::Sqrt => e.sqrt(x),
        UnaryOp::Square => e.mul(x, x),
        UnaryOp::Reciprocal => {
            let one = e.c(1.0);
            e.div(one, x)
        }
        UnaryOp::Relu => {
            let zero = e.c(0.0);
            e.max(x, zero)
        }
        UnaryOp::Step => {
            let (zero, one) = (e.c(0.0), e.c(1.0));
            e.pick(FloatCC::GreaterThan, x, zero, one, zero)
        }
        UnaryOp::Sign => {
            let (zero, one, m1) = (e.c(0.0), e.c(1.0), e.c(-1.0));
            let neg = e.pick(FloatCC::LessThan, x, zero, m1, zero);
            e.pick(FloatCC::GreaterThan, x, zero, one, neg)
        }
        UnaryOp::Exp => e.exp_f32(x),
        UnaryOp::Sigmoid => e.sigmoid_f32(x),
        UnaryOp::Tanh => e.tanh_f32(x),
        UnaryOp::Log
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Softplus
        | UnaryOp::Atan
        | UnaryOp::Erf => {
            unreachable!("called, not inline")
        }
    }
}
