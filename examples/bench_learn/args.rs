//! Configurations and the command line.

use crate::zoo;
use crate::{trace_dtype, N_IN};
use braintrace::learn::Algorithm;

#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Threads (`None`: the library's choice, called from the main thread).
    pub(crate) threads: Option<usize>,
    /// The D-RTRL traces' precision (`model`, `f32`, `bf16`).
    pub(crate) trace_dtype: String,
    pub(crate) model: String,
    pub(crate) algo: String,
    pub(crate) n_rec: usize,
    pub(crate) batch: usize,
    pub(crate) t: usize,
    /// Steps per `etrace_grad` call (0 = the whole sequence in one call).
    pub(crate) chunk: usize,
    /// D-RTRL without its fused trace kernels (every relation through its
    /// registered rules).
    pub(crate) generic: bool,
    /// Print a per-op profile after the configuration.
    pub(crate) profile: bool,
    /// Print the learner's `explain()` after compiling.
    pub(crate) explain: bool,
    /// Time the configuration's floor (`examples/floor`) alternately with
    /// the learner.
    pub(crate) floor: bool,
}

pub(crate) struct Args {
    pub(crate) models: Vec<String>,
    pub(crate) algos: Vec<String>,
    pub(crate) n_recs: Vec<usize>,
    pub(crate) batches: Vec<usize>,
    pub(crate) ts: Vec<usize>,
    pub(crate) budget_s: f64,
    pub(crate) runs: usize,
    pub(crate) chunk: usize,
    pub(crate) generic: bool,
    pub(crate) child: bool,
    pub(crate) in_process: bool,
    pub(crate) profile: bool,
    pub(crate) explain: bool,
    pub(crate) no_plan: bool,
    /// Per entry: a thread count, or `None` for the library's own choice.
    pub(crate) threads: Vec<Option<usize>>,
    pub(crate) trace_dtypes: Vec<String>,
    pub(crate) rounds: usize,
    pub(crate) floor: bool,
}

/// The models `--model` accepts (the default grid runs `gru` and `lif`).
pub(crate) const MODELS: [&str; 10] = [
    "gru",
    "lif",
    "gru_tanh",
    "sparse",
    "lora",
    "conv",
    "gru_macro",
    "gru_macro_rules",
    "lif_syn",
    "alif",
];

pub(crate) const USAGE: &str = "usage: bench_learn [--model gru,lif,gru_tanh,sparse,lora,conv,gru_macro,gru_macro_rules,lif_syn,alif,<cell>[_ce]] [--algo d_rtrl,pp_prop,snap1,snap2,<any Algorithm::by_name name>] \
[--n-rec 128,512] [--batch 16,64] [--T 100] [--budget-s 20] [--runs 3] [--chunk 0] [--generic] [--in-process]
       [--profile] [--explain] [--no-plan] [--threads 1|auto] [--trace-dtype model] [--rounds 1] [--floor]
  every filter takes a value or a comma-separated list;
  --budget-s: time budget per configuration's timed calls (0 = none);
  --runs: at most this many timed runs (median reported);
  --chunk N: feed each run's sequence in etrace_grad calls of N steps
             (state carries over; 0 = one call, the default);
  --generic: D-RTRL without its fused trace kernels (rule path);
  --in-process: run every configuration in this process (for profilers;
                peak RSS is then cumulative);
  --profile: with --in-process, print a per-op profile of one more run;
  --explain: with --in-process, print each learner's explain() to stderr (hidden
             groups, relations, which run fused paths, diagnostics);
  --no-plan: run the jitted step programs through the graph interpreter;
  --threads N: threads for the fused trace kernels, the matrix products
               and the fused element-wise loops (sets RAYON_NUM_THREADS and
               MATMUL_NUM_THREADS; default 1, to compare with a reference
               pinned to one core); with more than one, the learner runs on
               the pool's threads, the others kept awake (threads::keep_awake);
               `auto`: nothing set, the learner called from the main thread
               on the global pool of all cores, as a user's program does (the
               library decides where to split, see threads::Auto); a list
               (`auto,1,2`) runs each size with each, one after the other;
  --trace-dtype model|f32|bf16: the D-RTRL traces' precision (trace_dtype;
               a list runs each);
  --rounds R: run the whole grid R times, one row per configuration and
              round (alternating configurations over the minutes of a run);
  --floor: for gru and lif, also time the floor (examples/floor: D-RTRL's
           trace-bandwidth loop, pp_prop's matrix products) for as many
           steps after each timed run, and report it (floor,
           floor_ms_per_step, floor_cpu_ms_per_step) and ours over it
           (vs_floor, CPU times): one ratio from the same minutes;
  BENCH_QUICK=1: smoke grid (hidden 32, batch 4, T 5).";

pub(crate) fn list<T: std::str::FromStr>(
    flag: &str,
    v: &str,
) -> std::result::Result<Vec<T>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("{flag}: cannot parse `{s}`"))
        })
        .collect()
}

