//! Weights from braintrace: every model of `tests/braintrace_weights`
//! (exported from braintrace 0.2.6 by `scripts/export_braintrace_weights.py`
//! with the parameters braintrace's own initialisers drew) is rebuilt from
//! `braintrace::nn`, its parameters are read with `nn::io_braintrace`, and
//! its outputs over the recorded input sequence must equal braintrace's to
//! 1e-9 (f64): each recurrent cell with a `Linear` readout, the spiking
//! networks (LIF, ALIF, IF; Expon, Alpha, DualExpon; STD, STP; a
//! `LeakyRateReadout`), a bare `Linear` and a `Sequential` of two. Each
//! parameter is then perturbed in turn and must change the outputs (the
//! comparison can fail), and a missing key or a wrong shape gives an error
//! naming them.

mod learn_support;

use braintrace::learn::{bptt_grad, Model, ModelState, Reduction, TensorDict};
use braintrace::nn::io::load_safetensors;
use braintrace::nn::io_braintrace::{load_braintrace, BraintraceParams, KeyMap, FORMAT};
use braintrace::nn::{
    CfnCell, Chain, GruCell, Linear, LruCell, LstmCell, MguCell, MiniGru, MiniLstm, MinimalRnnCell,
    UrLstmCell, VanillaRnnCell,
};
use braintrace::{DType, Error, Tensor};
use learn_support::snn_models::SnnNet;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

type R<T> = std::result::Result<T, String>;

const TOL: f64 = 1e-9;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("braintrace_weights")
}

fn manifest() -> Value {
    let p = dir().join("MANIFEST.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn models() -> Vec<Map<String, Value>> {
    manifest()["models"]
        .as_array()
        .expect("models")
        .iter()
        .map(|m| m.as_object().expect("model").clone())
        .collect()
}

fn dim(m: &Map<String, Value>, k: &str) -> usize {
    m[k].as_u64().unwrap_or_else(|| panic!("`{k}`")) as usize
}

/// The largest `|got − want| / (1 + |want|)`.
fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(
            0.0,
            |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}

/// The model's outputs over `xs` from `state` (zero targets: only the
/// outputs are read).
fn outputs<M: Model>(model: &M, state: &ModelState, xs: &Tensor, n_out: usize) -> R<Tensor> {
    let (t, b) = (xs.shape()[0], xs.shape()[1]);
    let ys = Tensor::zeros(&[t, b, n_out], xs.dtype());
    let mse = |o: &Tensor, y: &Tensor| o.sub(y)?.square()?.mean_all();
    bptt_grad(model, state, xs, &ys, mse, Reduction::Mean)
        .map(|r| r.outputs)
        .map_err(|e| e.to_string())
}

/// What one model's check found.
struct Checked {
    max_err: f64,
    /// Parameters whose perturbation changed the outputs by more than TOL.
    sensitive: Vec<String>,
    keys: Vec<String>,
}

/// Load `name`'s braintrace parameters into `model` (through `map`),
/// compare the initial hidden states and the outputs with braintrace's,
/// then perturb each parameter.
fn check<M: Model>(model: M, m: &Map<String, Value>, map: &KeyMap) -> R<Checked> {
    // A spiking net's outputs are spikes through the readout: a small
    // change of the input weights moves no spike, a large one does.
    let bump = if m["kind"] == "snn" { 0.5 } else { 1e-4 };
    let name = m["name"].as_str().unwrap();
    let b = dim(m, "B");
    let e = |e: Error| format!("{name}: {e}");
    let mut state = ModelState::new(&model, DType::F64, 99, Some(b)).map_err(e)?;
    let file = dir().join(format!("{name}.safetensors"));
    let meta = load_braintrace(&mut state, &file, map).map_err(e)?;
    if meta.get("format").map(String::as_str) != Some(FORMAT)
        || meta.get("model").map(String::as_str) != Some(name)
        || meta.get("braintrace").map(String::as_str) != Some("0.2.6")
    {
        return Err(format!("{name}: metadata {meta:?}"));
    }
    let run = load_safetensors(dir().join(format!("{name}.run.safetensors"))).map_err(e)?;
    // braintrace's initial hidden states are ours (same paths, same values).
    let h0: TensorDict = run
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("hidden0/")?.to_string(), v.clone())))
        .collect();
    let ours = state.hidden();
    let mut hk: Vec<&String> = h0.keys().collect();
    let mut ok: Vec<&String> = ours.keys().collect();
    hk.sort();
    ok.sort();
    if hk != ok {
        return Err(format!("{name}: hidden states {ok:?}, braintrace's {hk:?}"));
    }
    for (k, v) in &h0 {
        if max_rel(&ours[k], v) != 0.0 {
            return Err(format!("{name}: initial hidden `{k}` differs"));
        }
    }
    let xs = &run["xs"];
    let want = &run["outputs"];
    let n_out = want.shape()[2];
    let got = outputs(&model, &state, xs, n_out)?;
    let max_err = max_rel(&got, want);
    if max_err > TOL {
        return Err(format!(
            "{name}: outputs differ from braintrace's by {max_err:e} (relative)"
        ));
    }
    // Each parameter perturbed in turn must move the outputs.
    let params = state.params();
    let mut sensitive = Vec::new();
    for (k, v) in &params {
        let mut p = state.clone();
        let bumped = v.sub_scalar(-bump).map_err(e)?;
        p.set_param(k, &bumped).map_err(e)?;
        if max_rel(&outputs(&model, &p, xs, n_out)?, want) > TOL {
            sensitive.push(k.clone());
        }
    }
    Ok(Checked {
        max_err,
        sensitive,
        keys: params.keys().cloned().collect(),
    })
}

