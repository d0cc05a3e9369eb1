//! Online training of a spiking network on evidence accumulation: a
//! recurrent layer of leaky integrate-and-fire neurons (surrogate spike
//! gradient) reads Poisson spike trains that carry left and right cues and a
//! go signal; a leaky rate readout of its spikes gives the answer. Trained
//! with pp_prop (ES-D-RTRL; or `--algo d-rtrl`), one Adam step per batch of trials.
//!
//! Run with `cargo run --release --example train_lif` (`-- --help` for the
//! options). Writes `target/train_lif/training.svg` and
//! `target/train_lif/params.safetensors`, and exits with an error when the
//! test accuracy stays below the threshold.

mod support;

use braintrace::nn::{Chain, LeakyRateReadout, LifCell};
use clap::Parser;
use std::process::ExitCode;
use support::{Algo, Common, Defaults, EvidenceTask, SpikeCode};

/// Train a spiking (LIF) network online on evidence accumulation.
#[derive(Parser, Debug)]
#[command(about)]
struct Cli {
    #[command(flatten)]
    common: Common,
}

const DEFAULTS: Defaults = Defaults {
    name: "train_lif",
    algo: Algo::PpProp,
    hidden: 64,
    steps: 600,
    quick_steps: 10,
    lr: 0.001,
    threshold: 0.85,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = cli.common.resolve(&DEFAULTS);
    let task = EvidenceTask {
        cue_steps: 20,
        delay_steps: 5,
        go_steps: 2,
        p_cue: 0.5,
        p_major: 0.7,
        spikes: Some(SpikeCode {
            per_channel: 8,
            rate: 0.6,
            noise: 0.02,
        }),
    };
    match run(&cfg, &task) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cfg: &support::Config, task: &EvidenceTask) -> std::result::Result<bool, String> {
    let dt = 1.0;
    // A recurrent LIF layer `lif` and a leaky readout `readout` of its spikes.
    let model = Chain::new(
        // membrane time constant 20 steps, synaptic current 5 steps, threshold 1
        LifCell::new(
            "lif",
            task.n_in(),
            cfg.hidden,
            (-dt / 20.0f64).exp(),
            (-dt / 5.0f64).exp(),
            1.0,
        ),
        // readout time constant 10 steps
        LeakyRateReadout::new("readout", cfg.hidden, task.n_out(), 10.0, dt),
    );
    println!(
        "evidence accumulation in spikes: {} cue steps, {} delay steps, {} go steps, {} input neurons; {} LIF neurons, {}",
        task.cue_steps,
        task.delay_steps,
        task.go_steps,
        task.n_in(),
        cfg.hidden,
        cfg.algo.label()
    );
    let mut learner = support::make_learner(model, cfg, task.n_in()).map_err(|e| e.to_string())?;
    let mut rng = braintrace::nn::Rng::seed(cfg.seed.wrapping_add(77));
    let eval = task.sample(256, &mut rng).map_err(|e| e.to_string())?;
    let hist = support::train(&mut learner, task, cfg, &eval, 10).map_err(|e| e.to_string())?;
    support::finish(
        &learner,
        task,
        cfg,
        &hist,
        &format!("LIF network, evidence accumulation, {}", cfg.algo.label()),
    )
}
