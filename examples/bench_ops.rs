//! Op-level micro benchmark: the core ops of one online-learning step (GRU /
//! LIF, hidden 128, batch 16) at exactly the shapes a per-op profile of that
//! step showed, each called eagerly (`bind` -> `Primitive::eval`), as the
//! learner's interpreter does.
//!
//! Run with `cargo run --release --example bench_ops`. Prints a table and one
//! JSON line per case (`{"bench":"ops","case":...,"ns_per_call":...}`).
//! `BENCH_QUICK=1` runs few repetitions; `BENCH_FILTER=text` runs only the
//! cases whose name contains `text`.

use braintrace::prelude::*;
use std::hint::black_box;
use std::time::Instant;

/// Deterministic values in `[-scale, scale)` (a 64-bit LCG; no `rand`).
fn det(shape: &[usize], seed: u64, scale: f64, dtype: DType) -> Result<Tensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, shape)?.cast(dtype)
}

type Case = (String, Box<dyn Fn() -> Result<Tensor>>);

fn cases(dt: DType) -> Result<Vec<Case>> {
    let tag = format!("{dt}");
    let mut v: Vec<Case> = Vec::new();
    let mut add = |name: &str, f: Box<dyn Fn() -> Result<Tensor>>| {
        v.push((format!("{name} {tag}"), f));
    };

    let x4 = det(&[16, 128, 1, 1], 1, 1.0, dt)?;
    add(
        "reduce_sum [16,128,1,1]->[16,128,1]",
        Box::new(move || x4.sum(&[3])),
    );
    let x3 = det(&[16, 128, 1], 2, 1.0, dt)?;
    add(
        "reduce_sum [16,128,1]->[16,128]",
        Box::new(move || x3.sum(&[2])),
    );
    let x2 = det(&[16, 128], 3, 1.0, dt)?;
    let x = x2.clone();
    add("reduce_sum [16,128]->[128]", Box::new(move || x.sum(&[0])));
    let x = x2.clone();
    add("reduce_sum [16,128]->[16]", Box::new(move || x.sum(&[1])));
    let x = det(&[16, 8, 128], 4, 1.0, dt)?;
    add(
        "reduce_sum [16,8,128] axes [0,2]",
        Box::new(move || x.sum(&[0, 2])),
    );

    // A [16,128,2] in a non-standard layout (what concatenating two
    // [16,128,1] along the last axis used to produce), and a standard one.
    let xt = det(&[2, 16, 128], 5, 1.0, dt)?.transpose(&[1, 2, 0])?;
    add(
        "reshape [16,128,2]->[16,128,1,2] strided",
        Box::new(move || xt.reshape(&[16, 128, 1, 2])),
    );
    let xs = det(&[16, 128, 2], 6, 1.0, dt)?;
    add(
        "reshape [16,128,2]->[16,128,1,2] standard",
        Box::new(move || xs.reshape(&[16, 128, 1, 2])),
    );

    let (a, b) = (det(&[16, 16], 7, 1.0, dt)?, det(&[16, 128], 8, 1.0, dt)?);
    add(
        "concatenate [16,16]+[16,128]->[16,144]",
        Box::new(move || concat(&[a.clone(), b.clone()], 1)),
    );
    let (a, b) = (
        det(&[16, 128, 1], 9, 1.0, dt)?,
        det(&[16, 128, 1], 10, 1.0, dt)?,
    );
    add(
        "concatenate [16,128,1]x2->[16,128,2]",
        Box::new(move || concat(&[a.clone(), b.clone()], 2)),
    );
    // A 2-state hidden group (LIF) at hidden 512, batch 64: the pp_prop
    // step stacks the two states' traces along a last axis of 2 and slices
    // them back, and sums a product over that axis.
    let (a, b) = (
        det(&[64, 512, 1], 40, 1.0, dt)?,
        det(&[64, 512, 1], 41, 1.0, dt)?,
    );
    add(
        "concatenate [64,512,1]x2->[64,512,2]",
        Box::new(move || concat(&[a.clone(), b.clone()], 2)),
    );
    let l = det(&[64, 512, 2], 42, 1.0, dt)?;
    let l2 = l.clone();
    add(
        "slice [64,512,2]->[64,512,1] (state 1)",
        Box::new(move || l2.slice(&[0, 0, 1], &[64, 512, 2])),
    );
    add(
        "reduce_sum [64,512,2]->[64,512]",
        Box::new(move || l.sum(&[2])),
    );
    let (a, b) = (det(&[16, 128], 11, 1.0, dt)?, det(&[16, 128], 12, 1.0, dt)?);
    add(
        "stack [16,128]x2 axis 2->[16,128,2]",
        Box::new(move || stack(&[a.clone(), b.clone()], 2)),
    );
    let (a, b) = (det(&[16, 128], 13, 1.0, dt)?, det(&[16, 128], 14, 1.0, dt)?);
    add(
        "stack [16,128]x2 axis 0->[2,16,128]",
        Box::new(move || stack(&[a.clone(), b.clone()], 0)),
    );

    let (a, s) = (det(&[16, 128], 15, 1.0, dt)?, Tensor::scalar_of(3.0, dt));
    add("div [16,128] / 0-d", Box::new(move || a.div(&s)));
    let (a, b) = (det(&[16, 128], 16, 1.0, dt)?, det(&[16, 128], 17, 1.0, dt)?);
    add("mul [16,128]x[16,128]", Box::new(move || a.mul(&b)));
    let (a, b) = (det(&[16, 128], 18, 1.0, dt)?, det(&[128], 19, 1.0, dt)?);
    add("add [16,128]+[128] (bias)", Box::new(move || a.add(&b)));
    let (a, b) = (det(&[16, 128], 20, 1.0, dt)?, det(&[16, 128], 21, 1.0, dt)?);
    add("add [16,128]+[16,128]", Box::new(move || a.add(&b)));
    let (a, b) = (det(&[16, 128], 22, 1.0, dt)?, det(&[16, 1], 23, 1.0, dt)?);
    add("mul [16,128]x[16,1] (column)", Box::new(move || a.mul(&b)));

    let a = det(&[16, 128], 24, 2.0, dt)?;
    let a2 = a.clone();
    add("logistic [16,128]", Box::new(move || a.sigmoid()));
    add("tanh [16,128]", Box::new(move || a2.tanh()));
    let at = det(&[128, 16], 25, 2.0, dt)?.transpose(&[1, 0])?;
    add("tanh [16,128] transposed", Box::new(move || at.tanh()));

    let s = Tensor::scalar_of(0.5, dt);
    add(
        "broadcast_in_dim []->[16,4]",
        Box::new(move || s.broadcast_to(&[16, 4])),
    );
    let b = det(&[128], 26, 1.0, dt)?;
    add(
        "broadcast_in_dim [128]->[16,128]",
        Box::new(move || b.broadcast_to(&[16, 128])),
    );
    let a = det(&[16, 128], 27, 1.0, dt)?;
    add("transpose [16,128]->[128,16]", Box::new(move || a.t()));

    let (a, w) = (
        det(&[16, 144], 28, 1.0, dt)?,
        det(&[144, 128], 29, 0.1, dt)?,
    );
    add("matmul [16,144]x[144,128]", Box::new(move || a.matmul(&w)));
    let (a, w) = (
        det(&[16, 128], 30, 1.0, dt)?,
        det(&[144, 128], 31, 0.1, dt)?,
    );
    let wt = w.t()?;
    add(
        "matmul [16,128]x[144,128]^T (strided)",
        Box::new(move || a.matmul(&wt)),
    );
    let (a, w) = (
        det(&[4, 16, 32], 32, 1.0, dt)?,
        det(&[4, 32, 16], 33, 0.1, dt)?,
    );
    let at = det(&[4, 32, 16], 34, 1.0, dt)?.t()?;
    add("matmul [4,16,32]x[4,32,16]", {
        let w = w.clone();
        Box::new(move || a.matmul(&w))
    });
    add(
        "matmul [4,16,32]^T-view x[4,32,16]",
        Box::new(move || at.matmul(&w)),
    );
    Ok(v)
}

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let filter = std::env::var("BENCH_FILTER").unwrap_or_default();
    let (reps, target_ns) = if quick { (5, 2e5) } else { (31, 2e6) };
    println!("braintrace op benchmarks: median over {reps} batches of ns per eager call");
    println!("{:<48} {:>12} {:>12}", "case", "ns/call", "min ns/call");
    let mut json = Vec::new();
    for dt in [DType::F32, DType::F64] {
        for (name, f) in cases(dt)? {
            if !name.contains(&filter) {
                continue;
            }
            // Calibrate the batch size to about `target_ns`.
            for _ in 0..50 {
                black_box(f()?);
            }
            let t0 = Instant::now();
            for _ in 0..100 {
                black_box(f()?);
            }
            let per = t0.elapsed().as_nanos() as f64 / 100.0;
            let iters = ((target_ns / per.max(1.0)) as usize).clamp(10, 100_000);
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t0 = Instant::now();
                for _ in 0..iters {
                    black_box(f()?);
                }
                samples.push(t0.elapsed().as_nanos() as f64 / iters as f64);
            }
            samples.sort_by(f64::total_cmp);
            let (med, min) = (samples[samples.len() / 2], samples[0]);
            println!("{name:<48} {med:>12.0} {min:>12.0}");
            json.push(format!(
                "{{\"bench\":\"ops\",\"case\":\"{name}\",\"ns_per_call\":{med:.1},\"min_ns_per_call\":{min:.1},\"iters\":{iters},\"reps\":{reps}}}"
            ));
        }
    }
    println!();
    for j in json {
        println!("{j}");
    }
    Ok(())
}
