//! Checkpoints (`nn::checkpoint`): a run saved, reloaded into fresh objects
//! and continued ends with the bits of the same run uninterrupted (Adam and
//! SGD with momentum, through the learner); a child process killed while it
//! writes checkpoints leaves the last complete one loadable; foreign and
//! damaged files are refused by name and restoring them changes nothing.

use braintrace::learn::{compile, DRtrl, Learner, ModelState, Reduction, TensorDict};
use braintrace::nn::checkpoint::Checkpoint;
use braintrace::nn::{Adam, Chain, GruCell, Linear, Optimizer, Sgd};
use braintrace::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Net = Chain<GruCell, Linear>;

fn net() -> Net {
    Chain::new(GruCell::new("rnn", 3, 5), Linear::new("out", 5, 2))
}

fn tmp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "braintrace-checkpoint-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn seq(t: usize, b: usize, n: usize, seed: u64) -> Tensor {
    let mut rng = braintrace::nn::Rng::seed(seed);
    let v: Vec<f64> = (0..t * b * n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, &[t, b, n])
        .unwrap()
        .cast(DType::F32)
        .unwrap()
}

fn bits(d: &TensorDict) -> Vec<(String, Vec<u64>)> {
    d.iter()
        .map(|(k, t)| {
            let v = t
                .to_vec_f64()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (k.clone(), v)
        })
        .collect()
}

const BATCH: usize = 2;

fn learner() -> Learner<Net> {
    let state = ModelState::new(&net(), DType::F32, 1, Some(BATCH)).unwrap();
    let x0 = Tensor::zeros(&[BATCH, 3], DType::F32);
    compile(net(), state, DRtrl::default(), &x0, Some(BATCH)).unwrap()
}