pub(crate) fn parse_args() -> std::result::Result<Args, String> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let mut a = Args {
        models: vec!["gru".into(), "lif".into()],
        algos: vec!["d_rtrl".into(), "pp_prop".into()],
        n_recs: if quick { vec![32] } else { vec![128, 512] },
        batches: if quick { vec![4] } else { vec![16, 64] },
        ts: vec![if quick { 5 } else { 100 }],
        budget_s: 20.0,
        runs: 3,
        chunk: 0,
        generic: false,
        child: false,
        in_process: false,
        profile: false,
        explain: false,
        no_plan: false,
        threads: vec![Some(1)],
        trace_dtypes: vec!["model".into()],
        rounds: 1,
        floor: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.models = list(&flag, &value()?)?,
            "--algo" => a.algos = list(&flag, &value()?)?,
            "--n-rec" => a.n_recs = list(&flag, &value()?)?,
            "--batch" => a.batches = list(&flag, &value()?)?,
            "--T" | "--t" => a.ts = list(&flag, &value()?)?,
            "--budget-s" => {
                a.budget_s = value()?
                    .parse()
                    .map_err(|_| "--budget-s: not a number".to_string())?
            }
            "--runs" => {
                a.runs = value()?
                    .parse()
                    .map_err(|_| "--runs: not an unsigned integer".to_string())?
            }
            "--chunk" => {
                a.chunk = value()?
                    .parse()
                    .map_err(|_| "--chunk: not an unsigned integer".to_string())?
            }
            "--threads" => {
                a.threads = value()?
                    .split(',')
                    .map(|v| match v.trim() {
                        "auto" => Ok(None),
                        n => n
                            .parse()
                            .map(Some)
                            .map_err(|_| format!("--threads: `{n}` is not a count nor auto")),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            "--trace-dtype" => a.trace_dtypes = list(&flag, &value()?)?,
            "--rounds" => {
                a.rounds = value()?
                    .parse()
                    .map_err(|_| "--rounds: not an unsigned integer".to_string())?
            }
            "--generic" => a.generic = true,
            "--child" => a.child = true,
            "--in-process" => a.in_process = true,
            "--profile" => a.profile = true,
            "--explain" => a.explain = true,
            "--no-plan" => a.no_plan = true,
            "--floor" => a.floor = true,
            // `cargo bench`-style harness flags are ignored.
            "--bench" => {}
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    for m in &a.models {
        if !MODELS.contains(&m.as_str()) && !zoo::is_zoo(m) {
            return Err(format!(
                "--model: `{m}` is not one of {MODELS:?} nor a cell of {:?} (`_ce`: cross-entropy)",
                zoo::CELLS
            ));
        }
    }
    for al in &a.algos {
        if !["snap1", "snap2"].contains(&al.as_str()) {
            Algorithm::by_name(al).map_err(|e| format!("--algo: {e}"))?;
        }
    }
    if a.profile && !a.in_process {
        return Err("--profile needs --in-process".into());
    }
    if a.explain && !a.in_process {
        return Err("--explain needs --in-process".into());
    }
    if a.models.iter().any(|m| m == "conv") && a.n_recs.iter().any(|n| n % N_IN != 0) {
        return Err(format!("--model conv needs --n-rec a multiple of {N_IN}"));
    }
    if a.n_recs.contains(&0)
        || a.batches.contains(&0)
        || a.ts.contains(&0)
        || a.threads.contains(&Some(0))
        || a.rounds == 0
    {
        return Err("--n-rec, --batch, --T, --threads and --rounds must be positive".into());
    }
    for t in &a.trace_dtypes {
        trace_dtype(t)?;
    }
    if a.in_process && a.threads.len() > 1 {
        return Err("--in-process runs one thread setting".into());
    }
    Ok(a)
}

pub(crate) fn configs(a: &Args) -> Vec<Config> {
    let mut v = Vec::new();
    for model in &a.models {
        for algo in &a.algos {
            for &n_rec in &a.n_recs {
                for &batch in &a.batches {
                    for &t in &a.ts {
                        for tdt in &a.trace_dtypes {
                            for &threads in &a.threads {
                                v.push(Config {
                                    model: model.clone(),
                                    algo: algo.clone(),
                                    n_rec,
                                    batch,
                                    t,
                                    chunk: a.chunk,
                                    generic: a.generic,
                                    profile: a.profile,
                                    explain: a.explain,
                                    floor: a.floor,
                                    threads,
                                    trace_dtype: tdt.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    v
}
