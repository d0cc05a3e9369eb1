//! Saving trained parameters in safetensors format and loading them back:
//! the file layout read by hand (header length, JSON header, little-endian
//! data), round trips of every dtype, and a model trained online for a few
//! steps whose reloaded copy gives bit-identical outputs.

use braintrace::learn::{
    compile, DRtrl, Init, Model, ModelState, NonTemporal, Reduction, StepCtx, TensorDict,
};
use braintrace::nn::optim::{Adam, Optimizer};
use braintrace::nn::{io, GruCell, Linear};
use braintrace::{DType, Result, Tensor};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("braintrace-save-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn bits32(t: &Tensor) -> Vec<u32> {
    t.to_array_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// A GRU cell and a linear readout.
struct Net {
    rnn: GruCell,
    out: Linear,
}

impl Net {
    fn new() -> Self {
        Net {
            rnn: GruCell::new("rnn", 3, 5),
            out: Linear::new("out", 5, 2),
        }
    }
}

impl Model for Net {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.rnn.init(init)?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = self.rnn.step(ctx, x)?;
        self.out.step(ctx, &h)
    }
}

fn seq(t: usize, b: usize, n: usize, seed: u64) -> Tensor {
    let mut rng = braintrace::nn::Rng::seed(seed);
    let v: Vec<f64> = (0..t * b * n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, &[t, b, n])
        .unwrap()
        .cast(DType::F32)
        .unwrap()
}

#[test]
fn file_layout_is_safetensors() {
    let mut d = TensorDict::new();
    d.insert(
        "rnn/W".into(),
        Tensor::from_vec(vec![1.5, -2.0, 0.25, 8.0], &[2, 2])
            .unwrap()
            .cast(DType::F32)
            .unwrap(),
    );
    d.insert("b".into(), Tensor::from_vec(vec![3.0], &[1]).unwrap());
    let bytes = io::params_to_bytes(&d).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let w = &header["rnn/W"];
    assert_eq!(w["dtype"], "F32");
    assert_eq!(w["shape"], serde_json::json!([2, 2]));
    let (s, e) = (
        w["data_offsets"][0].as_u64().unwrap() as usize,
        w["data_offsets"][1].as_u64().unwrap() as usize,
    );
    let vals: Vec<f32> = data[s..e]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, vec![1.5, -2.0, 0.25, 8.0]);
    let b = &header["b"];
    assert_eq!(b["dtype"], "F64");
    let s = b["data_offsets"][0].as_u64().unwrap() as usize;
    assert_eq!(f64::from_le_bytes(data[s..s + 8].try_into().unwrap()), 3.0);
}

#[test]
fn every_dtype_round_trips() {
    let mut d = TensorDict::new();
    d.insert(
        "f32".into(),
        Tensor::from_vec_typed(vec![1.0f32, f32::MIN_POSITIVE, -0.0, 7.5], &[2, 2]).unwrap(),
    );
    d.insert(
        "f64".into(),
        Tensor::from_vec(vec![std::f64::consts::PI, -1e-300], &[2]).unwrap(),
    );
    d.insert(
        "i64".into(),
        Tensor::from_vec_typed(vec![i64::MIN, 0, 42], &[3]).unwrap(),
    );
    d.insert(
        "bool".into(),
        Tensor::from_vec_typed(vec![true, false, true], &[3, 1]).unwrap(),
    );
    d.insert("scalar".into(), Tensor::scalar(2.5));
    let back = io::params_from_bytes(&io::params_to_bytes(&d).unwrap()).unwrap();
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        d.keys().collect::<Vec<_>>()
    );
    for (k, t) in &d {
        let u = &back[k];
        assert_eq!(u.dtype(), t.dtype(), "{k}");
        assert_eq!(u.shape(), t.shape(), "{k}");
    }
    assert_eq!(bits32(&back["f32"]), bits32(&d["f32"]));
    assert_eq!(
        back["f64"].to_vec_f64().unwrap(),
        d["f64"].to_vec_f64().unwrap()
    );
    assert_eq!(
        back["i64"]
            .data()
            .unwrap()
            .as_i64("t")
            .unwrap()
            .as_slice()
            .unwrap(),
        &[i64::MIN, 0, 42]
    );
    assert_eq!(
        back["bool"]
            .data()
            .unwrap()
            .as_bool("t")
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        vec![true, false, true]
    );
}

