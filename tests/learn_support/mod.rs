//! Support for the online-learning tests: the golden models and the
//! end-to-end golden case checker.

#![allow(dead_code)]

pub mod e2e;
pub mod models;

use braintrace::learn::TensorDict;
use braintrace::DType;

/// `f32` gradients (`a`) agree with `f64` ones (`b`) of the same run: the
/// same keys' values, f32, within 1e-5 of the largest `f64` entry (f32
/// rounding over a few steps of a small model).
pub fn assert_f32_matches_f64(a: &TensorDict, b: &TensorDict) {
    for (k, g) in b {
        assert_eq!(a[k].dtype(), DType::F32);
        let (x, y) = (a[k].to_vec_f64().unwrap(), g.to_vec_f64().unwrap());
        let scale = y.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (u, v) in x.iter().zip(&y) {
            assert!((u - v).abs() <= 1e-5 * scale, "{k}: f32 {u} vs f64 {v}");
        }
    }
}
