//! The memory-bandwidth floor of a D-RTRL step, measured on this machine:
//! one plain single-threaded loop over the f32 weight traces of the two GRU
//! relations (`ε = ε·D + x⊗Df; ∇ += g·ε`), with nothing else of the learner.
//! The fused kernels of `braintrace::learn` do the same work per trace
//! element, so their time per step is bounded below by this one.
//!
//! ```sh
//! cargo run --release --example bench_floor             # hidden 512, batch 64
//! cargo run --release --example bench_floor -- 128 16   # hidden, batch
//! ```
//!
//! Prints a line per repetition and one JSON line with the best.

use std::hint::black_box;
use std::time::Instant;

const N_IN: usize = 16;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n_rec, batch) = (
        args.first().copied().unwrap_or(512),
        args.get(1).copied().unwrap_or(64),
    );
    let (b, i, o) = (batch, N_IN + n_rec, n_rec);
    let n = b * i * o;
    let mut traces = [vec![0.5f32; n], vec![0.25f32; n]];
    let mut grads = [vec![0f32; i * o], vec![0f32; i * o]];
    let d = vec![0.9f32; b * o];
    let f = vec![0.1f32; b * o];
    let g = vec![0.01f32; b * o];
    let x = vec![0.3f32; b * i];
    let bytes = 2.0 * 2.0 * n as f64 * 4.0; // two traces, read and written
    let mut best = f64::INFINITY;
    for rep in 0..8 {
        let t = Instant::now();
        for (e, grad) in traces.iter_mut().zip(grads.iter_mut()) {
            for bb in 0..b {
                let (db, fb, gb) = (
                    &d[bb * o..(bb + 1) * o],
                    &f[bb * o..(bb + 1) * o],
                    &g[bb * o..(bb + 1) * o],
                );
                for ii in 0..i {
                    let xi = x[bb * i + ii];
                    let row = &mut e[(bb * i + ii) * o..(bb * i + ii + 1) * o];
                    let gr = &mut grad[ii * o..(ii + 1) * o];
                    for k in 0..o {
                        let v = db[k] * row[k] + xi * fb[k];
                        row[k] = v;
                        gr[k] += gb[k] * v;
                    }
                }
            }
        }
        let dt = t.elapsed().as_secs_f64();
        best = best.min(dt);
        eprintln!(
            "rep {rep}: {:.3} ms/step, {:.1} GB/s of trace traffic",
            dt * 1e3,
            bytes / dt / 1e9
        );
    }
    black_box(&grads);
    println!(
        "{{\"bench\":\"floor\",\"n_rec\":{n_rec},\"batch\":{batch},\"n_in\":{N_IN},\"ms_per_step\":{:.4},\"gb_per_s\":{:.2}}}",
        best * 1e3,
        bytes / best / 1e9
    );
}
