//! The learner's non-finite policy (`Learner::set_non_finite`): under the
//! default `NonFinite::Error`, a NaN or an infinity in an input, a target,
//! the mask, or written by a step (hidden state, output, loss, trace,
//! gradient) is refused with an error naming it — what, key, index, step —
//! and the learner is exactly as before the call (bits of hidden states,
//! traces, step counter, parameters); `Skip` drops the step and gives the
//! bits of a run that never saw it; `Allow` lets it through. Under D-RTRL
//! (fused trace kernels and program traces) and pp_prop, f32 and f64.

use braintrace::learn::{
    compile, Algorithm, DRtrl, EtraceOpts, Learner, ModelState, NonFinite, PpProp, Reduction,
};
use braintrace::nn::checkpoint::Checkpoint;
use braintrace::nn::{Chain, GruCell, Linear, Rng, Sgd};
use braintrace::{DType, Error, Tensor};

type Net = Chain<GruCell, Linear>;

fn net() -> Net {
    Chain::new(GruCell::new("rnn", 3, 5), Linear::new("out", 5, 2))
}

fn algos() -> Vec<Algorithm> {
    vec![
        DRtrl::default().into(),
        DRtrl::default().fast_paths(false).into(),
        PpProp::new(0.5).unwrap().into(),
    ]
}

fn learner(algo: &Algorithm, dtype: DType) -> Learner<Net> {
    let state = ModelState::new(&net(), dtype, 3, Some(2)).unwrap();
    let x0 = Tensor::zeros(&[2, 3], dtype);
    compile(net(), state, algo.clone(), &x0, Some(2)).unwrap()
}

fn seq(t: usize, n: usize, seed: u64, dtype: DType) -> Tensor {
    let mut rng = Rng::seed(seed);
    let v: Vec<f64> = (0..t * 2 * n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, &[t, 2, n])
        .unwrap()
        .cast(dtype)
        .unwrap()
}

/// `s` with element `idx` (row-major) set to `v`.
fn poison(s: &Tensor, idx: usize, v: f64) -> Tensor {
    let mut d = s.to_vec_f64().unwrap();
    d[idx] = v;
    Tensor::from_vec(d, s.shape())
        .unwrap()
        .cast(s.dtype())
        .unwrap()
}

/// Everything the learner carries, as bits: hidden states, traces (both
/// kinds), the step counter, the parameters.
fn fingerprint(l: &Learner<Net>) -> Vec<u64> {
    let mut v = Vec::new();
    let s = l.snapshot();
    for t in l
        .state()
        .hidden_values()
        .iter()
        .chain(l.state().param_values())
        .chain(&s.traces)
        .chain(&s.owned)
    {
        v.extend(t.to_vec_f64().unwrap().iter().map(|x| x.to_bits()));
    }
    v.push(s.running_index as u64);
    v
}

fn mse(o: &Tensor, y: &Tensor) -> braintrace::Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

fn grads_bits(g: &braintrace::learn::TensorDict) -> Vec<(String, Vec<u64>)> {
    g.iter()
        .map(|(k, t)| {
            let b = t
                .to_vec_f64()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (k.clone(), b)
        })
        .collect()
}

fn non_finite(e: &Error) -> (&str, &str, &str, &[usize], f64, Option<usize>) {
    match e {
        Error::NonFinite {
            op,
            what,
            key,
            index,
            value,
            step,
        } => (op, what, key, index, *value, *step),
        other => panic!("expected Error::NonFinite, got {other}"),
    }
}

#[test]
fn update_refuses_a_nan_input_and_changes_nothing() {
    for dtype in [DType::F64, DType::F32] {
        for algo in algos() {
            let mut l = learner(&algo, dtype);
            l.update(&seq(1, 3, 1, dtype).reshape(&[2, 3]).unwrap())
                .unwrap();
            let before = fingerprint(&l);
            let x = poison(&seq(1, 3, 2, dtype).reshape(&[2, 3]).unwrap(), 4, f64::NAN);
            let e = l.update(&x).unwrap_err();
            let (op, what, key, index, value, step) = non_finite(&e);
            assert_eq!(
                (op, what, key, index),
                ("update", "input", "x", &[1, 1][..])
            );
            assert!(value.is_nan());
            assert_eq!(step, Some(1));
            assert_eq!(
                e.to_string(),
                "update: input `x` holds NaN at index [1, 1] at step 1"
            );
            assert_eq!(fingerprint(&l), before, "{algo:?} {dtype:?}");
        }
    }
}

