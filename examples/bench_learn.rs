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

mod floor;
mod snn_nets;
mod zoo;

use braintrace::etp::ElemFn;
use braintrace::learn::{
    compile, Algorithm, DRtrl, InStepPaths, Init, Model, ModelState, NonTemporal, PpProp,
    RandomProjection, SnAp, StepCtx, Uoro,
};
use braintrace::learn::{EProp, OstlFeedforward, OstlRecurrent, ThreeFactor};
use braintrace::learn::{Learner, Reduction};
use braintrace::nn::Initializer;
use braintrace::nn::{Chain, GruCell, LeakyRateReadout, LifCell, Linear};
use braintrace::ops::{ConvPadding, ConvParams};
use braintrace::prims::{conv, lora_matmul, sparse_matmul, CsrStructure, Transforms};
use braintrace::{DType, Result, Tensor};
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use floor::{ProductsFloor, TraceFloor};

const N_IN: usize = 16;
const N_OUT: usize = 4;
const PP_DECAY: f64 = 0.95;
const SEED: u64 = 0;

// ---------------------------------------------------------------------------
// the two benchmark models (the golden `gru` and `lif` nets)
// ---------------------------------------------------------------------------

/// `gru`: GRUCell `rnn` then Linear `out`.
fn gru_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<GruCell, Linear> {
    Chain::new(
        GruCell::new("rnn", n_in, n_rec),
        Linear::new("out", n_rec, n_out),
    )
}

/// `lif`: a LIF cell (states `i`, `v`) then a leaky readout of its spikes,
/// with the golden hyperparameters: β, γ, v_th, readout τ = 5 with dt = 1.
fn lif_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<LifCell, LeakyRateReadout> {
    Chain::new(
        LifCell::new("", n_in, n_rec, 0.8, 0.6, 1.0),
        LeakyRateReadout::new("readout", n_rec, n_out, 5.0, 1.0),
    )
}

/// `gru_tanh`: the `gru` net with `weight_fn = tanh` on the cell's three
/// products (dense relations with a weight transform).
fn gru_tanh_net(n_in: usize, n_rec: usize, n_out: usize) -> Chain<GruCell, Linear> {
    let mut net = gru_net(n_in, n_rec, n_out);
    for l in [&mut net.first.wz, &mut net.first.wr, &mut net.first.wh] {
        l.weight_fn = ElemFn::builtin("tanh");
    }
    net
}

// ---------------------------------------------------------------------------
// `gru_macro` / `gru_macro_rules`: the GRU with its three products an
// `#[etp_primitive]` (`y = x @ W + b`), with a declared dense trace kernel
// or with its rules only.
// ---------------------------------------------------------------------------

/// `xᵀ h` for one sample (`x (I,)`, `h (O,)`: the learner calls a batched
/// primitive's rules per sample) or a batch.
fn outer_xh(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.matmul(&h.expand_dims(0)?)
    } else {
        x.transpose(&[1, 0])?.matmul(h)
    }
}

/// The rules both bench primitives share: weight `(.., I, O)`, bias `(.., O)`.
mod dense_rules {
    use super::*;

    pub fn yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
        trace
            .iter()
            .map(|(k, t)| {
                let f = if k == "bias" {
                    t.mul(h)?
                } else {
                    t.mul(&h.expand_dims(h.ndim() - 1)?)?
                };
                Ok((k.clone(), f))
            })
            .collect()
    }
    pub fn dw(x: &Tensor, h: &Tensor) -> Result<TensorMap> {
        let db = if h.ndim() == 2 {
            h.sum(&[0])?
        } else {
            h.clone()
        };
        Ok([
            ("weight".to_string(), outer_xh(x, h)?),
            ("bias".to_string(), db),
        ]
        .into())
    }
    pub fn init(y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
        let lead = &y.shape()[..y.ndim() - 1];
        Ok([
            (
                "weight".to_string(),
                Tensor::zeros(&[lead, w["weight"].shape(), &[n]].concat(), y.dtype()),
            ),
            (
                "bias".to_string(),
                Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()),
            ),
        ]
        .into())
    }
    pub fn init_pp(y: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
    }
}

