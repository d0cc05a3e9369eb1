//! Deterministic test fixtures shared by several test files: values from a
//! fixed 64-bit LCG and a small GRU step written with the core ops (the
//! model the transform and graph tests differentiate). Included with
//! `#[path]` by the files that need only these, and by `common/mod.rs`.

#![allow(dead_code)]

use braintrace::{concat, Result, Tensor};

pub fn det_vec(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn det(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(det_vec(n, seed, scale), shape).expect("length matches shape")
}

/// The GRU step's sizes: input 3, hidden 4.
pub const GRU_IN: usize = 3;
/// See [`GRU_IN`].
pub const GRU_HID: usize = 4;

/// One GRU step: `[x, h, wz, bz, wr, br, wh, bh] -> [h']`.
pub fn gru_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, h) = (&a[0], &a[1]);
    let (wz, bz, wr, br, wh, bh) = (&a[2], &a[3], &a[4], &a[5], &a[6], &a[7]);
    let axis = x.ndim() - 1;
    let xh = concat(&[x.clone(), h.clone()], axis)?;
    let z = xh.matmul(wz)?.add(bz)?.sigmoid()?;
    let r = xh.matmul(wr)?.add(br)?.sigmoid()?;
    let xrh = concat(&[x.clone(), r.mul(h)?], axis)?;
    let hc = xrh.matmul(wh)?.add(bh)?.tanh()?;
    let h_next = z.rsub_scalar(1.0)?.mul(h)?.add(&z.mul(&hc)?)?;
    Ok(vec![h_next])
}

pub fn gru_args(seed: u64) -> Vec<Tensor> {
    let k = GRU_IN + GRU_HID;
    vec![
        det(&[GRU_IN], seed, 1.0),
        det(&[GRU_HID], seed + 1, 0.8),
        det(&[k, GRU_HID], seed + 2, 0.7),
        det(&[GRU_HID], seed + 3, 0.2),
        det(&[k, GRU_HID], seed + 4, 0.7),
        det(&[GRU_HID], seed + 5, 0.2),
        det(&[k, GRU_HID], seed + 6, 0.7),
        det(&[GRU_HID], seed + 7, 0.2),
    ]
}
