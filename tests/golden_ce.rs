//! Golden test with a cross-entropy loss: the `e2e__gru_ce__*` cases of
//! `tests/golden_ce` (recorded from braintrace 0.2.6 by
//! `scripts/golden_gen/generate_ce.py`: a GRU cell and a `Linear` readout
//! of class logits, braintools' softmax cross-entropy against integer
//! labels, D-RTRL and pp_prop, single- and multi-step, batch 1 and 3) are
//! checked field by field to 1e-9 by the e2e checker with
//! `nn::loss::softmax_cross_entropy_with_integer_labels`: BPTT gradients,
//! losses, outputs and hidden states, the online gradients and losses, the
//! compiled graph. A perturbed weight and a changed label must fail.

mod learn_support;

use serde_json::Value;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_ce")
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap_or_else(|e| panic!("golden ce: {}: {e}", dir().display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("e2e__") && n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

fn case(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join(name)).unwrap()).unwrap()
}

#[test]
fn golden_cross_entropy_cases() {
    let names = names();
    for algo in ["d_rtrl", "pp_prop"] {
        assert!(
            names.iter().filter(|n| n.contains(algo)).count() >= 2,
            "golden ce: fewer than 2 {algo} cases"
        );
    }
    for n in &names {
        let c = case(n);
        assert_eq!(
            c["loss"], "softmax_cross_entropy_with_integer_labels",
            "{n}"
        );
    }
    let failures = learn_support::e2e::check_files(&dir(), &names, &Default::default());
    println!("golden ce: {} cases", names.len());
    assert!(failures.is_empty(), "golden ce:\n{}", failures.join("\n"));
}

/// The comparison can fail: one weight moved by 1e-6, or one label
/// changed, gives mismatches (the losses and gradients).
#[test]
fn golden_cross_entropy_can_fail() {
    for name in ["e2e__gru_ce__d_rtrl.json", "e2e__gru_ce__pp_prop.json"] {
        let mut c = case(name);
        let w = &mut c["weights"]["rnn/Wh/weight/weight"]["data"][0][0];
        *w = Value::from(w.as_f64().unwrap() + 1e-6);
        let f = learn_support::e2e::check_e2e(name, &c);
        assert!(
            f.iter().any(|m| m.contains("etrace.grads")) && f.iter().any(|m| m.contains("losses")),
            "{name}: a perturbed weight passed: {f:?}"
        );

        let mut c = case(name);
        let classes = c["dims"]["n_out"].as_f64().unwrap();
        let y = &mut c["ys"]["data"][2][0];
        *y = Value::from((y.as_f64().unwrap() + 1.0) % classes);
        let f = learn_support::e2e::check_e2e(name, &c);
        assert!(
            f.iter().any(|m| m.contains("etrace.losses")),
            "{name}: a changed label passed: {f:?}"
        );
    }
}
