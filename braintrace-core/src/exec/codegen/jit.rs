//! Cranelift's JIT for the fused loops: the host's target (once), one
//! module per compiled group (kept for the life of the process, as the
//! cache that hands its loop out), and the Rust element functions a loop
//! may call ([`Callee`]).

use super::key::Resolved;
use super::lower::{callees, lower, signature};
use super::math::Callee;
use crate::ops::UnaryOp;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use std::sync::OnceLock;

/// The host's target with speed optimisations, or `None` where Cranelift
/// does not support it (the block interpreter then runs every group).
fn isa() -> Option<&'static OwnedTargetIsa> {
    static ISA: OnceLock<Option<OwnedTargetIsa>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").ok()?;
        flags.set("use_colocated_libcalls", "false").ok()?;
        flags.set("is_pic", "false").ok()?;
        let builder = cranelift_native::builder().ok()?;
        builder.finish(settings::Flags::new(flags)).ok()
    })
    .as_ref()
}

/// Whether the target runs the loops' multiply-adds as instructions: the
/// block kernels' `mul_add` is rounded once either way, but without them
/// Cranelift calls `fmaf` per lane, slower than the block interpreter.
pub(super) fn has_fma() -> bool {
    isa().is_some_and(|i| {
        i.isa_flags()
            .iter()
            .any(|f| f.name == "has_fma" && f.as_bool() == Some(true))
    })
}

macro_rules! callee_fns {
    ($($name:ident: $t:ty => $e:expr;)*) => {
        $(extern "C" fn $name(x: $t) -> $t {
            let f: fn($t) -> $t = $e;
            f(x)
        })*
    };
}

callee_fns! {
    log_f32: f32 => |x| UnaryOp::Log.apply(x);
    sin_f32: f32 => |x| UnaryOp::Sin.apply(x);
    cos_f32: f32 => |x| UnaryOp::Cos.apply(x);
    softplus_f32: f32 => |x| UnaryOp::Softplus.apply(x);
    atan_f32: f32 => |x| UnaryOp::Atan.apply(x);
    erf_f32: f32 => |x| UnaryOp::Erf.apply(x);
    exp_f64: f64 => |x| UnaryOp::Exp.apply(x);
    log_f64: f64 => |x| UnaryOp::Log.apply(x);
    tanh_f64: f64 => |x| UnaryOp::Tanh.apply(x);
    sigmoid_f64: f64 => |x| UnaryOp::Sigmoid.apply(x);
    sin_f64: f64 => |x| UnaryOp::Sin.apply(x);
    cos_f64: f64 => |x| UnaryOp::Cos.apply(x);
    softplus_f64: f64 => |x| UnaryOp::Softplus.apply(x);
    atan_f64: f64 => |x| UnaryOp::Atan.apply(x);
    erf_f64: f64 => |x| UnaryOp::Erf.apply(x);
}

extern "C" fn pow_f32(x: f32, y: f32) -> f32 {
    x.powf(y)
}

extern "C" fn pow_f64(x: f64, y: f64) -> f64 {
    x.powf(y)
}

/// A callee's symbol, address and arity; `None` for a unary op emitted
/// inline (never called).
fn callee(c: Callee) -> Option<(&'static str, *const u8, usize)> {
    use UnaryOp::*;
    let u = |name, f: *const u8| Some((name, f, 1));
    match c {
        Callee::Pow(false) => Some(("bt_pow_f32", pow_f32 as *const u8, 2)),
        Callee::Pow(true) => Some(("bt_pow_f64", pow_f64 as *const u8, 2)),
        Callee::Unary(op, false) => match op {
            Log => u("bt_log_f32", log_f32 as *const u8),
            Sin => u("bt_sin_f32", sin_f32 as *const u8),
            Cos => u("bt_cos_f32", cos_f32 as *const u8),
            Softplus => u("bt_softplus_f32", softplus_f32 as *const u8),
            Atan => u("bt_atan_f32", atan_f32 as *const u8),
            Erf => u("bt_erf_f32", erf_f32 as *const u8),
            _ => None,
        },
        Callee::Unary(op, true) => match op {
            Exp => u("bt_exp_f64", exp_f64 as *const u8),
            Log => u("bt_log_f64", log_f64 as *const u8),
            Tanh => u("bt_tanh_f64", tanh_f64 as *const u8),
            Sigmoid => u("bt_sigmoid_f64", sigmoid_f64 as *const u8),
            Sin => u("bt_sin_f64", sin_f64 as *const u8),
            Cos => u("bt_cos_f64", cos_f64 as *const u8),
            Softplus => u("bt_softplus_f64", softplus_f64 as *const u8),
            Atan => u("bt_atan_f64", atan_f64 as *const u8),
            Erf => u("bt_erf_f64", erf_f64 as *const u8),
            _ => None,
        },
    }
}

/// Compile the group's loop; its address, or `None` where Cranelift
/// refuses it (then the block interpreter runs the group). The module is
/// leaked: its code lives as long as the process, as the cache's entry.
pub(super) fn compile(r: &Resolved) -> Option<usize> {
    let isa = isa()?.clone();
    let cfg = isa.frontend_config();
    let ptr = isa.pointer_type();
    let cs = callees(r);
    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    let mut found = Vec::new();
    for &c in &cs {
        let (name, addr, arity) = callee(c)?;
        builder.symbol(name, addr);
        found.push((c, name, arity));
    }
    let mut module = JITModule::new(builder);
    let mut ctx = module.make_context();
    signature(&mut ctx.func.signature, ptr);
    let lane = match r.dtype {
        crate::tensor::DType::F64 => cranelift_codegen::ir::types::F64,
        _ => cranelift_codegen::ir::types::F32,
    };
    let mut calls = Vec::new();
    for (c, name, arity) in found {
        let mut sig = module.make_signature();
        for _ in 0..arity {
            sig.params.push(cranelift_codegen::ir::AbiParam::new(lane));
        }
        sig.returns.push(cranelift_codegen::ir::AbiParam::new(lane));
        let id = module.declare_function(name, Linkage::Import, &sig).ok()?;
        calls.push((c, module.declare_func_in_func(id, &mut ctx.func)));
    }
    let mut fctx = cranelift_frontend::FunctionBuilderContext::new();
    lower(r, &mut ctx.func, &mut fctx, &calls, cfg);
    let id = module
        .declare_function("group", Linkage::Local, &ctx.func.signature)
        .ok()?;
    module.define_function(id, &mut ctx).ok()?;
    module.clear_context(&mut ctx);
    module.finalize_definitions().ok()?;
    let addr = module.get_finalized_function(id) as usize;
    // The code must outlive every plan that holds its address.
    std::mem::forget(module);
    Some(addr)
}
