//! What the training examples share: the command line, the evidence-
//! accumulation task, the online training loop with its progress bar, the
//! loss/accuracy plot and saving/reloading the trained parameters.

#![allow(dead_code)] // each example uses a different part of it

use braintrace::learn::{
    compile, DRtrl, InStepPaths, Learner, Model, ModelState, NonTemporal, PpProp, Reduction,
};
use braintrace::nn::optim::{clip_grad_norm, Adam, Optimizer};
use braintrace::nn::{io, Rng};
use braintrace::{DType, Result, Tensor};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The online learning algorithm to train with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Algo {
    /// D-RTRL: eligibility traces of parameter size (diagonal approximation).
    DRtrl,
    /// ES-D-RTRL / pp_prop: low-rank traces of input and output size.
    PpProp,
}

impl Algo {
    /// The algorithm's usual name.
    pub fn label(self) -> &'static str {
        match self {
            Algo::DRtrl => "D-RTRL",
            Algo::PpProp => "pp_prop",
        }
    }
}

/// How the learning signal counts an in-step path between two states of
/// one group (`InStepPaths`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Paths {
    /// Once: exact wherever D-RTRL's approximation is.
    Once,
    /// Twice, as braintrace 0.2.6 (the library's default).
    Twice,
}

impl From<Paths> for InStepPaths {
    fn from(p: Paths) -> Self {
        match p {
            Paths::Once => InStepPaths::Once,
            Paths::Twice => InStepPaths::Twice,
        }
    }
}

/// The precision of the eligibility traces (`trace_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TracePrecision {
    /// The model's (f32).
    Model,
    /// bfloat16: half the trace memory and bandwidth (D-RTRL only).
    Bf16,
}

impl TracePrecision {
    pub fn dtype(self) -> braintrace::learn::TraceDType {
        match self {
            TracePrecision::Model => braintrace::learn::TraceDType::Model,
            TracePrecision::Bf16 => braintrace::learn::TraceDType::BF16,
        }
    }
}

/// Options every training example takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Online learning algorithm (default: the example's).
    #[arg(long, value_enum)]
    pub algo: Option<Algo>,
    /// How an in-step path between two states of a group (an LSTM's c → h,
    /// a LIF's current → voltage) enters the learning signal.
    #[arg(long, value_enum, default_value_t = Paths::Twice)]
    pub in_step_paths: Paths,
    /// Decay of pp_prop's traces (with `--algo pp-prop`).
    #[arg(long, default_value_t = 0.9)]
    pub pp_decay: f64,
    /// Precision of the eligibility traces.
    #[arg(long, value_enum, default_value_t = TracePrecision::Model)]
    pub trace_dtype: TracePrecision,
    /// Number of recurrent units (default: the example's).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Number of training iterations, one batch of trials each (default: the example's).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Trials per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Adam learning rate (default: the example's).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Seed of the initial weights and of the trials.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for the plot and the saved weights (default: target/<example>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A few iterations only, to check that everything runs (the accuracy
    /// threshold is not checked).
    #[arg(long)]
    pub quick: bool,
    /// Accuracy the run must reach (fraction; default: the example's).
    #[arg(long)]
    pub threshold: Option<f64>,
}

/// The per-example defaults of [`Common`]'s optional options.
pub struct Defaults {
    pub name: &'static str,
    pub algo: Algo,
    pub hidden: usize,
    pub steps: usize,
    pub quick_steps: usize,
    pub lr: f64,
    pub threshold: f64,
}

/// [`Common`] with the defaults filled in.
pub struct Config {
    pub name: &'static str,
    pub algo: Algo,
    pub in_step_paths: InStepPaths,
    pub pp_decay: f64,
    pub trace_dtype: TracePrecision,
    pub hidden: usize,
    pub steps: usize,
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
    pub out: PathBuf,
    pub quick: bool,
    pub threshold: f64,
}

