//! DNI against braintrace 0.2.6 (`tests/golden_dni`, written by
//! `scripts/golden_gen/generate_dni.py`): the GRU, the LIF network and the
//! zoo's LSTM compiled with DNI, a synthesiser of braintrace's draws
//! attached; `etrace_grad` with windows of 2 and of 1, and
//! `train_synthetic_gradient` (two epochs, windows of 2) followed by
//! `etrace_grad` with the trained synthesiser. Every recorded value to
//! `1e-9·(1 + |want|)`; the hidden groups by path and shape. A perturbed
//! synthesiser must fail the same checks.

mod learn_support;

use braintrace::learn::{
    compile, train_synthetic_gradient, Dni, EtraceOpts, Model, ModelState, SgTrainOpts,
    SyntheticGradient, TensorDict,
};
use braintrace::nn::{Chain, Linear, LstmCell};
use braintrace::{DType, Tensor};
use learn_support::e2e::{array, compare};
use learn_support::models::{GruNet, LifNet};
use learn_support::{dims_and_hyperparams, get, known, mse};
use serde_json::{Map, Value};

type R<T> = std::result::Result<T, String>;

fn e(e: braintrace::Error) -> String {
    e.to_string()
}

/// The synthesiser's `w` and `b` lists of a case.
fn synth_lists(v: &Value, what: &str) -> R<(Vec<Tensor>, Vec<Tensor>)> {
    let o = v.as_object().ok_or(what.to_string())?;
    let list = |k: &str| -> R<Vec<Tensor>> {
        get(o, k)?
            .as_array()
            .ok_or(format!("{what}.{k}"))?
            .iter()
            .map(|a| array(a, &format!("{what}.{k}")))
            .collect()
    };
    Ok((list("w")?, list("b")?))
}

/// What the can-fail check moves: the first element of group 0's initial
/// synthesiser weight, and of the model's first weight (in key order).
#[derive(Clone, Copy, Default)]
struct Perturb {
    synth: f64,
    weight: f64,
}

/// `t` with `d` added to its first element.
fn bump(t: &Tensor, d: f64) -> R<Tensor> {
    let mut v = t.to_vec_f64().map_err(e)?;
    v[0] += d;
    Tensor::from_vec(v, t.shape()).map_err(e)
}

/// Check one case file (moved by `perturb`); the failures.
fn check(file: &str, v: &Value, perturb: Perturb) -> Vec<String> {
    let mut fails = Vec::new();
    if let Err(err) = run(v, perturb, &mut fails) {
        fails.push(err);
    }
    fails.into_iter().map(|f| format!("{file}: {f}")).collect()
}

fn run(v: &Value, perturb: Perturb, fails: &mut Vec<String>) -> R<()> {
    let o = v.as_object().ok_or("not an object")?;
    known(
        o,
        "case",
        &[
            "kind",
            "case_id",
            "model",
            "dims",
            "hyperparams",
            "algorithm",
            "driver",
            "synth_scale",
            "synth_seed",
            "groups",
            "synth",
            "weights",
            "xs",
            "ys",
            "expect",
            "generator",
            "train",
        ],
        fails,
    );
    let ((n_in, n_rec, n_out, b), h) = dims_and_hyperparams(o)?;
    match get(o, "model")?.as_str() {
        Some("gru") => check_model(GruNet::new(n_in, n_rec, n_out), o, b, perturb, fails),
        Some("lif") => check_model(
            LifNet::new(
                n_in,
                n_rec,
                n_out,
                h("beta")?,
                h("gamma")?,
                h("v_th")?,
                h("readout_decay")?,
            ),
            o,
            b,
            perturb,
            fails,
        ),
        Some("zoo_lstm") => check_model(
            Chain::new(
                LstmCell::new("rnn", n_in, n_rec).map_err(e)?,
                Linear::new("out", n_rec, n_out),
            ),
            o,
            b,
            perturb,
            fails,
        ),
        other => Err(format!("model {other:?}")),
    }
}

