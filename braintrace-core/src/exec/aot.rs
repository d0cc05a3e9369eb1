//! Fused groups compiled ahead of time: one loop per group, every value of
//! an element in registers.
//!
//! The planned executor runs a fused group op by op over blocks of
//! elements, each op loading its operands from block buffers and storing
//! its result into one. That load and store cost more than most ops'
//! arithmetic: the largest group of a GRU pp_prop step (18 ops and a
//! `tanh`, `64 × 128`) took 10–12 µs op by op, 6.3 µs as one loop (a
//! hand-written loop of the same math, 3.4 µs). Without a code generator
//! at run time, the groups of the built-in layers' step programs are
//! compiled here ahead of time: [`source`] writes a group as a Rust
//! function (the same operations as the block kernels, in the same order,
//! so the same bits), `compiled.rs` holds those of the bench models
//! (`GruCell` and `LifCell` nets, the latter with each of the three
//! surrogate gradients; D-RTRL and pp_prop; `f32`), and the plan runs a
//! group's function when its [`key`] (its ops and their wiring; constants
//! are arguments) is there. Any other group runs op by op, as before.
//!
//! `compiled.rs` is generated: the test `compiled_groups_are_current`
//! fails when a change to the learning compiler changes these groups, and
//! `BRAINTRACE_REGENERATE=1 cargo test -p braintrace-core
//! compiled_groups_are_current` rewrites it.

use super::{Fused, OpKind, Operand};
use crate::ops::Surrogate;
use crate::tensor::DType;
use std::fmt::Write as _;

/// A compiled group's block function: the inputs (the group's external
/// inputs, then its broadcast buffers) and outputs of one block, all of
/// the block's length, and the group's constants ([`constants`]).
pub(super) type Kernel = fn(&[&[f32]], &[f32], &mut [&mut [f32]]);

/// Most inputs (external and broadcast) and outputs of a compiled group:
/// the executor passes a block's operands in arrays of these sizes.
pub(super) const MAX_INS: usize = 16;
pub(super) const MAX_OUTS: usize = 8;

/// Where an op's operand comes from, resolved through the buffers.
#[derive(Clone, Copy)]
enum Src {
    /// An external input, or a broadcast buffer (after the inputs).
    In(usize),
    /// The value of op `j`.
    Val(usize),
}

/// The group's ops with operands resolved to inputs and earlier values,
/// and, per output, the op that writes it; `None` for a group with an op
/// that cannot be compiled (a primitive's own kernel) or not in `f32`.
#[allow(clippy::type_complexity)]
fn resolve(f: &Fused) -> Option<(Vec<(OpKind, Vec<Src>)>, Vec<usize>)> {
    // One op runs as fast through its block kernel; the executor passes
    // at most `MAX_INS` inputs and `MAX_OUTS` outputs.
    let n_ins = f.inputs.len() + f.scalars.len() + f.rows.len();
    if f.dtype != DType::F32 || f.ops.len() < 2 || n_ins > MAX_INS || f.outputs.len() > MAX_OUTS {
        return None;
    }
    let n_in = f.inputs.len();
    let n_bcast = f.scalars.len() + f.rows.len();
    let mut buf_val: Vec<Option<usize>> = vec![None; f.nbufs];
    let mut out_val: Vec<Option<usize>> = vec![None; f.outputs.len()];
    let mut ops = Vec::with_capacity(f.ops.len());
    for (j, op) in f.ops.iter().enumerate() {
        if op.kind == OpKind::Eqn {
            return None;
        }
        let srcs = op
            .operands
            .iter()
            .map(|o| match *o {
                Operand::Input(i) => Some(Src::In(i)),
                Operand::Buf(b) => match buf_val[b] {
                    Some(v) => Some(Src::Val(v)),
                    None if b < n_bcast => Some(Src::In(n_in + b)),
                    None => None,
                },
                Operand::Out(o) => out_val[o].map(Src::Val),
            })
            .collect::<Option<Vec<_>>>()?;
        match op.dst {
            Operand::Buf(b) => buf_val[b] = Some(j),
            Operand::Out(o) => out_val[o] = Some(j),
            Operand::Input(_) => return None,
        }
        ops.push((op.kind, srcs));
    }
    let outs = out_val.into_iter().collect::<Option<Vec<_>>>()?;
    (!outs.is_empty()).then_some((ops, outs))
}

