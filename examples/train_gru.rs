//! Online training of a GRU network on evidence accumulation: count left and
//! right cues over many steps, hold the count through a delay, answer on a
//! go signal. Trained with D-RTRL (or `--algo pp-prop`), one Adam step per
//! batch of trials, memory constant in the trial length.
//!
//! Run with `cargo run --release --example train_gru` (`-- --help` for the
//! options). Writes `target/train_gru/training.svg` and
//! `target/train_gru/params.safetensors`, and exits with an error when the
//! test accuracy stays below the threshold.

mod support;

use braintrace::nn::{Chain, GruCell, Linear, LstmCell};
use clap::{Parser, ValueEnum};
use std::process::ExitCode;
use support::{Algo, Common, Defaults, EvidenceTask};

/// Train a GRU online on evidence accumulation.
#[derive(Parser, Debug)]
#[command(about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// The recurrent cell: the GRU, or an LSTM (whose cell state `c` feeds
    /// its output `h` inside the step: see `--in-step-paths`).
    #[arg(long, value_enum, default_value_t = Cell::Gru)]
    cell: Cell,
}

/// The recurrent cell to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Cell {
    Gru,
    Lstm,
}

const DEFAULTS: Defaults = Defaults {
    name: "train_gru",
    algo: Algo::DRtrl,
    hidden: 32,
    steps: 800,
    quick_steps: 10,
    lr: 0.003,
    threshold: 0.9,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = cli.common.resolve(&DEFAULTS);
    let task = EvidenceTask {
        cue_steps: 30,
        delay_steps: 10,
        go_steps: 2,
        p_cue: 0.5,
        p_major: 0.6,
        spikes: None,
    };
    let outcome = match cli.cell {
        Cell::Gru => run(
            &cfg,
            &task,
            "GRU",
            GruCell::new("rnn", task.n_in(), cfg.hidden),
        ),
        Cell::Lstm => LstmCell::new("rnn", task.n_in(), cfg.hidden)
            .map_err(|e| e.to_string())
            .and_then(|c| run(&cfg, &task, "LSTM", c)),
    };
    support::exit_code(outcome)
}

fn run<C: braintrace::learn::Model>(
    cfg: &support::Config,
    task: &EvidenceTask,
    name: &str,
    cell: C,
) -> std::result::Result<bool, String> {
    // A recurrent cell `rnn` and a linear readout `readout` of its output.
    let model = Chain::new(cell, Linear::new("readout", cfg.hidden, task.n_out()));
    println!(
        "evidence accumulation: {} cue steps, {} delay steps, {} go steps; {} with {} units, {}",
        task.cue_steps,
        task.delay_steps,
        task.go_steps,
        name,
        cfg.hidden,
        cfg.algo.label()
    );
    support::train_and_finish(
        model,
        task,
        cfg,
        &format!("{name}, evidence accumulation, {}", cfg.algo.label()),
    )
}
