//! The sequence driver (`etrace_grad_with`, `evolve`, `evaluate`,
//! `etrace_of`, `reset_state` to another batch size): each option against
//! an explicit loop of single steps (one-step `etrace_grad` calls with the
//! weighting written into the loss, `update` calls), the window mode
//! against BPTT, bad input refused with nothing changed.

mod learn_support;

use braintrace::learn::{
    bptt_grad, compile, Algorithm, DRtrl, EtraceOpts, EvolveOpts, Learner, ModelState, PpProp,
    Reduction, TensorDict, VjpMethod,
};
use braintrace::prelude::*;
use learn_support::models::GruNet;
use learn_support::{draw, mse};

const T: usize = 6;
const B: usize = 2;
const I: usize = 3;
const H: usize = 5;
const O: usize = 2;

fn learner(algo: impl Into<Algorithm>, batch: usize) -> Learner<GruNet> {
    let model = GruNet::new(I, H, O);
    let state = ModelState::new(&model, DType::F64, 4, Some(batch)).unwrap();
    compile(
        model,
        state,
        algo,
        &Tensor::zeros(&[batch, I], DType::F64),
        Some(batch),
    )
    .unwrap()
}

fn algos() -> Vec<Algorithm> {
    vec![
        DRtrl::default().into(),
        DRtrl::default().fast_paths(false).into(),
        PpProp::new(0.9).unwrap().into(),
        DRtrl::default().vjp_method(VjpMethod::MultiStep).into(),
    ]
}

/// Row `t` of a time-major sequence as a one-step sequence `(1, ...)`.
fn step_of(xs: &Tensor, t: usize) -> Tensor {
    xs.index_axis0(t).unwrap().expand_dims(0).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: {x} vs {y} (scale {scale})"
        );
    }
}

fn close_dicts(a: &TensorDict, b: &TensorDict, tol: f64, what: &str) {
    assert_eq!(a.len(), b.len());
    for (k, g) in b {
        close(&vals(&a[k]), &vals(g), tol, &format!("{what} {k}"));
    }
}

fn add_into(acc: &mut Option<TensorDict>, g: &TensorDict, scale: f64) {
    match acc {
        None => {
            *acc = Some(
                g.iter()
                    .map(|(k, v)| (k.clone(), v.mul_scalar(scale).unwrap()))
                    .collect(),
            )
        }
        Some(a) => {
            for (k, v) in g {
                let s = a[k].add(&v.mul_scalar(scale).unwrap()).unwrap();
                a.insert(k.clone(), s);
            }
        }
    }
}

/// What a call may change: hidden states, traces, step counter.
fn snapshot(l: &Learner<GruNet>) -> (Vec<Vec<f64>>, Vec<Vec<f64>>, usize) {
    (
        l.state().hidden_values().iter().map(vals).collect(),
        l.traces().iter().map(vals).collect(),
        l.running_index(),
    )
}

/// A learner that already ran a few steps (hidden states and traces away
/// from zero).
fn warmed(algo: impl Into<Algorithm>) -> Learner<GruNet> {
    let mut l = learner(algo, B);
    l.evolve(&draw(&[3, B, I], 9), &EvolveOpts::new()).unwrap();
    l
}

#[test]
fn mask_and_weights_equal_a_loop_of_weighted_steps() {
    let (xs, ys) = (draw(&[T, B, I], 1), draw(&[T, B, O], 2));
    let mask = Tensor::from_vec(vec![0.0, 1.0, 0.5, 0.0, 2.0, 1.0], &[T]).unwrap();
    let w = [1.0, 0.3, 1.0, 4.0, 1.0, 0.7];
    for algo in algos() {
        for reduction in [Reduction::Mean, Reduction::Sum] {
            let mut a = warmed(algo.clone());
            let mut b = warmed(algo.clone());
            let opts = EtraceOpts::new()
                .mask(&mask)
                .weights(&w)
                .reduction(reduction);
            let out = a
                .etrace_grad_with(&xs, std::slice::from_ref(&ys), |o, y| mse(o, &y[0]), &opts)
                .unwrap();
            let m = vals(&mask);
            let mut acc = None;
            let mut losses = Vec::new();
            for t in 0..T {
                let c = m[t] * w[t];
                let g = b
                    .etrace_grad(
                        &step_of(&xs, t),
                        &step_of(&ys, t),
                        |o, y| mse(o, y)?.mul_scalar(c),
                        Reduction::Sum,
                    )
                    .unwrap();
                add_into(&mut acc, &g.grads, 1.0);
                losses.push(vals(&g.losses)[0] / if c == 0.0 { f64::NAN } else { c });
            }
            let total: f64 = (0..T).map(|t| m[t] * w[t]).sum();
            let scale = match reduction {
                Reduction::Mean => 1.0 / total,
                Reduction::Sum => 1.0,
            };
            let mut expect = None;
            add_into(&mut expect, acc.as_ref().unwrap(), scale);
            close_dicts(&out.grads, expect.as_ref().unwrap(), 1e-10, algo.name());
            // Raw losses: where the weight is non-zero, the loop's loss / weight.
            let raw = vals(&out.losses);
            for t in 0..T {
                if losses[t].is_finite() {
                    close(&[raw[t]], &[losses[t]], 1e-12, "raw loss");
                }
            }
            let masked: Vec<f64> = (0..T).map(|t| raw[t] * m[t] * w[t]).collect();
            close(&vals(&out.masked), &masked, 1e-12, "masked");
            close(
                &[out.objective],
                &[masked.iter().sum::<f64>() * scale],
                1e-12,
                "objective",
            );
            assert_eq!(snapshot(&a), snapshot(&b), "{}", algo.name());
        }
    }
}

