//! The learning layer by property: random small models assembled from the
//! layers and ETP primitives (built-in, and one defined here with the
//! macros), random algorithms and options, random valid and hostile
//! inputs (wrong shapes and dtypes, NaN and infinities). Every call must return (never panic); every error must name
//! what it refuses; after an error the learner is exactly as before
//! (parameters, hidden states, traces); a valid call gives finite
//! gradients shaped like the parameters; the staged step (`update`) gives
//! the eager step's output; and on models where D-RTRL is exact (the
//! recurrence element-wise), its gradients equal BPTT's.
//!
//! A case is one call on a compiled learner: `CONFIGS` random
//! configurations, `CALLS` calls each. The seed is fixed so that a failure
//! reproduces; `BRAINTRACE_PROPTEST_SEED` picks another, and
//! `BRAINTRACE_PROPTEST_LEARN_CONFIGS` another number of configurations.

mod common;
mod learn_support;

use braintrace::learn::{
    bptt_grad, compile, Algorithm, DRtrl, InStepPaths, Init, Learner, Model, ModelState,
    NonTemporal, PpProp, Reduction, StepCtx, TensorDict, VjpMethod,
};
use braintrace::nn::{
    Chain, GruCell, LifCell, Linear, LstmCell, MguCell, MinimalRnnCell, VanillaRnnCell,
};
use braintrace::prelude::*;
use common::Lcg as Rng;
use learn_support::models::DiagNet;
use learn_support::mse;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

const CALLS: usize = 6;

// ------------------------------------------------------------ a macro-defined primitive

/// y = (x @ w) * scale, x `(B, I)`, w `(I, O)`.
#[etp_primitive(name = "etp_prop_learn_op", batched, x = x, weight = w)]
fn prop_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(prop_op)]
fn prop_op_yw_to_w(hidden: &Tensor, trace: &Tensor, _p: &prop_op::Params) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

#[xy_to_dw(prop_op)]
fn prop_op_xy_to_dw(
    x: &Tensor,
    hidden: &Tensor,
    _w: &Tensor,
    p: &prop_op::Params,
) -> Result<Tensor> {
    let outer = if x.ndim() == 1 {
        x.expand_dims(1)?.mul(&hidden.expand_dims(0)?)?
    } else {
        x.t()?.matmul(hidden)?
    };
    outer.mul_scalar(p.scale)
}

#[init_drtrl(prop_op)]
fn prop_op_init_drtrl(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    let shape = [&[x.shape()[0]], w.shape(), &[num_hidden_state]].concat();
    Ok(Tensor::zeros(&shape, y.dtype()))
}

#[init_pp(prop_op)]
fn prop_op_init_pp(_x: &Aval, y: &Aval, _w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[y.shape(), &[num_hidden_state]].concat(),
        y.dtype(),
    ))
}

/// `v' = 0.6·v + tanh(prop_op(x, W))`: the recurrence element-wise, so
/// D-RTRL is exact.
struct MacroLeaky {
    n_in: usize,
    n_rec: usize,
}

impl Model for MacroLeaky {
    fn init(&self, init: &mut Init) -> Result<()> {
        let w = Tensor::from_vec(
            (0..self.n_in * self.n_rec)
                .map(|i| ((i * 7 % 11) as f64 - 5.0) / 6.0)
                .collect(),
            &[self.n_in, self.n_rec],
        )?
        .cast(init.dtype())?;
        init.param("mac", Some("w"), w)?;
        init.hidden("v", &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let v = ctx.hidden("v")?;
        let y = prop_op(x, &ctx.param("mac/w")?, 0.8)?;
        let v_new = v.mul_scalar(0.6)?.add(&y.tanh()?)?;
        ctx.set_hidden("v", v_new.clone())?;
        Ok(v_new)
    }
}

// ------------------------------------------------------------ random configurations

/// Any model, behind one type.
struct Net(Box<dyn Model>);

impl Model for Net {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.0.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        self.0.step(ctx, x)
    }
}

const CELLS: [&str; 9] = [
    "gru", "lstm", "lif", "vanilla", "mgu", "minimal", "diag", "diag_raw", "macro",
];

#[derive(Clone, Debug)]
struct Cfg {
    cell: &'static str,
    n_in: usize,
    n_rec: usize,
    n_out: usize,
    batch: Option<usize>,
    dtype: DType,
    algo: AlgoCfg,
    seed: u64,
}

#[derive(Clone, Debug)]
struct AlgoCfg {
    pp_decay: Option<f64>,
    multi: bool,
    zero: bool,
    fast: bool,
    once: bool,
}