use braintrace::etp::{AvalMap, TensorMap};
use braintrace::{etp_primitive, init_drtrl, init_pp, xy_to_dw, yw_to_w, Aval};

/// `y = x @ W + b`, declaring the dense trace kernel.
#[etp_primitive(name = "etp_bench_dense", batched, x = x, weight = [weight, bias], trace_kernel = dense)]
fn bench_dense(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}
#[yw_to_w(bench_dense)]
fn bench_dense_yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    dense_rules::yw(h, trace)
}
#[xy_to_dw(bench_dense)]
fn bench_dense_dw(x: &Tensor, h: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    dense_rules::dw(x, h)
}
#[init_drtrl(bench_dense)]
fn bench_dense_init(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    dense_rules::init(y, w, n)
}
#[init_pp(bench_dense)]
fn bench_dense_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    dense_rules::init_pp(y, n)
}

/// The same op with its rules only (no trace kernel).
#[etp_primitive(name = "etp_bench_dense_rules", batched, x = x, weight = [weight, bias])]
fn bench_dense_rules(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(weight)?.add(bias)
}
#[yw_to_w(bench_dense_rules)]
fn bench_dense_rules_yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    dense_rules::yw(h, trace)
}
#[xy_to_dw(bench_dense_rules)]
fn bench_dense_rules_dw(x: &Tensor, h: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    dense_rules::dw(x, h)
}
#[init_drtrl(bench_dense_rules)]
fn bench_dense_rules_init(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    dense_rules::init(y, w, n)
}
#[init_pp(bench_dense_rules)]
fn bench_dense_rules_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    dense_rules::init_pp(y, n)
}

/// The `gru` net with its cell's products through `bench_dense`
/// (`declared`) or `bench_dense_rules`; the same parameters and step.
struct GruMacro {
    net: Chain<GruCell, Linear>,
    declared: bool,
}

impl Model for GruMacro {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.net.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let cell = &self.net.first;
        let lin = |ctx: &StepCtx, l: &Linear, x: &Tensor| -> Result<Tensor> {
            let (w, b) = (ctx.param(&l.weight_key())?, ctx.param(&l.bias_key())?);
            if self.declared {
                bench_dense(x, &w, &b)
            } else {
                bench_dense_rules(x, &w, &b)
            }
        };
        let cat = |a: &Tensor, b: &Tensor| braintrace::concat(&[a.clone(), b.clone()], 1);
        let h = ctx.hidden(&cell.hidden_path())?;
        let xh = cat(x, &h)?;
        let z = lin(ctx, &cell.wz, &xh)?.sigmoid()?;
        let r = lin(ctx, &cell.wr, &xh)?.sigmoid()?;
        let hc = lin(ctx, &cell.wh, &cat(x, &r.mul(&h)?)?)?.tanh()?;
        let h_new = z.rsub_scalar(1.0)?.mul(&h)?.add(&z.mul(&hc)?)?;
        ctx.set_hidden(&cell.hidden_path(), h_new.clone())?;
        self.net.second.step(ctx, &h_new)
    }
}

/// The recurrent product of a [`LeakyNet`].
#[derive(Clone, Debug)]
enum Product {
    /// `etp_sp_mm` over a fixed pattern holding about 10 % of the entries.
    Sparse(CsrStructure),
    /// `etp_lora_mm` of rank `r`, α = 1 / r.
    Lora(usize),
    /// `etp_conv` (1-D, kernel 3, SAME) over `[x, h]` as channels: `x`
    /// `(B, 16)` is one channel of length 16, `h` is `(B, O, 16)` with
    /// `O = n_rec / 16` channels.
    Conv,
}

/// `sparse` / `lora`: a leaky rate RNN `h' = 0.9 h + tanh(P([x, h]) + b)`
/// over a sparse or a LoRA product `P`, then a `Linear` readout `out`.
struct LeakyNet {
    product: Product,
    n_in: usize,
    n_rec: usize,
    out: Linear,
}