fn check_model<M: Model>(
    model: M,
    o: &Map<String, Value>,
    b: usize,
    perturb: Perturb,
    fails: &mut Vec<String>,
) -> R<()> {
    let mut state = ModelState::new(&model, DType::F64, 0, Some(b)).map_err(e)?;
    let weights: TensorDict = get(o, "weights")?
        .as_object()
        .ok_or("weights")?
        .iter()
        .map(|(k, a)| Ok((k.clone(), array(a, k)?)))
        .collect::<R<_>>()?;
    let mut weights = weights;
    if perturb.weight != 0.0 {
        let (k, w) = weights.iter().next().ok_or("no weights")?;
        let (k, w) = (k.clone(), bump(w, perturb.weight)?);
        weights.insert(k, w);
    }
    state.set_params(&weights).map_err(e)?;
    let xs = array(get(o, "xs")?, "xs")?;
    let ys = array(get(o, "ys")?, "ys")?;
    let x0 = Tensor::zeros(&xs.shape()[1..], DType::F64);
    let dni = Dni::new();
    let mut l = compile(model, state, dni.clone(), &x0, Some(b)).map_err(e)?;

    // The hidden groups: braintrace's order, paths and signal shapes.
    let shapes = SyntheticGradient::group_shapes(l.graph());
    let want_groups = get(o, "groups")?.as_array().ok_or("groups")?;
    if want_groups.len() != shapes.len() {
        fails.push(format!(
            "groups: {} hidden groups, braintrace has {}",
            shapes.len(),
            want_groups.len()
        ));
    }
    for (g, (grp, w)) in l.graph().groups().iter().zip(want_groups).enumerate() {
        let paths: Vec<&str> = w["hidden_paths"]
            .as_array()
            .ok_or("hidden_paths")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if grp.hidden_paths != paths {
            fails.push(format!(
                "groups[{g}]: paths {:?}, braintrace {paths:?}",
                grp.hidden_paths
            ));
        }
        let shape: Vec<usize> = w["shape"]
            .as_array()
            .ok_or("shape")?
            .iter()
            .filter_map(Value::as_u64)
            .map(|u| u as usize)
            .collect();
        if shapes[g] != shape {
            fails.push(format!(
                "groups[{g}]: shape {:?}, braintrace {shape:?}",
                shapes[g]
            ));
        }
    }

    let (mut w0, b0) = synth_lists(get(o, "synth")?, "synth")?;
    if perturb.synth != 0.0 {
        w0[0] = bump(&w0[0], perturb.synth)?;
    }
    dni.attach_synthesizer(SyntheticGradient::from_values(&shapes, w0, b0).map_err(e)?);

    let drv = get(o, "driver")?.as_object().ok_or("driver")?;
    known(drv, "driver", &["grad", "train", "reset"], fails);
    let ex = get(o, "expect")?.as_object().ok_or("expect")?;
    known(
        ex,
        "expect",
        &["grads", "losses", "history", "synth_after", "hidden_after"],
        fails,
    );
    let k = if let Some(k) = drv.get("grad").and_then(Value::as_u64) {
        k as usize
    } else {
        let k = get(drv, "train")?.as_u64().ok_or("driver.train")? as usize;
        let tr = get(o, "train")?.as_object().ok_or("train")?;
        known(
            tr,
            "train",
            &["lr", "epochs", "reset", "loss", "loss_c"],
            fails,
        );
        let lr = get(tr, "lr")?.as_f64().ok_or("train.lr")?;
        let epochs = get(tr, "epochs")?.as_u64().ok_or("train.epochs")? as usize;
        let reset = get(tr, "reset")?.as_bool().ok_or("train.reset")?;
        let c = array(get(tr, "loss_c")?, "loss_c")?;
        let loss = |o: &Tensor, _: &[Tensor]| o.sub(&c)?.square()?.sum_all();
        let opts = SgTrainOpts::new()
            .chunk_size(k)
            .lr(lr)
            .epochs(epochs)
            .reset(reset);
        let hist = train_synthetic_gradient(&mut l, &xs, &[], loss, &opts).map_err(e)?;
        let want: Vec<f64> = get(ex, "history")?
            .as_array()
            .ok_or("history")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let n = want.len();
        compare(
            "history",
            &Tensor::from_vec(hist, &[epochs]).map_err(e)?,
            &Tensor::from_vec(want, &[n]).map_err(e)?,
            fails,
        );
        let sg = dni.synthesizer().ok_or("no synthesiser after training")?;
        let (wa, ba) = synth_lists(get(ex, "synth_after")?, "synth_after")?;
        for (g, (w, bb)) in wa.iter().zip(&ba).enumerate() {
            compare(&format!("synth_after.w[{g}]"), &sg.weights()[g], w, fails);
            compare(&format!("synth_after.b[{g}]"), &sg.biases()[g], bb, fails);
        }
        let hidden = l.state().hidden();
        for (p, want) in get(ex, "hidden_after")?.as_object().ok_or("hidden_after")? {
            match hidden.get(p) {
                Some(got) => compare(&format!("hidden_after.{p}"), got, &array(want, p)?, fails),
                None => fails.push(format!("hidden_after: no hidden state `{p}`")),
            }
        }
        l.reset_state(Some(b)).map_err(e)?;
        k
    };
    let out = l
        .etrace_grad_with(
            &xs,
            std::slice::from_ref(&ys),
            |o, y| mse(o, &y[0]),
            &EtraceOpts::new().chunk_size(k),
        )
        .map_err(e)?;
    let want = get(ex, "grads")?.as_object().ok_or("grads")?;
    if want.len() != out.grads.len() {
        fails.push(format!(
            "grads: {} leaves, braintrace {}",
            out.grads.len(),
            want.len()
        ));
    }
    for (key, w) in want {
        match out.grads.get(key) {
            Some(g) => compare(&format!("grads.{key}"), g, &array(w, key)?, fails),
            None => fails.push(format!("grads: no `{key}`")),
        }
    }
    compare(
        "losses",
        &out.losses,
        &array(get(ex, "losses")?, "losses")?,
        fails,
    );
    Ok(())
}