#[test]
fn etrace_grad_refuses_non_finite_inputs_targets_and_masks_and_changes_nothing() {
    for dtype in [DType::F64, DType::F32] {
        for algo in algos() {
            let mut l = learner(&algo, dtype);
            l.etrace_grad(
                &seq(2, 3, 1, dtype),
                &seq(2, 2, 2, dtype),
                mse,
                Reduction::Mean,
            )
            .unwrap();
            let before = fingerprint(&l);
            let (xs, ys) = (seq(4, 3, 3, dtype), seq(4, 2, 4, dtype));
            // xs row 2, sample 1, feature 0: flat index 2·6 + 1·3 + 0.
            let e = l
                .etrace_grad(&poison(&xs, 15, f64::INFINITY), &ys, mse, Reduction::Mean)
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                "etrace_grad: input `xs` holds inf at index [2, 1, 0] at step 2"
            );
            let e = l
                .etrace_grad(
                    &xs,
                    &poison(&ys, 5, f64::NEG_INFINITY),
                    mse,
                    Reduction::Mean,
                )
                .unwrap_err();
            let (_, what, key, index, _, step) = non_finite(&e);
            assert_eq!(
                (what, key, index, step),
                ("input", "ys[0]", &[1, 0, 1][..], Some(1))
            );
            let mask = poison(&Tensor::ones(&[4], dtype), 3, f64::NAN);
            let e = l
                .etrace_grad_with(
                    &xs,
                    std::slice::from_ref(&ys),
                    |o, y| mse(o, &y[0]),
                    &EtraceOpts::new().mask(&mask),
                )
                .unwrap_err();
            // (The options refuse it first, naming the mask.)
            assert!(e.to_string().contains("mask"), "{e}");
            let e = l
                .evolve(&poison(&xs, 0, f64::NAN), &Default::default())
                .unwrap_err();
            assert_eq!(non_finite(&e).0, "evolve");
            assert_eq!(fingerprint(&l), before, "{algo:?} {dtype:?}");
        }
    }
}

/// A loss that is infinite where the target's first entry is 0: a
/// non-finite value made by the step from finite inputs.
fn fragile(o: &Tensor, y: &Tensor) -> braintrace::Result<Tensor> {
    let first = y.slice_axis(1, 0, 1)?.abs()?.sum_all()?;
    o.sub(y)?.square()?.mean_all()?.div(&first)
}

#[test]
fn a_step_that_writes_a_non_finite_loss_is_refused_at_its_step() {
    for dtype in [DType::F64, DType::F32] {
        for algo in algos() {
            let (xs, ys) = (seq(4, 3, 5, dtype), seq(4, 2, 6, dtype));
            // At the first step: nothing changes.
            let mut l = learner(&algo, dtype);
            let before = fingerprint(&l);
            let zero0 = poison(&poison(&ys, 0, 0.0), 2, 0.0);
            let e = l
                .etrace_grad(&xs, &zero0, fragile, Reduction::Mean)
                .unwrap_err();
            let (op, what, key, _, value, step) = non_finite(&e);
            assert_eq!(
                (op, what, key, step),
                ("etrace_grad", "loss", "loss", Some(0))
            );
            assert_eq!(value, f64::INFINITY);
            assert_eq!(fingerprint(&l), before, "{algo:?} {dtype:?}");
            // At step 2: the two completed (finite) steps are kept, as a
            // learner that ran only them.
            let zero2 = poison(&poison(&ys, 8, 0.0), 10, 0.0);
            let e = l
                .etrace_grad(&xs, &zero2, fragile, Reduction::Mean)
                .unwrap_err();
            assert_eq!(non_finite(&e).5, Some(2));
            let mut two = learner(&algo, dtype);
            two.etrace_grad(
                &xs.slice_axis(0, 0, 2).unwrap(),
                &ys.slice_axis(0, 0, 2).unwrap(),
                fragile,
                Reduction::Mean,
            )
            .unwrap();
            assert_eq!(fingerprint(&l), fingerprint(&two), "{algo:?} {dtype:?}");
        }
    }
}