#[test]
fn per_sample_mask_equals_a_loop_of_masked_sample_losses() {
    let (xs, ys) = (draw(&[T, B, I], 1), draw(&[T, B, O], 2));
    let m: Vec<f64> = (0..T * B).map(|i| [1.0, 0.0, 0.5][i % 3]).collect();
    let mask = Tensor::from_vec(m.clone(), &[T, B]).unwrap();
    // The per-sample loss: the mean square over features, (B,).
    let per_sample = |o: &Tensor, y: &Tensor| o.sub(y)?.square()?.mean(&[1]);
    for algo in algos() {
        let mut a = warmed(algo.clone());
        let mut b = warmed(algo.clone());
        let out = a
            .etrace_grad_with(
                &xs,
                std::slice::from_ref(&ys),
                |o, y| per_sample(o, &y[0]),
                &EtraceOpts::new().mask(&mask),
            )
            .unwrap();
        assert_eq!(out.losses.shape(), &[T, B]);
        let mut acc = None;
        for t in 0..T {
            let row = Tensor::from_vec(m[t * B..(t + 1) * B].to_vec(), &[B]).unwrap();
            let g = b
                .etrace_grad(
                    &step_of(&xs, t),
                    &step_of(&ys, t),
                    |o, y| per_sample(o, y)?.mul(&row)?.sum_all(),
                    Reduction::Sum,
                )
                .unwrap();
            add_into(&mut acc, &g.grads, 1.0);
        }
        let total: f64 = m.iter().sum();
        let mut expect = None;
        add_into(&mut expect, acc.as_ref().unwrap(), 1.0 / total);
        close_dicts(&out.grads, expect.as_ref().unwrap(), 1e-10, algo.name());
        assert_eq!(snapshot(&a), snapshot(&b));
    }
}

#[test]
fn several_targets_outputs_and_aux_equal_a_loop() {
    let xs = draw(&[T, B, I], 1);
    let (y1, y2) = (draw(&[T, B, O], 2), draw(&[T, B, O], 3));
    // A loss of two targets; its auxiliary values: the output's mean and
    // the second target's sum.
    let loss = |o: &Tensor, y: &[Tensor]| -> Result<(Tensor, Vec<Tensor>)> {
        let l = mse(o, &y[0])?.add(&o.mul(&y[1])?.mean_all()?)?;
        Ok((l, vec![o.mean_all()?, y[1].sum_all()?]))
    };
    for algo in algos() {
        let mut a = warmed(algo.clone());
        let mut b = warmed(algo.clone());
        let mut c = warmed(algo.clone());
        let out = a
            .etrace_grad_with(
                &xs,
                &[y1.clone(), y2.clone()],
                loss,
                &EtraceOpts::new().outputs(true),
            )
            .unwrap();
        let mut acc = None;
        for t in 0..T {
            let (t1, t2) = (step_of(&y1, t), step_of(&y2, t));
            let g = b
                .etrace_grad_with(
                    &step_of(&xs, t),
                    &[t1, t2],
                    loss,
                    &EtraceOpts::new().reduction(Reduction::Sum),
                )
                .unwrap();
            add_into(&mut acc, &g.grads, 1.0 / T as f64);
            // The outputs and aux from an explicit update loop.
            let o = c.update(&xs.index_axis0(t).unwrap()).unwrap();
            let (_, aux) = loss(
                &o,
                &[y1.index_axis0(t).unwrap(), y2.index_axis0(t).unwrap()],
            )
            .unwrap();
            let got = out.outputs.as_ref().unwrap().index_axis0(t).unwrap();
            close(&vals(&got), &vals(&o), 1e-12, "output");
            for (k, v) in aux.iter().enumerate() {
                close(&[vals(&out.aux[k])[t]], &vals(v), 1e-12, "aux");
            }
        }
        close_dicts(&out.grads, acc.as_ref().unwrap(), 1e-10, algo.name());
        assert_eq!(out.aux.len(), 2);
        assert_eq!(out.outputs.as_ref().unwrap().shape(), &[T, B, O]);
        assert_eq!(snapshot(&a), snapshot(&b));
        assert_eq!(snapshot(&a).0, snapshot(&c).0, "hidden states as update's");
    }
}

