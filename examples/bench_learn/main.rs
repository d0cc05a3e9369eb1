//! Online-learning benchmark: `etrace_grad` time per step, compile time and
//! peak memory of the D-RTRL and pp_prop learners on a GRU net and a LIF net.
//!
//! ```text
//! cargo run --release --example bench_learn > rs.jsonl
//! cargo run --release --example bench_learn -- --model gru --algo d_rtrl --n-rec 128 --batch 16
//! cargo run --release --example bench_learn -- --model gru --algo d_rtrl --n-rec 128 \
//!     --batch 16 --T 10000 --budget-s 0 --runs 1 [--chunk 100]
//! BENCH_QUICK=1 cargo run --release --example bench_learn
//! ```
//!
//! The grid is model {gru, lif} × algorithm {d_rtrl, pp_prop (decay 0.95)}
//! × hidden {128, 512} × batch {16, 64}, with input 16, output 4, T = 100,
//! f32. Every filter takes one value or a comma-separated list. Each
//! configuration runs in a child process of this program (`--child`), so the
//! peak RSS it reports (`VmHWM` of `/proc/self/status`, MiB) is that
//! configuration's own.
//!
//! Per configuration: `compile` is timed (`compile_ms`); a warm-up
//! `etrace_grad` over `min(T, 3)` steps (`first_call_ms`, which includes the
//! staging of the per-step programs on first use) estimates the time per
//! step; then `etrace_grad` over the sequence is timed up to `--runs` times
//! (default 3) while the time budget `--budget-s` (default 20 s; 0 = none)
//! lasts, at least once, and `ms_per_step` is the median wall time / steps;
//! `cpu_ms_per_step` is the same with the process's CPU time (summed over
//! its threads from `/proc/self/task/*/schedstat`), which is much steadier
//! than wall time on a shared, loaded machine. The budget counts CPU time.
//! When the estimate says T steps would overrun the budget, a shorter
//! sequence (at least 3 steps) is timed and `steps_timed` says so.
//! `--chunk N` feeds the sequence in `etrace_grad` calls of N steps (state
//! carries over), so that memory is not dominated by the input sequence
//! when checking that it is flat in T. `--generic` turns D-RTRL's fused
//! trace kernels off (`DRtrl::fast_paths(false)`), to compare with the
//! registered-rule path. `--floor` (GRU and LIF) runs the configuration's
//! floor of `examples/floor` (D-RTRL: the trace-bandwidth loop; pp_prop:
//! the model's matrix products alone) for as many steps after each timed
//! run and adds `floor`, `floor_ms_per_step`, `floor_cpu_ms_per_step` and
//! `vs_floor` (ours over the floor, CPU time, medians) to the line: a ratio
//! measured in the same minutes. `peak_rss_mb` then leaves the floor's
//! buffers out.
//!
//! Output: one JSON line per configuration on stdout as it finishes
//! (`impl, model, algo, n_in, n_rec, n_out, batch, T, ms_per_step,
//! cpu_ms_per_step, compile_ms, peak_rss_mb, steps_timed, runs, first_call_ms, chunk`), then a table
//! on stderr. `scripts/bench_ref/bench_learn_ref.py` runs the same workloads
//! on braintrace 0.2.6 and `scripts/bench_compare.py` prints both side by
//! side.
//!
//! `--model` also takes `gru_tanh` (the GRU with `weight_fn = tanh`: dense
//! relations with a weight transform), `sparse` (a leaky rate RNN over a
//! sparse `[x, h]` product with about 10 % of the entries) and `lora` (the
//! same over a rank-8 LoRA product) and `conv` (the same over a 1-D
//! convolution of `[x, h]` as channels, `n_rec / 16` channels of length
//! 16, kernel 3, SAME), for the fused kernels of those primitives, and
//! `gru_macro` / `gru_macro_rules` (the `gru` net with its products an
//! `#[etp_primitive]` with a declared dense trace kernel, or with its
//! rules only); they are not in the default grid. `lif_syn` (a recurrent
//! `nn::Lif` layer behind an `nn::Expon` synapse, leaky readout) and `alif`
//! (a recurrent `nn::Alif` layer, leaky readout), from `examples/snn_nets`,
//! train with a cross-entropy against `softmax(y)`; not in the default grid
//! either.
//!
//! `--model` also takes braintrace's recurrent cells with a `Linear`
//! readout (`vanilla`, `mgu`, `minimal`, `cfn`, `lstm`, `urlstm`,
//! `minigru`, `minilstm`, `lru`; `examples/zoo`), each also as `<cell>_ce`:
//! softmax cross-entropy on integer labels instead of the MSE.
//!
//! The models are the golden `gru` and `lif` nets (golden README §6.1),
//! copied from `tests/learn_support/models.rs`; the LIF uses the golden
//! hyperparameters (β = 0.8, γ = 0.6, v_th = 1, readout decay e^{-1/5}).
//! Inputs are uniform in [0, 1), targets in [-1, 1), the loss is the mean
//! squared error. `BENCH_QUICK=1` runs a smoke grid (hidden 32, batch 4,
//! T 5). The learners compute what braintrace does (`NonTemporal::Zero`,
//! `InStepPaths::Twice`); `BENCH_IN_STEP_PATHS=once` measures the
//! corrected learning signal instead (in-step paths counted once: an extra
//! reverse pass for groups such as the LIF's `i → v`). The learner scans
//! each step for NaN and infinities (its default `NonFinite::Error`);
//! `BENCH_NON_FINITE=allow` measures without the scan.