#[test]
fn skip_drops_the_step_and_gives_the_bits_of_a_run_without_it() {
    for dtype in [DType::F64, DType::F32] {
        for algo in algos() {
            let (xs, ys) = (seq(5, 3, 7, dtype), seq(5, 2, 8, dtype));
            let bad = poison(&xs, 2 * 6 + 4, f64::NAN);
            let mut l = learner(&algo, dtype).with_non_finite(NonFinite::Skip);
            let opts = EtraceOpts::new().reduction(Reduction::Sum);
            let out = l
                .etrace_grad_with(&bad, std::slice::from_ref(&ys), |o, y| mse(o, &y[0]), &opts)
                .unwrap();
            assert_eq!(out.skipped, vec![2]);
            assert_eq!(l.skipped(), 1);
            assert!(out.losses.to_vec_f64().unwrap()[2].is_nan());
            assert_eq!(out.masked.to_vec_f64().unwrap()[2], 0.0);
            assert!(out.objective.is_finite());
            // The same learner fed the sequence without row 2.
            let keep = |s: &Tensor| {
                braintrace::concat(
                    &[
                        s.slice_axis(0, 0, 2).unwrap(),
                        s.slice_axis(0, 3, 5).unwrap(),
                    ],
                    0,
                )
                .unwrap()
            };
            let mut clean = learner(&algo, dtype);
            let want = clean
                .etrace_grad_with(
                    &keep(&xs),
                    std::slice::from_ref(&keep(&ys)),
                    |o, y| mse(o, &y[0]),
                    &opts,
                )
                .unwrap();
            assert_eq!(
                grads_bits(&out.grads),
                grads_bits(&want.grads),
                "{algo:?} {dtype:?}"
            );
            assert_eq!(out.objective.to_bits(), want.objective.to_bits());
            let mut a = fingerprint(&l);
            let mut b = fingerprint(&clean);
            // The counter counts the steps taken: 4 in both.
            assert_eq!(a.pop(), Some(4));
            assert_eq!(b.pop(), Some(4));
            assert_eq!(a, b, "{algo:?} {dtype:?}");
            // `update` skips too: the output comes back, nothing moves.
            let before = fingerprint(&l);
            let x = poison(&xs.index_axis0(0).unwrap(), 0, f64::NAN);
            let o = l.update(&x).unwrap();
            assert!(o.to_vec_f64().unwrap().iter().any(|v| v.is_nan()));
            assert_eq!(fingerprint(&l), before);
            assert_eq!(l.skipped(), 2);
        }
    }
}

#[test]
fn allow_lets_nan_through() {
    let mut l = learner(&DRtrl::default().into(), DType::F64).with_non_finite(NonFinite::Allow);
    assert_eq!(l.non_finite(), NonFinite::Allow);
    let x = poison(&Tensor::zeros(&[2, 3], DType::F64), 0, f64::NAN);
    l.update(&x).unwrap();
    let h = l.state().hidden_values()[0].to_vec_f64().unwrap();
    assert!(h.iter().any(|v| v.is_nan()));
    assert_eq!(l.running_index(), 1);
}

#[test]
fn an_output_gone_non_finite_is_refused_with_nothing_changed() {
    // Finite input, finite parameters, but a readout weight so large that
    // its f32 product overflows.
    let mut l = learner(&DRtrl::default().into(), DType::F32);
    let w = l.state().params()["out/weight/weight"].clone();
    let big = Tensor::full(w.shape(), 3e38, DType::F32);
    l.state_mut().set_param("out/weight/weight", &big).unwrap();
    let before = fingerprint(&l);
    let x = Tensor::full(&[2, 3], 1.0, DType::F32);
    let e = l.update(&x).unwrap_err();
    let (_, what, key, index, _, step) = non_finite(&e);
    assert_eq!((what, key, step), ("output", "out", Some(0)));
    assert_eq!(index.len(), 2);
    assert_eq!(fingerprint(&l), before);
}

#[test]
fn the_skip_count_survives_a_checkpoint() {
    let algo: Algorithm = DRtrl::default().into();
    let mut l = learner(&algo, DType::F64).with_non_finite(NonFinite::Skip);
    let x = poison(&Tensor::zeros(&[2, 3], DType::F64), 0, f64::NAN);
    l.update(&x).unwrap();
    l.update(&x).unwrap();
    let bytes = Checkpoint::capture_learner(&l, &Sgd::new(0.1).unwrap())
        .to_bytes()
        .unwrap();
    let mut again = learner(&algo, DType::F64);
    Checkpoint::from_bytes(&bytes)
        .unwrap()
        .restore_learner(&mut again, &mut Sgd::new(0.1).unwrap())
        .unwrap();
    assert_eq!(again.skipped(), 2);
}
