use super::*;
use crate::graph::{trace, LinearArg};
use crate::ops::elementwise::binary;
use crate::ops::{BinaryOp, UnaryOp};
use crate::tensor::Tensor;
use ndarray::ShapeBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::any::Any;

fn rand_tensor(rng: &mut StdRng, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.5..1.5)).collect();
    Tensor::from_vec(v, shape).unwrap().cast(dtype).unwrap()
}

/// Exactly equal values and shapes (NaN equal to NaN).
fn assert_same(a: &[Tensor], b: &[Tensor], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: output count");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.aval(), y.aval(), "{what}: output {i}");
        let (xv, yv) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
        for (p, q) in xv.iter().zip(&yv) {
            assert!(
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                "{what}: output {i}: planned {p} vs interpreted {q}"
            );
        }
    }
}

/// Plan `g` and check it against the interpreter on `args`.
pub(super) fn check(g: Graph, args: &[Tensor], what: &str) -> Plan {
    let g = Arc::new(g);
    let want = g.eval(args).unwrap();
    let plan = Plan::new(g.clone()).expect("a graph without tracers is planned");
    let got = plan.run(args.to_vec()).unwrap();
    assert_same(&got, &want, what);
    // Twice: nothing of the first run leaks into the second.
    let got = plan.run(args.to_vec()).unwrap();
    assert_same(&got, &want, what);
    plan
}

pub(super) fn fused_groups(p: &Plan) -> Vec<usize> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Fused(f) => Some(f.members),
            Step::Eqn { .. } => None,
        })
        .collect()
}

/// One random program over a pool of values: element-wise ops (some
/// with a 0-d operand), matmuls, transposes (non-contiguous values),
/// sums, a captured constant; random outputs, inputs among them.
fn random_program(seed: u64, dtype: DType) -> (Graph, Vec<Tensor>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [3usize, 5];
    let n_in = rng.random_range(1..4);
    let mut avals: Vec<Aval> = (0..n_in).map(|_| Aval::new(&shape, dtype)).collect();
    avals.push(Aval::new(&[], dtype));
    avals.push(Aval::new(&[5, 5], dtype));
    avals.push(Aval::new(&[5], dtype));
    let args: Vec<Tensor> = avals
        .iter()
        .map(|a| rand_tensor(&mut rng, a.shape(), dtype))
        .collect();
    let konst = rand_tensor(&mut rng, &shape, dtype);
    let n_ops = rng.random_range(1..30);
    let choices: Vec<(usize, usize, usize, f64)> = (0..n_ops)
        .map(|_| {
            (
                rng.random_range(0..19),
                rng.random_range(0..1000),
                rng.random_range(0..1000),
                rng.random_range(-2.0..2.0),
            )
        })
        .collect();
    let n_out = rng.random_range(1..5);
    let outs: Vec<usize> = (0..n_out).map(|_| rng.random_range(0..1000)).collect();
    let g = trace(
        |a: &[Tensor]| {
            let mut pool: Vec<Tensor> = a[..n_in].to_vec();
            let (s, w, row) = (&a[n_in], &a[n_in + 1], &a[n_in + 2]);
            for &(op, i, j, c) in &choices {
                let x = pool[i % pool.len()].clone();
                let y = pool[j % pool.len()].clone();
                let z = match op {
                    0 => x.add(&y)?,
                    1 => x.mul(&y)?,
                    2 => x.sub(&y)?,
                    3 => x.div(&y.square()?.add_scalar(1.0)?)?,
                    4 => x.tanh()?,
                    5 => x.sigmoid()?.mul_scalar(c)?,
                    6 => x.exp()?.rsub_scalar(c)?,
                    7 => binary(BinaryOp::Mul, &x, s)?,
                    8 => binary(BinaryOp::Sub, s, &x)?,
                    9 => x.matmul(w)?,
                    // A transposed (non-contiguous) value, back to shape.
                    10 => x.matmul(w)?.t()?.t()?.add(&y)?,
                    11 => x
                        .sum(&[1])?
                        .reshape(&[3, 1])?
                        .broadcast_to(&shape)?
                        .mul(&y)?,
                    12 => x.mul(&konst)?,
                    // Reshapes: the inner ones get a moved, unique operand.
                    14 => x
                        .add_scalar(c)?
                        .reshape(&[5, 3])?
                        .reshape(&[15])?
                        .reshape(&[3, 5])?,
                    // A product of a transposed value (and its reshape).
                    15 => y.matmul(&x.t()?.matmul(&y)?)?.reshape(&[3, 5])?,
                    13 => crate::ops::elementwise::unary(UnaryOp::Sin, &x)?.mul(&x)?,
                    // Rows broadcast along the leading axis.
                    16 => x.add(row)?,
                    17 => binary(BinaryOp::Sub, row, &x)?.mul(&y)?,
                    18 => x.mul(&y.sum(&[0])?)?.add_scalar(c)?,
                    _ => unreachable!("ops are drawn from 0..19"),
                };
                pool.push(z);
            }
            Ok(outs.iter().map(|&k| pool[k % pool.len()].clone()).collect())
        },
        &avals,
    )
    .unwrap();
    (g, args)
}

#[test]
fn plan_matches_interpreter_on_random_graphs() {
    let (mut fused, mut with_rows) = (0, 0);
    for seed in 0..300 {
        for dtype in [DType::F64, DType::F32] {
            let (g, args) = random_program(seed, dtype);
            let p = check(g, &args, &format!("seed {seed} {dtype}"));
            fused += fused_groups(&p).iter().filter(|&&n| n > 1).count();
            with_rows += p
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Fused(f) if !f.rows.is_empty()))
                .count();
        }
    }
    assert!(
        fused > 100,
        "only {fused} groups of several equations fused"
    );
    assert!(
        with_rows > 100,
        "only {with_rows} groups with a row operand"
    );
}