/// Training iteration `i`: a fresh sequence, its eligibility-trace
/// gradient, one optimiser step.
fn train_step(l: &mut Learner<Net>, opt: &mut dyn Optimizer, i: u64) {
    l.reset_state(Some(BATCH)).unwrap();
    let (xs, ys) = (seq(5, BATCH, 3, 10 + i), seq(5, BATCH, 2, 50 + i));
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

fn resume_is_exact(make: fn() -> Box<dyn Optimizer>, name: &str) {
    let (n, k) = (6, 3);
    let mut whole = learner();
    let mut opt = make();
    for i in 0..n {
        train_step(&mut whole, opt.as_mut(), i);
    }

    let path = tmp_dir(name).join("run.ckpt");
    let mut first = learner();
    let mut opt1 = make();
    for i in 0..k {
        train_step(&mut first, opt1.as_mut(), i);
    }
    Checkpoint::capture(first.state(), opt1.as_ref())
        .with_counter("iteration", k)
        .save(&path)
        .unwrap();
    drop((first, opt1));

    // Fresh objects (other seeds: nothing carried over but the file).
    let c = Checkpoint::load(&path).unwrap();
    let mut second = {
        let state = ModelState::new(&net(), DType::F32, 77, Some(BATCH)).unwrap();
        let x0 = Tensor::zeros(&[BATCH, 3], DType::F32);
        compile(net(), state, DRtrl::default(), &x0, Some(BATCH)).unwrap()
    };
    let mut opt2 = make();
    c.restore(second.state_mut(), opt2.as_mut()).unwrap();
    for i in c.counters["iteration"]..n {
        train_step(&mut second, opt2.as_mut(), i);
    }
    assert_eq!(
        bits(&second.state().params()),
        bits(&whole.state().params()),
        "{name}: the resumed run's parameters"
    );
    let (s1, s2) = (opt.state(), opt2.state());
    assert_eq!(s1.counters, s2.counters, "{name}");
    assert_eq!(bits(&s1.tensors), bits(&s2.tensors), "{name}");
    assert!(!s1.tensors.is_empty(), "{name}: the optimiser kept state");
}

#[test]
fn a_resumed_adam_run_has_the_bits_of_an_uninterrupted_one() {
    resume_is_exact(|| Box::new(Adam::new(0.05).unwrap()), "adam");
}

#[test]
fn a_resumed_sgd_momentum_run_has_the_bits_of_an_uninterrupted_one() {
    resume_is_exact(
        || Box::new(Sgd::new(0.1).unwrap().momentum(0.9).unwrap()),
        "sgd",
    );
}

#[test]
fn without_the_optimiser_state_the_resume_differs() {
    // The test above can fail: dropping Adam's moments changes the bits.
    let mut whole = learner();
    let mut opt = Adam::new(0.05).unwrap();
    for i in 0..4 {
        train_step(&mut whole, &mut opt, i);
    }
    let mut part = learner();
    let mut opt1 = Adam::new(0.05).unwrap();
    for i in 0..2 {
        train_step(&mut part, &mut opt1, i);
    }
    let mut fresh = Adam::new(0.05).unwrap();
    for i in 2..4 {
        train_step(&mut part, &mut fresh, i);
    }
    assert_ne!(bits(&part.state().params()), bits(&whole.state().params()));
}

#[test]
fn hidden_states_extras_and_counters_round_trip() {
    let mut state = ModelState::new(&net(), DType::F64, 3, Some(BATCH)).unwrap();
    state
        .advance(&net(), &Tensor::ones(&[BATCH, 3], DType::F64))
        .unwrap();
    let extra = Tensor::from_vec_typed(vec![1i64, -2, 3], &[3]).unwrap();
    let c = Checkpoint::capture(&state, &Sgd::new(0.1).unwrap())
        .with_extra("cursor", extra)
        .with_counter("step", u64::MAX);
    let back = Checkpoint::from_bytes(&c.to_bytes().unwrap()).unwrap();
    assert_eq!(bits(&back.hidden), bits(&state.hidden()));
    assert_eq!(bits(&back.params), bits(&state.params()));
    assert_eq!(back.extra["cursor"].dtype(), DType::I64);
    assert_eq!(
        back.extra["cursor"].to_vec_f64().unwrap(),
        vec![1.0, -2.0, 3.0]
    );
    assert_eq!(back.counters["step"], u64::MAX);
    let mut other = ModelState::new(&net(), DType::F64, 4, Some(BATCH)).unwrap();
    back.restore(&mut other, &mut Sgd::new(0.1).unwrap())
        .unwrap();
    assert_eq!(bits(&other.hidden()), bits(&state.hidden()));
}

#[test]
fn wrong_files_are_refused_and_restore_changes_nothing() {
    let state = ModelState::new(&net(), DType::F32, 3, Some(BATCH)).unwrap();
    let mut adam = Adam::new(0.05).unwrap();
    let mut s2 = state.clone();
    train_step(&mut learner(), &mut adam, 0);
    let c = Checkpoint::capture(&state, &adam);
    let bytes = c.to_bytes().unwrap();

    // A truncated file, a plain parameters file.
    let e = Checkpoint::from_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(e.to_string().starts_with("Checkpoint::from_bytes"), "{e}");
    let plain = braintrace::nn::io::params_to_bytes(&state.params()).unwrap();
    let e = Checkpoint::from_bytes(&plain).unwrap_err().to_string();
    assert!(e.contains("not a braintrace checkpoint"), "{e}");

    // Adam's state into an SGD: refused, and the model state is untouched.
    let before = bits(&s2.params());
    let mut sgd = Sgd::new(0.1).unwrap().momentum(0.5).unwrap();
    let e = c.restore(&mut s2, &mut sgd).unwrap_err().to_string();
    assert!(e.contains("`adam`") && e.contains("`sgd`"), "{e}");
    assert!(sgd.state().tensors.is_empty());

    // Another model's parameters: refused, the optimiser untouched.
    let other = ModelState::new(&Linear::new("lin", 2, 2), DType::F32, 0, None).unwrap();
    let c2 = Checkpoint::capture(&other, &Adam::new(0.1).unwrap());
    let mut adam2 = adam.clone();
    let e = c2.restore(&mut s2, &mut adam2).unwrap_err().to_string();
    assert!(
        e.contains("load_params") && e.contains("lin/weight/weight"),
        "{e}"
    );
    assert_eq!(bits(&adam2.state().tensors), bits(&adam.state().tensors));
    assert_eq!(bits(&s2.params()), before);

    // A missing file names its path.
    let e = Checkpoint::load("/nonexistent/x.ckpt")
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/x.ckpt"), "{e}");
}

// ---- kill while saving -------------------------------------------------

/// Set in the child: the directory it writes checkpoints into.
const CHILD_ENV: &str = "BRAINTRACE_CHECKPOINT_CHILD_DIR";
/// Elements of the child's big tensor (4 MB of f32, several pages to write
/// and flush).
const BIG: usize = 1 << 20;

/// The child's loop: checkpoint `i` holds a tensor filled with `i` and the
/// counter `i`, written over the same file again and again until killed.
fn child_writes_forever(dir: &Path) -> ! {
    let state = ModelState::new(&net(), DType::F32, 3, Some(BATCH)).unwrap();
    let sgd = Sgd::new(0.1).unwrap();
    let path = dir.join("run.ckpt");
    for i in 0u64.. {
        let fill = Tensor::full(&[BIG], i as f64, DType::F32);
        Checkpoint::capture(&state, &sgd)
            .with_extra("big", fill)
            .with_counter("i", i)
            .save(&path)
            .unwrap();
        if i == 0 {
            std::fs::write(dir.join("ready"), b"").unwrap();
        }
    }
    unreachable!()
}

/// The checkpoint at `path` is whole: its big tensor is all its counter.
fn check_whole(path: &Path) -> u64 {
    let c = Checkpoint::load(path).expect("the last checkpoint loads");
    let i = c.counters["i"];
    let v = c.extra["big"].to_vec_f64().unwrap();
    assert_eq!(v.len(), BIG);
    assert!(v.iter().all(|&x| x == i as f64), "checkpoint {i} is mixed");
    i
}

#[test]
fn killing_a_process_while_it_saves_leaves_the_last_checkpoint_loadable() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child_writes_forever(Path::new(&dir));
    }
    let exe = std::env::current_exe().unwrap();
    let mut caught_mid_write = 0;
    let rounds = 3;
    for round in 0..rounds {
        let dir = tmp_dir(&format!("kill{round}"));
        let _ = std::fs::remove_file(dir.join("ready"));
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "killing_a_process_while_it_saves_leaves_the_last_checkpoint_loadable",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !dir.join("ready").exists() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the child never wrote"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Some more saves, then SIGKILL as soon as the child's temporary
        // file exists: inside a save, between its creation and the rename.
        std::thread::sleep(Duration::from_millis(20 * round as u64));
        let tmp = dir.join(format!(".run.ckpt.tmp.{}", child.id()));
        while !tmp.exists() {
            assert!(start.elapsed() < Duration::from_secs(120), "no save seen");
            std::hint::spin_loop();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let stray = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains(".tmp."));
        caught_mid_write += stray as usize;
        check_whole(&dir.join("run.ckpt"));
        // A later save in this process replaces it whole.
        let state = ModelState::new(&net(), DType::F32, 3, Some(BATCH)).unwrap();
        Checkpoint::capture(&state, &Sgd::new(0.1).unwrap())
            .with_extra("big", Tensor::full(&[BIG], 1e6, DType::F32))
            .with_counter("i", 1_000_000)
            .save(dir.join("run.ckpt"))
            .unwrap();
        assert_eq!(check_whole(&dir.join("run.ckpt")), 1_000_000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("{caught_mid_write} of {rounds} kills left a half-written temporary file");
    // The kill must have landed inside a save at least once (a half-written
    // temporary file left behind), or the test showed nothing.
    assert!(
        caught_mid_write >= 1,
        "no kill landed inside a save in {rounds} rounds"
    );
}