impl AlgoCfg {
    fn build(&self) -> Algorithm {
        let vjp = if self.multi {
            VjpMethod::MultiStep
        } else {
            VjpMethod::SingleStep
        };
        let nt = if self.zero {
            NonTemporal::Zero
        } else {
            NonTemporal::InStep
        };
        let paths = if self.once {
            InStepPaths::Once
        } else {
            InStepPaths::Twice
        };
        match self.pp_decay {
            Some(d) => PpProp::new(d)
                .unwrap()
                .vjp_method(vjp)
                .non_temporal(nt)
                .in_step_paths(paths)
                .fast_paths(self.fast)
                .into(),
            None => DRtrl::default()
                .vjp_method(vjp)
                .non_temporal(nt)
                .in_step_paths(paths)
                .fast_paths(self.fast)
                .into(),
        }
    }
}

impl Cfg {
    fn draw(r: &mut Rng) -> Cfg {
        let cell = CELLS[r.below(CELLS.len())];
        // The macro-defined primitive is declared `batched`: its `x` has
        // the batch axis.
        let batches: &[Option<usize>] = if cell == "macro" {
            &[Some(1), Some(2), Some(3)]
        } else {
            &[None, Some(1), Some(2), Some(3)]
        };
        Cfg {
            cell,
            n_in: 1 + r.below(3),
            n_rec: 1 + r.below(4),
            n_out: 1 + r.below(2),
            batch: batches[r.below(batches.len())],
            dtype: if r.below(2) == 0 {
                DType::F64
            } else {
                DType::F32
            },
            algo: AlgoCfg {
                pp_decay: if r.below(2) == 0 {
                    None
                } else {
                    Some(r.range(0.0, 0.99))
                },
                multi: r.below(4) == 0,
                zero: r.below(2) == 0,
                fast: r.below(3) != 0,
                once: r.below(2) == 0,
            },
            seed: r.next_u64() % 1000,
        }
    }

    /// The model; the element-wise ones have no readout (their output is
    /// the hidden state, `n_out = n_rec`).
    fn model(&self) -> Net {
        let (i, h, o) = (self.n_in, self.n_rec, self.n_out);
        let out = || Linear::new("out", h, o);
        Net(match self.cell {
            "gru" => Box::new(Chain::new(GruCell::new("rnn", i, h), out())),
            "lstm" => Box::new(Chain::new(LstmCell::new("rnn", i, h).unwrap(), out())),
            "lif" => Box::new(Chain::new(LifCell::new("rnn", i, h, 0.9, 0.7, 0.5), out())),
            "vanilla" => Box::new(Chain::new(VanillaRnnCell::new("rnn", i, h).unwrap(), out())),
            "mgu" => Box::new(Chain::new(MguCell::new("rnn", i, h).unwrap(), out())),
            "minimal" => Box::new(Chain::new(MinimalRnnCell::new("rnn", i, h).unwrap(), out())),
            "diag" => Box::new(DiagNet::new(i, h)),
            "diag_raw" => Box::new(DiagNet::identity(i, h)),
            "macro" => Box::new(MacroLeaky { n_in: i, n_rec: h }),
            c => unreachable!("{c}"),
        })
    }

    fn n_out(&self) -> usize {
        match self.cell {
            "diag" | "diag_raw" | "macro" => self.n_rec,
            _ => self.n_out,
        }
    }

    /// D-RTRL is exact here: the recurrence element-wise, one state, the
    /// single-step signal.
    fn exact(&self) -> bool {
        matches!(self.cell, "diag" | "diag_raw" | "macro")
            && self.algo.pp_decay.is_none()
            && !self.algo.multi
            && self.dtype == DType::F64
    }

    /// A step's input shape (with the batch axis when batched).
    fn x_shape(&self) -> Vec<usize> {
        match self.batch {
            Some(b) => vec![b, self.n_in],
            None => vec![self.n_in],
        }
    }
    fn y_shape(&self) -> Vec<usize> {
        match self.batch {
            Some(b) => vec![b, self.n_out()],
            None => vec![self.n_out()],
        }
    }
}

fn data(r: &mut Rng, shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(r.vec(n), shape)
        .unwrap()
        .cast(dtype)
        .unwrap()
}

// ------------------------------------------------------------ the calls

/// What a learner is made of, to check that an error changed nothing.
#[derive(PartialEq, Debug)]
struct Snapshot {
    params: Vec<(String, Vec<f64>)>,
    hidden: Vec<(String, Vec<f64>)>,
    traces: Vec<Vec<f64>>,
}

fn flat(d: &TensorDict) -> Vec<(String, Vec<f64>)> {
    d.iter()
        .map(|(k, t)| (k.clone(), t.to_vec_f64().unwrap()))
        .collect()
}

fn snapshot(l: &Learner<Net>) -> Snapshot {
    Snapshot {
        params: flat(&l.state().params()),
        hidden: flat(&l.state().hidden()),
        traces: l.traces().iter().map(|t| t.to_vec_f64().unwrap()).collect(),
    }
}

