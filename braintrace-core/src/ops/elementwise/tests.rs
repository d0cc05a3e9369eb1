//! Element-wise ops against explicit loops and their formulas.

use super::binary::{binary_loop, mul_add_loop, scale_add_loop};
use super::scalar::scalar_loop;
use super::unary::{unary_loop, unary_loop_f32};
use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Values across signs and magnitudes, with the edge cases the element
/// functions branch on (zero, ±1, the fast `exp`'s clamps, infinities).
fn data<T: Float>(seed: u64, n: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    let edges = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.39,
        0.41,
        88.5,
        -88.5,
        1e-30,
        f64::INFINITY,
    ];
    (0..n)
        .map(|i| match i % 5 {
            0 => edges[(i / 5) % edges.len()],
            1 => rng.random_range(-100.0..100.0),
            _ => rng.random_range(-4.0..4.0),
        })
        .map(|x| T::from(x).expect("finite or infinite floats convert"))
        .collect()
}

fn same_bits<T: Float + std::fmt::Debug>(what: &str, a: &[T], b: &[T]) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let same = (x.is_nan() && y.is_nan()) || x.integer_decode() == y.integer_decode();
        assert!(same, "{what}: element {i}: dispatched {x:?}, plain {y:?}");
    }
}

/// The dispatched block kernels (AVX-512 or AVX2 where the CPU has it) give the
/// same bits as the plain loops, for every op, in f32 and f64, on a
/// length that is not a multiple of the vector width. (On a CPU without
/// AVX2 both sides run the same code.)
fn check<T: Float + std::fmt::Debug>(seed: u64) {
    let n = 261;
    let (a, b) = (data::<T>(seed, n), data::<T>(seed + 1, n));
    let (mut got, mut want) = (vec![T::zero(); n], vec![T::zero(); n]);
    use UnaryOp as U;
    for op in [
        U::Neg,
        U::Exp,
        U::Log,
        U::Tanh,
        U::Sigmoid,
        U::Relu,
        U::Sqrt,
        U::Abs,
        U::Sin,
        U::Cos,
        U::Square,
        U::Reciprocal,
        U::Softplus,
        U::Step,
        U::Sign,
        U::Atan,
    ] {
        unary_block(op, &a, &mut got);
        unary_loop(op, &a, &mut want);
        same_bits(op.name(), &got, &want);
    }
    use BinaryOp as B;
    for op in [B::Add, B::Sub, B::Mul, B::Div, B::Max, B::Min, B::Pow] {
        binary_block(op, &a, &b, &mut got);
        binary_loop(op, &a, &b, &mut want);
        same_bits(op.name(), &got, &want);
    }
    use ScalarOp as S;
    for op in [
        S::Add,
        S::Mul,
        S::Div,
        S::RSub,
        S::RDiv,
        S::Pow,
        S::Max,
        S::Min,
    ] {
        scalar_block(op, -1.7, &a, &mut got);
        scalar_loop(op, -1.7, &a, &mut want);
        same_bits(&format!("{op:?}"), &got, &want);
    }
}

/// `x * 1` and `x / 1` record no equation (and are `x`); other values,
/// and integer operands, still do.
#[test]
fn multiplying_or_dividing_by_one_records_nothing() {
    use crate::graph::trace;
    use crate::tensor::Aval;
    let g = trace(
        |x: &[Tensor]| {
            Ok(vec![
                x[0].mul_scalar(1.0)?.div_scalar(1.0)?,
                x[0].mul_scalar(2.0)?.div_scalar(-1.0)?,
            ])
        },
        &[Aval::new(&[3], DType::F32)],
    )
    .unwrap();
    assert_eq!(g.eqns.len(), 2, "{g}");
    assert_eq!(g.outvars[0], g.invars[0], "{g}");
    let i = Tensor::from_vec_typed(vec![1i64, 2], &[2]).unwrap();
    let x = Tensor::from_vec(vec![1.5, -0.0, f64::INFINITY], &[3]).unwrap();
    let y = x.mul_scalar(1.0).unwrap().div_scalar(1.0).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
    assert!(y.to_vec_f64().unwrap()[1].is_sign_negative());
    // Integers keep the op, and its checks.
    assert_eq!(
        i.mul_scalar(1.0)
            .map(|t| t.dtype())
            .map_err(|e| e.to_string()),
        i.mul_scalar(2.0)
            .map(|t| t.dtype())
            .map_err(|e| e.to_string()),
    );
}

/// The tangent of `a - b` (and of `a / b`) is one `sub`, not an `add`
/// of a `neg`; the values are checked against the formulas.
#[test]
fn sub_and_div_tangents_subtract() {
    use crate::graph::trace;
    use crate::tensor::Aval;
    let f = |x: &[Tensor]| -> Result<Vec<Tensor>> {
        let (_, t) = crate::transform::jvp(
            |p: &[Tensor]| Ok(vec![p[0].sub(&p[1])?, p[0].div(&p[1])?]),
            &x[..2],
            &x[2..],
        )?;
        Ok(t)
    };
    let av = Aval::new(&[3], DType::F64);
    let g = trace(f, &[av.clone(), av.clone(), av.clone(), av]).unwrap();
    let names: Vec<String> = g.eqns.iter().map(|e| e.prim.name()).collect();
    assert!(!names.iter().any(|n| n == "neg"), "{g}");
    let v = |d: [f64; 3]| Tensor::from_vec(d.to_vec(), &[3]).unwrap();
    let (a, b, ta, tb) = (
        [1.0, -2.0, 3.0],
        [0.5, 4.0, -1.5],
        [0.3, 0.1, -2.0],
        [1.0, -0.7, 0.2],
    );
    let t = f(&[v(a), v(b), v(ta), v(tb)]).unwrap();
    let (dsub, ddiv) = (t[0].to_vec_f64().unwrap(), t[1].to_vec_f64().unwrap());
    for k in 0..3 {
        assert_eq!(dsub[k], ta[k] - tb[k]);
        let want = ta[k] / b[k] - tb[k] * (a[k] / b[k]) / b[k];
        assert!((ddiv[k] - want).abs() <= 1e-15 * want.abs().max(1.0), "{k}");
    }
}

/// Every copy the CPU can run: the widest, then (on a CPU with
/// AVX-512) the AVX2 one.
#[test]
fn dispatched_block_kernels_match_the_plain_loops_bit_for_bit() {
    let all = || {
        for seed in [1, 7, 42] {
            check::<f64>(seed);
            check::<f32>(seed);
        }
        // f32's own kernels (the fast exp/sigmoid/tanh), and the
        // folded `a·b + c` and `a·s + c`.
        let (a, b, c) = (
            data::<f32>(3, 261),
            data::<f32>(4, 261),
            data::<f32>(5, 261),
        );
        let (mut got, mut want) = (vec![0.0; 261], vec![0.0; 261]);
        for op in [UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Log] {
            unary_block_f32(op, &a, &mut got);
            unary_loop_f32(op, &a, &mut want);
            same_bits(op.name(), &got, &want);
        }
        mul_add_block(&a, &b, &c, &mut got);
        mul_add_loop(&a, &b, &c, &mut want);
        same_bits("mul_add", &got, &want);
        scale_add_block(-0.3, &a, &c, &mut got);
        scale_add_loop(-0.3, &a, &c, &mut want);
        same_bits("scale_add", &got, &want);
    };
    all();
    crate::kernels::without_avx512(all);
}
