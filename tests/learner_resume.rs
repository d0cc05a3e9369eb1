//! A learner's checkpoint (`Checkpoint::capture_learner` /
//! `restore_learner`): an online run that never resets its streams,
//! stopped after K updates, saved, restored into a learner compiled afresh
//! (other seeds) and continued, ends with the bits of the run
//! uninterrupted — parameters, traces, hidden states, step counter and the
//! optimiser — in f64 and f32, under D-RTRL (fused trace kernels and
//! program traces) and pp_prop. A checkpoint of another batch size, model,
//! algorithm or dtype is refused by name and changes nothing.

use braintrace::learn::{compile, Algorithm, DRtrl, Learner, ModelState, PpProp, Reduction};
use braintrace::nn::checkpoint::Checkpoint;
use braintrace::nn::{Adam, Chain, GruCell, Linear, Optimizer, Rng};
use braintrace::{DType, Tensor};

type Net = Chain<GruCell, Linear>;

fn net(hidden: usize) -> Net {
    Chain::new(
        GruCell::new("rnn", 3, hidden),
        Linear::new("out", hidden, 2),
    )
}

fn seq(t: usize, b: usize, n: usize, seed: u64, dtype: DType) -> Tensor {
    let mut rng = Rng::seed(seed);
    let v: Vec<f64> = (0..t * b * n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, &[t, b, n])
        .unwrap()
        .cast(dtype)
        .unwrap()
}

fn learner(algo: &Algorithm, dtype: DType, batch: usize, hidden: usize, seed: u64) -> Learner<Net> {
    let state = ModelState::new(&net(hidden), dtype, seed, Some(batch)).unwrap();
    let x0 = Tensor::zeros(&[batch, 3], dtype);
    compile(net(hidden), state, algo.clone(), &x0, Some(batch)).unwrap()
}

/// Update `i` of an online run: one `update` step, then the gradient of a
/// short stretch of the same streams (nothing reset) and an Adam step.
fn train_step(l: &mut Learner<Net>, opt: &mut Adam, i: u64, batch: usize) {
    let dtype = l.state().dtype();
    let x = seq(1, batch, 3, 1000 + i, dtype)
        .reshape(&[batch, 3])
        .unwrap();
    l.update(&x).unwrap();
    let (xs, ys) = (
        seq(3, batch, 3, 10 + i, dtype),
        seq(3, batch, 2, 50 + i, dtype),
    );
    let r = l
        .etrace_grad(
            &xs,
            &ys,
            |o, y| o.sub(y)?.square()?.mean_all(),
            Reduction::Mean,
        )
        .unwrap();
    opt.step(l.state_mut(), &r.grads).unwrap();
}