/// A copy of `t`'s values that nobody else holds, row- or column-major.
fn fresh_copy(t: &Tensor, column_major: bool) -> Tensor {
    fn lay<T: Copy + num_traits::Zero>(a: &ArrayD<T>, f: bool) -> ArrayD<T> {
        let mut b = ArrayD::zeros(IxDyn(a.shape()).set_f(f));
        b.assign(a);
        b
    }
    match t.data().unwrap() {
        ArrayData::F32(a) => Tensor::from_array(lay(a, column_major)),
        ArrayData::F64(a) => Tensor::from_array(lay(a, column_major)),
        d => Tensor::from_data(d.clone()),
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_vec_f64()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// One plan called repeatedly: new arguments each call (fresh random
/// values, copies nobody else holds, column-major copies, and outputs
/// of the previous call fed back as arguments, as a recurrent state
/// is); outputs held by the caller across calls must keep their values
/// (a recycled buffer is never one the caller still holds), and every
/// call matches the interpreter bit for bit.
#[test]
fn plan_repeated_calls_recycle_buffers_without_aliasing() {
    for seed in 0..200 {
        for dtype in [DType::F64, DType::F32] {
            let what = |call: usize| format!("seed {seed} {dtype} call {call}");
            let (g, mut args) = random_program(seed, dtype);
            let g = Arc::new(g);
            let plan = Plan::new(g.clone()).unwrap();
            let mut rng = StdRng::seed_from_u64(seed + 1000);
            let mut held: Vec<(Tensor, Vec<u64>)> = Vec::new();
            for call in 0..6 {
                let want = g.eval(&args).unwrap();
                let given: Vec<Tensor> = match call % 3 {
                    0 => args.clone(),
                    1 => args.iter().map(|t| fresh_copy(t, false)).collect(),
                    _ => args.iter().map(|t| fresh_copy(t, t.ndim() == 2)).collect(),
                };
                let got = plan.run(given).unwrap();
                assert_same(&got, &want, &what(call));
                if call == 3 {
                    // Dropped by the caller: recyclable from now on.
                    held.clear();
                }
                held.extend(got.iter().map(|t| (t.clone(), bits(t))));
                for (t, b) in &held {
                    assert_eq!(&bits(t), b, "{}: a held output changed", what(call));
                }
                let in_avals = g.in_avals();
                args = in_avals
                    .iter()
                    .map(|a| {
                        let back = got.iter().find(|t| t.aval() == *a);
                        match back {
                            Some(t) if rng.random_bool(0.6) => t.clone(),
                            _ => rand_tensor(&mut rng, a.shape(), dtype),
                        }
                    })
                    .collect();
            }
        }
    }
}

/// The data pointer of a float tensor.
fn data_ptr(t: &Tensor) -> usize {
    match t.data().unwrap() {
        ArrayData::F32(a) => a.as_ptr() as usize,
        ArrayData::F64(a) => a.as_ptr() as usize,
        _ => panic!("float expected"),
    }
}

#[test]
fn plan_reuses_a_buffer_once_the_caller_drops_it() {
    let a = Aval::new(&[4, 70], DType::F32);
    let g = trace(
        |x: &[Tensor]| Ok(vec![x[0].tanh()?.mul(&x[1])?.matmul(&x[1].t()?)?]),
        &[a.clone(), a],
    )
    .unwrap();
    let g = Arc::new(g);
    let plan = Plan::new(g.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut args = || -> Vec<Tensor> {
        (0..2)
            .map(|_| rand_tensor(&mut rng, &[4, 70], DType::F32))
            .collect()
    };
    let (a1, a2, a3) = (args(), args(), args());
    let y1 = plan.run(a1.clone()).unwrap();
    let p1 = data_ptr(&y1[0]);
    let handle1 = Arc::as_ptr(&y1[0].0) as usize;
    // Held: the next call writes elsewhere, and y1 keeps its values.
    let v1 = bits(&y1[0]);
    let y2 = plan.run(a2.clone()).unwrap();
    assert_ne!(data_ptr(&y2[0]), p1);
    assert_eq!(bits(&y1[0]), v1);
    assert_same(&y2, &g.eval(&a2).unwrap(), "second call");
    // Dropped: its buffer comes back (the matrix product writes into it).
    drop(y1);
    let y3 = plan.run(a3.clone()).unwrap();
    assert_eq!(data_ptr(&y3[0]), p1);
    // Kept whole: the value's handle itself comes back (no allocation,
    // no array rebuilt), as it has the new value's shape and order.
    assert_eq!(Arc::as_ptr(&y3[0].0) as usize, handle1);
    assert_same(&y3, &g.eval(&a3).unwrap(), "third call");
    // Against explicit loops in f64 (f32 rounding allowed).
    let (x0, x1) = (a3[0].to_vec_f64().unwrap(), a3[1].to_vec_f64().unwrap());
    let h: Vec<f64> = x0
        .iter()
        .zip(&x1)
        .map(|(p, q)| (*p as f32).tanh() as f64 * q)
        .collect();
    let got = y3[0].to_vec_f64().unwrap();
    for i in 0..4 {
        for j in 0..4 {
            let want: f64 = (0..70).map(|k| h[i * 70 + k] * x1[j * 70 + k]).sum();
            assert!(
                (got[i * 4 + j] - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{i},{j}"
            );
        }
    }
}

#[test]
fn plan_keeps_a_weights_panels_while_the_same_tensor_comes_back() {
    // `x @ w` and `tanh(..) @ v` read inputs on the right (panels kept);
    // `x @ (2 w)` an intermediate (packed on every call).
    let av = |s: &[usize]| Aval::new(s, DType::F32);
    let g = Arc::new(
        trace(
            |x: &[Tensor]| {
                Ok(vec![
                    x[0].matmul(&x[1])?.tanh()?.matmul(&x[2])?,
                    x[0].matmul(&x[1].mul_scalar(2.0)?)?,
                ])
            },
            &[av(&[16, 30]), av(&[30, 20]), av(&[20, 5])],
        )
        .unwrap(),
    );
    let plan = Plan::new(g.clone()).unwrap();
    let packs = || plan.pool.lock().unwrap().packs;
    let mut rng = StdRng::seed_from_u64(11);
    let mut w = rand_tensor(&mut rng, &[30, 20], DType::F32);
    let v = rand_tensor(&mut rng, &[20, 5], DType::F32);
    let mut run = |w: &Tensor, what: &str| {
        let x = rand_tensor(&mut rng, &[16, 30], DType::F32);
        let args = vec![x, w.clone(), v.clone()];
        let want = g.eval(&args).unwrap();
        assert_same(&plan.run(args).unwrap(), &want, what);
    };
    let per_call = usize::from(sgemm::available());
    for step in 0..3 {
        run(&w, &format!("call {step}"));
    }
    // w and v once, the intermediate every call.
    assert_eq!(packs(), per_call * (2 + 3));
    // A weight changed in place is another tensor (the plan's handle
    // made it copy): packed again, and the results follow it.
    w.add_scalar_in_place(0.5).unwrap();
    run(&w, "after an in-place change");
    assert_eq!(packs(), per_call * (2 + 3 + 2));
    // The same values in a new tensor: packed again too.
    let w2 = Tensor::from_data(w.data().unwrap().clone());
    run(&w2, "a fresh copy");
    assert_eq!(packs(), per_call * (2 + 3 + 2 + 2));
}

/// The kernels of a plan's equation steps, in order.
fn kernels(p: &Plan) -> Vec<Kernel> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Eqn { kernel, .. } => Some(*kernel),
            Step::Fused(_) => None,
        })
        .collect()
}

#[test]
fn plan_multiplies_by_a_weights_transpose_without_running_the_transpose() {
    // `d @ wᵀ` with `w` an input (a readout's backward pass): no
    // transpose step; the product packs `wᵀ` from `w` once while the
    // same tensor comes back, and gives the interpreter's bits.
    for dtype in [DType::F32, DType::F64] {
        let av = |s: &[usize]| Aval::new(s, dtype);
        let g = Arc::new(
            trace(
                |x: &[Tensor]| Ok(vec![x[0].matmul(&x[1].t()?)?.tanh()?]),
                &[av(&[16, 4]), av(&[37, 4])],
            )
            .unwrap(),
        );
        let plan = Plan::new(g.clone()).unwrap();
        assert_eq!(
            kernels(&plan),
            vec![Kernel::Matmul {
                panels: Some(0),
                transposed: true
            }],
            "{dtype}"
        );
        let packs = || plan.pool.lock().unwrap().packs;
        let mut rng = StdRng::seed_from_u64(12);
        let mut w = rand_tensor(&mut rng, &[37, 4], dtype);
        let mut run = |w: &Tensor, what: &str| {
            let d = rand_tensor(&mut rng, &[16, 4], dtype);
            let args = vec![d.clone(), w.clone()];
            let want = g.eval(&args).unwrap();
            let got = plan.run(args).unwrap();
            assert_same(&got, &want, what);
            // And against the definition, `Σ_k d[i][k] w[j][k]`.
            let (dv, wv) = (d.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
            let got = got[0].to_vec_f64().unwrap();
            for i in 0..16 {
                for j in 0..37 {
                    let s: f64 = (0..4).map(|k| dv[i * 4 + k] * wv[j * 4 + k]).sum();
                    assert!((got[i * 37 + j] - s.tanh()).abs() < 1e-5, "{what} {i},{j}");
                }
            }
        };
        let per_call = usize::from(dtype == DType::F32 && sgemm::available());
        for step in 0..3 {
            run(&w, &format!("{dtype} call {step}"));
        }
        assert_eq!(packs(), per_call, "{dtype}: packed once");
        w.add_scalar_in_place(0.5).unwrap();
        run(&w, &format!("{dtype} after an in-place change"));
        assert_eq!(
            packs(),
            2 * per_call,
            "{dtype}: a changed weight is packed again"
        );
    }
    // A transpose read twice, or of an intermediate, stays a step.
    let av = |s: &[usize]| Aval::new(s, DType::F32);
    let mut rng = StdRng::seed_from_u64(13);
    let d = rand_tensor(&mut rng, &[16, 4], DType::F32);
    let w = rand_tensor(&mut rng, &[37, 4], DType::F32);
    let twice = trace(
        |x: &[Tensor]| {
            let wt = x[1].t()?;
            Ok(vec![x[0].matmul(&wt)?, wt])
        },
        &[av(&[16, 4]), av(&[37, 4])],
    )
    .unwrap();
    let p = check(
        twice,
        &[d.clone(), w.clone()],
        "a transpose that is also a result",
    );
    assert!(kernels(&p).contains(&Kernel::Transpose));
    let inner = trace(
        |x: &[Tensor]| Ok(vec![x[0].matmul(&x[1].exp()?.t()?)?]),
        &[av(&[16, 4]), av(&[37, 4])],
    )
    .unwrap();
    let p = check(inner, &[d, w], "a transpose of an intermediate");
    assert!(kernels(&p).contains(&Kernel::Transpose));
}

#[test]
fn plan_reshape_and_transpose_of_a_moved_unique_value_copy_nothing() {
    let g = trace(
        |x: &[Tensor]| Ok(vec![x[0].exp()?.reshape(&[6, 2])?.reshape(&[3, 4])?]),
        &[Aval::new(&[2, 6], DType::F64)],
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    let x = rand_tensor(&mut rng, &[2, 6], DType::F64);
    let p = check(g, std::slice::from_ref(&x), "reshape");
    assert_eq!(kernels(&p), vec![Kernel::Reshape, Kernel::Reshape]);
    let y = p.run(vec![x.clone()]).unwrap();
    let want: Vec<f64> = x.to_vec_f64().unwrap().iter().map(|v| v.exp()).collect();
    assert_eq!(y[0].shape(), &[3, 4]);
    assert_eq!(y[0].to_vec_f64().unwrap(), want);
    // An argument nobody else holds is reshaped where it lies; a held
    // one is copied (and keeps its shape).
    let g = trace(
        |x: &[Tensor]| Ok(vec![x[0].reshape(&[12])?.reshape(&[4, 3])?]),
        &[Aval::new(&[2, 6], DType::F64)],
    )
    .unwrap();
    let p = Plan::new(Arc::new(g)).unwrap();
    let moved = fresh_copy(&x, false);
    let ptr = data_ptr(&moved);
    let y = p.run(vec![moved]).unwrap();
    assert_eq!(data_ptr(&y[0]), ptr);
    assert_eq!(y[0].to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
    let y = p.run(vec![x.clone()]).unwrap();
    assert_ne!(data_ptr(&y[0]), data_ptr(&x));
    assert_eq!((x.shape(), y[0].shape()), (&[2, 6][..], &[4, 3][..]));
    assert_eq!(y[0].to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
    // Likewise a transpose (strides permuted, as `eval` does).
    let g = trace(
        |x: &[Tensor]| Ok(vec![x[0].t()?]),
        &[Aval::new(&[2, 6], DType::F64)],
    )
    .unwrap();
    let p = Plan::new(Arc::new(g)).unwrap();
    let moved = fresh_copy(&x, false);
    let ptr = data_ptr(&moved);
    let y = p.run(vec![moved]).unwrap();
    assert_eq!(data_ptr(&y[0]), ptr);
    let y2 = p.run(vec![x.clone()]).unwrap();
    assert_ne!(data_ptr(&y2[0]), data_ptr(&x));
    let xv = x.to_vec_f64().unwrap();
    let want: Vec<f64> = (0..12).map(|k| xv[(k % 2) * 6 + k / 2]).collect();
    assert_eq!(y[0].to_vec_f64().unwrap(), want);
    assert_eq!(y2[0].to_vec_f64().unwrap(), want);
}

#[test]
fn plan_fuses_a_chain_into_one_loop() {
    // Over two blocks, the last one partial.
    const { assert!(2 * 1300 > 2 * BLOCK && !(2 * 1300usize).is_multiple_of(BLOCK)) };
    let a = Aval::new(&[2, 1300], DType::F64);
    let g = trace(
        |x: &[Tensor]| {
            let h = x[0].mul(&x[1])?.tanh()?.add_scalar(1.0)?;
            Ok(vec![h.sigmoid()?.mul(&x[0])?])
        },
        &[a.clone(), a],
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let args = vec![
        rand_tensor(&mut rng, &[2, 1300], DType::F64),
        rand_tensor(&mut rng, &[2, 1300], DType::F64),
    ];
    let p = check(g, &args, "chain");
    assert_eq!(fused_groups(&p), vec![5]);
    // Core ops run their block kernels directly.
    assert_eq!(
        fused_kinds(&p),
        vec![vec![
            OpKind::Binary(BinaryOp::Mul),
            OpKind::Unary(UnaryOp::Tanh),
            OpKind::Scalar(ScalarOp::Add, 1.0),
            OpKind::Unary(UnaryOp::Sigmoid),
            OpKind::Binary(BinaryOp::Mul),
        ]]
    );
    // Only the result is materialised; the chain runs in block buffers,
    // reused once dead (two are enough for a chain).
    let Step::Fused(f) = &p.steps[0] else {
        panic!("fused step expected")
    };
    assert_eq!(f.outputs.len(), 1);
    assert!(f.nbufs <= 3, "{} block buffers", f.nbufs);
}

/// The kinds of a plan's fused ops, group by group.
fn fused_kinds(p: &Plan) -> Vec<Vec<OpKind>> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Fused(f) => Some(f.ops.iter().map(|o| o.kind).collect()),
            Step::Eqn { .. } => None,
        })
        .collect()
}

#[test]
fn plan_folds_a_product_into_the_add_that_alone_reads_it() {
    // Over two blocks, the last one partial, f32 and f64: the bits of
    // the interpreter (the product is rounded before the sum).
    for dtype in [DType::F32, DType::F64] {
        let a = Aval::new(&[2, 1300], dtype);
        let g = trace(
            |x: &[Tensor]| {
                let e = x[0].exp()?;
                // Folded: `a·x1 + x2`, computed at the add: `a` is read
                // after the product, and buffers are freed and taken
                // before the add, but `a`'s must stay its own until then.
                let a = x[0].tanh()?;
                let t = a.mul(&x[1])?;
                let between = a.neg()?.sigmoid()?.tanh()?;
                let u = x[2].add(&t)?;
                // Folded: `u·0.3 + between` (the scalar product on the
                // right of the add).
                let v = between.add(&u.mul_scalar(0.3)?)?;
                // Not folded: the product is read twice.
                let w = v.mul(&e)?;
                let y = w.add(&x[0])?.add(&w)?;
                // Not folded: the product is also a result.
                let z = y.mul(&x[2])?;
                Ok(vec![z.add(&e)?, z])
            },
            &[a.clone(), a.clone(), a],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let args: Vec<Tensor> = (0..3)
            .map(|_| rand_tensor(&mut rng, &[2, 1300], dtype))
            .collect();
        let p = check(g, &args, "folded pairs");
        assert_eq!(fused_groups(&p), vec![14]);
        let kinds = &fused_kinds(&p)[0];
        assert_eq!(kinds.len(), 12, "{kinds:?}");
        assert_eq!(kinds.iter().filter(|k| **k == OpKind::MulAdd).count(), 1);
        assert!(kinds.contains(&OpKind::ScaleAdd(0.3)), "{kinds:?}");
    }
}

#[test]
fn plan_materialises_values_read_outside_the_group() {
    let a = Aval::new(&[4, 4], DType::F64);
    let g = trace(
        |x: &[Tensor]| {
            let h = x[0].tanh()?;
            let m = h.matmul(&x[0])?; // reads h: the group closes
            let k = h.mul(&m)?.exp()?;
            Ok(vec![k, h])
        },
        &[a],
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let p = check(g, &[rand_tensor(&mut rng, &[4, 4], DType::F64)], "closed");
    assert_eq!(fused_groups(&p), vec![1, 2]);
}

#[test]
fn plan_repeated_operands_and_inputs_as_outputs() {
    let a = Aval::new(&[3], DType::F64);
    let g = trace(
        |x: &[Tensor]| {
            let y = x[0].mul(&x[0])?.add(&x[0])?;
            Ok(vec![x[0].clone(), y.clone(), y, x[1].clone()])
        },
        &[a.clone(), a],
    )
    .unwrap();
    let args = vec![
        Tensor::from_vec(vec![1.0, -2.0, 3.0], &[3]).unwrap(),
        Tensor::from_vec(vec![4.0, 5.0, 6.0], &[3]).unwrap(),
    ];
    let p = check(g, &args, "repeated");
    let out = p.run(args.clone()).unwrap();
    assert_eq!(out[1].to_vec_f64().unwrap(), vec![2.0, 2.0, 12.0]);
    assert!(out[0].ptr_eq(&args[0]) && out[3].ptr_eq(&args[1]));
}

#[test]
fn plan_writes_results_on_cache_line_boundaries() {
    // Every buffer the plan writes a result into starts on a 64-byte
    // boundary, fresh or recycled: a concatenation, products (the
    // f32 kernel and matrixmultiply in f64), a fused loop's two
    // results (row- and column-major). malloc aligns to 16 bytes, so
    // without the slack most of these start elsewhere.
    for dtype in [DType::F32, DType::F64] {
        let (x, w) = (Aval::new(&[6, 40], dtype), Aval::new(&[80, 48], dtype));
        let g = trace(
            |a: &[Tensor]| {
                let xx = crate::ops::shape::concat(&[a[0].clone(), a[0].clone()], 1)?;
                let y = xx.matmul(&a[1])?;
                let h = y.tanh()?.mul(&y)?;
                let c = crate::ops::shape::concat(&[a[0].t()?, a[0].t()?], 0)?;
                Ok(vec![h.add_scalar(1.0)?, h, c.mul_scalar(2.0)?, xx])
            },
            &[x.clone(), w.clone()],
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let args = vec![
            rand_tensor(&mut rng, &[6, 40], dtype),
            rand_tensor(&mut rng, &[80, 48], dtype),
        ];
        let g = Arc::new(g);
        let plan = Plan::new(g.clone()).unwrap();
        for call in 0..3 {
            let outs = plan.run(args.clone()).unwrap();
            assert_same(&outs, &g.eval(&args).unwrap(), "aligned");
            for (k, t) in outs.iter().enumerate() {
                assert_eq!(data_ptr(t) % 64, 0, "{dtype:?} call {call} output {k}");
            }
        }
    }
    // Block buffers: the block starts on a boundary and fits.
    for n in [BLOCK + ALIGN_SLACK, BLOCK + 3] {
        for _ in 0..8 {
            let v = vec![0f32; n];
            let at = aligned(&v);
            assert!(at + BLOCK <= v.len());
            if n == BLOCK + ALIGN_SLACK {
                assert_eq!(v[at..].as_ptr() as usize % 64, 0);
            }
            let w = vec![0f64; n];
            assert!(aligned(&w) + BLOCK <= w.len());
        }
    }
}

#[test]
fn plan_sums_to_one_value_in_evals_order() {
    // Values of very different sizes: another order of the additions
    // gives other bits. Shapes around the short runs (2, 3..=7) and the
    // eight partial sums, with unit axes, one element, none; operands
    // row-major and column-major (a transpose's result).
    let mut rng = StdRng::seed_from_u64(17);
    let shapes: [&[usize]; 10] = [
        &[1],
        &[2],
        &[5],
        &[7],
        &[8],
        &[37, 3],
        &[4, 1, 5],
        &[1, 1],
        &[0, 3],
        &[9, 13],
    ];
    for dtype in [DType::F64, DType::F32] {
        for shape in shapes {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|i| rng.random_range(-1.0..1.0) * 10f64.powi((i % 9) as i32 - 4))
                .collect();
            let x = Tensor::from_vec(v, shape).unwrap().cast(dtype).unwrap();
            let aval = x.aval();
            let g = trace(
                |a: &[Tensor]| {
                    let t = a[0].transpose(&(0..a[0].ndim()).rev().collect::<Vec<_>>())?;
                    // Every axis; and every axis but the unit ones of a
                    // column-major operand.
                    let keep: Vec<usize> = (0..t.ndim()).filter(|&k| t.shape()[k] != 1).collect();
                    Ok(vec![a[0].sum_all()?, t.exp()?.sum(&keep)?.mul_scalar(2.0)?])
                },
                std::slice::from_ref(&aval),
            )
            .unwrap();
            let what = format!("{dtype} {shape:?}");
            let p = check(g, std::slice::from_ref(&x), &what);
            // (A sum over no axes is no equation.)
            let want = 1 + usize::from(shape.iter().any(|&d| d != 1));
            let sums = kernels(&p).iter().filter(|k| **k == Kernel::SumAll).count();
            assert_eq!(sums, want, "{what}: the sums planned");
        }
    }
    // A single -0.0 stays -0.0 (as `eval` copies it), not 0 + -0.
    let x = Tensor::from_vec(vec![-0.0], &[1]).unwrap();
    let g = trace(|a: &[Tensor]| Ok(vec![a[0].sum_all()?]), &[x.aval()]).unwrap();
    let p = check(g, std::slice::from_ref(&x), "-0");
    assert!(p.run(vec![x]).unwrap()[0].to_vec_f64().unwrap()[0].is_sign_negative());
}

#[test]
fn plan_concatenates_into_recycled_buffers() {
    // Joins along the last, a middle and the first axis, a stack of one
    // element per row, and a transposed (column-major) operand; every
    // join is read by an add, so its buffer goes back to the pool and
    // the next call writes over the last call's values.
    for dtype in [DType::F64, DType::F32] {
        let (a, b) = (Aval::new(&[2, 3, 4], dtype), Aval::new(&[2, 3, 1], dtype));
        let m = Aval::new(&[4, 3], dtype);
        let g = trace(
            |x: &[Tensor]| {
                let last =
                    crate::ops::shape::concat(&[x[0].clone(), x[1].clone(), x[0].clone()], 2)?;
                let mid = crate::ops::shape::concat(&[x[0].clone(), x[0].clone()], 1)?;
                let first = crate::ops::shape::concat(&[x[0].clone(), x[0].clone()], 0)?;
                let stack = crate::ops::shape::concat(&[x[1].clone(), x[1].clone()], 2)?;
                let t = crate::ops::shape::concat(&[x[2].t()?, x[2].t()?], 0)?;
                Ok(vec![
                    last.add_scalar(1.0)?,
                    mid.add_scalar(1.0)?,
                    first.add_scalar(1.0)?,
                    stack.add_scalar(1.0)?,
                    t.add_scalar(1.0)?,
                ])
            },
            &[a.clone(), b.clone(), m.clone()],
        )
        .unwrap();
        let arg = |shape: &[usize], k: f64| {
            let n: usize = shape.iter().product();
            Tensor::from_vec((0..n).map(|i| k * i as f64).collect(), shape)
                .unwrap()
                .cast(dtype)
                .unwrap()
        };
        let g = Arc::new(g);
        let plan = Plan::new(g.clone()).unwrap();
        let planned = plan
            .steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Step::Eqn {
                        kernel: Kernel::Concat { .. },
                        ..
                    }
                )
            })
            .count();
        assert_eq!(planned, 5, "every join runs in the plan");
        for k in [1.0, -3.0, 0.5] {
            let args = vec![
                arg(&[2, 3, 4], k),
                arg(&[2, 3, 1], 100.0 * k),
                arg(&[4, 3], k),
            ];
            let got = plan.run(args.clone()).unwrap();
            assert_same(&got, &g.eval(&args).unwrap(), "concat");
            // By hand: row (i, j) of the last-axis join is x0[i, j, :],
            // x1[i, j, 0], x0[i, j, :], plus one.
            let v = got[0].to_vec_f64().unwrap();
            let (i, j) = (1, 2);
            let row = &v[(i * 3 + j) * 9..(i * 3 + j + 1) * 9];
            let x0 = |c: usize| k * ((i * 3 + j) * 4 + c) as f64 + 1.0;
            let want = [
                x0(0),
                x0(1),
                x0(2),
                x0(3),
                100.0 * k * (i * 3 + j) as f64 + 1.0,
            ];
            assert_eq!(&row[..5], &want);
            // The transposed operand: element (1, 1) of x2ᵀ is x2[1, 1],
            // the fourth element of x2 (row-major, 3 columns).
            let t = got[4].to_vec_f64().unwrap();
            assert_eq!(t[4 + 1], k * 4.0 + 1.0);
        }
    }
}

#[test]
fn plan_scalar_operands_broadcast() {
    let g = trace(
        |x: &[Tensor]| {
            let y = binary(BinaryOp::Mul, &x[0], &x[1])?;
            Ok(vec![binary(BinaryOp::Sub, &x[1], &y)?.exp()?])
        },
        &[Aval::new(&[2600], DType::F64), Aval::new(&[], DType::F64)],
    )
    .unwrap();
    const { assert!(2600 > 2 * BLOCK) };
    let mut rng = StdRng::seed_from_u64(3);
    let x = rand_tensor(&mut rng, &[2600], DType::F64);
    let p = check(g, &[x.clone(), Tensor::scalar(0.5)], "scalar");
    assert_eq!(fused_groups(&p), vec![3]);
    // Against an explicit loop.
    let got = p.run(vec![x.clone(), Tensor::scalar(0.5)]).unwrap();
    let want: Vec<f64> = x
        .to_vec_f64()
        .unwrap()
        .iter()
        .map(|v| (0.5 - v * 0.5).exp())
        .collect();
    assert_eq!(got[0].to_vec_f64().unwrap(), want);
}

/// The stride-slice `order_of` agrees with ndarray's own layout checks
/// (row-major: `is_standard_layout`; column-major: the reversed view's),
/// and `elements` returns every element in the asked order, on row- and
/// column-major, sliced (keeping their strides, length-1 axes
/// included), permuted and empty arrays.
#[test]
fn order_of_agrees_with_ndarray_and_elements_walk_in_order() {
    use ndarray::{s, ShapeBuilder, SliceInfoElem};
    let base = ArrayD::from_shape_fn(IxDyn(&[3, 4, 5]), |ix| {
        (ix[0] * 100 + ix[1] * 10 + ix[2]) as f64
    });
    let f =
        ArrayD::from_shape_vec(IxDyn(&[3, 4, 5]).f(), base.t().iter().copied().collect()).unwrap();
    let cut = |a: &ArrayD<f64>, info: &[SliceInfoElem]| {
        let mut a = a.clone();
        a.slice_collapse(info);
        a
    };
    let cases = [
        base.clone(),
        f.clone(),
        cut(&base, s![.., 1..3, ..].as_ref()),
        cut(&base, s![.., 1..2, ..].as_ref()),
        cut(&base, s![..;2, .., 3..4].as_ref()),
        cut(&base, s![1..2, .., ..].as_ref()),
        cut(&base, s![1..2, 2..3, 3..4].as_ref()),
        cut(&f, s![.., .., 2..3].as_ref()),
        cut(&f, s![.., 1..3, ..].as_ref()),
        base.clone().permuted_axes(vec![1, 0, 2]),
        base.clone().permuted_axes(vec![2, 1, 0]),
        ArrayD::zeros(IxDyn(&[0, 3])),
        ArrayD::zeros(IxDyn(&[1, 1])),
    ];
    let mut seen = [0; 3];
    for a in &cases {
        let want = if a.is_standard_layout() {
            Some(Order::C)
        } else if a.view().reversed_axes().is_standard_layout() {
            Some(Order::F)
        } else {
            None
        };
        seen[want.map_or(2, |o| o as usize)] += 1;
        let got = order_of(a);
        assert_eq!(got, want, "{:?} strides {:?}", a.shape(), a.strides());
        let row: Vec<f64> = a.iter().copied().collect();
        let col: Vec<f64> = a.t().iter().copied().collect();
        assert_eq!(
            elements(a, Order::C).as_ref(),
            &row[..],
            "{:?}",
            a.strides()
        );
        assert_eq!(
            elements(a, Order::F).as_ref(),
            &col[..],
            "{:?}",
            a.strides()
        );
    }
    // Every kind of answer was checked.
    assert!(seen.iter().all(|&n| n >= 2), "{seen:?}");
}

/// An array of `shape` with values drawn uniformly from `[-1, 1)`.
pub(super) fn random_array(rng: &mut StdRng, shape: &[usize]) -> ArrayD<f64> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

#[test]
fn plan_non_contiguous_and_column_major_operands() {
    use ndarray::s;
    let mut rng = StdRng::seed_from_u64(5);
    let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
    // Column-major 2-D and 3-D, strided (neither order), row-major.
    let f2 = Tensor::from_array(arr(&[40, 30]).reversed_axes());
    let f3 = Tensor::from_array(arr(&[5, 4, 3]).reversed_axes());
    let strided = Tensor::from_array(arr(&[30, 80]).slice_move(s![.., ..;2]).into_dyn());
    let c2 = Tensor::from_array(arr(&[30, 40]));
    let c3 = Tensor::from_array(arr(&[3, 4, 5]));
    let column_major = |t: &Tensor| match t.data().unwrap() {
        ArrayData::F64(a) => !a.is_standard_layout(),
        _ => false,
    };
    assert!(column_major(&f2) && column_major(&f3) && column_major(&strided));
    let args = vec![f2, strided, c2, f3, c3];
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let g = trace(
        |x: &[Tensor]| {
            let a = x[0].mul(&x[1])?.add(&x[2])?.tanh()?; // F, strided, C
            let b = x[0].mul_scalar(0.5)?.add(&x[0])?; // all F: stays F
            let c = x[3].sigmoid()?.mul(&x[4])?; // 3-D F with C
            let d = x[3].exp()?; // 3-D all F
            Ok(vec![a, b.clone(), c, d, b.matmul(&x[2].t()?)?])
        },
        &avals,
    )
    .unwrap();
    check(g, &args, "layouts");
}

#[test]
fn plan_row_operands_broadcast_in_either_order() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
    // Row-major and column-major loops (2-D over 300 elements: blocks
    // that end inside a row), and a 3-D loop with a 2-D trailing row.
    for column_major in [false, true] {
        let lay = |a: ArrayD<f64>| {
            if column_major {
                Tensor::from_array(
                    a.reversed_axes()
                        .as_standard_layout()
                        .reversed_axes()
                        .to_owned(),
                )
            } else {
                Tensor::from_array(a)
            }
        };
        // Both loops over more than one block, a block ending mid-row.
        const { assert!(100 * 15 > BLOCK && 17 * 3 * 40 > BLOCK && !BLOCK.is_multiple_of(15)) };
        let (x, y) = (lay(arr(&[100, 15])), lay(arr(&[100, 15])));
        let row = Tensor::from_array(arr(&[15]));
        let (z, row2) = (lay(arr(&[17, 3, 40])), Tensor::from_array(arr(&[3, 40])));
        let args = vec![x.clone(), y.clone(), row.clone(), z.clone(), row2.clone()];
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let g = trace(
            |a: &[Tensor]| {
                let h = a[0].add(&a[2])?.tanh()?.mul(&a[1])?;
                let k = binary(BinaryOp::Sub, &a[4], &a[3])?.exp()?;
                Ok(vec![h, k])
            },
            &avals,
        )
        .unwrap();
        let p = check(g, &args, "rows");
        assert_eq!(fused_groups(&p), vec![3, 2]);
        let got = p.run(args).unwrap();
        for t in &got {
            let ArrayData::F64(a) = t.data().unwrap() else {
                panic!("f64 expected")
            };
            assert_eq!(!a.is_standard_layout(), column_major, "the loop's order");
        }
        let (xa, ya, ra) = (
            x.to_array_f64().unwrap(),
            y.to_array_f64().unwrap(),
            row.to_array_f64().unwrap(),
        );
        let (za, r2) = (z.to_array_f64().unwrap(), row2.to_array_f64().unwrap());
        let h = got[0].to_array_f64().unwrap();
        for i in 0..100 {
            for j in 0..15 {
                let want = (xa[[i, j]] + ra[[j]]).tanh() * ya[[i, j]];
                assert_eq!(h[[i, j]], want, "{column_major} h[{i},{j}]");
            }
        }
        let k = got[1].to_array_f64().unwrap();
        for i in 0..17 {
            for j in 0..3 {
                for l in 0..40 {
                    let want = (r2[[j, l]] - za[[i, j, l]]).exp();
                    assert_eq!(k[[i, j, l]], want, "{column_major} k[{i},{j},{l}]");
                }
            }
        }
    }
}

/// Under `keep_awake` on a pool of several threads a long fused loop
/// runs in parts of whole blocks, one per thread, each with its own
/// block buffers: the same bits as on one thread, for row-major and
/// column-major loops, with row and scalar operands, and lengths that
/// end inside a block.
#[test]
fn plan_splits_long_loops_across_threads_with_the_same_bits() {
    let mut rng = StdRng::seed_from_u64(21);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for (rows, cols) in [(97, 131), (64, 128), (200, 41)] {
        const { assert!(64 * 128 >= PAR_MIN_ELEMS_AWAKE) };
        for column_major in [false, true] {
            for dtype in [DType::F64, DType::F32] {
                let what = format!("{rows}x{cols} {dtype} column-major {column_major}");
                let mut arr = |shape: &[usize]| {
                    let t = Tensor::from_array(random_array(&mut rng, shape))
                        .cast(dtype)
                        .unwrap();
                    if column_major && shape.len() == 2 {
                        fresh_copy(&t, true)
                    } else {
                        t
                    }
                };
                let args = vec![
                    arr(&[rows, cols]),
                    arr(&[rows, cols]),
                    arr(&[cols]),
                    arr(&[]),
                ];
                let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
                let g = trace(
                    |a: &[Tensor]| {
                        let h = a[0].add(&a[2])?.tanh()?.mul(&a[1])?;
                        let k = h.mul(&a[3])?.sub(&a[0])?.exp()?;
                        Ok(vec![h, k])
                    },
                    &avals,
                )
                .unwrap();
                let p = check(g, &args, &what);
                assert_eq!(fused_groups(&p), vec![6], "{what}");
                let before = SPLITS.load(Ordering::Relaxed);
                let split =
                    pool.install(|| crate::threads::keep_awake(|| p.run(args.clone()).unwrap()));
                assert!(SPLITS.load(Ordering::Relaxed) > before, "{what}: not split");
                let one = p.run(args.clone()).unwrap();
                assert_same(&split, &one, &what);
            }
        }
    }
}

/// `fill_row` gives each element of the block its row element by the
/// definition (row-major: `p % n`; column-major: `p / (size / n)`),
/// for rows shorter and longer than the block and blocks starting at
/// every phase.
#[test]
fn fill_row_is_the_broadcast_by_index() {
    for n in [1usize, 3, 4, 7, 16, 40] {
        let row: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
        let size = n * 13;
        for start in [0, 1, 2, n.saturating_sub(1), n, n + 5, 3 * n + 1] {
            for len in [1, 2, n, n + 1, 2 * n + 3, 5 * n, size - start.min(size)] {
                let len = len.min(size - start);
                let mut got = vec![f64::NAN; len];
                fill_row(&mut got, &row, start, size, Order::C);
                let want: Vec<f64> = (start..start + len).map(|p| row[p % n]).collect();
                assert_eq!(got, want, "C: n {n}, start {start}, len {len}");
                let mut got = vec![f64::NAN; len];
                fill_row(&mut got, &row, start, size, Order::F);
                let want: Vec<f64> = (start..start + len).map(|p| row[p / 13]).collect();
                assert_eq!(got, want, "F: n {n}, start {start}, len {len}");
            }
        }
    }
}

#[test]
fn plan_row_operands_of_several_lengths() {
    // Rows longer than a block (filled block by block), and rows of 8
    // and 24 elements (filled once, for blocks of 1008 elements), in
    // row-major loops of several blocks.
    let mut rng = StdRng::seed_from_u64(11);
    let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
    for (l, m, n) in [(3, 1, 1100), (50, 3, 8)] {
        assert!(l * m * n > BLOCK);
        let x = Tensor::from_array(arr(&[l, m, n]));
        let r1 = Tensor::from_array(arr(&[n]));
        let r2 = Tensor::from_array(arr(&[m, n]));
        let args = vec![x.clone(), r1.clone(), r2.clone()];
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let g = trace(
            |a: &[Tensor]| Ok(vec![a[0].add(&a[1])?.mul(&a[2])?.tanh()?]),
            &avals,
        )
        .unwrap();
        let p = check(g, &args, "rows of several lengths");
        let got = p.run(args).unwrap()[0].to_array_f64().unwrap();
        let (xa, ra, rb) = (
            x.to_array_f64().unwrap(),
            r1.to_array_f64().unwrap(),
            r2.to_array_f64().unwrap(),
        );
        for i in 0..l {
            for j in 0..m {
                for k in 0..n {
                    let want = ((xa[[i, j, k]] + ra[[k]]) * rb[[j, k]]).tanh();
                    assert_eq!(got[[i, j, k]], want, "({l}, {m}, {n}) [{i},{j},{k}]");
                }
            }
        }
    }
}

/// A two-output primitive: `(x + 1, 2 x)`.
#[derive(Clone, Debug)]
struct Split;

impl Primitive for Split {
    fn name(&self) -> String {
        "split_test".into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        Ok(vec![inputs[0].clone(), inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![inputs[0].add_scalar(1.0)?, inputs[0].mul_scalar(2.0)?])
    }
    fn jvp(
        &self,
        _p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        unimplemented!("not needed by the test")
    }
    fn transpose(
        &self,
        _cts: &[Option<Tensor>],
        _args: &[LinearArg],
    ) -> Result<Vec<Option<Tensor>>> {
        unimplemented!("not needed by the test")
    }
    fn batch(
        &self,
        _args: &[Tensor],
        _batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        unimplemented!("not needed by the test")
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn plan_multi_output_equations() {
    let g = trace(
        |x: &[Tensor]| {
            let h = x[0].tanh()?;
            let o = crate::graph::bind(Arc::new(Split), std::slice::from_ref(&h))?;
            Ok(vec![o[1].mul(&h)?.add(&o[0])?, o[0].clone()])
        },
        &[Aval::new(&[2, 3], DType::F64)],
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    check(g, &[rand_tensor(&mut rng, &[2, 3], DType::F64)], "split");
}

#[test]
fn plan_rejects_other_avals_and_symbolic_arguments() {
    let g = trace(
        |x: &[Tensor]| Ok(vec![x[0].exp()?]),
        &[Aval::new(&[2], DType::F64)],
    )
    .unwrap();
    let p = Plan::new(Arc::new(g)).unwrap();
    let e = p.run(vec![Tensor::zeros(&[3], DType::F64)]).unwrap_err();
    assert!(e.to_string().contains("traced"), "{e}");
    let e = p.run(vec![Tensor::zeros(&[2], DType::F32)]).unwrap_err();
    assert!(e.to_string().contains("traced"), "{e}");
    let sym = Tensor::symbolic(7, 0, Aval::new(&[2], DType::F64));
    assert!(matches!(
        p.run(vec![sym]).unwrap_err(),
        Error::EscapedTracer { .. }
    ));
}

#[test]
fn plan_is_used_by_jit_and_can_be_turned_off() {
    let f = crate::transform::Jit::new(|a: &[Tensor]| {
        Ok(vec![a[0].sin()?.mul(&a[0])?.add_scalar(0.25)?])
    });
    let x = Tensor::from_vec(vec![0.5, -1.0, 2.0], &[3]).unwrap();
    let planned = f.call(std::slice::from_ref(&x)).unwrap();
    set_planned_execution(false);
    let interpreted = f.call(std::slice::from_ref(&x));
    set_planned_execution(true);
    assert_same(&planned, &interpreted.unwrap(), "jit");
    let want: Vec<f64> = [0.5f64, -1.0, 2.0]
        .iter()
        .map(|v| v.sin() * v + 0.25)
        .collect();
    assert_eq!(planned[0].to_vec_f64().unwrap(), want);
    assert_eq!(f.trace_count(), 1);
}