#[test]
fn transposed_tensor_is_saved_row_major() {
    // `t()` permutes strides; the file must hold the logical row-major order.
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let at = a.t().unwrap();
    let d: TensorDict = [("at".to_string(), at.clone())].into();
    let back = io::params_from_bytes(&io::params_to_bytes(&d).unwrap()).unwrap();
    assert_eq!(back["at"].shape(), &[3, 2]);
    assert_eq!(
        back["at"].to_vec_f64().unwrap(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
}

/// Train a few online steps, save, reload into a state initialised from
/// another seed: the parameters and every output (eager and through a newly
/// compiled learner) are bit-identical.
#[test]
fn reloaded_trained_model_gives_identical_outputs() {
    let batch = 4;
    let state = ModelState::new(&Net::new(), DType::F32, 1, Some(batch)).unwrap();
    let x0 = Tensor::zeros(&[batch, 3], DType::F32);
    let algo = DRtrl::default().non_temporal(NonTemporal::InStep);
    let mut learner = compile(Net::new(), state, algo, &x0, Some(batch)).unwrap();
    let mut opt = Adam::new(0.05).unwrap();
    let initial = learner.state().params();
    for i in 0..3 {
        learner.reset_state(Some(batch)).unwrap();
        let xs = seq(6, batch, 3, 10 + i);
        let ys = seq(6, batch, 2, 20 + i);
        let r = learner
            .etrace_grad(
                &xs,
                &ys,
                |o, y| o.sub(y)?.square()?.mean_all(),
                Reduction::Mean,
            )
            .unwrap();
        opt.step(learner.state_mut(), &r.grads).unwrap();
    }
    let trained = learner.state().params();
    assert_ne!(
        bits32(&trained["out/weight/weight"]),
        bits32(&initial["out/weight/weight"]),
        "training must have changed the readout"
    );

    let path = tmp("trained.safetensors");
    io::save_params(learner.state(), &path).unwrap();
    let mut fresh = ModelState::new(&Net::new(), DType::F32, 999, Some(batch)).unwrap();
    assert_ne!(
        bits32(&fresh.params()["rnn/Wz/weight/weight"]),
        bits32(&trained["rnn/Wz/weight/weight"])
    );
    io::load_params(&mut fresh, &path).unwrap();
    for (k, v) in &trained {
        assert_eq!(bits32(&fresh.params()[k]), bits32(v), "{k}");
        assert_eq!(fresh.params()[k].dtype(), DType::F32);
    }

    // Eager outputs over a sequence.
    let xs = seq(8, batch, 3, 99);
    let mut a = learner.state().clone();
    a.reset_hidden(Some(batch)).unwrap();
    let mut b = fresh.clone();
    b.reset_hidden(Some(batch)).unwrap();
    let model = Net::new();
    for t in 0..8 {
        let x = xs.index_axis0(t).unwrap();
        let oa = a.advance(&model, &x).unwrap();
        let ob = b.advance(&model, &x).unwrap();
        assert_eq!(bits32(&oa), bits32(&ob), "eager output at step {t}");
    }

    // Through a learner compiled on the reloaded state.
    let mut reloaded = compile(Net::new(), fresh, algo, &x0, Some(batch)).unwrap();
    learner.reset_state(Some(batch)).unwrap();
    for t in 0..8 {
        let x = xs.index_axis0(t).unwrap();
        let oa = learner.update(&x).unwrap();
        let ob = reloaded.update(&x).unwrap();
        assert_eq!(bits32(&oa), bits32(&ob), "learner output at step {t}");
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn loading_parameters_of_another_model_names_the_differences() {
    let net = ModelState::new(&Net::new(), DType::F32, 1, None).unwrap();
    let bytes = io::params_to_bytes(&net.params()).unwrap();
    let mut other = ModelState::new(&GruCell::new("rnn", 3, 5), DType::F32, 1, None).unwrap();
    let before = other.params();
    let e = io::load_params_from_bytes(&mut other, &bytes)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("load_params") && e.contains("out/weight/weight"),
        "{e}"
    );
    for (k, v) in &before {
        assert_eq!(bits32(&other.params()[k]), bits32(v), "unchanged on error");
    }
}

#[test]
fn loading_a_wrong_shape_is_an_error_and_changes_nothing() {
    let small = ModelState::new(&GruCell::new("rnn", 3, 5), DType::F32, 1, None).unwrap();
    let bytes = io::params_to_bytes(&small.params()).unwrap();
    let mut big = ModelState::new(&GruCell::new("rnn", 3, 6), DType::F32, 1, None).unwrap();
    let before = big.params();
    let e = io::load_params_from_bytes(&mut big, &bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("set_param"), "{e}");
    for (k, v) in &before {
        assert_eq!(bits32(&big.params()[k]), bits32(v));
    }
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let missing = tmp("does-not-exist.safetensors");
    let e = io::load_safetensors(&missing).unwrap_err().to_string();
    assert!(e.contains("does-not-exist.safetensors"), "{e}");
    let garbage = tmp("garbage.safetensors");
    std::fs::write(&garbage, b"not a safetensors file at all").unwrap();
    let e = io::load_safetensors(&garbage).unwrap_err().to_string();
    assert!(
        e.contains("garbage.safetensors") && e.contains("safetensors"),
        "{e}"
    );
    assert!(io::params_from_bytes(&[1, 2, 3]).is_err());
    std::fs::remove_file(&garbage).ok();
}