mod args;
#[path = "../floor/mod.rs"]
mod floor;
mod measure;
mod nets;
#[path = "../snn_nets/mod.rs"]
mod snn_nets;
#[path = "../zoo/mod.rs"]
mod zoo;

use crate::args::{configs, parse_args, Config};
use crate::measure::run_config;
use braintrace::Result;
use std::process::Command;

const N_IN: usize = 16;
const N_OUT: usize = 4;
const PP_DECAY: f64 = 0.95;
const SEED: u64 = 0;

fn child_args(cfg: &Config, budget_s: f64, runs: usize) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--child".into(),
        "--model".into(),
        cfg.model.clone(),
        "--algo".into(),
        cfg.algo.clone(),
        "--n-rec".into(),
        cfg.n_rec.to_string(),
        "--batch".into(),
        cfg.batch.to_string(),
        "--T".into(),
        cfg.t.to_string(),
        "--budget-s".into(),
        budget_s.to_string(),
        "--runs".into(),
        runs.to_string(),
        "--chunk".into(),
        cfg.chunk.to_string(),
        "--threads".into(),
        cfg.threads.map_or("auto".into(), |n| n.to_string()),
        "--trace-dtype".into(),
        cfg.trace_dtype.clone(),
    ];
    if cfg.generic {
        v.push("--generic".into());
    }
    if cfg.floor {
        v.push("--floor".into());
    }
    if !braintrace::exec::planned_execution() {
        v.push("--no-plan".into());
    }
    v
}

/// Run `cfg` in a child process; its JSON line, or why not.
fn spawn(
    cfg: &Config,
    budget_s: f64,
    runs: usize,
) -> std::result::Result<serde_json::Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = Command::new(exe)
        .args(child_args(cfg, budget_s, runs))
        .output()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "child failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| "child printed no JSON line".to_string())?;
    serde_json::from_str(line).map_err(|e| format!("child JSON: {e}"))
}

