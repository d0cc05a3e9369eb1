//! In-place buffers: a uniquely owned tensor is written where it lies (the
//! data pointer does not move), a shared one is copied first (the other
//! handles keep the old value), and the kernels that write into a
//! preallocated output agree with explicit loops. Shapes, dtypes and
//! symbolic operands are refused with errors naming the op.

mod common;

use braintrace::ops::{BinaryOp, ScalarOp};
use braintrace::prelude::*;
use braintrace::ArrayData;
use common::{assert_allclose, ref_binary, t, v, Lcg};

/// Address of the first element of a concrete tensor's buffer.
fn ptr(x: &Tensor) -> usize {
    match x.data().unwrap() {
        ArrayData::F32(a) => a.as_ptr() as usize,
        ArrayData::F64(a) => a.as_ptr() as usize,
        ArrayData::I64(a) => a.as_ptr() as usize,
        ArrayData::Bool(a) => a.as_ptr() as usize,
    }
}

fn binop(op: BinaryOp) -> fn(f64, f64) -> f64 {
    match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Max => f64::max,
        BinaryOp::Min => f64::min,
        BinaryOp::Pow => f64::powf,
    }
}

const OPS: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
];

#[test]
fn binary_assign_unique_is_in_place_and_matches_loops() {
    let mut rng = Lcg::new(1);
    for op in OPS {
        for xshape in [vec![2, 3, 4], vec![4], vec![3, 1], vec![], vec![1, 3, 4]] {
            let mut out = rng.positive(&[2, 3, 4]);
            let x = rng.positive(&xshape);
            let want = ref_binary(&out, &x, &[2, 3, 4], binop(op));
            let before = ptr(&out);
            out.binary_assign(op, &x).unwrap();
            assert_eq!(ptr(&out), before, "{op:?} {xshape:?}: no copy when unique");
            assert_allclose(&format!("{op:?} {xshape:?}"), &v(&out), &want, 1e-15, 0.0);
        }
    }
    // f32 too.
    let mut out = t(vec![1.0, 2.0, 3.0], &[3]).cast(DType::F32).unwrap();
    let before = ptr(&out);
    out.mul_in_place(&Tensor::scalar_of(2.0, DType::F32))
        .unwrap();
    assert_eq!(ptr(&out), before);
    assert_eq!(v(&out), vec![2.0, 4.0, 6.0]);
}

#[test]
fn in_place_on_a_shared_tensor_copies_on_write() {
    let mut out = t(vec![1.0, 2.0, 3.0], &[3]);
    let other = out.clone();
    let before = ptr(&out);
    out.add_in_place(&t(vec![10.0], &[1])).unwrap();
    assert_ne!(ptr(&out), before, "a shared buffer is not written");
    assert_eq!(ptr(&other), before);
    assert_eq!(v(&other), vec![1.0, 2.0, 3.0]);
    assert_eq!(v(&out), vec![11.0, 12.0, 13.0]);
    // Now unique again: the next update stays in the new buffer.
    let now = ptr(&out);
    out.mul_scalar_in_place(2.0).unwrap();
    assert_eq!(ptr(&out), now);
    assert_eq!(v(&out), vec![22.0, 24.0, 26.0]);

    // An operand that is the output itself (aliasing through a clone).
    let mut out = t(vec![1.0, 2.0], &[2]);
    let alias = out.clone();
    out.add_in_place(&alias).unwrap();
    assert_eq!(v(&out), vec![2.0, 4.0]);
    assert_eq!(v(&alias), vec![1.0, 2.0]);
}

#[test]
fn binary_into_writes_a_preallocated_output() {
    let mut rng = Lcg::new(2);
    for op in OPS {
        let a = rng.positive(&[3, 4]);
        let b = rng.positive(&[4]);
        let mut out = Tensor::zeros(&[3, 4], DType::F64);
        let before = ptr(&out);
        out.binary_into(op, &a, &b).unwrap();
        assert_eq!(ptr(&out), before);
        assert_allclose(
            &format!("{op:?} into"),
            &v(&out),
            &ref_binary(&a, &b, &[3, 4], binop(op)),
            1e-15,
            0.0,
        );
    }
}

