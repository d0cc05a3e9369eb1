//! One configuration: data, timing, the floor, the JSON line.

use crate::args::Config;
use crate::floor::{ProductsFloor, TraceFloor};
use crate::nets::{gru_net, gru_tanh_net, lif_net, GruMacro, LeakyNet};
use crate::{snn_nets, zoo};
use crate::{trace_dtype, N_IN, N_OUT, PP_DECAY, SEED};
use braintrace::learn::{
    compile, Algorithm, DRtrl, EProp, InStepPaths, Learner, Model, ModelState, NonTemporal,
    OstlFeedforward, OstlRecurrent, PpProp, RandomProjection, Reduction, SnAp, ThreeFactor, Uoro,
};
use braintrace::{DType, Result, Tensor};
use std::hint::black_box;
use std::time::Instant;

/// Deterministic f32 values in `[lo, hi)` (a 64-bit LCG; no `rand`).
pub(crate) fn det_f32(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Result<Tensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (s >> 40) as f32 / (1u64 << 24) as f32 * (hi - lo)
        })
        .collect();
    Tensor::from_vec_typed(data, shape)
}

/// Peak resident set size of this process in MiB (`VmHWM`), if readable.
pub(crate) fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The floor of a configuration (`--floor`): which one, its wall and CPU
/// ms per step, and the learner's own peak RSS, without the floor's buffers.
pub(crate) struct MeasuredFloor {
    pub(crate) kind: &'static str,
    pub(crate) ms_per_step: f64,
    pub(crate) cpu_ms_per_step: Option<f64>,
    pub(crate) rss: Option<f64>,
}

/// The floor `--floor` times beside a configuration's learner.
pub(crate) enum Floor {
    Trace(TraceFloor),
    Products(ProductsFloor),
}

