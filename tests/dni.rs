//! DNI beyond the golden cases: an untrained (zero) synthesiser is
//! multi-step D-RTRL; a live one leaves the relation parameters' gradients
//! as multi-step D-RTRL's and changes the others'; the learner's and the
//! configuration's synthesiser are one; an optimiser drives the training;
//! a learner checkpoint carries the synthesiser; another batch size keeps
//! it; bad input is refused naming the argument, with nothing changed.

mod learn_support;

use braintrace::learn::{
    compile, train_synthetic_gradient, train_synthetic_gradient_with, Algorithm, DRtrl, Dni,
    EtraceOpts, EvolveOpts, Learner, ModelState, Reduction, SgTrainOpts, SyntheticGradient,
    TensorDict, VjpMethod,
};
use braintrace::nn::{Adam, Checkpoint, Optimizer, Sgd};
use braintrace::{DType, Tensor};
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

fn grads(l: &mut Learner<GruNet>, k: usize) -> TensorDict {
    let (xs, ys) = (draw(&[T, B, I], 1), draw(&[T, B, O], 2));
    l.etrace_grad_with(
        &xs,
        std::slice::from_ref(&ys),
        |o, y| mse(o, &y[0]),
        &EtraceOpts::new().chunk_size(k),
    )
    .unwrap()
    .grads
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    a.iter().zip(&b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

/// A DNI learner with a synthesiser of weights `scale · N(0, 1)`.
fn dni_learner(scale: f64) -> (Dni, Learner<GruNet>) {
    let dni = Dni::new();
    let l = learner(dni.clone(), B);
    let shapes = SyntheticGradient::group_shapes(l.graph());
    dni.attach_synthesizer(SyntheticGradient::random(&shapes, scale, 9, DType::F64).unwrap());
    (dni, l)
}

fn multi_drtrl() -> Learner<GruNet> {
    learner(DRtrl::default().vjp_method(VjpMethod::MultiStep), B)
}

#[test]
fn an_untrained_synthesiser_is_multistep_drtrl() {
    for k in [1, 2, 3] {
        let (_, mut d) = dni_learner(0.0);
        let (gd, gr) = (grads(&mut d, k), grads(&mut multi_drtrl(), k));
        for (key, g) in &gr {
            let diff = max_diff(&gd[key], g);
            // Windows of 2 and 3 run the same program: bit for bit; one
            // step runs as a window of one against D-RTRL's step program.
            let tol = if k == 1 { 1e-14 } else { 0.0 };
            assert!(diff <= tol, "k={k} {key}: {diff:e}");
        }
    }
}

#[test]
fn the_estimate_reaches_only_the_parameters_without_a_relation() {
    let (_, mut d) = dni_learner(0.5);
    let gd = grads(&mut d, 2);
    let gr = grads(&mut multi_drtrl(), 2);
    let plain: Vec<String> = {
        let l = multi_drtrl();
        l.graph()
            .params_without_relation()
            .into_iter()
            .map(|i| l.graph().param_keys()[i].clone())
            .collect()
    };
    assert!(plain.iter().any(|k| k.starts_with("rnn/Wr")), "{plain:?}");
    for (key, g) in &gr {
        let diff = max_diff(&gd[key], g);
        if plain.contains(key) && key.starts_with("rnn/") {
            assert!(diff > 1e-6, "{key}: the estimate did not reach it");
        } else {
            assert_eq!(
                diff, 0.0,
                "{key}: a relation's or the readout's gradient moved"
            );
        }
    }
}

/// One window over the whole sequence (traces zero at its start): every
/// parameter's gradient is the exact gradient of the window's summed loss,
/// plus, for the parameters without a relation only, that of `⟨ĝ, h_T⟩`
/// with the estimate `ĝ = M(h_T)` held fixed — against central finite
/// differences of the model run forward.
#[test]
fn one_window_is_bptt_plus_the_estimate_for_parameters_without_a_relation() {
    let k = 4;
    let (xs, ys) = (draw(&[k, B, I], 5), draw(&[k, B, O], 6));
    let (dni, mut l) = dni_learner(0.4);
    let state0 = l.state().clone();
    let out = l
        .etrace_grad_with(
            &xs,
            std::slice::from_ref(&ys),
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new().chunk_size(k).reduction(Reduction::Sum),
        )
        .unwrap();
    let h_t = l.state().hidden_values()[0].reshape(&[B, H, 1]).unwrap();
    let g_hat = dni.synthesizer().unwrap().apply(&[h_t]).unwrap()[0]
        .reshape(&[B, H])
        .unwrap();
    // Σ_t loss_t and ⟨ĝ, h_T⟩ of a forward run with `key[idx]` moved by `d`.
    let run = |key: &str, idx: usize, d: f64| -> (f64, f64) {
        let mut st = state0.clone();
        let p = st.param(key).unwrap();
        let mut v = p.to_vec_f64().unwrap();
        v[idx] += d;
        st.set_param(key, &Tensor::from_vec(v, p.shape()).unwrap())
            .unwrap();
        let mut f = compile(
            GruNet::new(I, H, O),
            st,
            DRtrl::default(),
            &Tensor::zeros(&[B, I], DType::F64),
            Some(B),
        )
        .unwrap();
        let o = f
            .evolve(&xs, &EvolveOpts::new().outputs(true))
            .unwrap()
            .unwrap();
        let loss: f64 = (0..k)
            .map(|t| {
                mse(&o.index_axis0(t).unwrap(), &ys.index_axis0(t).unwrap())
                    .unwrap()
                    .to_vec_f64()
                    .unwrap()[0]
            })
            .sum();
        let future = f.state().hidden_values()[0]
            .mul(&g_hat)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_vec_f64()
            .unwrap()[0];
        (loss, future)
    };
    let eps = 1e-6;
    // The estimate's own term is far above the tolerance (the check can fail).
    let mut biggest_future = 0.0f64;
    for (key, plain) in [
        ("rnn/Wr/weight/weight", true),
        ("rnn/Wr/weight/bias", true),
        ("rnn/Wz/weight/weight", false),
        ("rnn/Wh/weight/bias", false),
    ] {
        let got = out.grads[key].to_vec_f64().unwrap();
        for idx in [0, 2, 4] {
            let ((lp, fp), (lm, fm)) = (run(key, idx, eps), run(key, idx, -eps));
            let mut want = (lp - lm) / (2.0 * eps);
            let future = (fp - fm) / (2.0 * eps);
            biggest_future = biggest_future.max(future.abs());
            if plain {
                want += future;
            }
            assert!(
                (got[idx] - want).abs() <= 1e-7 * (1.0 + want.abs()),
                "{key}[{idx}]: {} vs finite differences {want}",
                got[idx]
            );
        }
    }
    assert!(biggest_future > 1e-3, "{biggest_future}");
}

#[test]
fn training_with_an_optimiser_moves_the_shared_synthesiser() {
    let (dni, mut l) = dni_learner(0.1);
    let before = dni.synthesizer().unwrap();
    let theirs = l.algorithm().get::<Dni>().unwrap().clone();
    assert_eq!(theirs, dni);
    let params_before = l.state().params();
    let mut adam = Adam::new(0.01).unwrap();
    let xs = draw(&[T, B, I], 1);
    let ys = draw(&[T, B, O], 2);
    let h = train_synthetic_gradient_with(
        &mut l,
        &xs,
        std::slice::from_ref(&ys),
        |o, y| mse(o, &y[0]),
        &SgTrainOpts::new().chunk_size(2).epochs(3),
        |p, g| adam.update(p, g),
    )
    .unwrap();
    assert_eq!(h.len(), 3);
    assert!(h.iter().all(|v| v.is_finite()));
    let after = theirs.synthesizer().unwrap();
    assert!(max_diff(&after.weights()[0], &before.weights()[0]) > 1e-4);
    // Adam's state is the caller's, keyed by the synthesiser's names.
    assert!(adam.steps("synth_w/0") > 0);
    // The model's parameters did not move.
    for (k, v) in l.state().params() {
        assert_eq!(max_diff(&v, &params_before[&k]), 0.0, "{k}");
    }
}

#[test]
fn fitting_lowers_the_regression_error() {
    let (_, mut l) = dni_learner(0.0);
    let xs = draw(&[8, B, I], 3);
    let loss = |o: &Tensor, _: &[Tensor]| o.square()?.sum_all();
    let h = train_synthetic_gradient(
        &mut l,
        &xs,
        &[],
        loss,
        &SgTrainOpts::new().chunk_size(2).lr(0.05).epochs(30),
    )
    .unwrap();
    assert!(h[29] < 0.97 * h[0], "{h:?}");
}

#[test]
fn a_learner_checkpoint_carries_the_synthesiser() {
    let (dni, mut l) = dni_learner(0.2);
    let xs = draw(&[T, B, I], 1);
    let loss = |o: &Tensor, _: &[Tensor]| o.square()?.sum_all();
    train_synthetic_gradient(&mut l, &xs, &[], loss, &SgTrainOpts::new().chunk_size(2)).unwrap();
    grads(&mut l, 2);
    let bytes = Checkpoint::capture_learner(&l, &Sgd::new(0.1).unwrap())
        .to_bytes()
        .unwrap();
    // A fresh learner with no synthesiser: restored, it has the trained one
    // and continues with the same numbers.
    let fresh = Dni::new();
    let mut r = learner(fresh.clone(), B);
    Checkpoint::from_bytes(&bytes)
        .unwrap()
        .restore_learner(&mut r, &mut Sgd::new(0.1).unwrap())
        .unwrap();
    let (a, b) = (dni.synthesizer().unwrap(), fresh.synthesizer().unwrap());
    for g in 0..a.weights().len() {
        assert_eq!(max_diff(&a.weights()[g], &b.weights()[g]), 0.0);
        assert_eq!(max_diff(&a.biases()[g], &b.biases()[g]), 0.0);
    }
    let (ga, gb) = (grads(&mut l, 2), grads(&mut r, 2));
    for (k, g) in &ga {
        assert_eq!(max_diff(g, &gb[k]), 0.0, "{k}");
    }
}

#[test]
fn another_batch_size_keeps_the_synthesiser() {
    let (dni, mut l) = dni_learner(0.3);
    l.reset_state(Some(3)).unwrap();
    let xs = draw(&[4, 3, I], 1);
    let ys = draw(&[4, 3, O], 2);
    let out = l
        .etrace_grad_with(
            &xs,
            std::slice::from_ref(&ys),
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new().chunk_size(2),
        )
        .unwrap();
    assert!(out
        .grads
        .values()
        .all(|g| g.to_vec_f64().unwrap().iter().all(|v| v.is_finite())));
    assert_eq!(dni.synthesizer().unwrap().shapes(), &[vec![B, H, 1]]);
}

#[test]
fn by_name() {
    let a = Algorithm::by_name("DNI").unwrap();
    assert_eq!(a.name(), "dni");
    assert_eq!(a.vjp_method(), VjpMethod::MultiStep);
    assert!(a.get::<Dni>().unwrap().synthesizer().is_none());
    assert!(Algorithm::names().contains(&"dni"));
}

/// Hidden states, traces, step counter and synthesiser of a learner.
fn snapshot(l: &Learner<GruNet>, dni: &Dni) -> Vec<Vec<f64>> {
    let mut v: Vec<Vec<f64>> = l
        .state()
        .hidden_values()
        .iter()
        .chain(&l.traces())
        .map(|t| t.to_vec_f64().unwrap())
        .collect();
    v.push(vec![l.running_index() as f64]);
    if let Some(sg) = dni.synthesizer() {
        for t in sg.weights().iter().chain(sg.biases()) {
            v.push(t.to_vec_f64().unwrap());
        }
    }
    v
}

fn err_of<T: std::fmt::Debug>(r: braintrace::Result<T>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn bad_input_is_refused_naming_the_argument_with_nothing_changed() {
    let xs = draw(&[T, B, I], 1);
    let ys = draw(&[T, B, O], 2);
    let loss = |o: &Tensor, _: &[Tensor]| o.square()?.sum_all();

    // No synthesiser: etrace_grad and training refuse.
    let dni = Dni::new();
    let mut l = learner(dni.clone(), B);
    l.update(&xs.index_axis0(0).unwrap()).unwrap();
    let before = snapshot(&l, &dni);
    let e = err_of(l.etrace_grad_with(
        &xs,
        std::slice::from_ref(&ys),
        |o, y| mse(o, &y[0]),
        &EtraceOpts::new(),
    ));
    assert!(
        e.contains("synthesizer") && e.contains("none attached"),
        "{e}"
    );
    let e = err_of(train_synthetic_gradient(
        &mut l,
        &xs,
        &[],
        loss,
        &SgTrainOpts::new(),
    ));
    assert!(e.contains("synthesizer"), "{e}");
    assert_eq!(snapshot(&l, &dni), before);

    // A synthesiser of other groups, of another dtype.
    for (sg, what) in [
        (
            SyntheticGradient::zeros(&[vec![B, H + 1, 1]], DType::F64).unwrap(),
            "group shapes",
        ),
        (
            SyntheticGradient::zeros(&[vec![B, H, 1], vec![B, H, 1]], DType::F64).unwrap(),
            "group shapes",
        ),
        (
            SyntheticGradient::zeros(&[vec![B, H, 1]], DType::F32).unwrap(),
            "f32",
        ),
    ] {
        dni.attach_synthesizer(sg);
        let before = snapshot(&l, &dni);
        let e = err_of(l.etrace_grad_with(
            &xs,
            std::slice::from_ref(&ys),
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new(),
        ));
        assert!(e.contains("synthesizer") && e.contains(what), "{e}");
        let e = err_of(train_synthetic_gradient(
            &mut l,
            &xs,
            &[],
            loss,
            &SgTrainOpts::new(),
        ));
        assert!(e.contains("synthesizer"), "{e}");
        assert_eq!(snapshot(&l, &dni), before);
    }

    // Training options.
    dni.attach_synthesizer(SyntheticGradient::for_graph(l.graph(), DType::F64).unwrap());
    let before = snapshot(&l, &dni);
    for (opts, what) in [
        (SgTrainOpts::new().chunk_size(0), "chunk_size"),
        (SgTrainOpts::new().chunk_size(4), "chunk_size"),
        (SgTrainOpts::new().lr(0.0), "lr"),
        (SgTrainOpts::new().lr(f64::NAN), "lr"),
        (SgTrainOpts::new().batch_size(Some(0)), "batch"),
    ] {
        let e = err_of(train_synthetic_gradient(&mut l, &xs, &[], loss, &opts));
        assert!(e.contains(what), "{what}: {e}");
        assert_eq!(snapshot(&l, &dni), before, "{what}");
    }
    let e = err_of(train_synthetic_gradient(
        &mut l,
        &draw(&[T, B, I + 1], 1),
        &[],
        loss,
        &SgTrainOpts::new(),
    ));
    assert!(e.contains("xs"), "{e}");
    let e = err_of(train_synthetic_gradient(
        &mut l,
        &xs,
        &[draw(&[T - 1, B, O], 2)],
        loss,
        &SgTrainOpts::new(),
    ));
    assert!(e.contains("ys[0]"), "{e}");
    assert_eq!(snapshot(&l, &dni), before);

    // Not a DNI learner.
    let mut d = multi_drtrl();
    let e = err_of(train_synthetic_gradient(
        &mut d,
        &xs,
        &[],
        loss,
        &SgTrainOpts::new(),
    ));
    assert!(e.contains("learner") && e.contains("d_rtrl"), "{e}");

    // Options of the configuration and the synthesiser.
    let e = err_of(Dni::new().vjp_method(VjpMethod::SingleStep));
    assert!(e.contains("vjp_method"), "{e}");
    assert!(Dni::new().vjp_method(VjpMethod::MultiStep).is_ok());
    let e = err_of(SyntheticGradient::random(
        &[vec![B, H, 1]],
        f64::INFINITY,
        0,
        DType::F64,
    ));
    assert!(e.contains("scale"), "{e}");
    let e = err_of(SyntheticGradient::zeros(&[vec![H]], DType::F64));
    assert!(e.contains("group_shapes[0]"), "{e}");
    let e = err_of(SyntheticGradient::zeros(&[vec![B, H, 1]], DType::I64));
    assert!(e.contains("dtype"), "{e}");
    let e = err_of(SyntheticGradient::from_values(
        &[vec![B, H, 1]],
        vec![Tensor::zeros(&[H, H + 1], DType::F64)],
        vec![Tensor::zeros(&[H], DType::F64)],
    ));
    assert!(e.contains("weights[0]"), "{e}");
    let e = err_of(SyntheticGradient::from_values(
        &[vec![B, H, 1]],
        vec![Tensor::zeros(&[H, H], DType::F64)],
        vec![],
    ));
    assert!(e.contains("biases"), "{e}");
    let mut sg = SyntheticGradient::zeros(&[vec![B, H, 1]], DType::F64).unwrap();
    let mut p = TensorDict::new();
    p.insert("synth_w/0".into(), Tensor::ones(&[H, H], DType::F64));
    p.insert("nope".into(), Tensor::ones(&[H], DType::F64));
    let e = err_of(sg.set_params(&p));
    assert!(e.contains("nope"), "{e}");
    assert!(sg.weights()[0]
        .to_vec_f64()
        .unwrap()
        .iter()
        .all(|v| *v == 0.0));
    let e = err_of(sg.apply(&[Tensor::zeros(&[B, H, 2], DType::F64)]));
    assert!(e.contains("group_hiddens[0]"), "{e}");
}