#[test]
fn scalar_assign_matches_the_allocating_op() {
    let mut rng = Lcg::new(3);
    let ops = [
        ScalarOp::Add,
        ScalarOp::Mul,
        ScalarOp::Div,
        ScalarOp::RSub,
        ScalarOp::RDiv,
        ScalarOp::Pow,
        ScalarOp::Max,
        ScalarOp::Min,
    ];
    let refs: [fn(f64, f64) -> f64; 8] = [
        |x, s| x + s,
        |x, s| x * s,
        |x, s| x / s,
        |x, s| s - x,
        |x, s| s / x,
        f64::powf,
        f64::max,
        f64::min,
    ];
    for (op, r) in ops.iter().zip(refs) {
        let x = rng.positive(&[5]);
        let s = 0.7;
        let want: Vec<f64> = v(&x).iter().map(|&x| r(x, s)).collect();
        let mut out = x.clone();
        out.scalar_assign(*op, s).unwrap();
        assert_allclose(&format!("{op:?}"), &v(&out), &want, 1e-15, 0.0);
        // The in-place element function and the allocating kernel agree.
        let alloc = braintrace::ops::elementwise::scalar_op(*op, &x, s).unwrap();
        assert_eq!(v(&out), v(&alloc), "{op:?}");
    }
}

#[test]
fn scaled_add_and_assign_update_a_trace_buffer() {
    let mut rng = Lcg::new(4);
    let mut trace = rng.normal(&[2, 3, 5]);
    let before = ptr(&trace);
    for step in 0..3 {
        let x = rng.normal(&[3, 5]);
        let old = v(&trace);
        let (a, b) = (0.9, 0.5 + step as f64);
        trace.scaled_add_in_place(a, b, &x).unwrap();
        let want = ref_binary(&t(old, &[2, 3, 5]), &x, &[2, 3, 5], |o, x| a * o + b * x);
        assert_allclose("a·trace + b·x", &v(&trace), &want, 1e-15, 0.0);
    }
    // a = 1: the plain accumulate path.
    let x = rng.normal(&[2, 3, 5]);
    let old = v(&trace);
    trace.scaled_add_in_place(1.0, -2.0, &x).unwrap();
    let want: Vec<f64> = old.iter().zip(v(&x)).map(|(o, x)| o - 2.0 * x).collect();
    assert_allclose("trace - 2x", &v(&trace), &want, 1e-15, 0.0);
    // assign broadcasts a row into every slot.
    let row = rng.normal(&[5]);
    trace.assign(&row).unwrap();
    let want: Vec<f64> = (0..6).flat_map(|_| v(&row)).collect();
    assert_eq!(v(&trace), want);
    assert_eq!(ptr(&trace), before, "every update stayed in the buffer");
    // assign works for integer buffers too.
    let mut idx = Tensor::from_vec_typed(vec![0i64; 3], &[3]).unwrap();
    idx.assign(&Tensor::from_vec_typed(vec![4i64, 5, 6], &[3]).unwrap())
        .unwrap();
    assert_eq!(v(&idx), vec![4.0, 5.0, 6.0]);
}

/// `alpha a b + beta c` by explicit loops over row-major data.
fn ref_gemm(
    a: &[f64],
    b: &[f64],
    c: &[f64],
    (m, k, n): (usize, usize, usize),
    al: f64,
    be: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            out[i * n + j] = al * s + be * c[i * n + j];
        }
    }
    out
}

#[test]
fn matmul_into_accumulates_in_place() {
    let mut rng = Lcg::new(5);
    let (m, k, n) = (3, 4, 5);
    let a = rng.normal(&[m, k]);
    let b = rng.normal(&[k, n]);
    let mut out = rng.normal(&[m, n]);
    let c0 = v(&out);
    let before = ptr(&out);
    out.matmul_into(&a, &b, 0.5, 2.0).unwrap();
    assert_eq!(ptr(&out), before);
    assert_allclose(
        "gemm",
        &v(&out),
        &ref_gemm(&v(&a), &v(&b), &c0, (m, k, n), 0.5, 2.0),
        1e-14,
        1e-15,
    );

    // beta = 0 ignores the old contents, NaN included.
    let mut out = Tensor::full(&[m, n], f64::NAN, DType::F64);
    out.matmul_into(&a, &b, 1.0, 0.0).unwrap();
    assert_allclose("beta 0", &v(&out), &v(&a.matmul(&b).unwrap()), 1e-14, 1e-15);

    // Batched (leading dims) and f32, with a transposed (strided) operand.
    let a3 = rng.normal(&[2, m, k]);
    let bt = rng.normal(&[2, n, k]);
    let b3 = bt.transpose(&[0, 2, 1]).unwrap();
    let mut out3 = Tensor::zeros(&[2, m, n], DType::F64);
    out3.matmul_into(&a3, &b3, 1.0, 1.0).unwrap();
    assert_allclose(
        "batched",
        &v(&out3),
        &v(&a3.matmul(&b3).unwrap()),
        1e-14,
        1e-15,
    );
    let (a32, b32) = (a.cast(DType::F32).unwrap(), b.cast(DType::F32).unwrap());
    let mut o32 = Tensor::zeros(&[m, n], DType::F32);
    let p32 = ptr(&o32);
    o32.matmul_into(&a32, &b32, 1.0, 0.0).unwrap();
    assert_eq!(ptr(&o32), p32);
    assert_allclose("f32", &v(&o32), &v(&a.matmul(&b).unwrap()), 1e-5, 1e-6);
}