impl Common {
    pub fn resolve(&self, d: &Defaults) -> Config {
        Config {
            name: d.name,
            algo: self.algo.unwrap_or(d.algo),
            in_step_paths: self.in_step_paths.into(),
            pp_decay: self.pp_decay,
            trace_dtype: self.trace_dtype,
            hidden: self.hidden.unwrap_or(d.hidden),
            steps: self
                .steps
                .unwrap_or(if self.quick { d.quick_steps } else { d.steps }),
            batch: self.batch,
            lr: self.lr.unwrap_or(d.lr),
            seed: self.seed,
            out: self
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("target").join(d.name)),
            quick: self.quick,
            threshold: self.threshold.unwrap_or(d.threshold),
        }
    }
}

/// Evidence accumulation: during the cue period a cue appears on the left or
/// the right input at random steps, more often on one side; after a silent
/// delay a go signal asks which side had more cues. Chance is 50%; counting
/// gives 100%. The answer depends on inputs many steps back, so the network
/// must keep a running count in its hidden state.
#[derive(Clone, Debug)]
pub struct EvidenceTask {
    /// Steps with cues.
    pub cue_steps: usize,
    /// Silent steps between the cues and the go signal.
    pub delay_steps: usize,
    /// Steps with the go signal; the loss is applied on them, the answer is
    /// read at the last one.
    pub go_steps: usize,
    /// Probability of a cue at each cue step.
    pub p_cue: f64,
    /// Probability that a cue is on the trial's majority side.
    pub p_major: f64,
    /// Input neurons per channel; `Some(n)` encodes each channel (left,
    /// right, go) as `n` Poisson spike trains with `rate` while the channel
    /// is on and `noise` otherwise. `None`: three analog inputs in {0, 1}.
    pub spikes: Option<SpikeCode>,
}

/// How channels are encoded as spikes.
#[derive(Clone, Copy, Debug)]
pub struct SpikeCode {
    /// Neurons per channel.
    pub per_channel: usize,
    /// Spike probability per step while the channel is on.
    pub rate: f64,
    /// Spike probability per step while it is off.
    pub noise: f64,
}

/// One batch of trials, time-major.
pub struct Batch {
    /// `(T, B, n_in)`.
    pub xs: Tensor,
    /// `(T, B, 2)`: the one-hot answer on go steps, zeros elsewhere.
    pub ys: Tensor,
    /// The answer of each trial (0 left, 1 right).
    pub labels: Vec<usize>,
}

impl EvidenceTask {
    pub fn seq_len(&self) -> usize {
        self.cue_steps + self.delay_steps + self.go_steps
    }
    pub fn n_in(&self) -> usize {
        3 * self.spikes.map_or(1, |s| s.per_channel)
    }
    pub fn n_out(&self) -> usize {
        2
    }
    /// Draw `batch` trials (ties in the cue counts are drawn again).
    pub fn sample(&self, batch: usize, rng: &mut Rng) -> Result<Batch> {
        let t_len = self.seq_len();
        let n_in = self.n_in();
        let mut xs = vec![0f32; t_len * batch * n_in];
        let mut ys = vec![0f32; t_len * batch * 2];
        let mut labels = Vec::with_capacity(batch);
        for b in 0..batch {
            // channel[t] for t in the cue period: None, Some(0) left, Some(1) right.
            let (cues, label) = loop {
                let major = rng.below(2);
                let mut counts = [0usize; 2];
                let cues: Vec<Option<usize>> = (0..self.cue_steps)
                    .map(|_| {
                        (rng.uniform() < self.p_cue).then(|| {
                            let side = if rng.uniform() < self.p_major {
                                major
                            } else {
                                1 - major
                            };
                            counts[side] += 1;
                            side
                        })
                    })
                    .collect();
                if counts[0] != counts[1] {
                    break (cues, usize::from(counts[1] > counts[0]));
                }
            };
            labels.push(label);
            for t in 0..t_len {
                let mut on = [false; 3];
                if t < self.cue_steps {
                    if let Some(c) = cues[t] {
                        on[c] = true;
                    }
                }
                let go = t >= self.cue_steps + self.delay_steps;
                on[2] = go;
                let row = &mut xs[(t * batch + b) * n_in..(t * batch + b + 1) * n_in];
                match self.spikes {
                    None => {
                        for (v, &o) in row.iter_mut().zip(&on) {
                            *v = f32::from(u8::from(o));
                        }
                    }
                    Some(code) => {
                        for (c, &o) in on.iter().enumerate() {
                            let p = if o { code.rate } else { code.noise };
                            for v in &mut row[c * code.per_channel..(c + 1) * code.per_channel] {
                                *v = f32::from(u8::from(rng.uniform() < p));
                            }
                        }
                    }
                }
                if go {
                    ys[(t * batch + b) * 2 + label] = 1.0;
                }
            }
        }
        Ok(Batch {
            xs: Tensor::from_vec_typed(xs, &[t_len, batch, n_in])?,
            ys: Tensor::from_vec_typed(ys, &[t_len, batch, 2])?,
            labels,
        })
    }
}

