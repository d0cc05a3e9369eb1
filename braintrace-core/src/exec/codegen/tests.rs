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

const UNARY: [UnaryOp; 17] = [
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
    UnaryOp::Erf,
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
                        1 => Surrogate::Sigmoid {
                            alpha: c.abs() + 0.1,
                        }
                        .grad(&x)?,
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
            Ok(outs
                .iter()
                .map(|&k| pool[n_in + k % (pool.len() - n_in)].clone())
                .collect())
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

/// A second plan of the same group finds its loop in the cache; a group
/// that differs only in its constants shares it.
#[test]
fn a_second_plan_of_a_group_does_not_compile_again() {
    if !super::enabled() {
        return;
    }
    let group = |c: f64| {
        let a = [
            Aval::new(&[4, 33], DType::F32),
            Aval::new(&[4, 33], DType::F32),
        ];
        let g = trace(
            |x: &[Tensor]| {
                // A chain no other test plans (its first compile is here).
                let y = unary(UnaryOp::Cos, &x[0])?.mul(&x[1])?;
                let y = unary(UnaryOp::Atan, &scalar_op(ScalarOp::Min, &y, c)?)?;
                Ok(vec![unary(
                    UnaryOp::Sqrt,
                    &binary(BinaryOp::Max, &y, &x[0])?,
                )?])
            },
            &a,
        )
        .unwrap();
        Plan::new(Arc::new(g)).unwrap()
    };
    let before = super::COMPILED_HERE.with(|n| n.get());
    let first = group(0.5);
    let mid = super::COMPILED_HERE.with(|n| n.get());
    let second = group(0.5);
    let third = group(-2.0);
    let after = super::COMPILED_HERE.with(|n| n.get());
    assert_eq!(mid - before, 1, "the first plan compiles its group");
    assert_eq!(after, mid, "later plans find it in the cache");
    let addr = |p: &Plan| {
        p.steps
            .iter()
            .find_map(|s| match s {
                Step::Fused(f) => f.compiled.map(|k| k.addr),
                Step::Eqn { .. } => None,
            })
            .expect("a compiled group")
    };
    assert_eq!(addr(&first), addr(&second));
    assert_eq!(addr(&first), addr(&third));
    // The shared loop reads each plan's own constant.
    let mut rng = StdRng::seed_from_u64(3);
    let args = vec![
        tensor(&mut rng, &[4, 33], DType::F32),
        tensor(&mut rng, &[4, 33], DType::F32),
    ];
    for p in [&first, &third] {
        let got = bits(&p.run(args.clone()).unwrap());
        let want = bits(&p.graph.eval(&args).unwrap());
        assert_eq!(got, want);
    }
}

mod bench_models {
    //! The bench models' step programs: every group of them is compiled,
    //! and the learners' losses and gradients have the bits they have with
    //! the block interpreter.
    use super::super::super::COMPILED_ON;
    use super::super::RECORD;
    use crate::learn::{compile, Algorithm, DRtrl, Model, ModelState, PpProp, Reduction};
    use crate::nn::{Chain, GruCell, LeakyRateReadout, LifCell, Linear};
    use crate::ops::Surrogate;
    use crate::{DType, Result, Tensor};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

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

    /// Every loss and gradient element of one `etrace_grad` call of 4
    /// steps (f32), as bits.
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

    /// `bench_learn`'s `gru` and `lif` nets (the latter also with the
    /// other two surrogate gradients), D-RTRL and pp_prop: (name, bits).
    fn bench_models(n_rec: usize, batch: usize) -> Vec<(String, Vec<u64>)> {
        let algos = || -> [(&str, Algorithm); 2] {
            [
                ("d_rtrl", DRtrl::default().into()),
                ("pp_prop", PpProp::new(0.95).expect("decay").into()),
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

    #[test]
    fn bench_models_groups_are_compiled_and_give_the_block_interpreters_bits() {
        if !super::super::enabled() {
            return;
        }
        // One size with a partial last block.
        for (n_rec, batch) in [(32, 4), (40, 30)] {
            RECORD.with(|r| *r.borrow_mut() = Some(Vec::new()));
            let on = bench_models(n_rec, batch);
            let groups = RECORD.with(|r| r.borrow_mut().take()).expect("recording");
            assert!(groups.len() >= 8, "{} groups", groups.len());
            for (k, compiled) in &groups {
                assert!(compiled, "{n_rec}x{batch}: not compiled: {k}");
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
