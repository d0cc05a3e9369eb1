//! Golden test of the weight-structured layers: every `e2e__wl_*` case of
//! `tests/golden_wlayers` (recorded from braintrace 0.2.6 by
//! `scripts/golden_gen/generate_zoo_wlayers.py`: the layer as the recurrent
//! weight of `h' = tanh(W([x, h]))` with a `Linear` readout, D-RTRL and
//! pp_prop, single- and multi-step, batch 1 and 2) is rebuilt from
//! `braintrace::nn`'s layers and checked field by field to 1e-9
//! (`tests/learn_support/e2e.rs`). A perturbed layer weight must fail.

mod learn_support;

use learn_support::e2e::{check_e2e_with, check_files, Algorithms};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_wlayers")
}

fn algos() -> Algorithms<'static> {
    Algorithms {
        case_keys: &["layer"],
        ..Default::default()
    }
}

#[test]
fn golden_wlayers_cases() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap_or_else(|e| panic!("golden wlayers: {}: {e}", dir().display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("e2e__wl_") && n.ends_with(".json"))
        .collect();
    names.sort();
    let mut per_layer: BTreeMap<String, usize> = BTreeMap::new();
    for name in &names {
        let l = name["e2e__wl_".len()..].split("__").next().unwrap_or("");
        *per_layer.entry(l.to_string()).or_default() += 1;
    }
    let failures = check_files(&dir(), &names, &algos());
    println!("golden wlayers: {} cases {per_layer:?}", names.len());
    for l in learn_support::wlayers::LAYERS {
        assert!(
            per_layer.get(*l).copied().unwrap_or(0) >= 4,
            "golden wlayers: fewer than 4 cases for `{l}`"
        );
    }
    assert!(
        failures.is_empty(),
        "golden wlayers:\n{}",
        failures.join("\n")
    );
}

/// The check can fail: one weight entry of the layer under test moved by
/// 1e-6 makes every case of each layer mismatch.
#[test]
fn golden_wlayers_can_fail() {
    for l in learn_support::wlayers::LAYERS {
        let name = format!("e2e__wl_{l}__d_rtrl.json");
        let text = std::fs::read_to_string(dir().join(&name)).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let w = v["weights"]
            .as_object_mut()
            .unwrap()
            .iter_mut()
            .find(|(k, _)| k.starts_with("rnn/W/"))
            .map(|(_, w)| w)
            .unwrap();
        let mut d = &mut w["data"];
        while d.is_array() {
            d = &mut d[0];
        }
        *d = serde_json::json!(d.as_f64().unwrap() + 1e-6);
        let fails = check_e2e_with(&name, &v, &algos());
        assert!(
            fails.iter().any(|f| f.contains("etrace.grads")),
            "{name}: a perturbed weight passed: {fails:?}"
        );
    }
}
