//! Two floors of a learning step, measured on this machine.
//!
//! **D-RTRL, memory bandwidth**: one plain single-threaded loop over the
//! f32 weight traces of the two GRU relations (`ε = ε·D + x⊗Df; ∇ += g·ε`),
//! with nothing else of the learner (`examples/floor`). The fused kernels of
//! `braintrace::learn` do the same work per trace element, so their time per
//! step is bounded below by this one. `bench_learn --floor` times the same
//! loop alternately with the learner, for a ratio measured at one moment.
//!
//! **pp_prop, matrix products**: the products a pp_prop step cannot avoid,
//! timed alone with the learner's own matrix products (one thread): the
//! forward product `[B, I]·[I, O]` of every dense weight (GRU: 3, LIF: 1;
//! `kernels::sgemm` on the weight's kept panels, as the planned executor
//! runs it for up to 128 rows) and the weight gradient `x̄ᵀ g` of every
//! relation (GRU: 2, as `explain()` counts them; LIF: 1), which the
//! learner runs as one `[I, K]·[K, O]` product per `K` rows of steps ×
//! batch (`braintrace::learn::pp_chunk_rows`). The readout's products
//! (output size 4) are left out. A pp_prop step costs at least this,
//! whatever runs around it.
//! (`examples/floor`; `bench_learn --floor` times it alternately with a
//! pp_prop learner.)
//!
//! ```sh
//! cargo run --release --example bench_floor             # hidden 512, batch 64
//! cargo run --release --example bench_floor -- 128 16   # hidden, batch
//! ```
//!
//! Prints a line per repetition and one JSON line per floor with the best.

mod floor;

use floor::{ProductsFloor, TraceFloor};
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
    let mut floor = TraceFloor::new(N_IN, n_rec, batch);
    let bytes = floor.bytes_per_step();
    let mut best = f64::INFINITY;
    for rep in 0..8 {
        let t = Instant::now();
        floor.step();
        let dt = t.elapsed().as_secs_f64();
        best = best.min(dt);
        eprintln!(
            "rep {rep}: {:.3} ms/step, {:.1} GB/s of trace traffic",
            dt * 1e3,
            bytes / dt / 1e9
        );
    }
    println!(
        "{{\"bench\":\"floor\",\"n_rec\":{n_rec},\"batch\":{batch},\"n_in\":{N_IN},\"ms_per_step\":{:.4},\"gb_per_s\":{:.2}}}",
        best * 1e3,
        bytes / best / 1e9
    );
    products_floor(n_rec, batch);
}

/// Best time of `f` over a few repetitions of `reps` calls, per call.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// The pp_prop products floor (see the module docs) for the GRU and the
/// LIF network of `bench_learn` at this size.
fn products_floor(n_rec: usize, batch: usize) {
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        // One thread, as bench_learn's default; before the first product.
        std::env::set_var("MATMUL_NUM_THREADS", "1");
    }
    let mut floor = ProductsFloor::new(N_IN, n_rec, batch, 1, 1);
    let reps = (2_000_000 / (batch * (N_IN + n_rec) * n_rec)).max(3);
    let forward = best_of(reps, || floor.forward(0));
    let chunk = best_of((reps / floor.steps_per_chunk()).max(2), || {
        floor.gradient_chunk()
    });
    let gradient = chunk / floor.steps_per_chunk() as f64;
    let flop = floor.flop_per_step() / 2.0;
    for (model, n_fwd, n_grad) in [("gru", 3.0, 2.0), ("lif", 1.0, 1.0)] {
        let t = n_fwd * forward + n_grad * gradient;
        let mflop = (n_fwd + n_grad) * flop / 1e6;
        eprintln!(
            "pp_prop products, {model}: {n_fwd} x forward {:.4} ms + {n_grad} x gradient {:.4} ms = {:.4} ms/step ({mflop:.1} MFLOP, {:.1} GFLOP/s)",
            forward * 1e3,
            gradient * 1e3,
            t * 1e3,
            mflop / t / 1e3
        );
        println!(
            "{{\"bench\":\"pp_products_floor\",\"model\":\"{model}\",\"n_rec\":{n_rec},\"batch\":{batch},\"n_in\":{N_IN},\"ms_per_step\":{:.4},\"mflop_per_step\":{mflop:.2},\"gflop_per_s\":{:.1}}}",
            t * 1e3,
            mflop / t / 1e3
        );
    }
}