impl Floor {
    /// D-RTRL's trace bandwidth or pp_prop's products, for the bench nets
    /// (`gru`: 3 dense weights and 2 relations, `lif`: 1 and 1); none for
    /// the other models.
    fn of(cfg: &Config) -> Option<Floor> {
        if cfg.algo != "d_rtrl" && cfg.algo != "pp_prop" {
            return None;
        }
        let (n_fwd, n_grad) = match cfg.model.as_str() {
            "gru" => (3, 2),
            "lif" => (1, 1),
            _ => return None,
        };
        Some(match cfg.algo.as_str() {
            "d_rtrl" => Floor::Trace(TraceFloor::new(N_IN, cfg.n_rec, cfg.batch)),
            "pp_prop" => Floor::Products(ProductsFloor::new(
                N_IN, cfg.n_rec, cfg.batch, n_fwd, n_grad,
            )),
            _ => return None,
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            Floor::Trace(_) => "trace_bandwidth",
            Floor::Products(_) => "pp_products",
        }
    }

    fn step(&mut self) {
        match self {
            Floor::Trace(f) => f.step(),
            Floor::Products(f) => f.step(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Floor::Trace(f) => f.bytes(),
            Floor::Products(f) => f.bytes(),
        }
    }
}

pub(crate) struct Measured {
    pub(crate) ms_per_step: f64,
    pub(crate) cpu_ms_per_step: Option<f64>,
    pub(crate) floor: Option<MeasuredFloor>,
    pub(crate) compile_ms: f64,
    pub(crate) first_call_ms: f64,
    pub(crate) steps_timed: usize,
    pub(crate) runs: usize,
    /// The learner's estimate of a step's work (`Learner::work`).
    pub(crate) work: braintrace::threads::Work,
}

pub(crate) fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

/// A loss of the readout and the targets.
pub(crate) type Loss = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// The spiking zoo's models train with a cross-entropy (soft targets
/// `softmax(y)`), the others with the mean squared error.
pub(crate) fn loss_of(cfg: &Config) -> Loss {
    match cfg.model.as_str() {
        "lif_syn" | "alif" => snn_nets::soft_cross_entropy,
        z if zoo::uses_ce(z) => zoo::ce_loss,
        _ => mse,
    }
}

pub(crate) fn sequences(t: usize, batch: usize, seed: u64) -> Result<(Tensor, Tensor)> {
    // Inputs in [0, 1) so the LIF net receives drive; targets in [-1, 1).
    let xs = det_f32(&[t, batch, N_IN], seed, 0.0, 1.0)?;
    let ys = det_f32(&[t, batch, N_OUT], seed + 1, -1.0, 1.0)?;
    Ok((xs, ys))
}

/// CPU time of this process so far in seconds: the sum over its threads of
/// the on-CPU time in `/proc/self/task/*/schedstat` (nanoseconds). On a
/// shared machine it is far steadier than wall time.
pub(crate) fn process_cpu_s() -> Option<f64> {
    // The kernel brings the running thread's count up to date at scheduler
    // events; a yield is one, so the reading includes the current slice.
    std::thread::yield_now();
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let s = std::fs::read_to_string(path).ok()?;
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}

/// Wall and CPU seconds of some work.
#[derive(Clone, Copy, Default)]
pub(crate) struct Timing {
    pub(crate) wall: f64,
    pub(crate) cpu: Option<f64>,
}

/// The timing of `etrace_grad` over `t` steps, fed in calls of at most
/// `chunk` steps (0 = one call); the learner's state carries over between
/// calls and generating the data is not timed.
pub(crate) fn run_grad<M: Model>(
    learner: &mut Learner<M>,
    loss: Loss,
    t: usize,
    chunk: usize,
    batch: usize,
    seed: u64,
    ce: bool,
) -> Result<Timing> {
    let chunk = if chunk == 0 { t } else { chunk.min(t) };
    let mut acc = Timing {
        wall: 0.0,
        cpu: Some(0.0),
    };
    let mut done = 0;
    while done < t {
        let n = chunk.min(t - done);
        let (xs, ys) = if ce {
            zoo::ce_sequences(n, batch, N_IN, N_OUT, seed + done as u64)?
        } else {
            sequences(n, batch, seed + done as u64)?
        };
        let (c0, t0) = (process_cpu_s(), Instant::now());
        let out = learner.etrace_grad(&xs, &ys, loss, Reduction::Mean)?;
        acc.wall += t0.elapsed().as_secs_f64();
        acc.cpu = match (acc.cpu, c0, process_cpu_s()) {
            (Some(a), Some(c0), Some(c1)) => Some(a + (c1 - c0)),
            _ => None,
        };
        black_box(out);
        done += n;
    }
    Ok(acc)
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn measure<M: Model>(
    model: M,
    cfg: &Config,
    budget_s: f64,
    runs: usize,
) -> Result<Measured> {
    let state = ModelState::new(&model, DType::F32, SEED, Some(cfg.batch))?;
    // `BENCH_IN_STEP_PATHS=once` measures the learning signal with in-step
    // paths counted once (`InStepPaths::Once`) instead of braintrace's.
    let paths = match std::env::var("BENCH_IN_STEP_PATHS").as_deref() {
        Ok("once") => InStepPaths::Once,
        _ => InStepPaths::Twice,
    };
    let nt = match std::env::var("BENCH_NON_TEMPORAL").as_deref() {
        Ok("in_step") => NonTemporal::InStep,
        _ => NonTemporal::Zero,
    };
    let algo: Algorithm = match cfg.algo.as_str() {
        // braintrace's zeros for parameters without a relation and its
        // learning signal (in-step paths counted twice), neither the
        // default: the work the reference scripts measure.
        "d_rtrl" => DRtrl::default()
            .fast_paths(!cfg.generic)
            .non_temporal(NonTemporal::Zero)
            .in_step_paths(paths)
            .trace_dtype(
                trace_dtype(&cfg.trace_dtype)
                    .map_err(|e| braintrace::Error::invalid("bench_learn", e))?,
            )
            .into(),
        "snap1" | "snap2" => SnAp::new(if cfg.algo == "snap1" { 1 } else { 2 })?
            .non_temporal(NonTemporal::Zero)
            .into(),
        "uoro" => Uoro::default().non_temporal(NonTemporal::Zero).into(),
        "random_projection" => {
            RandomProjection(Uoro::default().non_temporal(NonTemporal::Zero)).into()
        }
        "pp_prop" => PpProp::new(PP_DECAY)?
            .non_temporal(NonTemporal::Zero)
            .in_step_paths(paths)
            .into(),
        // braintrace's zeros for parameters without a relation (not the
        // default) here too: the work the reference measures.
        // `BENCH_NON_TEMPORAL=in_step` measures the default instead.
        "eprop" => EProp::default().non_temporal(nt).into(),
        "three_factor" => ThreeFactor::new(1.0)?.non_temporal(nt).into(),
        "ostl_recurrent" => OstlRecurrent::default().non_temporal(nt).into(),
        "ostl_feedforward" => OstlFeedforward::default().non_temporal(nt).into(),
        // Any other name with its defaults (`Algorithm::by_name`).
        other => Algorithm::by_name(other)?,
    };
    let x0 = Tensor::zeros(&[cfg.batch, N_IN], DType::F32);
    let t0 = Instant::now();
    let mut learner = compile(model, state, algo, &x0, Some(cfg.batch))?;
    // `BENCH_NON_FINITE=allow` measures without the learner's scan for NaN
    // and infinities (braintrace has none); the default scans.
    if std::env::var("BENCH_NON_FINITE").as_deref() == Ok("allow") {
        learner.set_non_finite(braintrace::learn::NonFinite::Allow);
    }
    // DNI runs only with a synthesiser: braintrace's default, zeros (the
    // exit estimate is computed and pushed back all the same).
    if let Some(dni) = learner.algorithm().get::<braintrace::learn::Dni>() {
        dni.attach_synthesizer(braintrace::learn::SyntheticGradient::for_graph(
            learner.graph(),
            DType::F32,
        )?);
    }
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    if cfg.explain {
        eprintln!("{}", learner.explain());
    }

    // Warm-up: a few steps, which also estimate the time per step (from the
    // CPU time when available: wall time on a loaded machine overestimates).
    let warm = cfg.t.clamp(1, 3);
    let ce = zoo::uses_ce(&cfg.model);
    let first = run_grad(
        &mut learner,
        loss_of(cfg),
        warm,
        cfg.chunk,
        cfg.batch,
        7,
        ce,
    )?;
    let est = first.cpu.unwrap_or(first.wall) / warm as f64;
    let mut steps = cfg.t;
    if budget_s > 0.0 && est * cfg.t as f64 > budget_s {
        steps = ((budget_s / est) as usize).clamp(3.min(cfg.t), cfg.t);
    }
    // The floor's buffers come after the learner's peak so far (compile and
    // a first call) is recorded.
    let rss_before_floor = peak_rss_mb();
    let mut floor = cfg.floor.then(|| Floor::of(cfg)).flatten();
    let (mut floor_wall, mut floor_cpu) = (Vec::new(), Vec::new());
    // Up to `runs` timed runs while the budget lasts (at least one).
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    let mut spent = 0.0;
    while wall.len() < runs.max(1) && (wall.is_empty() || spent < budget_s) {
        let seed = 11 + 1_000_000 * wall.len() as u64;
        let tm = run_grad(
            &mut learner,
            loss_of(cfg),
            steps,
            cfg.chunk,
            cfg.batch,
            seed,
            ce,
        )?;
        wall.push(tm.wall / steps as f64);
        if let Some(c) = tm.cpu {
            cpu.push(c / steps as f64);
        }
        spent += tm.cpu.unwrap_or(tm.wall);
        if let Some(fl) = floor.as_mut() {
            let (c0, t0) = (process_cpu_s(), Instant::now());
            for _ in 0..steps {
                fl.step();
            }
            floor_wall.push(t0.elapsed().as_secs_f64() / steps as f64);
            if let (Some(c0), Some(c1)) = (c0, process_cpu_s()) {
                floor_cpu.push((c1 - c0) / steps as f64);
            }
        }
    }
    let runs = wall.len();
    let floor = floor.map(|fl| {
        // VmHWM now counts the floor's buffers (all touched) on top of the
        // learner's own peak during the timed runs.
        let own = peak_rss_mb().map(|end| end - fl.bytes() as f64 / (1 << 20) as f64);
        let kind = fl.kind();
        let rss = match (rss_before_floor, own) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        MeasuredFloor {
            kind,
            ms_per_step: median(&mut floor_wall) * 1e3,
            cpu_ms_per_step: (floor_cpu.len() == runs).then(|| median(&mut floor_cpu) * 1e3),
            rss,
        }
    });
    if cfg.profile {
        print_profile(&mut learner, cfg, steps)?;
    }
    Ok(Measured {
        ms_per_step: median(&mut wall) * 1e3,
        cpu_ms_per_step: (cpu.len() == runs).then(|| median(&mut cpu) * 1e3),
        floor,
        runs,
        compile_ms,
        first_call_ms: first.wall * 1e3,
        steps_timed: steps,
        work: learner.work(),
    })
}

/// One more run of `steps` steps with the per-op profile on; its table on
/// stderr.
pub(crate) fn print_profile<M: Model>(
    learner: &mut Learner<M>,
    cfg: &Config,
    steps: usize,
) -> Result<()> {
    use braintrace::graph::profile;
    profile::reset();
    profile::set_enabled(true);
    let ce = zoo::uses_ce(&cfg.model);
    let tm = run_grad(learner, loss_of(cfg), steps, cfg.chunk, cfg.batch, 99, ce);
    profile::set_enabled(false);
    let tm = tm?;
    let mut rows = profile::report();
    // Ranked by the median-based estimate: a run that included time the
    // thread was descheduled inflates a row's total, not its median.
    let est = |r: &profile::ProfileRow| r.median.as_secs_f64() * r.count as f64;
    rows.sort_by(|a, b| est(b).total_cmp(&est(a)));
    let total: f64 = rows.iter().map(|r| r.total.as_secs_f64()).sum();
    let total_est: f64 = rows.iter().map(est).sum();
    let per_step = |s: f64| s / steps as f64 * 1e3;
    eprintln!(
        "\nprofile: {} {} n_rec {} batch {}, {steps} steps: op time {:.4} ms/step \
         (median-based {:.4}), wall {:.4} ms/step (cpu {:.4}), {} op rows",
        cfg.model,
        cfg.algo,
        cfg.n_rec,
        cfg.batch,
        per_step(total),
        per_step(total_est),
        per_step(tm.wall),
        tm.cpu.map_or(f64::NAN, per_step),
        rows.len()
    );
    eprintln!(
        "{:>9} {:>6} {:>9} {:>9} {:>6}  {:<40} shapes",
        "us/step", "%", "med us", "mean us", "n/step", "op"
    );
    let mut long = Vec::new();
    for r in rows.iter().take(30) {
        let t = est(r);
        let op: String = if r.op.chars().count() > 40 {
            long.push(&r.op);
            r.op.chars().take(37).chain("...".chars()).collect()
        } else {
            r.op.clone()
        };
        eprintln!(
            "{:>9.2} {:>6.1} {:>9.2} {:>9.2} {:>6}  {:<40} {}",
            per_step(t) * 1e3,
            100.0 * t / total_est.max(1e-12),
            r.median.as_secs_f64() * 1e6,
            r.total.as_secs_f64() / r.count as f64 * 1e6,
            r.count / steps as u64,
            op,
            r.shapes
        );
    }
    for op in long {
        eprintln!("  {op}");
    }
    Ok(())
}

pub(crate) fn run_config(cfg: &Config, budget_s: f64, runs: usize) -> Result<serde_json::Value> {
    let m = match cfg.model.as_str() {
        "gru" => measure(gru_net(N_IN, cfg.n_rec, N_OUT), cfg, budget_s, runs)?,
        "gru_tanh" => measure(gru_tanh_net(N_IN, cfg.n_rec, N_OUT), cfg, budget_s, runs)?,
        "gru_macro" | "gru_macro_rules" => {
            let net = gru_net(N_IN, cfg.n_rec, N_OUT);
            let declared = cfg.model == "gru_macro";
            measure(GruMacro { net, declared }, cfg, budget_s, runs)?
        }
        "sparse" => measure(
            LeakyNet::sparse(N_IN, cfg.n_rec, N_OUT),
            cfg,
            budget_s,
            runs,
        )?,
        "lora" => measure(LeakyNet::lora(N_IN, cfg.n_rec, N_OUT), cfg, budget_s, runs)?,
        "conv" => measure(LeakyNet::conv(N_IN, cfg.n_rec, N_OUT), cfg, budget_s, runs)?,
        z if zoo::is_zoo(z) => measure(zoo::net(z, N_IN, cfg.n_rec, N_OUT)?, cfg, budget_s, runs)?,
        "lif_syn" => measure(
            snn_nets::RecurrentSnn::lif_syn(N_IN, cfg.n_rec, N_OUT)?,
            cfg,
            budget_s,
            runs,
        )?,
        "alif" => measure(
            snn_nets::RecurrentSnn::alif(N_IN, cfg.n_rec, N_OUT)?,
            cfg,
            budget_s,
            runs,
        )?,
        _ => measure(lif_net(N_IN, cfg.n_rec, N_OUT), cfg, budget_s, runs)?,
    };
    let rss = match &m.floor {
        Some(f) => f.rss,
        None => peak_rss_mb(),
    };
    let rss = rss.map_or(serde_json::Value::Null, |r| round(r, 1).into());
    let mut v = serde_json::json!({
        "impl": "braintrace-rs",
        "model": cfg.model,
        "algo": cfg.algo,
        "n_in": N_IN,
        "n_rec": cfg.n_rec,
        "n_out": N_OUT,
        "batch": cfg.batch,
        "T": cfg.t,
        "ms_per_step": round(m.ms_per_step, 4),
        "cpu_ms_per_step": m.cpu_ms_per_step.map(|c| round(c, 4)),
        "compile_ms": round(m.compile_ms, 2),
        "peak_rss_mb": rss,
        "steps_timed": m.steps_timed,
        "runs": m.runs,
        "first_call_ms": round(m.first_call_ms, 2),
        "chunk": cfg.chunk,
        "fast_paths": cfg.algo == "d_rtrl" && !cfg.generic,
        "threads": cfg.threads.map_or_else(|| "auto".into(), serde_json::Value::from),
        "pool_threads": rayon::current_num_threads(),
        "work_trace_mb": round(m.work.trace_bytes as f64 / 1e6, 2),
        "work_mmacs": round(m.work.macs as f64 / 1e6, 2),
        "work_est_ms": round(m.work.estimate_ns() / 1e6, 3),
        "auto_splits": m.work.splits(),
        "trace_dtype": cfg.trace_dtype,
    });
    if let Some(f) = m.floor {
        let vs = f
            .cpu_ms_per_step
            .zip(m.cpu_ms_per_step)
            .map(|(f, c)| round(c / f, 3));
        v["floor"] = f.kind.into();
        v["floor_ms_per_step"] = round(f.ms_per_step, 4).into();
        v["floor_cpu_ms_per_step"] = f.cpu_ms_per_step.map(|c| round(c, 4)).into();
        v["vs_floor"] = vs.into();
    }
    Ok(v)
}

pub(crate) fn round(v: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (v * p).round() / p
}