fn bits(ts: impl IntoIterator<Item = Tensor>) -> Vec<Vec<u64>> {
    ts.into_iter()
        .map(|t| {
            t.to_vec_f64()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

fn everything(l: &Learner<Net>, opt: &Adam) -> Vec<Vec<u64>> {
    let mut v = bits(l.state().params().into_values());
    v.extend(bits(l.state().hidden().into_values()));
    v.extend(bits(l.traces()));
    v.extend(bits(opt.state().tensors.into_values()));
    v.push(vec![l.running_index() as u64]);
    v
}

fn resume_is_exact(algo: Algorithm, dtype: DType) {
    let (n, k, batch) = (5, 2, 3);
    let name = format!("{algo:?} {dtype:?}");
    let mut whole = learner(&algo, dtype, batch, 4, 1);
    let mut opt = Adam::new(0.05).unwrap();
    for i in 0..n {
        train_step(&mut whole, &mut opt, i, batch);
    }

    let dir = std::env::temp_dir().join(format!("braintrace-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{dtype:?}.ckpt", algo.name()));
    let mut first = learner(&algo, dtype, batch, 4, 1);
    let mut opt1 = Adam::new(0.05).unwrap();
    for i in 0..k {
        train_step(&mut first, &mut opt1, i, batch);
    }
    Checkpoint::capture_learner(&first, &opt1)
        .save(&path)
        .unwrap();
    drop((first, opt1));

    // A learner compiled afresh from other parameters: only the file carries over.
    let mut second = learner(&algo, dtype, batch, 4, 99);
    let mut opt2 = Adam::new(0.05).unwrap();
    let c = Checkpoint::load(&path).unwrap();
    assert!(c.is_learner());
    c.restore_learner(&mut second, &mut opt2).unwrap();
    assert_eq!(second.running_index(), 2 * 4, "{name}: the step counter");
    assert!(
        second
            .traces()
            .iter()
            .any(|t| t.to_vec_f64().unwrap().iter().any(|&v| v != 0.0)),
        "{name}: the restored traces are not zero"
    );
    for i in k..n {
        train_step(&mut second, &mut opt2, i, batch);
    }
    assert_eq!(
        everything(&second, &opt2),
        everything(&whole, &opt),
        "{name}"
    );
    // Resuming matters: the same continuation from fresh traces differs.
    let mut fresh = learner(&algo, dtype, batch, 4, 99);
    let mut opt3 = Adam::new(0.05).unwrap();
    fresh.state_mut().set_params(&c.params).unwrap();
    for i in k..n {
        train_step(&mut fresh, &mut opt3, i, batch);
    }
    assert_ne!(
        bits(fresh.state().params().into_values()),
        bits(whole.state().params().into_values()),
        "{name}: parameters alone do not resume the run"
    );
    std::fs::remove_file(&path).unwrap();
}

fn drtrl() -> Algorithm {
    DRtrl::default().into()
}
fn pp() -> Algorithm {
    PpProp::new(0.9).unwrap().into()
}

#[test]
fn d_rtrl_resumes_with_the_bits_of_an_uninterrupted_run_f64() {
    resume_is_exact(drtrl(), DType::F64);
}

#[test]
fn d_rtrl_resumes_with_the_bits_of_an_uninterrupted_run_f32() {
    resume_is_exact(drtrl(), DType::F32);
}

#[test]
fn pp_prop_resumes_with_the_bits_of_an_uninterrupted_run_f64() {
    resume_is_exact(pp(), DType::F64);
}

#[test]
fn pp_prop_resumes_with_the_bits_of_an_uninterrupted_run_f32() {
    resume_is_exact(pp(), DType::F32);
}

#[test]
fn a_checkpoint_of_another_learner_is_refused_by_name_and_changes_nothing() {
    let mut saved = learner(&drtrl(), DType::F64, 3, 4, 1);
    let mut opt = Adam::new(0.05).unwrap();
    train_step(&mut saved, &mut opt, 0, 3);
    let c = Checkpoint::capture_learner(&saved, &opt);
    let cases: Vec<(Learner<Net>, &str)> = vec![
        (learner(&drtrl(), DType::F64, 2, 4, 5), "batch size"),
        (learner(&drtrl(), DType::F64, 3, 6, 5), "parameter `"),
        (learner(&pp(), DType::F64, 3, 4, 5), "algorithm"),
        // The dtype error is typed: the checkpoint's f64 against the
        // learner's f32.
        (
            learner(&drtrl(), DType::F32, 3, 4, 5),
            "checkpoint is f64, expected f32",
        ),
    ];
    for (mut target, what) in cases {
        let b = target.state().batch().unwrap();
        let mut topt = Adam::new(0.05).unwrap();
        train_step(&mut target, &mut topt, 3, b);
        let before = everything(&target, &topt);
        let e = c
            .restore_learner(&mut target, &mut topt)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "expected `{what}` in: {e}");
        assert!(
            e.contains("restore_learner") || e.contains("set_param"),
            "the error names the call: {e}"
        );
        assert_eq!(
            everything(&target, &topt),
            before,
            "{what}: nothing changed"
        );
    }
    // A plain (model-state) checkpoint is not a learner's.
    let mut target = learner(&drtrl(), DType::F64, 3, 4, 5);
    let e = Checkpoint::capture(saved.state(), &opt)
        .restore_learner(&mut target, &mut Adam::new(0.05).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a learner's checkpoint"), "{e}");
}