/// The group's identity for the table of compiled groups: its operand
/// counts, each op's kind and operands, and which op writes each output.
/// Constants are not part of it: the function takes them as arguments
/// (a pp_prop decay, a mean's divisor). `None` where [`resolve`] says it
/// cannot be compiled.
pub(super) fn key(f: &Fused) -> Option<String> {
    let (ops, outs) = resolve(f)?;
    let mut k = format!(
        "in{}+{}/out{}:",
        f.inputs.len(),
        f.scalars.len() + f.rows.len(),
        outs.len()
    );
    for (kind, srcs) in &ops {
        match kind {
            OpKind::Unary(u) => write!(k, "u{u:?}"),
            OpKind::Binary(b) => write!(k, "b{b:?}"),
            OpKind::Scalar(o, _) => write!(k, "s{o:?}"),
            OpKind::MulAdd => write!(k, "MulAdd"),
            OpKind::ScaleAdd(_) => write!(k, "ScaleAdd"),
            OpKind::Surrogate(g) => write!(k, "g{}", surrogate_kind(g)),
            OpKind::Eqn => unreachable!("resolve refuses kernels of their own"),
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
    for o in outs {
        write!(k, "o{o},").expect("writing to a String");
    }
    Some(k)
}

/// A name for the group's function: FNV-1a of its key.
#[cfg(test)]
pub(super) fn name(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("g{h:016x}")
}

/// A surrogate's kind (its parameters are constants).
fn surrogate_kind(g: &Surrogate) -> &'static str {
    match g {
        Surrogate::Arctan { .. } => "Arctan",
        Surrogate::Sigmoid { .. } => "Sigmoid",
        Surrogate::ReluGrad { .. } => "ReluGrad",
        // No group of it is compiled: the key finds nothing, the group runs op by op.
        _ => "Other",
    }
}

/// The group's constants, in op order (a scalar op's, a scaled add's, a
/// surrogate's two), converted to `f32` as the block kernels convert them.
pub(super) fn constants(f: &Fused) -> Vec<f32> {
    let mut out = Vec::new();
    for op in &f.ops {
        match op.kind {
            OpKind::Scalar(_, v) | OpKind::ScaleAdd(v) => {
                out.push(num_traits::cast(v).unwrap_or(f32::NAN))
            }
            OpKind::Surrogate(g) => out.extend(g.constants::<f32>()),
            _ => {}
        }
    }
    out
}

/// The Rust source of the group's function (`None` where it cannot be
/// compiled): a loop over the block's elements computing every op of an
/// element in turn, each op the same operation as its block kernel.
#[cfg(test)]
pub(super) fn source(f: &Fused) -> Option<String> {
    use crate::ops::{BinaryOp, ScalarOp, UnaryOp};
    let k = key(f)?;
    let (ops, outs) = resolve(f)?;
    let name = name(&k);
    let n_ins = f.inputs.len() + f.scalars.len() + f.rows.len();
    let mut s = String::new();
    let w = &mut s;
    let line = |w: &mut String, t: String| {
        w.push_str(&t);
        w.push('\n');
    };
    line(w, format!("// {}", f.label.0));
    line(w, "#[inline(always)]".into());
    line(
        w,
        format!("fn {name}_body(ins: &[&[f32]], c: &[f32], outs: &mut [&mut [f32]]) {{"),
    );
    let os: Vec<String> = (0..outs.len()).map(|o| format!("o{o}")).collect();
    line(
        w,
        format!(
            "    let [{}] = outs else {{ unreachable!(\"{} outputs\") }};",
            os.join(", "),
            outs.len()
        ),
    );
    line(w, "    let n = o0.len();".into());
    for o in &os {
        line(w, format!("    let {o} = &mut {o}[..n];"));
    }
    for i in 0..n_ins {
        line(w, format!("    let i{i} = &ins[{i}][..n];"));
    }
    let n_c = constants(f).len();
    for i in 0..n_c {
        line(w, format!("    let c{i} = c[{i}];"));
    }
    if n_c == 0 {
        line(w, "    let _ = c;".into());
    }
    line(w, "    for p in 0..n {".into());
    let src = |s: &Src| match s {
        Src::In(i) => format!("i{i}[p]"),
        Src::Val(v) => format!("v{v}"),
    };
    let mut n_const = 0;
    let mut constant = || {
        n_const += 1;
        format!("c{}", n_const - 1)
    };
    for (j, (kind, srcs)) in ops.iter().enumerate() {
        let a: Vec<String> = srcs.iter().map(src).collect();
        let e = match *kind {
            OpKind::Unary(UnaryOp::Exp) => format!("fastmath::exp_f32({})", a[0]),
            OpKind::Unary(UnaryOp::Sigmoid) => format!("fastmath::sigmoid_f32({})", a[0]),
            OpKind::Unary(UnaryOp::Tanh) => format!("fastmath::tanh_f32({})", a[0]),
            OpKind::Unary(u) => format!("UnaryOp::{u:?}.apply({})", a[0]),
            OpKind::Binary(BinaryOp::Add) => format!("{} + {}", a[0], a[1]),
            OpKind::Binary(BinaryOp::Sub) => format!("{} - {}", a[0], a[1]),
            OpKind::Binary(BinaryOp::Mul) => format!("{} * {}", a[0], a[1]),
            OpKind::Binary(BinaryOp::Div) => format!("{} / {}", a[0], a[1]),
            OpKind::Binary(b) => format!("BinaryOp::{b:?}.apply({}, {})", a[0], a[1]),
            OpKind::Scalar(ScalarOp::Add, _) => format!("{} + {}", a[0], constant()),
            OpKind::Scalar(ScalarOp::Mul, _) => format!("{} * {}", a[0], constant()),
            OpKind::Scalar(ScalarOp::Div, _) => format!("{} / {}", a[0], constant()),
            OpKind::Scalar(ScalarOp::RSub, _) => format!("{} - {}", constant(), a[0]),
            OpKind::Scalar(ScalarOp::RDiv, _) => format!("{} / {}", constant(), a[0]),
            OpKind::Scalar(o, _) => format!("ScalarOp::{o:?}.apply({}, {})", a[0], constant()),
            OpKind::MulAdd => format!("{} * {} + {}", a[0], a[1], a[2]),
            OpKind::ScaleAdd(_) => format!("{} * {} + {}", a[0], constant(), a[1]),
            // The formulas of `ops::spike`'s kernel in `f32` (the test
            // compares the bits).
            OpKind::Surrogate(g) => {
                let (c0, c1) = (constant(), constant());
                match g {
                    Surrogate::Arctan { .. } => {
                        format!("{{ let z = {c1} * {}; {c0} / (1.0 + z * z) }}", a[0])
                    }
                    Surrogate::Sigmoid { .. } => format!(
                        "{{ let _ = {c1}; let e = fastmath::exp_f32(-({c0} * {}).abs()); \
                         let d = 1.0 + e; {c0} * e / (d * d) }}",
                        a[0]
                    ),
                    Surrogate::ReluGrad { .. } => {
                        format!("({c1} - {c0} * {}.abs()).max(0.0)", a[0])
                    }
                    _ => return None,
                }
            }
            OpKind::Eqn => unreachable!("resolve refuses kernels of their own"),
        };
        line(w, format!("        let v{j} = {e};"));
    }
    for (o, v) in outs.iter().enumerate() {
        line(w, format!("        o{o}[p] = v{v};"));
    }
    line(w, "    }".into());
    line(w, "}".into());
    line(w, "avx2_dispatch!(avx512:".into());
    line(
        w,
        format!("    fn {name}(ins: &[&[f32]], c: &[f32], outs: &mut [&mut [f32]]) => {name}_body"),
    );
    line(w, ");".into());
    Some(s)
}

/// The whole of `compiled.rs` for `groups` (key → source).
#[cfg(test)]
pub(super) fn file(groups: &std::collections::BTreeMap<String, String>) -> String {
    let mut s = String::from(
        "//! Generated by `BRAINTRACE_REGENERATE=1 cargo test -p braintrace-core \
         compiled_groups_are_current`\n//! (see `aot.rs`); do not edit.\n\n\
         // One index for every slice: the loop is one pass over them all.\n\
         #![allow(clippy::needless_range_loop)]\n\n\
         use super::aot::Kernel;\n\
         #[allow(unused_imports)]\n\
         use crate::kernels::{avx2_dispatch, fastmath};\n\
         #[allow(unused_imports)]\n\
         use crate::ops::{BinaryOp, ScalarOp, UnaryOp};\n\n",
    );
    for src in groups.values() {
        s.push_str(src);
        s.push('\n');
    }
    s.push_str("/// Key ([`super::aot::key`]) and function of every compiled group.\n");
    s.push_str("pub(super) static COMPILED: &[(&str, Kernel)] = &[\n");
    for k in groups.keys() {
        s.push_str(&format!("    ({k:?}, {}),\n", name(k)));
    }
    s.push_str("];\n");
    s
}

/// The compiled function of the group with this key, if there is one.
pub(super) fn lookup(key: &str) -> Option<Kernel> {
    super::compiled::COMPILED
        .iter()
        .find(|(k, _)| *k == key)
        .map(|&(_, f)| f)
}

#[cfg(test)]
mod tests {
    use super::super::{COMPILED_ON, RECORD};
    use crate::learn::NonTemporal::Zero;
    use crate::learn::{compile, Algorithm, DRtrl, Model, ModelState, PpProp, Reduction};
    use crate::nn::{Chain, GruCell, LeakyRateReadout, LifCell, Linear};
    use crate::ops::Surrogate;
    use crate::{DType, Result, Tensor};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    const N_IN: usize = 16;
    const N_OUT: usize = 4;

    fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
        o.sub(y)?.square()?.mean_all()
    }

    fn uniform(rng: &mut StdRng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
        let n = shape.iter().product();
        let v = (0..n).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_vec(v, shape)
            .and_then(|t| t.cast(DType::F32))
            .expect("a valid shape")
    }

    /// Every loss and gradient element of one `etrace_grad` call of 4 steps
    /// (f32), as bits.
    fn run<M: Model>(model: M, algo: Algorithm, batch: usize) -> Vec<u64> {
        let state = ModelState::new(&model, DType::F32, 3, Some(batch)).expect("state");
        let x0 = Tensor::zeros(&[batch, N_IN], DType::F32);
        let mut learner = compile(model, state, algo, &x0, Some(batch)).expect("compile");
        let mut rng = StdRng::seed_from_u64(5);
        let xs = uniform(&mut rng, &[4, batch, N_IN], 0.0, 1.0);
        let ys = uniform(&mut rng, &[4, batch, N_OUT], -1.0, 1.0);
        let out = learner
            .etrace_grad(&xs, &ys, mse, Reduction::Mean)
            .expect("etrace_grad");
        std::iter::once(&out.losses)
            .chain(out.grads.values())
            .flat_map(|t| t.to_vec_f64().expect("float"))
            .map(f64::to_bits)
            .collect()
    }

    /// The bench models (`bench_learn`'s `gru` and `lif` nets, the latter
    /// also with the other two surrogate gradients) with D-RTRL and
    /// pp_prop: (name, run's output).
    fn bench_models(n_rec: usize, batch: usize) -> Vec<(String, Vec<u64>)> {
        let algos = || -> [(&str, Algorithm); 2] {
            [
                // As bench_learn runs them (braintrace's zeros).
                ("d_rtrl", DRtrl::default().non_temporal(Zero).into()),
                (
                    "pp_prop",
                    PpProp::new(0.95).expect("decay").non_temporal(Zero).into(),
                ),
            ]
        };
        let mut out = Vec::new();
        for (a, algo) in algos() {
            let gru = Chain::new(
                GruCell::new("rnn", N_IN, n_rec),
                Linear::new("out", n_rec, N_OUT),
            );
            out.push((format!("gru {a}"), run(gru, algo, batch)));
        }
        // The bench net's surrogate (arctan), and the other two.
        for g in [
            Surrogate::default(),
            Surrogate::sigmoid(),
            Surrogate::relu_grad(),
        ] {
            for (a, algo) in algos() {
                let mut cell = LifCell::new("", N_IN, n_rec, 0.8, 0.6, 1.0);
                cell.surrogate = g;
                let lif = Chain::new(
                    cell,
                    LeakyRateReadout::new("readout", n_rec, N_OUT, 5.0, 1.0),
                );
                out.push((format!("lif {g:?} {a}"), run(lif, algo, batch)));
            }
        }
        out
    }

    /// The groups the bench models' step programs plan (key → source), at
    /// two sizes.
    fn recorded() -> BTreeMap<String, String> {
        RECORD.with(|r| *r.borrow_mut() = Some(BTreeMap::new()));
        bench_models(32, 4);
        bench_models(128, 16);
        RECORD
            .with(|r| r.borrow_mut().take())
            .expect("recording on this thread")
    }

    /// `compiled.rs` holds exactly the bench models' groups, so each of
    /// them runs compiled; `BRAINTRACE_REGENERATE=1` rewrites it.
    #[test]
    fn compiled_groups_are_current() {
        let groups = recorded();
        assert!(groups.len() >= 8, "{} groups", groups.len());
        let want = super::file(&groups);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/graph/plan/compiled.rs");
        if std::env::var_os("BRAINTRACE_REGENERATE").is_some() {
            std::fs::write(path, &want).expect("write compiled.rs");
            return;
        }
        let have = include_str!("compiled.rs");
        assert!(
            have == want,
            "src/graph/plan/compiled.rs is not the bench models' groups: the learning \
             compiler's step programs changed. Rewrite it with `BRAINTRACE_REGENERATE=1 \
             cargo test -p braintrace-core compiled_groups_are_current`, then run the tests \
             again (a group that is not in it runs op by op: right, but slower)."
        );
        for k in groups.keys() {
            assert!(super::lookup(k).is_some(), "{k}");
        }
    }

    /// With the compiled groups, every loss and gradient has the bits it has
    /// with the groups run op by op (the same operations in the same order),
    /// for both bench models and both algorithms, at two sizes (one with a
    /// partial last block).
    #[test]
    fn compiled_groups_give_the_op_by_op_bits() {
        assert!(!super::super::compiled::COMPILED.is_empty());
        for (n_rec, batch) in [(32, 4), (40, 30)] {
            RECORD.with(|r| *r.borrow_mut() = Some(BTreeMap::new()));
            let on = bench_models(n_rec, batch);
            let keys = RECORD.with(|r| r.borrow_mut().take()).expect("recording");
            // Every group of these runs had a compiled function (so the
            // comparison below compares something).
            for k in keys.keys() {
                assert!(super::lookup(k).is_some(), "{n_rec}x{batch}: {k}");
            }
            COMPILED_ON.with(|c| c.set(false));
            let off = bench_models(n_rec, batch);
            COMPILED_ON.with(|c| c.set(true));
            for ((name, a), (_, b)) in on.iter().zip(&off) {
                assert_eq!(a.len(), b.len(), "{name}");
                let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
                assert_eq!(
                    diff,
                    0,
                    "{name} {n_rec}x{batch}: {diff} of {} differ",
                    a.len()
                );
            }
        }
    }
}