fn cases() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_dni");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("MANIFEST.json")).unwrap()).unwrap();
    manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let f = f.as_str().unwrap().to_string();
            let v = serde_json::from_str(&std::fs::read_to_string(dir.join(&f)).unwrap()).unwrap();
            (f, v)
        })
        .collect()
}

/// Every case of `tests/golden_dni` (GRU, LIF, zoo LSTM; windows of 2 and
/// 1; the synthesiser's training, with and without reset) reproduced to
/// 1e-9.
#[test]
fn golden_dni_cases() {
    let cases = cases();
    assert!(cases.len() >= 10, "{} cases", cases.len());
    assert!(cases
        .iter()
        .any(|(f, _)| f == "dni__gru__train_k1_noreset.json"));
    for model in ["gru", "lif", "zoo_lstm"] {
        for case in ["grad_k2", "grad_k1", "train_k2"] {
            let name = format!("dni__{model}__{case}.json");
            assert!(cases.iter().any(|(f, _)| *f == name), "no {name}");
        }
    }
    let mut fails = Vec::new();
    for (f, v) in &cases {
        fails.extend(check(f, v, Perturb::default()));
    }
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// The checks can fail: with group 0's synthesiser weight moved by 1e-3,
/// every case whose numbers depend on it is reported — the plain
/// parameters' gradients (the GRU's `Wr`), the trained synthesiser and its
/// error history; with the model's first weight moved, every case's
/// gradients and losses.
#[test]
fn golden_dni_can_fail() {
    for (f, v) in cases() {
        let fails = check(
            &f,
            &v,
            Perturb {
                weight: 1e-3,
                synth: 0.0,
            },
        );
        assert!(
            fails.iter().any(|m| m.contains("grads."))
                && fails.iter().any(|m| m.contains("losses")),
            "{f}: perturbing a weight did not fail the gradients and losses: {fails:?}"
        );
        let fails = check(
            &f,
            &v,
            Perturb {
                synth: 1e-3,
                weight: 0.0,
            },
        );
        let wants: &[&str] = if f.contains("__train_") {
            &["history", "synth_after.w[0]"]
        } else if f.contains("__gru__") {
            &["grads.rnn/Wr/weight/weight"]
        } else {
            &[]
        };
        for w in wants {
            assert!(
                fails.iter().any(|m| m.contains(w)),
                "{f}: perturbing the synthesiser did not fail `{w}`: {fails:?}"
            );
        }
    }
}
