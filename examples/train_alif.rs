//! Online training of an adaptive spiking network on evidence
//! accumulation: a recurrent layer of adaptive LIF neurons (`nn::Alif`,
//! brainpy.state's ALIF: the threshold rises with each spike and relaxes
//! over `τ_a`) behind an exponential synapse (`nn::Expon`) reads Poisson
//! spike trains that carry left and right cues and a go signal; a leaky
//! rate readout of its spikes gives the answer. Trained with pp_prop
//! (ES-D-RTRL; or `--algo d-rtrl`), one Adam step per batch of trials.
//!
//! Run with `cargo run --release --example train_alif` (`-- --help` for
//! the options; `-- --quick` for a smoke run). Writes
//! `target/train_alif/training.svg` and `target/train_alif/params.safetensors`,
//! and exits with an error when the test accuracy stays below the threshold.

mod snn_nets;
mod support;

use braintrace::nn::{Alif, Expon, LeakyRateReadout, Linear};
use braintrace::Surrogate;
use clap::Parser;
use snn_nets::{Cell, RecurrentSnn};
use std::process::ExitCode;
use support::{Algo, Common, Defaults, EvidenceTask, SpikeCode};

/// Train an adaptive spiking (ALIF) network online on evidence accumulation.
#[derive(Parser, Debug)]
#[command(about)]
struct Cli {
    #[command(flatten)]
    common: Common,
}

const DEFAULTS: Defaults = Defaults {
    name: "train_alif",
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
    let e = |e: braintrace::Error| e.to_string();
    let (dt, n, n_in) = (1.0, cfg.hidden, task.n_in());
    // Membrane τ = 20 steps with R = 20, so one step adds about the
    // synaptic current (e·V + (1 − e)·R·i, 1 − e ≈ 1/20); synapse τ = 5;
    // adaptation τ_a = 50 steps (the trial's length), β = 0.1.
    let alif = Alif::new("neu", n, 20.0, 50.0, dt)
        .map_err(e)?
        .with_beta(0.1)
        .with_lif(|l| l.with_resistance(20.0).with_surrogate(Surrogate::default()));
    let model = RecurrentSnn {
        syn_in: Linear::new("syn_in", n_in + n, n),
        syn: Some(Expon::new("syn", n, 5.0, dt).map_err(e)?),
        cell: Cell::Alif(alif),
        // readout time constant 10 steps
        readout: LeakyRateReadout::new("readout", n, task.n_out(), 10.0, dt),
    };
    println!(
        "evidence accumulation in spikes: {} cue steps, {} delay steps, {} go steps, {} input neurons; {} ALIF neurons, {}",
        task.cue_steps,
        task.delay_steps,
        task.go_steps,
        n_in,
        n,
        cfg.algo.label()
    );
    let mut learner = support::make_learner(model, cfg, n_in).map_err(|e| e.to_string())?;
    let mut rng = braintrace::nn::Rng::seed(cfg.seed.wrapping_add(77));
    let eval = task.sample(256, &mut rng).map_err(|e| e.to_string())?;
    let hist = support::train(&mut learner, task, cfg, &eval, 10).map_err(|e| e.to_string())?;
    support::finish(
        &learner,
        task,
        cfg,
        &hist,
        &format!("ALIF network, evidence accumulation, {}", cfg.algo.label()),
    )
}
