//! Core benchmarks: eager vs `jit` for a GRU step's forward pass and its
//! `value_and_grad` (hidden 128, batch 16, input 16, f32), and
//! `Tensor::matmul` throughput in f32.
//!
//! Run with `cargo run --release --example bench_core`. Times are medians
//! over repeated runs after a warm-up. Set `BENCH_QUICK=1` for a fast smoke
//! run with few repetitions.

use braintrace::prelude::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

const BATCH: usize = 16;
const INPUT: usize = 16;
const HIDDEN: usize = 128;

/// Deterministic f32 values in `[-scale, scale)` (a 64-bit LCG; no `rand`).
fn det_f32(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec_typed(data, shape)
}

/// One GRU step on a batch. Arguments `[x (B,I), h (B,H), wz, bz, wr, br,
/// wh, bh]` with `w*` of shape `(I+H, H)` and `b*` of shape `(H,)`.
fn gru_step(a: &[Tensor]) -> Result<Tensor> {
    let (x, h) = (&a[0], &a[1]);
    let (wz, bz, wr, br, wh, bh) = (&a[2], &a[3], &a[4], &a[5], &a[6], &a[7]);
    let xh = concat(&[x.clone(), h.clone()], 1)?;
    let z = xh.matmul(wz)?.add(bz)?.sigmoid()?;
    let r = xh.matmul(wr)?.add(br)?.sigmoid()?;
    let hc = concat(&[x.clone(), r.mul(h)?], 1)?
        .matmul(wh)?
        .add(bh)?
        .tanh()?;
    z.rsub_scalar(1.0)?.mul(h)?.add(&z.mul(&hc)?)
}

fn gru_forward(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![gru_step(a)?])
}

fn gru_loss(a: &[Tensor]) -> Result<Tensor> {
    gru_step(a)?.square()?.mean_all()
}

/// `value_and_grad` in the `Vec`-returning form that `jit` takes:
/// `[loss, dx, dh, dWz, ...]`.
fn gru_value_and_grad(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (v, g) = value_and_grad(gru_loss)(a)?;
    Ok(std::iter::once(v).chain(g).collect())
}

/// Median wall time of `runs` calls after `warmup` calls.
fn median_time<F: FnMut() -> Result<()>>(warmup: usize, runs: usize, mut f: F) -> Result<Duration> {
    for _ in 0..warmup {
        f()?;
    }
    let mut ts = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        f()?;
        ts.push(t0.elapsed());
    }
    ts.sort();
    Ok(ts[ts.len() / 2])
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    a.sub(b)?
        .abs()?
        .cast(DType::F64)?
        .to_vec_f64()
        .map(|v| v.into_iter().fold(0.0, f64::max))
}

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (warm, runs) = if quick { (1, 3) } else { (10, 101) };

    let k = INPUT + HIDDEN;
    let args = vec![
        det_f32(&[BATCH, INPUT], 1, 1.0)?,
        det_f32(&[BATCH, HIDDEN], 2, 0.5)?,
        det_f32(&[k, HIDDEN], 3, 0.1)?,
        det_f32(&[HIDDEN], 4, 0.1)?,
        det_f32(&[k, HIDDEN], 5, 0.1)?,
        det_f32(&[HIDDEN], 6, 0.1)?,
        det_f32(&[k, HIDDEN], 7, 0.1)?,
        det_f32(&[HIDDEN], 8, 0.1)?,
    ];

    println!("braintrace core benchmarks (median of {runs} runs after {warm} warm-up runs)");
    println!();
    println!("(a) GRU step, batch {BATCH}, input {INPUT}, hidden {HIDDEN}, f32");
    println!(
        "{:<28} {:>12} {:>12} {:>9}",
        "", "eager [us]", "jit [us]", "speed-up"
    );

    let jit_fwd = jit(gru_forward);
    let jit_vg = jit(gru_value_and_grad);
    // Results must agree before timing means anything.
    let (e, j) = (gru_value_and_grad(&args)?, jit_vg(&args)?);
    let mut worst: f64 = 0.0;
    for (a, b) in e.iter().zip(&j) {
        worst = worst.max(max_abs_diff(a, b)?);
    }
    worst = worst.max(max_abs_diff(&gru_forward(&args)?[0], &jit_fwd(&args)?[0])?);

    let rows: [(&str, Duration, Duration); 2] = [
        (
            "forward",
            median_time(warm, runs, || {
                black_box(gru_forward(&args)?);
                Ok(())
            })?,
            median_time(warm, runs, || {
                black_box(jit_fwd(&args)?);
                Ok(())
            })?,
        ),
        (
            "value_and_grad (fwd + bwd)",
            median_time(warm, runs, || {
                black_box(gru_value_and_grad(&args)?);
                Ok(())
            })?,
            median_time(warm, runs, || {
                black_box(jit_vg(&args)?);
                Ok(())
            })?,
        ),
    ];
    for (name, te, tj) in rows {
        println!(
            "{name:<28} {:>12.1} {:>12.1} {:>8.2}x",
            us(te),
            us(tj),
            te.as_secs_f64() / tj.as_secs_f64()
        );
    }
    println!("max |eager - jit| over all outputs: {worst:.1e}");
    println!();

    println!("(b) Tensor::matmul, f32, C = A @ B (n x n x n)");
    println!("{:<18} {:>12} {:>10}", "n", "time [ms]", "GFLOP/s");
    for (n, runs) in [
        (256usize, if quick { 3 } else { 51 }),
        (1024, if quick { 1 } else { 11 }),
    ] {
        let a = det_f32(&[n, n], 10, 1.0)?;
        let b = det_f32(&[n, n], 11, 1.0)?;
        let t = median_time(if quick { 0 } else { 2 }, runs, || {
            black_box(a.matmul(&b)?);
            Ok(())
        })?;
        let gflops = 2.0 * (n as f64).powi(3) / t.as_secs_f64() / 1e9;
        println!(
            "{:<18} {:>12.3} {:>10.1}",
            format!("{n}x{n}x{n}"),
            t.as_secs_f64() * 1e3,
            gflops
        );
    }
    Ok(())
}
