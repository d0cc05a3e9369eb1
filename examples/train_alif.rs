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
mod spike_example;
mod support;

use braintrace::nn::{Alif, Expon, LeakyRateReadout, Linear};
use braintrace::Surrogate;
use snn_nets::{Cell, RecurrentSnn};
use spike_example::Example;
use std::process::ExitCode;

fn main() -> ExitCode {
    let ex = Example {
        name: "train_alif",
        about: "Train an adaptive spiking (ALIF) network online on evidence accumulation.",
        cell: "ALIF",
    };
    spike_example::main(&ex, |cfg, task| {
        let e = |e: braintrace::Error| e.to_string();
        let (dt, n, n_in) = (1.0, cfg.hidden, task.n_in());
        // Membrane τ = 20 steps with R = 20, so one step adds about the
        // synaptic current (e·V + (1 − e)·R·i, 1 − e ≈ 1/20); synapse τ = 5;
        // adaptation τ_a = 50 steps (the trial's length), β = 0.1.
        let alif = Alif::new("neu", n, 20.0, 50.0, dt)
            .map_err(e)?
            .with_beta(0.1)
            .with_lif(|l| l.with_resistance(20.0).with_surrogate(Surrogate::default()));
        Ok(RecurrentSnn {
            syn_in: Linear::new("syn_in", n_in + n, n),
            syn: Some(Expon::new("syn", n, 5.0, dt).map_err(e)?),
            cell: Cell::Alif(alif),
            // readout time constant 10 steps
            readout: LeakyRateReadout::new("readout", n, task.n_out(), 10.0, dt),
        })
    })
}
