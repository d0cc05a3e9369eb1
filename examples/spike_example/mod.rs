//! What `train_lif` and `train_alif` share: their command line (the
//! training options of [`Common`](super::support::Common) and the
//! defaults of a spiking example), the evidence-accumulation task in
//! Poisson spikes, and the run from a built network to the final check.
//! Each example supplies its name, its `--help` line and its network.

use super::support::{self, Algo, Common, Config, Defaults, EvidenceTask, SpikeCode};
use braintrace::learn::Model;
use clap::{Args, Command, FromArgMatches};
use std::process::ExitCode;

/// The command line of a spiking example.
#[derive(Args, Debug)]
struct Cli {
    #[command(flatten)]
    common: Common,
}

/// A spiking example: its name (the output folder `target/<name>`), the
/// `--help` line, and the cell's name in the messages ("LIF", "ALIF").
pub struct Example {
    pub name: &'static str,
    pub about: &'static str,
    pub cell: &'static str,
}

/// The task both examples learn: 20 cue steps (a cue at half the steps,
/// 70% on the majority side), a 5-step delay, a 2-step go signal, each
/// channel coded by 8 Poisson neurons.
fn task() -> EvidenceTask {
    EvidenceTask {
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
    }
}

/// Parse the command line, build the network with `build(cfg, task)` and
/// train it online (pp_prop by default, 64 neurons, 600 iterations, Adam
/// at 0.001; `--quick`: 10), exiting with failure when the test accuracy
/// stays below 0.85 (or on an error).
pub fn main<M: Model>(
    ex: &Example,
    build: impl FnOnce(&Config, &EvidenceTask) -> Result<M, String>,
) -> ExitCode {
    // After `augment_args`, which sets `about` from `Cli`'s doc comment.
    let cmd = Cli::augment_args(Command::new(ex.name)).about(ex.about);
    let cli = match Cli::from_arg_matches(&cmd.get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let defaults = Defaults {
        name: ex.name,
        algo: Algo::PpProp,
        hidden: 64,
        steps: 600,
        quick_steps: 10,
        lr: 0.001,
        threshold: 0.85,
    };
    let cfg = cli.common.resolve(&defaults);
    let task = task();
    support::exit_code(build(&cfg, &task).and_then(|model| run(ex, model, &cfg, &task)))
}

fn run<M: Model>(
    ex: &Example,
    model: M,
    cfg: &Config,
    task: &EvidenceTask,
) -> Result<bool, String> {
    println!(
        "evidence accumulation in spikes: {} cue steps, {} delay steps, {} go steps, {} input neurons; {} {} neurons, {}",
        task.cue_steps,
        task.delay_steps,
        task.go_steps,
        task.n_in(),
        cfg.hidden,
        ex.cell,
        cfg.algo.label()
    );
    support::train_and_finish(
        model,
        task,
        cfg,
        &format!(
            "{} network, evidence accumulation, {}",
            ex.cell,
            cfg.algo.label()
        ),
    )
}