#[test]
fn evolve_equals_an_update_loop_and_evaluate_changes_nothing() {
    let xs = draw(&[T, B, I], 1);
    for algo in algos() {
        let mut a = warmed(algo.clone());
        let mut b = warmed(algo.clone());
        // evaluate: the outputs of an update loop, nothing changed.
        let before = snapshot(&a);
        let ev = a.evaluate(&xs).unwrap();
        assert_eq!(snapshot(&a), before, "evaluate changed the learner");
        let outs = a
            .evolve(&xs, &EvolveOpts::new().outputs(true))
            .unwrap()
            .unwrap();
        for t in 0..T {
            let o = b.update(&xs.index_axis0(t).unwrap()).unwrap();
            close(
                &vals(&outs.index_axis0(t).unwrap()),
                &vals(&o),
                1e-12,
                "evolve",
            );
            close(
                &vals(&ev.index_axis0(t).unwrap()),
                &vals(&o),
                1e-12,
                "evaluate",
            );
        }
        assert_eq!(snapshot(&a), snapshot(&b), "{}", algo.name());
        // Windows: the same states and traces, the counter once per window.
        let mut c = warmed(algo.clone());
        let start = c.running_index();
        assert!(c
            .evolve(&xs, &EvolveOpts::new().chunk_size(3))
            .unwrap()
            .is_none());
        let (h, tr, n) = snapshot(&c);
        let (h2, tr2, _) = snapshot(&a);
        assert_eq!((h, tr), (h2, tr2));
        assert_eq!(n, start + T / 3);
    }
}

#[test]
fn a_window_over_the_whole_sequence_is_bptt() {
    // Fresh traces and one window of every step: reverse mode through the
    // window with nothing before it, i.e. BPTT.
    let (xs, ys) = (draw(&[T, B, I], 1), draw(&[T, B, O], 2));
    let algo = DRtrl::default().vjp_method(VjpMethod::MultiStep);
    for (k, windows) in [(T, 1usize), (2, T / 2)] {
        let mut l = learner(algo, B);
        let out = l
            .etrace_grad_with(
                &xs,
                std::slice::from_ref(&ys),
                |o, y| mse(o, &y[0]),
                &EtraceOpts::new().chunk_size(k).reduction(Reduction::Sum),
            )
            .unwrap();
        assert_eq!(l.running_index(), windows);
        assert_eq!(out.losses.shape(), &[T]);
        let bp = bptt_grad(
            l.model(),
            &learner(algo, B).state().clone(),
            &xs,
            &ys,
            mse,
            Reduction::Sum,
        )
        .unwrap();
        if k == T {
            close_dicts(&out.grads, &bp.grads, 1e-10, "window T vs BPTT");
        }
        close(&vals(&out.losses), &vals(&bp.losses), 1e-12, "losses");
        // The hidden states and traces end where a plain evolve leaves them.
        let mut e = learner(algo, B);
        e.evolve(&xs, &EvolveOpts::new()).unwrap();
        assert_eq!(snapshot(&l).0, snapshot(&e).0);
        for (a, b) in snapshot(&l).1.iter().zip(&snapshot(&e).1) {
            close(a, b, 1e-12, "traces");
        }
    }
    // chunk_size 1 is the plain path.
    let mut a = learner(algo, B);
    let mut b = learner(algo, B);
    let o1 = a
        .etrace_grad_with(
            &xs,
            std::slice::from_ref(&ys),
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new().chunk_size(1),
        )
        .unwrap();
    let o2 = b.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
    close_dicts(&o1.grads, &o2.grads, 0.0, "chunk 1");
}

#[test]
fn etrace_of_gives_each_weight_its_traces() {
    let xs = draw(&[T, B, I], 1);
    for algo in algos() {
        let mut l = learner(algo.clone(), B);
        l.evolve(&xs, &EvolveOpts::new()).unwrap();
        let all = l.traces();
        let wz = l.etrace_of("rnn/Wz/weight").unwrap();
        assert!(!wz.is_empty(), "{}", algo.name());
        // Each returned trace is one of the learner's traces, non-zero.
        for t in &wz {
            assert!(all.iter().any(|a| vals(a) == vals(t)));
            assert!(vals(t).iter().any(|v| *v != 0.0));
        }
        // A leaf key gives a subset of its state's traces.
        let leaf = l.etrace_of("rnn/Wz/weight/weight").unwrap();
        assert!(!leaf.is_empty() && leaf.len() <= wz.len());
        // The readout has no trace; an unknown key is an error naming it.
        assert!(l.etrace_of("out/weight").unwrap().is_empty());
        let e = l.etrace_of("rnn/nope").unwrap_err().to_string();
        assert!(
            e.contains("weight_key") && e.contains("rnn/Wz/weight/weight"),
            "{e}"
        );
        if algo.name() == "d_rtrl" {
            // D-RTRL: every trace belongs to exactly one weight state.
            let n: usize = ["rnn/Wz/weight", "rnn/Wh/weight", "rnn/Wr/weight"]
                .iter()
                .map(|k| l.etrace_of(k).unwrap().len())
                .sum();
            assert_eq!(n, all.len());
        }
    }
}

