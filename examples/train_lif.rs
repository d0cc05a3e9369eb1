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

mod spike_example;
mod support;

use braintrace::nn::{Chain, LeakyRateReadout, LifCell};
use spike_example::Example;
use std::process::ExitCode;

fn main() -> ExitCode {
    let ex = Example {
        name: "train_lif",
        about: "Train a spiking (LIF) network online on evidence accumulation.",
        cell: "LIF",
    };
    spike_example::main(&ex, |cfg, task| {
        let dt = 1.0;
        // A recurrent LIF layer `lif` and a leaky readout `readout` of its spikes.
        Ok(Chain::new(
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
        ))
    })
}