/// Softmax cross-entropy of logits `o` `(B, C)` against `y` `(B, C)`, summed
/// over classes and averaged over the batch. `y` is a one-hot answer on the
/// steps that count and zeros elsewhere, so other steps contribute nothing.
pub fn masked_cross_entropy(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    let lse = o.exp()?.sum(&[1])?.log()?.expand_dims(1)?;
    let b = o.shape()[0] as f64;
    y.mul(&lse.sub(o)?)?.sum_all()?.mul_scalar(1.0 / b)
}

/// Compile `model` with the configured algorithm (readouts learn in-step).
pub fn make_learner<M: Model>(model: M, cfg: &Config, n_in: usize) -> Result<Learner<M>> {
    let state = ModelState::new(&model, DType::F32, cfg.seed, Some(cfg.batch))?;
    let x0 = Tensor::zeros(&[cfg.batch, n_in], DType::F32);
    match cfg.algo {
        Algo::DRtrl => compile(
            model,
            state,
            // InStep is the default (the readout learns); spelled out because
            // braintrace's `Zero` would leave the readout untrained.
            DRtrl::default()
                .non_temporal(NonTemporal::InStep)
                .in_step_paths(cfg.in_step_paths)
                .trace_dtype(cfg.trace_dtype.dtype()),
            &x0,
            Some(cfg.batch),
        ),
        Algo::PpProp => compile(
            model,
            state,
            PpProp::new(cfg.pp_decay)?
                .non_temporal(NonTemporal::InStep)
                .in_step_paths(cfg.in_step_paths)
                .trace_dtype(cfg.trace_dtype.dtype()),
            &x0,
            Some(cfg.batch),
        ),
    }
}

/// Run `model` eagerly over a batch from a zero state; the outputs `(T, B, C)`.
pub fn run<M: Model>(model: &M, state: &ModelState, xs: &Tensor) -> Result<Vec<Tensor>> {
    let mut s = state.clone();
    s.reset_hidden(Some(xs.shape()[1]))?;
    (0..xs.shape()[0])
        .map(|t| s.advance(model, &xs.index_axis0(t)?))
        .collect()
}

/// The fraction of trials answered right: the argmax of the output at the
/// last step.
pub fn accuracy<M: Model>(model: &M, state: &ModelState, batch: &Batch) -> Result<f64> {
    let outs = run(model, state, &batch.xs)?;
    let last = match outs.last() {
        Some(o) => o.to_vec_f64()?,
        None => return Ok(f64::NAN),
    };
    let c = last.len() / batch.labels.len();
    let right = batch
        .labels
        .iter()
        .enumerate()
        .filter(|(b, &l)| {
            let row = &last[b * c..(b + 1) * c];
            let best = (0..c)
                .max_by(|&i, &j| row[i].total_cmp(&row[j]))
                .unwrap_or(0);
            best == l
        })
        .count();
    Ok(right as f64 / batch.labels.len() as f64)
}

/// The training curve.
#[derive(Default)]
pub struct History {
    /// `(iteration, mean loss per go step)`.
    pub loss: Vec<(usize, f64)>,
    /// `(iteration, accuracy on the held-out batch)`.
    pub accuracy: Vec<(usize, f64)>,
    /// Wall time of the training loop.
    pub elapsed: Duration,
}