impl LeakyNet {
    fn sparse(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        let structure = CsrStructure::from_dense_pattern(n_in + n_rec, n_rec, |r, c| {
            (r * 7 + c * 13) % 10 == 0
        });
        LeakyNet {
            product: Product::Sparse(structure),
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
    fn conv(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        LeakyNet {
            product: Product::Conv,
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
    fn lora(n_in: usize, n_rec: usize, n_out: usize) -> Self {
        LeakyNet {
            product: Product::Lora(8),
            n_in,
            n_rec,
            out: Linear::new("out", n_rec, n_out),
        }
    }
}

impl Model for LeakyNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        let fan_in = (self.n_in + self.n_rec) as f64;
        let draw = |init: &mut Init, k: &str, shape: &[usize], std: f64| -> Result<()> {
            let v = Initializer::Normal { std }.draw(shape, init.dtype(), init.rng())?;
            init.param(k, None, v)
        };
        match &self.product {
            Product::Sparse(st) => draw(init, "rnn/w", &[st.nnz()], (10.0 / fan_in).sqrt())?,
            Product::Conv => {}
            Product::Lora(r) => {
                draw(
                    init,
                    "rnn/B",
                    &[self.n_in + self.n_rec, *r],
                    fan_in.sqrt().recip(),
                )?;
                draw(init, "rnn/A", &[*r, self.n_rec], 1.0)?;
            }
        }
        if let Product::Conv = self.product {
            let o = self.n_rec / self.n_in;
            draw(
                init,
                "rnn/K",
                &[o, o + 1, 3],
                (3.0 * (o + 1) as f64).sqrt().recip(),
            )?;
            draw(init, "rnn/b", &[o], 0.1)?;
            init.hidden("rnn/h", &[o, self.n_in])?;
            return self.out.init(init);
        }
        draw(init, "rnn/b", &[self.n_rec], 0.1)?;
        init.hidden("rnn/h", &[self.n_rec])?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("rnn/h")?;
        if let Product::Conv = self.product {
            let xc = x.expand_dims(1)?; // (B, 1, 16)
            let xh = braintrace::ops::concat(&[xc, h.clone()], 1)?;
            let cp = ConvParams::default_for(1).with_padding(ConvPadding::Same);
            let (k, b) = (ctx.param("rnn/K")?, ctx.param("rnn/b")?);
            let y = conv(&xh, &k, Some(&b), &cp, &Transforms::default())?;
            let h_new = h.mul_scalar(0.9)?.add(&y.tanh()?)?;
            ctx.set_hidden("rnn/h", h_new.clone())?;
            let flat = h_new.reshape(&[h_new.shape()[0], self.n_rec])?;
            return self.out.step(ctx, &flat);
        }
        let xh = braintrace::ops::concat(&[x.clone(), h.clone()], x.ndim() - 1)?;
        let b = ctx.param("rnn/b")?;
        let t = Transforms::default();
        let y = match &self.product {
            Product::Sparse(st) => sparse_matmul(&xh, &ctx.param("rnn/w")?, st, Some(&b), &t)?,
            Product::Conv => unreachable!("handled above"),
            Product::Lora(r) => {
                let (lb, la) = (ctx.param("rnn/B")?, ctx.param("rnn/A")?);
                lora_matmul(&xh, &lb, &la, 1.0 / *r as f64, Some(&b), &t)?
            }
        };
        let h_new = h.mul_scalar(0.9)?.add(&y.tanh()?)?;
        ctx.set_hidden("rnn/h", h_new.clone())?;
        self.out.step(ctx, &h_new)
    }
}

// ---------------------------------------------------------------------------
// configurations and arguments
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Config {
    /// Threads (`None`: the library's choice, called from the main thread).
    threads: Option<usize>,
    /// The D-RTRL traces' precision (`model`, `f32`, `bf16`).
    trace_dtype: String,
    model: String,
    algo: String,
    n_rec: usize,
    batch: usize,
    t: usize,
    /// Steps per `etrace_grad` call (0 = the whole sequence in one call).
    chunk: usize,
    /// D-RTRL without its fused trace kernels (every relation through its
    /// registered rules).
    generic: bool,
    /// Print a per-op profile after the configuration.
    profile: bool,
    /// Print the learner's `explain()` after compiling.
    explain: bool,
    /// Time the configuration's floor (`examples/floor`) alternately with
    /// the learner.
    floor: bool,
}

struct Args {
    models: Vec<String>,
    algos: Vec<String>,
    n_recs: Vec<usize>,
    batches: Vec<usize>,
    ts: Vec<usize>,
    budget_s: f64,
    runs: usize,
    chunk: usize,
    generic: bool,
    child: bool,
    in_process: bool,
    profile: bool,
    explain: bool,
    no_plan: bool,
    /// Per entry: a thread count, or `None` for the library's own choice.
    threads: Vec<Option<usize>>,
    trace_dtypes: Vec<String>,
    rounds: usize,
    floor: bool,
}

/// The models `--model` accepts (the default grid runs `gru` and `lif`).
const MODELS: [&str; 10] = [
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

const USAGE: &str = "usage: bench_learn [--model gru,lif,gru_tanh,sparse,lora,conv,gru_macro,gru_macro_rules,lif_syn,alif,<cell>[_ce]] [--algo d_rtrl,pp_prop,snap1,snap2,<any Algorithm::by_name name>] \
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

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> std::result::Result<Vec<T>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("{flag}: cannot parse `{s}`"))
        })
        .collect()
}