/// A hostile sequence: `(xs, ys, what the error must mention)`.
fn hostile(r: &mut Rng, cfg: &Cfg) -> (Tensor, Tensor, &'static [&'static str]) {
    let t = 1 + r.below(3);
    let (xs_ok, ys_ok) = (
        [&[t], &cfg.x_shape()[..]].concat(),
        [&[t], &cfg.y_shape()[..]].concat(),
    );
    let extra = 1 + r.below(2);
    let mut wide = xs_ok.clone();
    *wide.last_mut().unwrap() += extra;
    match r.below(7) {
        // A NaN or an infinity in the inputs or the targets (the learner's
        // default `NonFinite::Error`).
        5 | 6 => {
            let (mut xs, mut ys) = (data(r, &xs_ok, cfg.dtype), data(r, &ys_ok, cfg.dtype));
            let bad = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][r.below(3)];
            let target = if r.below(2) == 0 { &mut xs } else { &mut ys };
            let mut v = target.to_vec_f64().unwrap();
            let i = r.below(v.len());
            v[i] = bad;
            *target = Tensor::from_vec(v, target.shape())
                .unwrap()
                .cast(cfg.dtype)
                .unwrap();
            (xs, ys, &["etrace_grad: input"])
        }
        // Wrong input width.
        0 => (
            data(r, &wide, cfg.dtype),
            data(r, &ys_ok, cfg.dtype),
            &["etrace_grad"],
        ),
        // Targets over another number of steps.
        1 => (
            data(r, &xs_ok, cfg.dtype),
            data(r, &[&[t + 1], &cfg.y_shape()[..]].concat(), cfg.dtype),
            &["etrace_grad"],
        ),
        // One axis too few (the steps only).
        2 => (
            data(r, &[t], cfg.dtype),
            data(r, &ys_ok, cfg.dtype),
            &["etrace_grad"],
        ),
        // Integer inputs.
        3 => (
            data(r, &xs_ok, cfg.dtype).cast(DType::I64).unwrap(),
            data(r, &ys_ok, cfg.dtype),
            &["etrace_grad"],
        ),
        // One axis too many.
        _ => (
            data(r, &[&xs_ok[..], &[2]].concat(), cfg.dtype),
            data(r, &ys_ok, cfg.dtype),
            &["etrace_grad"],
        ),
    }
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let scale = b.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[derive(Default, Debug)]
struct Tally {
    configs: usize,
    cases: usize,
    valid: usize,
    refused: usize,
    exact_checked: usize,
    staged_checked: usize,
}

