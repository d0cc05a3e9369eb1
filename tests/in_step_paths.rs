//! In-step paths between the states of one hidden group, counted once or
//! twice (`InStepPaths`).
//!
//! With the recurrent weights at zero, every state depends on its own past
//! only element-wise, so D-RTRL's diagonal approximation is exact and its
//! gradients must equal BPTT's. Two models have a state computed from
//! another in the same step: the LSTM (`c' → h'`) and the current-based LIF
//! (`i' → v'`). braintrace 0.2.6's computation (`Twice`) counts that path
//! twice; here the LSTM's `Wi`, `Wg`, `Wf` gradients are exactly 2× BPTT's
//! (the loss sees `c'` only through `h'`, so both terms are equal), which
//! confirms the analysis, and the LIF's input weight is far from BPTT.
//! `Once` equals BPTT to 1e-12 on both. A model without such a path (GRU,
//! one state per group) gives the same numbers either way.

mod learn_support;

use braintrace::learn::{
    bptt_grad, compile, Algorithm, DRtrl, InStepPaths, Model, ModelState, NonTemporal, PpProp,
    Reduction, StepCtx, TensorDict,
};
use braintrace::nn::{LifCell, Linear, LstmCell};
use braintrace::prelude::*;
use learn_support::models::GruNet;
use learn_support::{draw, mse};

/// An LSTM cell `lstm` and a `Linear` readout `out`.
struct LstmNet {
    cell: LstmCell,
    out: Linear,
}

impl Model for LstmNet {
    fn init(&self, init: &mut braintrace::learn::Init) -> Result<()> {
        self.cell.init(init)?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = self.cell.step(ctx, x)?;
        self.out.step(ctx, &h)
    }
}

const N_IN: usize = 3;
const N_REC: usize = 4;
const T: usize = 7;
const BATCH: usize = 2;

fn lstm() -> LstmNet {
    LstmNet {
        cell: LstmCell::new("lstm", N_IN, N_REC).unwrap(),
        out: Linear::new("out", N_REC, 2),
    }
}

/// A current-based LIF cell `lif` (states `i`, `v`) and a `Linear` readout
/// of its spikes (a readout without a state of its own: a leaky readout
/// would carry the weights' past influence through another group, which
/// no trace of the cell's group holds, so D-RTRL would not be exact).
struct LifLinear {
    cell: LifCell,
    out: Linear,
}

impl Model for LifLinear {
    fn init(&self, init: &mut braintrace::learn::Init) -> Result<()> {
        self.cell.init(init)?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let s = self.cell.step(ctx, x)?;
        self.out.step(ctx, &s)
    }
}

fn lif() -> LifLinear {
    // A low threshold so that neurons spike and the reset path is used.
    LifLinear {
        cell: LifCell::new("lif", N_IN, N_REC, 0.9, 0.8, 0.3),
        out: Linear::new("out", N_REC, 2),
    }
}

/// The model's state in f64 with the rows of `[x, h]` weights that read
/// the recurrent part set to zero (every 2-D weight with `N_IN + N_REC`
/// rows); the input weights are scaled so the cells are not saturated.
fn state_without_recurrence<M: Model>(model: &M, seed: u64) -> ModelState {
    let mut state = ModelState::new(model, DType::F64, seed, Some(BATCH)).unwrap();
    let mut zeroed = 0;
    for (k, w) in state.params().clone() {
        if w.shape().len() == 2 && w.shape()[0] == N_IN + N_REC {
            let mut v = w.to_vec_f64().unwrap();
            for r in N_IN..N_IN + N_REC {
                for c in 0..w.shape()[1] {
                    v[r * w.shape()[1] + c] = 0.0;
                }
            }
            let v: Vec<f64> = v.iter().map(|a| 2.0 * a).collect();
            state
                .set_param(&k, &Tensor::from_vec(v, w.shape()).unwrap())
                .unwrap();
            zeroed += 1;
        }
    }
    assert!(zeroed > 0, "no recurrent weight was found to zero");
    state
}

/// Online D-RTRL gradients with `paths` and BPTT's, on the same data.
fn grads<M: Model>(
    make: impl Fn() -> M,
    state: &ModelState,
    algo: Algorithm,
) -> (TensorDict, TensorDict) {
    let model = &make();
    let xs = draw(&[T, BATCH, N_IN], 21).mul_scalar(1.5).unwrap();
    let (out, _) = state.step(model, &xs.index_axis0(0).unwrap()).unwrap();
    let ys = draw(&[&[T], out.shape()].concat(), 22);
    let bptt = bptt_grad(model, state, &xs, &ys, mse, Reduction::Mean).unwrap();
    let x0 = xs.index_axis0(0).unwrap();
    let mut learner = compile(make(), state.clone(), algo, &x0, Some(BATCH)).unwrap();
    let online = learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
    (online.grads, bptt.grads)
}