fn parse_args() -> std::result::Result<Args, String> {
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

fn configs(a: &Args) -> Vec<Config> {
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

// ---------------------------------------------------------------------------
// one configuration
// ---------------------------------------------------------------------------

/// Deterministic f32 values in `[lo, hi)` (a 64-bit LCG; no `rand`).
fn det_f32(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Result<Tensor> {
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
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The floor of a configuration (`--floor`): which one, its wall and CPU
/// ms per step, and the learner's own peak RSS, without the floor's buffers.
struct MeasuredFloor {
    kind: &'static str,
    ms_per_step: f64,
    cpu_ms_per_step: Option<f64>,
    rss: Option<f64>,
}

/// The floor `--floor` times beside a configuration's learner.
enum Floor {
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

struct Measured {
    ms_per_step: f64,
    cpu_ms_per_step: Option<f64>,
    floor: Option<MeasuredFloor>,
    compile_ms: f64,
    first_call_ms: f64,
    steps_timed: usize,
    runs: usize,
    /// The learner's estimate of a step's work (`Learner::work`).
    work: braintrace::threads::Work,
}

fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

/// A loss of the readout and the targets.
type Loss = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// The spiking zoo's models train with a cross-entropy (soft targets
/// `softmax(y)`), the others with the mean squared error.
fn loss_of(cfg: &Config) -> Loss {
    match cfg.model.as_str() {
        "lif_syn" | "alif" => snn_nets::soft_cross_entropy,
        z if zoo::uses_ce(z) => zoo::ce_loss,
        _ => mse,
    }
}

fn sequences(t: usize, batch: usize, seed: u64) -> Result<(Tensor, Tensor)> {
    // Inputs in [0, 1) so the LIF net receives drive; targets in [-1, 1).
    let xs = det_f32(&[t, batch, N_IN], seed, 0.0, 1.0)?;
    let ys = det_f32(&[t, batch, N_OUT], seed + 1, -1.0, 1.0)?;
    Ok((xs, ys))
}

/// CPU time of this process so far in seconds: the sum over its threads of
/// the on-CPU time in `/proc/self/task/*/schedstat` (nanoseconds). On a
/// shared machine it is far steadier than wall time.
fn process_cpu_s() -> Option<f64> {
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
struct Timing {
    wall: f64,
    cpu: Option<f64>,
}

/// The timing of `etrace_grad` over `t` steps, fed in calls of at most
/// `chunk` steps (0 = one call); the learner's state carries over between
/// calls and generating the data is not timed.
fn run_grad<M: Model>(
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure<M: Model>(model: M, cfg: &Config, budget_s: f64, runs: usize) -> Result<Measured> {
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
fn print_profile<M: Model>(learner: &mut Learner<M>, cfg: &Config, steps: usize) -> Result<()> {
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

fn run_config(cfg: &Config, budget_s: f64, runs: usize) -> Result<serde_json::Value> {
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

fn round(v: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (v * p).round() / p
}

// ---------------------------------------------------------------------------
// driver
// ---------------------------------------------------------------------------

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
