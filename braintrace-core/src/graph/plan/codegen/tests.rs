//! The compiled loops against the block interpreter: the same bits on
//! random groups over every op the generator compiles, on the bench
//! models' real groups, and the cache.

use super::super::{Plan, Step, COMPILED_ON};
use crate::graph::{trace, Graph};
use crate::ops::elementwise::{binary, scalar_op, unary};
use crate::ops::{BinaryOp, ScalarOp, Surrogate, UnaryOp};
use crate::tensor::{Aval, DType, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const UNARY: [UnaryOp; 16] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Sqrt,
    UnaryOp::Abs,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Square,
    UnaryOp::Reciprocal,
    UnaryOp::Softplus,
    UnaryOp::Step,
    UnaryOp::Sign,
    UnaryOp::Atan,
];
const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
];
const SCALAR: [ScalarOp; 8] = [
    ScalarOp::Add,
    ScalarOp::Mul,
    ScalarOp::Div,
    ScalarOp::RSub,
    ScalarOp::RDiv,
    ScalarOp::Pow,
    ScalarOp::Max,
    ScalarOp::Min,
];

/// A value for the inputs: mostly ordinary, some huge, tiny, subnormal,
/// zero of either sign, infinite or NaN.
fn value(rng: &mut StdRng) -> f64 {
    match rng.random_range(0..20) {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => f64::NEG_INFINITY,
        3 => 0.0,
        4 => -0.0,
        5 => rng.random_range(-1e30..1e30),
        6 => rng.random_range(-1e-30..1e-30),
        7 => 1e-40 * rng.random_range(-1.0..1.0),
        8 => rng.random_range(-100.0..100.0),
        _ => rng.random_range(-3.0..3.0),
    }
}

fn tensor(rng: &mut StdRng, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| value(rng)).collect();
    Tensor::from_vec(v, shape).unwrap().cast(dtype).unwrap()
}

/// A scalar constant of an op: ordinary mostly, sometimes zero, huge or
/// beyond `f32` (NaN after the conversion) or NaN.
fn constant(rng: &mut StdRng) -> f64 {
    match rng.random_range(0..12) {
        0 => 0.0,
        1 => -0.0,
        2 => 1e39,
        3 => f64::NAN,
        4 => 0.5,
        _ => rng.random_range(-3.0..3.0),
    }
}

/// A random chain of element-wise ops over `shape` (several inputs of the
/// shape, a scalar and a row broadcast), with several outputs.
fn random_group(seed: u64, shape: &[usize], dtype: DType) -> (Graph, Vec<Tensor>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_in = rng.random_range(1..5);
    let row = [*shape.last().unwrap()];
    let mut avals: Vec<Aval> = (0..n_in).map(|_| Aval::new(shape, dtype)).collect();
    avals.push(Aval::new(&[], dtype));
    avals.push(Aval::new(&row, dtype));
    let args: Vec<Tensor> = avals
        .iter()
        .map(|a| tensor(&mut rng, a.shape(), dtype))
        .collect();
    let n_ops = rng.random_range(2..25);
    let choices: Vec<(usize, usize, usize, usize, f64)> = (0..n_ops)
        .map(|_| {
            (
                rng.random_range(0..8),
                rng.random_range(0..100),
                rng.random_range(0..1000),
                rng.random_range(0..1000),
                constant(&mut rng),
            )
        })
        .collect();
    let n_out = rng.random_range(1..4);
    let outs: Vec<usize> = (0..n_out).map(|_| rng.random_range(0..1000)).collect();
    let g = trace(
        |a: &[Tensor]| {
            let mut pool: Vec<Tensor> = a[..n_in].to_vec();
            let (s, r) = (&a[n_in], &a[n_in + 1]);
            for &(kind, which, i, j, c) in &choices {
                let x = pool[i % pool.len()].clone();
                let y = pool[j % pool.len()].clone();
                let z = match kind {
                    0 | 1 => unary(UNARY[which % UNARY.len()], &x)?,
                    2 => binary(BINARY[which % BINARY.len()], &x, &y)?,
                    3 => scalar_op(SCALAR[which % SCALAR.len()], &x, c)?,
                    // Folded into one op: a product only an add reads,
                    // a scaled value only an add reads.
                    4 => x.mul(&y)?.add(&pool[which % pool.len()])?,
                    5 => x.mul_scalar(c)?.add(&y)?,
                    6 => match which % 3 {
                        0 => Surrogate::Arctan { alpha: c }.grad(&x)?,
                        1 => Surrogate::Sigmoid { alpha: c.abs() + 0.1 }.grad(&x)?,
                        _ => Surrogate::ReluGrad {
                            alpha: c.abs() + 0.1,
                            width: 1.0,
                        }
                        .grad(&x)?,
                    },
                    // Broadcast operands: the scalar, the row.
                    _ if which % 2 == 0 => binary(BINARY[i % BINARY.len()], &x, s)?,
                    _ => binary(BINARY[i % BINARY.len()], r, &x)?,
                };
                pool.push(z);
            }
            Ok(outs.iter().map(|&k| pool[n_in + k % (pool.len() - n_in)].clone()).collect())
        },
        &avals,
    );
    match g {
        Ok(g) => (g, args),
        // A surrogate refused its drawn constant: draw again.
        Err(_) => random_group(seed + 1_000_000, shape, dtype),
    }
}

/// The bits of every output (NaNs as one: their payloads are not kept
/// alike by either path, nor by the interpreter).
fn bits(ts: &[Tensor]) -> Vec<Vec<u64>> {
    ts.iter()
        .map(|t| {
            t.to_vec_f64()
                .unwrap()
                .iter()
                .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
                .collect()
        })
        .collect()
}

/// Run the plan of `g` with compiled loops and with the block interpreter;
/// how many of its groups were compiled.
fn compare(g: Graph, args: &[Tensor], what: &str) -> usize {
    let text = format!("{g}");
    let plan = Plan::new(Arc::new(g)).unwrap();
    let compiled = plan
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Fused(f) if f.compiled.is_some()))
        .count();
    let on = bits(&plan.run(args.to_vec()).unwrap());
    COMPILED_ON.with(|c| c.set(false));
    let off = plan.run(args.to_vec());
    COMPILED_ON.with(|c| c.set(true));
    let off = bits(&off.unwrap());
    for (o, (a, b)) in on.iter().zip(&off).enumerate() {
        let diff: Vec<usize> = (0..a.len()).filter(|&p| a[p] != b[p]).collect();
        assert!(
            diff.is_empty(),
            "{what}: output {o}: {} of {} elements differ, first at {} ({:e} vs {:e}) {text}",
            diff.len(),
            a.len(),
            diff[0],
            f64::from_bits(a[diff[0]]),
            f64::from_bits(b[diff[0]]),
        );
    }
    compiled
}

#[test]
fn random_groups_give_the_block_interpreters_bits() {
    if !super::enabled() {
        eprintln!("code generation is off on this target: nothing to compare");
        return;
    }
    let mut compiled = 0;
    for seed in 0..150u64 {
        for dtype in [DType::F32, DType::F64] {
            // Lengths 0..100 (every tail of the vector loops), and more than
            // a block with a partial last one.
            let n = (seed as usize * 7) % 100;
            let shape: Vec<usize> = match seed % 5 {
                0 => vec![3, 1100],
                1 => vec![n],
                _ => vec![1 + n % 7, n / 7 + 1],
            };
            let (g, args) = random_group(seed, &shape, dtype);
            compiled += compare(g, &args, &format!("seed {seed} {dtype} {shape:?}"));
        }
    }
    assert!(compiled > 200, "only {compiled} groups compiled");
}