#[test]
fn into_array_and_array_mut_are_zero_copy_when_unique() {
    let x = t(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let before = ptr(&x);
    let arr = x.into_array::<f64>().unwrap();
    assert_eq!(arr.as_ptr() as usize, before);
    // And back: a tensor over the array keeps the buffer.
    let mut y = Tensor::from_array(arr);
    assert_eq!(ptr(&y), before);
    y.array_mut::<f64>().unwrap()[[1, 1]] = -1.0;
    assert_eq!(ptr(&y), before);
    assert_eq!(v(&y), vec![1.0, 2.0, 3.0, -1.0]);
    // Shared: into_array copies and leaves the other handle intact.
    let keep = y.clone();
    let arr = y.into_array::<f64>().unwrap();
    assert_ne!(arr.as_ptr() as usize, ptr(&keep));
}

#[test]
fn in_place_errors_name_the_op_and_shapes() {
    let mut out = Tensor::zeros(&[2, 3], DType::F64);
    let e = out
        .add_in_place(&Tensor::zeros(&[4], DType::F64))
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Shape { .. }), "{msg}");
    assert!(
        msg.contains("binary_assign") && msg.contains("[4]") && msg.contains("[2, 3]"),
        "{msg}"
    );
    // The output is never resized, even when the broadcast would grow it.
    let e = out
        .add_in_place(&Tensor::zeros(&[5, 2, 3], DType::F64))
        .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = out
        .add_in_place(&Tensor::zeros(&[2, 3], DType::F32))
        .unwrap_err();
    assert!(
        matches!(e, Error::DType { .. }) && e.to_string().contains("f32"),
        "{e}"
    );
    let mut ints = Tensor::from_vec_typed(vec![1i64], &[1]).unwrap();
    let e = ints.mul_scalar_in_place(2.0).unwrap_err();
    assert!(matches!(e, Error::DType { .. }), "{e}");
    let e = out.assign(&Tensor::zeros(&[2, 3], DType::F32)).unwrap_err();
    assert!(e.to_string().contains("assign"), "{e}");

    let a = Tensor::zeros(&[2, 4], DType::F64);
    let b = Tensor::zeros(&[3, 3], DType::F64);
    let e = out.matmul_into(&a, &b, 1.0, 0.0).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("matmul_into") && msg.contains("contracting"),
        "{msg}"
    );
    let b = Tensor::zeros(&[4, 5], DType::F64);
    let e = out.matmul_into(&a, &b, 1.0, 0.0).unwrap_err();
    assert!(e.to_string().contains("the output must be [2, 5]"), "{e}");
    let e = out
        .matmul_into(&Tensor::zeros(&[2], DType::F64), &b, 1.0, 0.0)
        .unwrap_err();
    assert!(e.to_string().contains("rank"), "{e}");

    // Symbolic tensors have no buffer to write.
    let r = make_graph(
        |x: &[Tensor]| {
            let mut y = x[0].clone();
            let e = y.add_in_place(&x[0]).unwrap_err();
            assert!(matches!(e, Error::Symbolic { .. }), "{e}");
            let mut z = x[0].clone();
            assert!(z.data_mut().is_err() && z.try_data_mut().is_none());
            assert!(z.clone().into_data().is_err());
            let mut c = Tensor::zeros(&[2], DType::F64);
            let e = c.add_in_place(&x[0]).unwrap_err();
            assert!(e.to_string().contains("binary_assign"), "{e}");
            Ok(vec![y])
        },
        &[Aval::new(&[2], DType::F64)],
    );
    assert!(r.is_ok());
}