fn print_table(rows: &[serde_json::Value]) {
    eprintln!();
    eprintln!(
        "{:<5} {:<8} {:>6} {:>6} {:>6} {:>12} {:>12} {:>11} {:>9} {:>6}",
        "model",
        "algo",
        "n_rec",
        "batch",
        "T",
        "ms/step",
        "cpu ms/step",
        "compile ms",
        "RSS MiB",
        "timed"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let u = |k: &str| r[k].as_u64().unwrap_or(0);
        eprintln!(
            "{:<5} {:<8} {:>6} {:>6} {:>6} {:>12.4} {:>12.4} {:>11.2} {:>9.1} {:>6}",
            r["model"].as_str().unwrap_or("?"),
            r["algo"].as_str().unwrap_or("?"),
            u("n_rec"),
            u("batch"),
            u("T"),
            f("ms_per_step"),
            f("cpu_ms_per_step"),
            f("compile_ms"),
            f("peak_rss_mb"),
            u("steps_timed"),
        );
    }
}

/// `f` on one of the rayon pool's threads, with the others kept awake
/// ([`braintrace::threads::keep_awake`]), when there is more than one: the
/// learner's kernels and products then split their work with the other
/// threads without handing it over from outside the pool, or waking a
/// sleeping thread, each time; see "Threads" in the book's online-learning
/// chapter.
///
/// With `--threads auto` it runs `f` on the calling thread: the library
/// decides.
fn in_pool(
    cfg: &Config,
    f: impl FnOnce() -> Result<serde_json::Value> + Send,
) -> Result<serde_json::Value, String> {
    let run = || f().map_err(|e| e.to_string());
    if cfg.threads.is_none() {
        return run();
    }
    braintrace::threads::keep_awake(run)
}

/// `--trace-dtype`'s value.
fn trace_dtype(s: &str) -> std::result::Result<braintrace::learn::TraceDType, String> {
    use braintrace::learn::TraceDType;
    match s {
        "model" => Ok(TraceDType::Model),
        "f32" => Ok(TraceDType::F32),
        "bf16" => Ok(TraceDType::BF16),
        "f64" => Ok(TraceDType::F64),
        other => Err(format!(
            "--trace-dtype: `{other}` is not model, f32, bf16 or f64"
        )),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if args.child || args.in_process {
        // Before any thread pool exists (a child runs one setting).
        if let Some(n) = args.threads[0] {
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
            std::env::set_var("MATMUL_NUM_THREADS", n.to_string());
        }
    }
    let cfgs = configs(&args);
    if args.no_plan {
        braintrace::exec::set_planned_execution(false);
    }
    if args.child {
        // Exactly one configuration, in this process.
        let Some(cfg) = cfgs.first().filter(|_| cfgs.len() == 1) else {
            eprintln!("--child needs exactly one configuration");
            std::process::exit(2);
        };
        let r = in_pool(cfg, || run_config(cfg, args.budget_s, args.runs));
        match r {
            Ok(v) => println!("{v}"),
            Err(e) => {
                eprintln!("{cfg:?}: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    eprintln!(
        "bench_learn: {} configuration(s), f32, n_in {N_IN}, n_out {N_OUT}, pp_prop decay {PP_DECAY}, \
         budget {} s per timed call{}",
        cfgs.len(),
        args.budget_s,
        if args.in_process {
            ", in-process (peak RSS cumulative)"
        } else {
            ", one child process per configuration"
        }
    );
    let mut rows = Vec::new();
    let mut failed = 0;
    for (round, cfg) in (0..args.rounds).flat_map(|r| cfgs.iter().map(move |c| (r, c))) {
        let r = if args.in_process {
            in_pool(cfg, || run_config(cfg, args.budget_s, args.runs))
        } else {
            spawn(cfg, args.budget_s, args.runs)
        };
        match r {
            Ok(mut v) => {
                if args.rounds > 1 {
                    v["round"] = round.into();
                }
                println!("{v}");
                rows.push(v);
            }
            Err(e) => {
                failed += 1;
                eprintln!("{cfg:?}: {e}");
            }
        }
    }
    print_table(&rows);
    if failed > 0 {
        eprintln!("{failed} configuration(s) failed");
        std::process::exit(1);
    }
}
