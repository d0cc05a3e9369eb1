//! Micro-benchmark of the built-in ETP primitives, in f32:
//! `etp_mm` forward + `yw_to_w` + `xy_to_dw` at B=16, I=O=256, and
//! `etp_conv` 2-D forward at B=8, 16 -> 32 channels, 32x32, 3x3, SAME.
//!
//! Run: `cargo run --release --example bench_etp`

use braintrace::etp::{Params, TensorMap};
use braintrace::ops::{ConvPadding, ConvParams};
use braintrace::prelude::*;
use braintrace::prims::{self, Transforms};
use std::time::Instant;

fn rand(shape: &[usize], seed: u64) -> Tensor {
    let mut s = seed;
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        })
        .collect();
    Tensor::from_vec(v, shape)
        .unwrap()
        .cast(DType::F32)
        .unwrap()
}

fn median_ms(mut f: impl FnMut(), reps: usize) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[reps / 2]
}

fn main() -> Result<()> {
    let (b, i, o) = (16, 256, 256);
    let x = rand(&[b, i], 1);
    let w = rand(&[i, o], 2);
    let h = rand(&[b, o], 3);
    let mm = prims::etp_mm::primitive();
    let params = Params::new().with("has_bias", false);
    let mut trace = TensorMap::new();
    trace.insert("weight".into(), rand(&[b, i, o], 4));
    let mut weights = TensorMap::new();
    weights.insert("weight".into(), w.clone());
    let fwd = median_ms(
        || drop(mm.bind(&[x.clone(), w.clone()], &params).unwrap()),
        50,
    );
    let yw = median_ms(|| drop(mm.yw_to_w(&h, &trace, &params).unwrap()), 50);
    let xy = median_ms(
        || drop(mm.xy_to_dw(Some(&x), &h, &weights, &params).unwrap()),
        50,
    );
    let all = median_ms(
        || {
            mm.bind(&[x.clone(), w.clone()], &params).unwrap();
            mm.yw_to_w(&h, &trace, &params).unwrap();
            mm.xy_to_dw(Some(&x), &h, &weights, &params).unwrap();
        },
        50,
    );
    println!("etp_mm  f32  B=16 I=O=256");
    println!("  forward            {fwd:8.3} ms");
    println!("  yw_to_w (B,I,O)    {yw:8.3} ms");
    println!("  xy_to_dw           {xy:8.3} ms");
    println!("  all three          {all:8.3} ms");

    let xc = rand(&[8, 16, 32, 32], 5);
    let k = rand(&[32, 16, 3, 3], 6);
    let cp = ConvParams::default_for(2).with_padding(ConvPadding::Same);
    let t = Transforms::default();
    let conv = median_ms(|| drop(prims::conv(&xc, &k, None, &cp, &t).unwrap()), 30);
    let flops = 2.0 * 8.0 * 32.0 * 32.0 * 32.0 * 16.0 * 9.0;
    println!("etp_conv f32  B=8 16->32 ch 32x32 3x3 SAME");
    println!(
        "  forward            {conv:8.3} ms  ({:.1} GFLOP/s)",
        flops / conv / 1e6
    );
    Ok(())
}