fn drtrl(paths: InStepPaths) -> Algorithm {
    DRtrl::default()
        .non_temporal(NonTemporal::InStep)
        .in_step_paths(paths)
        .into()
}

fn vals(d: &TensorDict, k: &str) -> Vec<f64> {
    d[k].to_vec_f64().unwrap()
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, a| m.max(a.abs()))
}

/// `max |a − b| / max |b|`.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    max_abs(&d) / max_abs(b).max(1e-300)
}

fn assert_all_close(what: &str, got: &TensorDict, want: &TensorDict, tol: f64) {
    for k in want.keys() {
        let (g, w) = (vals(got, k), vals(want, k));
        assert!(max_abs(&w) > 1e-6, "{what}: BPTT gradient of {k} is zero");
        let r = rel(&g, &w);
        assert!(r <= tol, "{what}: {k} is {r:e} (relative) away from BPTT");
    }
}

#[test]
fn lstm_without_recurrence_once_equals_bptt_and_twice_is_double() {
    let make = lstm;
    let state = state_without_recurrence(&make(), 5);
    let (once, bptt) = grads(make, &state, drtrl(InStepPaths::Once));
    assert_all_close("LSTM, once", &once, &bptt, 1e-12);

    let (twice, bptt) = grads(make, &state, drtrl(InStepPaths::Twice));
    let keys = |gate: &str| -> Vec<String> {
        let ks: Vec<String> = bptt
            .keys()
            .filter(|k| k.starts_with(&format!("lstm/{gate}/")))
            .cloned()
            .collect();
        assert!(!ks.is_empty(), "no parameter of lstm/{gate}");
        ks
    };
    for gate in ["Wi", "Wg", "Wf"] {
        for k in keys(gate) {
            let want: Vec<f64> = vals(&bptt, &k).iter().map(|v| 2.0 * v).collect();
            let r = rel(&vals(&twice, &k), &want);
            assert!(r <= 1e-12, "LSTM, twice: {k} is not 2× BPTT ({r:e})");
        }
    }
    // The output gate is computed in the same equation as h' and has no
    // in-step path through another state: exact either way.
    for k in keys("Wo") {
        let r = rel(&vals(&twice, &k), &vals(&bptt, &k));
        assert!(r <= 1e-12, "LSTM, twice: {k} off BPTT by {r:e}");
    }
}

#[test]
fn lif_without_recurrence_once_equals_bptt_and_twice_does_not() {
    let make = lif;
    let state = state_without_recurrence(&make(), 6);
    let (once, bptt) = grads(make, &state, drtrl(InStepPaths::Once));
    assert_all_close("LIF, once", &once, &bptt, 1e-12);

    let (twice, bptt) = grads(make, &state, drtrl(InStepPaths::Twice));
    let k = "lif/rec/weight/weight";
    let r = rel(&vals(&twice, k), &vals(&bptt, k));
    println!("LIF, twice: {k} is {r:.3} (relative) away from BPTT");
    assert!(
        r > 0.1,
        "LIF, twice: expected the double-counted path to show, got {r:e}"
    );
}

#[test]
fn models_without_in_step_paths_are_unchanged() {
    let make = || GruNet::new(N_IN, N_REC, 2);
    let state = ModelState::new(&make(), DType::F64, 3, Some(BATCH)).unwrap();
    for algo in [
        |p| drtrl(p),
        |p| PpProp::new(0.9).unwrap().in_step_paths(p).into(),
    ] as [fn(InStepPaths) -> Algorithm; 2]
    {
        let (a, _) = grads(make, &state, algo(InStepPaths::Once));
        let (b, _) = grads(make, &state, algo(InStepPaths::Twice));
        for k in a.keys() {
            assert_eq!(vals(&a, k), vals(&b, k), "GRU: {k} differs");
        }
    }
}

#[test]
fn pp_prop_and_multi_step_take_the_option() {
    // pp_prop is not exact here; the option must change its LIF numbers
    // (the same learning signal feeds its solve) and leave the multi-step
    // method (whose signal is ∂L/∂h_{t−1}) unchanged.
    let make = lif;
    let state = state_without_recurrence(&make(), 8);
    let pp = |p| PpProp::new(0.9).unwrap().in_step_paths(p).into();
    let (a, _) = grads(make, &state, pp(InStepPaths::Once));
    let (b, _) = grads(make, &state, pp(InStepPaths::Twice));
    assert_ne!(
        vals(&a, "lif/rec/weight/weight"),
        vals(&b, "lif/rec/weight/weight")
    );
    let ms = |p| {
        DRtrl::default()
            .vjp_method(braintrace::learn::VjpMethod::MultiStep)
            .in_step_paths(p)
            .into()
    };
    let (a, _) = grads(make, &state, ms(InStepPaths::Once));
    let (b, _) = grads(make, &state, ms(InStepPaths::Twice));
    for k in a.keys() {
        assert_eq!(vals(&a, k), vals(&b, k), "multi-step: {k} differs");
    }
}
