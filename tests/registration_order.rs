//! Registration order: the compile-time primitives (built-ins and
//! `#[etp_primitive]`s) hold their names before any runtime registration
//! can claim them. This file is its own test binary with a single test, so
//! the runtime registrations below are the process's very first touch of
//! the registries (the other order, compile-time first, is tested in
//! `etp_framework.rs`).

use braintrace::etp::{
    primitive_by_name, register_primitive, register_primitive_spec, registration_errors,
    EtpPrimitiveSpec, InitDrtrl, InitPp, Params, PrimitiveOptions, XyToDw, YwToW,
};
use braintrace::prelude::*;
use braintrace::prims;
use std::sync::Arc;

/// y = x @ w, defined with the macro in this test binary.
#[etp_primitive(name = "etp_order_macro")]
fn order_macro(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(w)
}

#[yw_to_w(order_macro)]
fn order_yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(0)?)
}

#[xy_to_dw(order_macro)]
fn order_xy(x: &Tensor, hidden: &Tensor, _w: &Tensor) -> Result<Tensor> {
    x.expand_dims(1)?.matmul(&hidden.expand_dims(0)?)
}

#[init_drtrl(order_macro)]
fn order_drtrl(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
}

#[init_pp(order_macro)]
fn order_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

fn impostor(a: &[Tensor], _p: &Params) -> Result<Tensor> {
    a[0].add(&a[1])
}

fn impostor_spec(name: &str) -> Arc<EtpPrimitiveSpec> {
    Arc::new(EtpPrimitiveSpec::new(
        name,
        impostor,
        YwToW::single(|_h, t, _p| Ok(t.clone())),
        XyToDw::single(|_x, h, _w, _p| Ok(h.clone())),
        InitDrtrl::single(|_x, y, _w, n, _p| {
            Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
        }),
        InitPp::single(|_x, y, _w, n, _p| {
            Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
        }),
    ))
}

/// Assert `e` refuses `name`, naming the compile-time definition first and
/// the runtime call (entry point and this file) second.
fn assert_refused(e: Error, name: &str, entry: &str) {
    let msg = e.to_string();
    match e {
        Error::DuplicatePrimitive {
            name: n,
            first,
            second,
        } => {
            assert_eq!(n, name, "{msg}");
            assert!(
                first.contains("#[etp_primitive]") && first.contains(".rs:"),
                "{msg}"
            );
            assert!(
                second.contains(entry) && second.contains("registration_order.rs"),
                "{msg}"
            );
        }
        other => panic!("expected DuplicatePrimitive for `{name}`, got {other:?}"),
    }
}

#[test]
fn a_runtime_registration_made_first_cannot_claim_a_compile_time_name() {
    // Nothing has touched the registries yet. A built-in's name ...
    let e = register_primitive("etp_mm", impostor, PrimitiveOptions::new()).unwrap_err();
    assert_refused(e, "etp_mm", "register_primitive(\"etp_mm\"");
    let e = register_primitive_spec(impostor_spec("etp_conv")).unwrap_err();
    assert_refused(e, "etp_conv", "register_primitive_spec(\"etp_conv\"");
    // ... and a macro primitive's name are both refused, by either entry point.
    let e = register_primitive("etp_order_macro", impostor, PrimitiveOptions::new()).unwrap_err();
    assert_refused(
        e,
        "etp_order_macro",
        "register_primitive(\"etp_order_macro\"",
    );
    let e = register_primitive_spec(impostor_spec("etp_order_macro")).unwrap_err();
    assert_refused(
        e,
        "etp_order_macro",
        "register_primitive_spec(\"etp_order_macro\"",
    );

    // The compile-time primitives registered without error and hold their names.
    assert!(
        registration_errors().is_empty(),
        "{:?}",
        registration_errors()
    );
    let mm = prims::etp_mm::try_primitive().expect("the built-in is registered");
    assert_eq!(primitive_by_name("etp_mm"), Some(mm.clone()));
    assert_eq!(
        primitive_by_name("etp_conv"),
        Some(prims::etp_conv::primitive())
    );
    let mine = order_macro::try_primitive().expect("the macro primitive is registered");
    assert_eq!(primitive_by_name("etp_order_macro"), Some(mine));

    // And they compute what they should (x @ w, not the impostor's x + w).
    let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let w = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.0], &[2, 2]).unwrap();
    let want = vec![4.5, -1.0, 9.5, -3.0];
    assert_eq!(order_macro(&x, &w).unwrap().to_vec_f64().unwrap(), want);
    let y = mm
        .bind(
            &[x.clone(), w.clone()],
            &Params::new().with("has_bias", false),
        )
        .unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), want);

    // A fresh name still registers at runtime.
    assert!(register_primitive("etp_order_fresh", impostor, PrimitiveOptions::new()).is_ok());
}
