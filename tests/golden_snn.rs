//! Golden test of the spiking zoo against braintrace 0.2.6 (brainpy.state's
//! neurons and synapses, braintools' surrogates), recorded by
//! `scripts/golden_gen/generate_zoo_snn.py` into `tests/golden_snn`:
//!
//! * `surrogates.json`: every surrogate's gradient `d spike(u)/du` (through
//!   `grad` of our `spike` op) and forward values against braintools' at 32
//!   points, to 1e-12 relative;
//! * `e2e__snn_*.json`: networks of `If`/`Lif`/`Alif`, `Expon`/`Alpha`/
//!   `DualExpon`, `Std`/`Stp` and `SpikeBitwise` between a `Linear` and a
//!   `LeakyRateReadout`, D-RTRL and pp_prop, single- and multi-step, batch 1
//!   and > 1, checked field by field to 1e-9 by the e2e checker
//!   (`tests/learn_support/e2e.rs`).

mod learn_support;

use braintrace::{grad, Tensor};
use learn_support::e2e::array;
use learn_support::snn_models::surrogate_from_braintools;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_snn")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn surrogate_gradients_match_braintools() {
    let v = load("surrogates.json");
    let entries = v["entries"].as_array().expect("entries");
    let mut fails = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for e in entries {
        let class = e["class"].as_str().expect("class");
        let s = surrogate_from_braintools(class, e["params"].as_object().expect("params"))
            .unwrap_or_else(|err| panic!("{err}"));
        kinds.insert(class.to_string());
        let u = array(&e["u"], "u").unwrap();
        let want_g = array(&e["grad"], "grad").unwrap().to_vec_f64().unwrap();
        let want_y = array(&e["forward"], "forward")
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let g = grad(|a: &[Tensor]| a[0].spike(s)?.sum_all())(std::slice::from_ref(&u)).unwrap();
        let y = u.spike(s).unwrap().to_vec_f64().unwrap();
        let us = u.to_vec_f64().unwrap();
        for (i, (got, want)) in g[0].to_vec_f64().unwrap().iter().zip(&want_g).enumerate() {
            if (got - want).abs() > 1e-12 * (1.0 + want.abs()) {
                fails.push(format!(
                    "{s:?} at u = {}: grad {got}, braintools {want}",
                    us[i]
                ));
            }
        }
        if y != want_y {
            fails.push(format!("{s:?}: forward {y:?}, braintools {want_y:?}"));
        }
    }
    println!(
        "{} surrogate entries, {} classes",
        entries.len(),
        kinds.len()
    );
    assert!(kinds.len() >= 13, "{kinds:?}");
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn spiking_zoo_e2e_cases_match_braintrace() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("tests/golden_snn")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("e2e__") && n.ends_with(".json"))
        .collect();
    names.sort();
    let mut fails = Vec::new();
    let mut per_model: BTreeMap<String, usize> = BTreeMap::new();
    for name in &names {
        let v = load(name);
        *per_model
            .entry(v["model"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        let f = learn_support::e2e::check_e2e(name, &v);
        println!("{name}: {}", if f.is_empty() { "ok" } else { "FAILED" });
        fails.extend(f);
    }
    println!("zoo snn: {} e2e cases {per_model:?}", names.len());
    assert!(names.len() >= 30, "only {} cases", names.len());
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// The planned `f32` executor (fused groups; the surrogates it has no
/// compiled loop for run through their block kernel) agrees with the `f64`
/// evaluation of the same spiking network, for surrogates of every shape.
#[test]
fn f32_learners_with_the_new_surrogates_match_f64() {
    use braintrace::learn::{DRtrl, PpProp};
    use learn_support::snn_models::SnnNet;
    for (i, (class, params)) in [
        (
            "MultiGaussianGrad",
            r#"{"h": 0.15, "s": 6.0, "sigma": 0.5, "scale": 0.5}"#,
        ),
        ("QPseudoSpike", r#"{"alpha": 2.0}"#),
        ("PiecewiseExp", r#"{"alpha": 1.0}"#),
    ]
    .into_iter()
    .enumerate()
    {
        let hp: serde_json::Map<String, Value> = serde_json::from_str(&format!(
            r#"{{"neuron": "ALIF", "R": 1.0, "tau": 5.0, "tau_a": 20.0, "V_th": 1.0,
                "V_reset": 0.0, "V_rest": 0.0, "beta": 0.4, "reset": "soft",
                "surrogate": "{class}", "surrogate_params": {params},
                "synapse": "DualExpon", "tau_decay": 6.0, "tau_rise": 2.0, "amplitude": 1.5,
                "plasticity": "{}", "U": 0.2, "tau_f": 15.0, "tau_d": 8.0, "bitwise": "or",
                "readout_decay": 0.8, "dt": 1.0}}"#,
            if i == 1 { "STP" } else { "none" }
        ))
        .unwrap();
        let make = || SnnNet::from_hp(&hp, 3, 6, 2).unwrap();
        learn_support::assert_learner_f32_matches_f64(
            make,
            || DRtrl::default().into(),
            Some(2),
            6,
            (&[2, 3], &[2, 2]),
            |_| {},
        );
        learn_support::assert_learner_f32_matches_f64(
            make,
            || PpProp::new(0.9).unwrap().into(),
            Some(2),
            6,
            (&[2, 3], &[2, 2]),
            |_| {},
        );
    }
}
