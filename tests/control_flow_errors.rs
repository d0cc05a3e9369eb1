//! Bad input to the control-flow functions: an `Error` naming the op, the
//! argument and the shapes (a `while` condition that is not a boolean
//! scalar, branches with different avals, a scan body that changes the
//! carry's shape, `xs` of different leading lengths).

use braintrace::prelude::*;
use braintrace::transform::{cond, scan, while_loop};

fn data(shape: &[usize], seed: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as f64 + 1.0) * 0.731 + seed).sin() * 0.8)
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn boolean(b: bool) -> Tensor {
    Tensor::scalar(if b { 1.0 } else { 0.0 })
        .cast(DType::Bool)
        .unwrap()
}

#[test]
fn while_condition_must_be_a_boolean_scalar() {
    let x = data(&[3], 0.0);
    // a float scalar
    let e = while_loop(
        |c: &[Tensor]| c[0].sum_all(),
        |c: &[Tensor]| Ok(c.to_vec()),
        std::slice::from_ref(&x),
    )
    .unwrap_err();
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "while_loop");
            assert!(shapes.iter().all(|s| s.dims().is_empty()));
            assert!(
                reason.contains("cond_fn") && reason.contains("f64"),
                "{reason}"
            );
        }
        e => panic!("{e:?}"),
    }
    // a boolean vector
    let e = while_loop(
        |c: &[Tensor]| c[0].gt(&Tensor::scalar(0.0)),
        |c: &[Tensor]| Ok(c.to_vec()),
        std::slice::from_ref(&x),
    )
    .unwrap_err();
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "while_loop");
            assert_eq!(shapes[0].dims(), &[3]);
            assert!(reason.contains("boolean scalar"), "{reason}");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn cond_branches_must_return_the_same_avals() {
    let x = data(&[3], 0.0);
    let e = cond(
        &boolean(true),
        |a: &[Tensor]| Ok(vec![a[0].clone()]),
        |a: &[Tensor]| Ok(vec![a[0].sum_all()?]),
        std::slice::from_ref(&x),
    )
    .unwrap_err();
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "cond");
            assert_eq!(shapes[0].dims(), &[] as &[usize]);
            assert_eq!(shapes[1].dims(), &[3]);
            assert!(reason.contains("branch 1"), "{reason}");
        }
        e => panic!("{e:?}"),
    }
    let e = cond(
        &Tensor::scalar(1.0),
        |a: &[Tensor]| Ok(a.to_vec()),
        |a: &[Tensor]| Ok(a.to_vec()),
        &[x],
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op, reason, .. } if op == "cond" && reason.contains("pred")),
        "{e:?}"
    );
}

#[test]
fn scan_body_must_keep_the_carry_shape() {
    let e = scan(
        |c: &[Tensor], x: &[Tensor]| Ok((vec![c[0].expand_dims(0)?.add(&x[0])?], vec![])),
        &[data(&[3], 0.0)],
        &[data(&[4, 3], 0.0)],
        None,
    )
    .unwrap_err();
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "scan");
            assert_eq!(shapes[0].dims(), &[3]);
            assert_eq!(shapes[1].dims(), &[1, 3]);
            assert!(reason.contains("carry 0"), "{reason}");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn scan_xs_must_share_the_leading_length() {
    let body = |c: &[Tensor], x: &[Tensor]| Ok((vec![c[0].add(&x[0])?.add(&x[1])?], vec![]));
    let e = scan(
        body,
        &[data(&[3], 0.0)],
        &[data(&[4, 3], 0.0), data(&[5, 3], 0.0)],
        None,
    )
    .unwrap_err();
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "scan");
            assert_eq!(shapes[0].dims(), &[4, 3]);
            assert_eq!(shapes[1].dims(), &[5, 3]);
            assert!(
                reason.contains("xs[1]") && reason.contains("xs[0]"),
                "{reason}"
            );
        }
        e => panic!("{e:?}"),
    }
    let e = scan(
        body,
        &[data(&[3], 0.0)],
        &[data(&[4, 3], 0.0), data(&[4, 3], 0.0)],
        Some(6),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op, reason, .. } if op == "scan" && reason.contains("length is 6")),
        "{e:?}"
    );
    let e = scan(body, &[data(&[3], 0.0)], &[], None).unwrap_err();
    assert!(
        matches!(&e, Error::Invalid { op, reason } if op == "scan" && reason.contains("length")),
        "{e:?}"
    );
}