#[test]
fn reset_state_to_another_batch_size_reallocates() {
    let (xs, ys) = (draw(&[T, 3, I], 1), draw(&[T, 3, O], 2));
    for algo in algos() {
        let mut a = learner(algo.clone(), B);
        a.evolve(&draw(&[2, B, I], 5), &EvolveOpts::new()).unwrap();
        a.reset_state(Some(3)).unwrap();
        assert_eq!(a.state().batch(), Some(3));
        assert_eq!(a.running_index(), 0);
        assert!(a.traces().iter().all(|t| vals(t).iter().all(|v| *v == 0.0)));
        let mut b = learner(algo.clone(), 3);
        let (ga, gb) = (
            a.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap(),
            b.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap(),
        );
        close_dicts(&ga.grads, &gb.grads, 1e-12, algo.name());
        assert_eq!(snapshot(&a), snapshot(&b));
        // And back; a batch of 0 is refused with nothing changed.
        let before = snapshot(&a);
        assert!(a.reset_state(Some(0)).is_err());
        assert_eq!(snapshot(&a), before);
        a.reset_state(Some(B)).unwrap();
        assert_eq!(a.state().hidden_values()[0].shape()[0], B);
    }
}

#[test]
fn bad_options_are_refused_naming_the_argument_with_nothing_changed() {
    let (xs, ys) = (draw(&[T, B, I], 1), draw(&[T, B, O], 2));
    let single: Algorithm = DRtrl::default().into();
    let multi: Algorithm = DRtrl::default().vjp_method(VjpMethod::MultiStep).into();
    let cases: Vec<(Algorithm, EtraceOpts, &str)> = vec![
        (
            single.clone(),
            EtraceOpts::new().mask(&Tensor::ones(&[T + 1], DType::F64)),
            "mask",
        ),
        (
            single.clone(),
            EtraceOpts::new().mask(&Tensor::ones(&[], DType::F64)),
            "mask",
        ),
        // A (T, B) mask needs a per-sample loss: the scalar loss is refused at the first step.
        (
            single.clone(),
            EtraceOpts::new().mask(&Tensor::ones(&[T, B], DType::F64)),
            "mask",
        ),
        (
            single.clone(),
            EtraceOpts::new().weights(&[1.0; T - 1]),
            "weights",
        ),
        (
            single.clone(),
            EtraceOpts::new().chunk_size(0),
            "chunk_size",
        ),
        (multi.clone(), EtraceOpts::new().chunk_size(4), "chunk_size"),
        (
            single.clone(),
            EtraceOpts::new().chunk_size(2),
            "chunk_size",
        ),
    ];
    for (algo, opts, arg) in cases {
        let mut l = warmed(algo);
        let before = snapshot(&l);
        let e = l
            .etrace_grad_with(&xs, std::slice::from_ref(&ys), |o, y| mse(o, &y[0]), &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains(arg), "{arg}: {e}");
        assert_eq!(snapshot(&l), before, "{arg}: the learner changed");
    }
    let mut l = warmed(single.clone());
    let before = snapshot(&l);
    let e = l
        .etrace_grad_with(
            &xs,
            &[ys.clone(), draw(&[T - 1, B], 3)],
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("ys[1]"), "{e}");
    let e = l
        .evolve(&xs, &EvolveOpts::new().chunk_size(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("chunk_size"), "{e}");
    assert!(l.evaluate(&draw(&[T, B, I + 1], 1)).is_err());
    assert_eq!(snapshot(&l), before);
}

/// Every case of `tests/golden_driver` (braintrace 0.2.6: mask, evolve
/// then grad, chunk_size 2, two targets with aux; GRU and LIF; D-RTRL and
/// pp_prop) reproduced to 1e-9.
#[test]
fn golden_driver_cases() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_driver");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("MANIFEST.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().unwrap();
    assert!(files.len() >= 14, "{} cases", files.len());
    let mut fails = Vec::new();
    for f in files {
        let f = f.as_str().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap();
        fails.extend(learn_support::driver_golden::check(f, &v));
    }
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}