/// One configuration: compile, then `CALLS` calls. Returns the failures.
fn run_config(cfg: &Cfg, r: &mut Rng, tally: &mut Tally) -> Vec<String> {
    let mut fails = Vec::new();
    let model = cfg.model();
    let state = match ModelState::new(&model, cfg.dtype, cfg.seed, cfg.batch) {
        Ok(s) => s,
        Err(e) => return vec![format!("{cfg:?}: ModelState::new failed: {e}")],
    };
    let x0 = data(r, &cfg.x_shape(), cfg.dtype);
    let fresh_state = state.clone();
    let mut learner = match compile(model, state, cfg.algo.build(), &x0, cfg.batch) {
        Ok(l) => l,
        Err(e) => return vec![format!("{cfg:?}: compile failed: {e}")],
    };
    tally.configs += 1;
    let mut fresh = true;
    for call in 0..CALLS {
        tally.cases += 1;
        let what = format!("{cfg:?}, call {call}");
        // The first call of an exact configuration is a valid sequence, so
        // that D-RTRL meets BPTT from zero traces.
        let pick = if fresh && cfg.exact() { 2 } else { r.below(4) };
        match pick {
            // A hostile sequence: an error naming the entry point, nothing changed.
            0 => {
                let (xs, ys, names) = hostile(r, cfg);
                let before = snapshot(&learner);
                match learner.etrace_grad(&xs, &ys, mse, Reduction::Mean) {
                    Ok(_) => fails.push(format!(
                        "{what}: hostile xs {:?} / ys {:?} accepted",
                        xs.shape(),
                        ys.shape()
                    )),
                    Err(e) => {
                        tally.refused += 1;
                        let msg = e.to_string();
                        if !names.iter().any(|n| msg.contains(n)) {
                            fails.push(format!("{what}: error `{msg}` names none of {names:?}"));
                        }
                        if snapshot(&learner) != before {
                            fails.push(format!("{what}: the refused call changed the learner"));
                        }
                    }
                }
            }
            // The staged step against the eager step.
            1 => {
                let x = data(r, &cfg.x_shape(), cfg.dtype);
                let eager = learner.state().step(learner.model(), &x).map(|(o, _)| o);
                match (learner.update(&x), eager) {
                    (Ok(a), Ok(b)) => {
                        tally.staged_checked += 1;
                        let tol = if cfg.dtype == DType::F64 { 1e-12 } else { 1e-5 };
                        let d = max_rel(&a, &b);
                        if d > tol {
                            fails.push(format!("{what}: staged step off the eager one by {d:e}"));
                        }
                    }
                    (a, b) => fails.push(format!(
                        "{what}: update {:?} / eager {:?}",
                        a.err(),
                        b.err()
                    )),
                }
                fresh = false;
            }
            // No steps: zero gradients, nothing changed.
            3 if r.below(4) == 0 => {
                let xs = data(r, &[&[0], &cfg.x_shape()[..]].concat(), cfg.dtype);
                let ys = data(r, &[&[0], &cfg.y_shape()[..]].concat(), cfg.dtype);
                let before = snapshot(&learner);
                match learner.etrace_grad(&xs, &ys, mse, Reduction::Mean) {
                    Err(e) => fails.push(format!("{what}: an empty sequence refused: {e}")),
                    Ok(g) => {
                        tally.valid += 1;
                        let nonzero = g
                            .grads
                            .values()
                            .any(|v| v.to_vec_f64().unwrap().iter().any(|x| *x != 0.0));
                        if nonzero || snapshot(&learner) != before {
                            fails.push(format!("{what}: an empty sequence changed something"));
                        }
                    }
                }
            }
            // A valid sequence: finite gradients shaped like the parameters,
            // and BPTT's where D-RTRL is exact and the traces start at zero.
            _ => {
                let t = 1 + r.below(4);
                let xs = data(r, &[&[t], &cfg.x_shape()[..]].concat(), cfg.dtype);
                let ys = data(r, &[&[t], &cfg.y_shape()[..]].concat(), cfg.dtype);
                let exact = fresh && cfg.exact();
                let bptt = exact.then(|| {
                    bptt_grad(
                        learner.model(),
                        &fresh_state,
                        &xs,
                        &ys,
                        mse,
                        Reduction::Mean,
                    )
                });
                match learner.etrace_grad(&xs, &ys, mse, Reduction::Mean) {
                    Err(e) => fails.push(format!("{what}: valid sequence refused: {e}")),
                    Ok(g) => {
                        tally.valid += 1;
                        let params = learner.state().params();
                        if g.grads.keys().ne(params.keys()) {
                            fails.push(format!("{what}: gradient keys differ from the parameters"));
                        }
                        for (k, v) in &g.grads {
                            if params.get(k).map(|p| p.shape()) != Some(v.shape()) {
                                fails.push(format!("{what}: gradient of {k} misshapen"));
                            }
                            if v.to_vec_f64().unwrap().iter().any(|x| !x.is_finite()) {
                                fails.push(format!("{what}: gradient of {k} not finite"));
                            }
                        }
                        if let Some(b) = bptt {
                            match b {
                                Err(e) => fails.push(format!("{what}: bptt_grad failed: {e}")),
                                Ok(b) => {
                                    tally.exact_checked += 1;
                                    for (k, w) in &b.grads {
                                        let d = max_rel(&g.grads[k], w);
                                        if d > 1e-9 {
                                            fails.push(format!(
                                                "{what}: D-RTRL {k} off BPTT by {d:e}"
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                fresh = false;
            }
        }
    }
    fails
}

#[test]
fn learning_layer_properties() {
    let seed = std::env::var("BRAINTRACE_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1ea5_u64);
    let configs: usize = std::env::var("BRAINTRACE_PROPTEST_LEARN_CONFIGS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(850);
    let mut r = Rng::new(seed);
    let mut tally = Tally::default();
    let mut fails = Vec::new();
    let t0 = Instant::now();
    for _ in 0..configs {
        let cfg = Cfg::draw(&mut r);
        let mut sub = Rng::new(r.next_u64());
        let out = catch_unwind(AssertUnwindSafe(|| {
            let mut t = Tally::default();
            let f = run_config(&cfg, &mut sub, &mut t);
            (f, t)
        }));
        match out {
            Ok((f, t)) => {
                fails.extend(f);
                tally.configs += t.configs;
                tally.cases += t.cases;
                tally.valid += t.valid;
                tally.refused += t.refused;
                tally.exact_checked += t.exact_checked;
                tally.staged_checked += t.staged_checked;
            }
            Err(_) => fails.push(format!("{cfg:?}: panicked")),
        }
    }
    println!(
        "learning-layer properties: {tally:?} in {:.1} s (seed {seed:#x})",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        fails.is_empty(),
        "{} failure(s):\n{}",
        fails.len(),
        fails[..fails.len().min(60)].join("\n")
    );
    assert!(tally.cases >= configs * CALLS, "{tally:?}");
    assert!(tally.exact_checked > 0 && tally.refused > 0 && tally.staged_checked > 0);
}