fn rnn(m: &Map<String, Value>) -> R<Checked> {
    let (n_in, n_rec, n_out) = (dim(m, "n_in"), dim(m, "n_rec"), dim(m, "n_out"));
    let e = |e: Error| e.to_string();
    let out = |k: usize| Linear::new("out", k, n_out);
    let id = KeyMap::new();
    macro_rules! run {
        ($cell:expr, $k:expr) => {
            check(Chain::new($cell, out($k)), m, &id)
        };
    }
    match m["cell"].as_str().unwrap() {
        "gru" => run!(GruCell::new("rnn", n_in, n_rec), n_rec),
        "vanilla" => run!(VanillaRnnCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "mgu" => run!(MguCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "minimal" => run!(MinimalRnnCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "cfn" => run!(CfnCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "lstm" => run!(LstmCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "urlstm" => run!(UrLstmCell::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "minigru" => run!(MiniGru::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        "minilstm" => run!(MiniLstm::new("rnn", n_in, n_rec).map_err(e)?, n_rec),
        // The LRU's output has the input's width.
        "lru" => run!(LruCell::new("rnn", n_in, n_rec).map_err(e)?, n_in),
        other => Err(format!("unknown cell {other}")),
    }
}

fn check_entry(m: &Map<String, Value>) -> R<Checked> {
    let (n_in, n_rec, n_out) = (dim(m, "n_in"), dim(m, "n_rec"), dim(m, "n_out"));
    match m["kind"].as_str().unwrap() {
        "rnn" => rnn(m),
        "snn" => {
            let hp = m["hp"].as_object().ok_or("hp")?;
            check(SnnNet::from_hp(hp, n_in, n_rec, n_out)?, m, &KeyMap::new())
        }
        // braintrace's bare `nn.Linear` has the keys `weight/weight`,
        // `weight/bias`; ours is the layer `fc`.
        "linear" => check(
            Linear::new("fc", n_in, n_out),
            m,
            &KeyMap::new().rename("", "fc"),
        ),
        // `brainstate.nn.Sequential(Linear, Linear)`: `layers/0`, `layers/1`.
        "sequential" => check(
            Chain::new(
                Linear::new("fc0", n_in, n_rec),
                Linear::new("fc1", n_rec, n_out),
            ),
            m,
            &KeyMap::new()
                .rename("layers/0", "fc0")
                .rename("layers/1", "fc1"),
        ),
        other => Err(format!("unknown kind {other}")),
    }
}

#[test]
fn braintrace_weights_give_braintraces_outputs() {
    let models = models();
    let mut fails = Vec::new();
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for m in &models {
        let name = m["name"].as_str().unwrap();
        match check_entry(m) {
            Ok(c) => {
                println!(
                    "{name}: max relative error {:.2e}; {}/{} parameters move the outputs",
                    c.max_err,
                    c.sensitive.len(),
                    c.keys.len()
                );
                *kinds.entry(m["kind"].as_str().unwrap().into()).or_default() += 1;
                // Every parameter moves the outputs.
                for k in &c.keys {
                    if !c.sensitive.contains(k) {
                        fails.push(format!(
                            "{name}: perturbing `{k}` leaves the outputs equal (the check cannot fail)"
                        ));
                    }
                }
            }
            Err(e) => fails.push(e),
        }
    }
    println!("braintrace weights: {kinds:?}");
    assert_eq!(kinds.get("rnn"), Some(&10), "every recurrent cell");
    assert_eq!(kinds.get("snn"), Some(&6), "the spiking nets");
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

fn gru_state(b: usize) -> (Chain<GruCell, Linear>, ModelState) {
    let model = Chain::new(GruCell::new("rnn", 3, 4), Linear::new("out", 4, 2));
    let state = ModelState::new(&model, DType::F64, 5, Some(b)).unwrap();
    (model, state)
}

#[test]
fn a_missing_key_or_a_wrong_shape_is_named_and_changes_nothing() {
    let file = BraintraceParams::read(dir().join("rnn_gru.safetensors")).unwrap();
    assert_eq!(file.model(), Some("rnn_gru"));
    assert_eq!(file.braintrace_version(), Some("0.2.6"));
    let (_, mut state) = gru_state(2);
    let before = state.params();
    let unchanged = |s: &ModelState| {
        for (k, v) in s.params() {
            assert_eq!(
                v.to_vec_f64().unwrap(),
                before[&k].to_vec_f64().unwrap(),
                "{k}"
            );
        }
    };
    let load = |s: &mut ModelState, p: &TensorDict| {
        braintrace::nn::io_braintrace::load_braintrace_into(s, p, &KeyMap::new())
    };

    let mut p = file.params.clone();
    p.remove("rnn/Wr/weight/bias");
    let m = load(&mut state, &p).unwrap_err().to_string();
    assert!(
        m.contains("missing") && m.contains("`rnn/Wr/weight/bias` [4]"),
        "{m}"
    );
    unchanged(&state);

    let mut p = file.params.clone();
    p.insert(
        "rnn/Wh/weight/weight".into(),
        Tensor::zeros(&[4, 7], DType::F64),
    );
    let e = load(&mut state, &p).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("`rnn/Wh/weight/weight`") && m.contains("[4, 7]") && m.contains("[7, 4]"),
        "{m}"
    );
    unchanged(&state);

    // A braintrace model with more parts than ours: named, or skipped.
    let mut p = file.params.clone();
    p.insert("head/W".into(), Tensor::zeros(&[2], DType::F64));
    let m = load(&mut state, &p).unwrap_err().to_string();
    assert!(
        m.contains("`head/W` [2]") && m.contains("does not have"),
        "{m}"
    );
    unchanged(&state);
    braintrace::nn::io_braintrace::load_braintrace_into(
        &mut state,
        &p,
        &KeyMap::new().skip("head"),
    )
    .unwrap();
    assert_eq!(
        state.params()["rnn/Wz/weight/weight"].to_vec_f64().unwrap(),
        file.params["rnn/Wz/weight/weight"].to_vec_f64().unwrap()
    );

    // A file that is not there, a file that is not safetensors.
    let (_, mut state) = gru_state(2);
    let m = load_braintrace(&mut state, dir().join("nope.safetensors"), &KeyMap::new())
        .unwrap_err()
        .to_string();
    assert!(m.contains("nope.safetensors"), "{m}");
    let m = load_braintrace(&mut state, dir().join("MANIFEST.json"), &KeyMap::new())
        .unwrap_err()
        .to_string();
    assert!(m.contains("MANIFEST.json"), "{m}");
}

/// The same file read into an f32 model: cast on load, outputs close.
#[test]
fn an_f32_model_reads_the_f64_file() {
    let m = models()
        .into_iter()
        .find(|m| m["name"] == "rnn_gru")
        .unwrap();
    let (model, _) = gru_state(2);
    let mut state = ModelState::new(&model, DType::F32, 0, Some(2)).unwrap();
    load_braintrace(
        &mut state,
        dir().join("rnn_gru.safetensors"),
        &KeyMap::new(),
    )
    .unwrap();
    assert_eq!(state.params()["rnn/Wz/weight/weight"].dtype(), DType::F32);
    let run = load_safetensors(dir().join("rnn_gru.run.safetensors")).unwrap();
    let xs = run["xs"].cast(DType::F32).unwrap();
    let got = outputs(&model, &state, &xs, dim(&m, "n_out")).unwrap();
    let err = max_rel(&got.cast(DType::F64).unwrap(), &run["outputs"]);
    assert!(err < 1e-5, "{err}");
}