/// Train online: per iteration, reset the state, accumulate eligibility-trace
/// gradients over one batch of trials, clip them and take an Adam step.
/// Evaluates on `eval` every `eval_every` iterations.
pub fn train<M: Model>(
    learner: &mut Learner<M>,
    task: &EvidenceTask,
    cfg: &Config,
    eval: &Batch,
    eval_every: usize,
) -> Result<History> {
    let mut rng = Rng::seed(cfg.seed.wrapping_add(1));
    let mut opt = Adam::new(cfg.lr)?;
    let mut hist = History::default();
    let pb = ProgressBar::new(cfg.steps as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let log_plain = pb.is_hidden();
    let start = Instant::now();
    let mut last_acc = accuracy(learner.model(), learner.state(), eval)?;
    hist.accuracy.push((0, last_acc));
    let mut smooth = f64::NAN;
    for it in 0..cfg.steps {
        let b = task.sample(cfg.batch, &mut rng)?;
        learner.reset_state(Some(cfg.batch))?;
        let r = learner.etrace_grad(&b.xs, &b.ys, masked_cross_entropy, Reduction::Sum)?;
        let loss = r.losses.sum_all()?.item()? / task.go_steps as f64;
        let (grads, _norm) = clip_grad_norm(&r.grads, 1.0)?;
        opt.step(learner.state_mut(), &grads)?;
        hist.loss.push((it + 1, loss));
        smooth = if smooth.is_nan() {
            loss
        } else {
            0.95 * smooth + 0.05 * loss
        };
        if (it + 1) % eval_every == 0 || it + 1 == cfg.steps {
            last_acc = accuracy(learner.model(), learner.state(), eval)?;
            hist.accuracy.push((it + 1, last_acc));
            if log_plain {
                println!(
                    "iteration {:>5}/{}  loss {smooth:.4}  accuracy {:.1}%  ({:.1} s)",
                    it + 1,
                    cfg.steps,
                    100.0 * last_acc,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        pb.set_message(format!("loss {smooth:.4}  acc {:.1}%", 100.0 * last_acc));
        pb.inc(1);
    }
    pb.finish();
    hist.elapsed = start.elapsed();
    Ok(hist)
}

/// Write the loss and accuracy curves as an SVG (two panels).
pub fn plot(hist: &History, title: &str, path: &Path) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (720, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(250);
    let n = hist.loss.len().max(1);
    // A running mean over 20 iterations makes the trend visible; the axis
    // follows it (single noisy iterations may leave the panel).
    let w = 20.min(n).min(hist.loss.len()).max(1);
    let smooth: Vec<(usize, f64)> = hist
        .loss
        .windows(w)
        .map(|win| {
            (
                win[w - 1].0,
                win.iter().map(|p| p.1).sum::<f64>() / w as f64,
            )
        })
        .collect();
    let max_loss = smooth
        .iter()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let mut c = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..n, 0.0..max_loss * 1.2)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("iteration")
        .y_desc("loss")
        .draw()
        .map_err(|e| err(&e))?;
    c.draw_series(LineSeries::new(
        hist.loss.iter().map(|&(i, l)| (i, l)),
        BLUE.mix(0.35),
    ))
    .map_err(|e| err(&e))?;
    c.draw_series(LineSeries::new(smooth, BLUE.stroke_width(2)))
        .map_err(|e| err(&e))?;
    let mut c = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..n, 0.0..1.0)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("iteration")
        .y_desc("accuracy (held-out)")
        .draw()
        .map_err(|e| err(&e))?;
    c.draw_series(LineSeries::new(
        hist.accuracy.iter().copied(),
        RED.stroke_width(2),
    ))
    .map_err(|e| err(&e))?;
    c.draw_series(LineSeries::new([(0, 0.5), (n, 0.5)], BLACK.mix(0.4)))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Save the trained parameters, load them into a fresh state (initialised
/// from another seed) and check that the reloaded model's outputs on `batch`
/// are bit-identical.
pub fn save_and_check<M: Model>(
    model: &M,
    state: &ModelState,
    path: &Path,
    batch: &Batch,
) -> std::result::Result<(), String> {
    io::save_params(state, path).map_err(|e| e.to_string())?;
    let mut fresh =
        ModelState::new(model, state.dtype(), 0xDEAD_BEEF, None).map_err(|e| e.to_string())?;
    io::load_params(&mut fresh, path).map_err(|e| e.to_string())?;
    let a = run(model, state, &batch.xs).map_err(|e| e.to_string())?;
    let b = run(model, &fresh, &batch.xs).map_err(|e| e.to_string())?;
    for (t, (x, y)) in a.iter().zip(&b).enumerate() {
        let (x, y) = (
            x.to_array_f32().map_err(|e| e.to_string())?,
            y.to_array_f32().map_err(|e| e.to_string())?,
        );
        if x.iter()
            .zip(y.iter())
            .any(|(p, q)| p.to_bits() != q.to_bits())
        {
            return Err(format!("reloaded model differs at step {t}"));
        }
    }
    Ok(())
}

/// The end of every example: plot, save, reload check, final accuracy on a
/// fresh test set against the threshold. Returns whether the run passed.
pub fn finish<M: Model>(
    learner: &Learner<M>,
    task: &EvidenceTask,
    cfg: &Config,
    hist: &History,
    title: &str,
) -> std::result::Result<bool, String> {
    std::fs::create_dir_all(&cfg.out)
        .map_err(|e| format!("cannot create {}: {e}", cfg.out.display()))?;
    let plot_path = cfg.out.join("training.svg");
    plot(hist, title, &plot_path)?;
    let weights = cfg.out.join("params.safetensors");
    let mut rng = Rng::seed(cfg.seed.wrapping_add(1_000_003));
    let test = task.sample(1000, &mut rng).map_err(|e| e.to_string())?;
    save_and_check(learner.model(), learner.state(), &weights, &test)?;
    let acc = accuracy(learner.model(), learner.state(), &test).map_err(|e| e.to_string())?;
    println!(
        "trained {} iterations of {} trials in {:.1} s ({}, hidden {})",
        cfg.steps,
        cfg.batch,
        hist.elapsed.as_secs_f64(),
        cfg.algo.label(),
        cfg.hidden
    );
    println!("plot:    {}", plot_path.display());
    println!(
        "weights: {} (reloaded: outputs identical)",
        weights.display()
    );
    if let Some(&(_, a)) = hist.accuracy.last() {
        println!(
            "held-out accuracy at the end of training {:.1}% (256 trials)",
            100.0 * a
        );
    }
    let pass = acc >= cfg.threshold;
    if cfg.quick {
        println!(
            "test accuracy {:.1}% on 1000 new trials (chance 50%); quick mode, the {:.0}% threshold is not checked",
            100.0 * acc,
            100.0 * cfg.threshold
        );
        return Ok(true);
    }
    println!(
        "test accuracy {:.1}% on 1000 new trials (chance 50%, required {:.0}%): {}",
        100.0 * acc,
        100.0 * cfg.threshold,
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(pass)
}

/// Compile `model` with the configured algorithm, train it on `task` and
/// [`finish`] (the plot titled `title`); returns whether the run passed.
pub fn train_and_finish<M: Model>(
    model: M,
    task: &EvidenceTask,
    cfg: &Config,
    title: &str,
) -> std::result::Result<bool, String> {
    let mut learner = make_learner(model, cfg, task.n_in()).map_err(|e| e.to_string())?;
    let mut rng = Rng::seed(cfg.seed.wrapping_add(77));
    let eval = task.sample(256, &mut rng).map_err(|e| e.to_string())?;
    let hist = train(&mut learner, task, cfg, &eval, 10).map_err(|e| e.to_string())?;
    finish(&learner, task, cfg, &hist, title)
}

/// The exit code of a run: success when it passed, failure (with the
/// error printed) otherwise.
pub fn exit_code(outcome: std::result::Result<bool, String>) -> std::process::ExitCode {
    use std::process::ExitCode;
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
