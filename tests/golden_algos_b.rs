//! Golden test of SnAp-1 and SnAp-2 (issue 35, algos-b): every `snap__*`
//! case of `tests/golden_algos` (recorded from braintrace 0.2.6 by
//! `scripts/golden_gen/generate_algos_b.py`: the GRU and LIF networks of
//! the e2e set and the zoo's LSTM and vanilla cells, n = 1 and 2, single-
//! and multi-step) is rebuilt and checked field by field to 1e-9
//! (`tests/learn_support/e2e.rs`): BPTT, the online gradients and losses,
//! the compiled graph and the compile warnings.

mod learn_support;

use std::path::Path;

fn cases(prefix: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_algos");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("golden algos: {}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

fn check(prefix: &str, at_least: usize, models: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_algos");
    let names = cases(prefix);
    assert!(
        names.len() >= at_least,
        "golden algos: {} `{prefix}` cases, expected at least {at_least}",
        names.len()
    );
    for m in models {
        assert!(
            names.iter().any(|n| n.contains(&format!("__{m}__"))),
            "golden algos: no `{prefix}` case for `{m}`"
        );
    }
    let mut failures = Vec::new();
    for name in &names {
        let fails = match std::fs::read_to_string(dir.join(name))
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => learn_support::e2e::check_e2e(name, &v),
            Err(e) => vec![format!("{name}: cannot read: {e}")],
        };
        println!(
            "{name}: {}",
            if fails.is_empty() {
                "ok".into()
            } else {
                format!("{} failure(s)", fails.len())
            }
        );
        failures.extend(fails);
    }
    assert!(
        failures.is_empty(),
        "golden algos:\n{}",
        failures.join("\n")
    );
}

#[test]
fn golden_snap_cases() {
    check("snap__", 14, &["gru", "lif", "zoo_lstm", "zoo_vanilla"]);
}

#[test]
fn golden_uoro_cases_with_braintraces_draws() {
    check("uoro__", 4, &["gru", "lif"]);
}

#[test]
fn golden_random_projection_cases_with_braintraces_draws() {
    check("random_projection__", 1, &["gru"]);
}

fn load(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_algos")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The checks can fail: SnAp-1's case run as SnAp-2, and UORO's case with
/// one recorded draw negated, each disagree with braintrace's numbers.
#[test]
fn golden_algos_b_checks_can_fail() {
    let mut v = load("snap__gru__n1.json");
    v["algorithm_options"]["n"] = 2.into();
    let fails = learn_support::e2e::check_e2e("snap__gru__n1.json (as n = 2)", &v);
    assert!(
        fails.iter().any(|f| f.contains("etrace.grads")),
        "{fails:?}"
    );

    let mut v = load("uoro__gru__singlestep.json");
    // data[sample 0][position 0][state 0] of step 1's draw.
    let d = &mut v["projection_draws"][1][0]["data"][0][0][0];
    let x = d.as_f64().unwrap();
    *d = (-x).into();
    let fails = learn_support::e2e::check_e2e("uoro__gru__singlestep.json (a draw negated)", &v);
    assert!(
        fails.iter().any(|f| f.contains("etrace.grads")),
        "{fails:?}"
    );
}

/// braintrace's `SnAp(n)` is `ParamDimVjpAlgorithm` with
/// `ETraceConfig(recurrence_scope='sparse_n', sparse_n=n)` (its
/// constructor builds that config), so `compile(model, config)` runs the
/// same rule: every SnAp-2 case, its algorithm taken from
/// [`EtraceConfig`](braintrace::learn::EtraceConfig) with
/// `RecurrenceScope::SparseN(2)`, gives braintrace's numbers.
fn by_config(v: &serde_json::Value, name: &str, sparse_n: usize) -> Vec<String> {
    use braintrace::learn::{
        Algorithm, EtraceConfig, NonTemporal, OstlRecurrent, RecurrenceScope, SnAp, VjpMethod,
    };
    use serde_json::{Map, Value};
    type R<T> = Result<T, String>;
    let resolve = move |class: &str,
                        _: &Map<String, Value>,
                        vjp: VjpMethod,
                        _: &Map<String, Value>|
          -> Option<R<Algorithm>> {
        (class == "ETraceConfig").then(|| {
            let cfg = EtraceConfig {
                recurrence_scope: RecurrenceScope::SparseN(sparse_n),
                ..Default::default()
            };
            let a = cfg.algorithm().map_err(|e| e.to_string())?;
            // braintrace's options for the comparison, as the checker sets
            // them for `SnAp` itself.
            if let Some(s) = a.get::<SnAp>() {
                return Ok((*s).vjp_method(vjp).non_temporal(NonTemporal::Zero).into());
            }
            if let Some(o) = a.get::<OstlRecurrent>() {
                return Ok((*o).vjp_method(vjp).non_temporal(NonTemporal::Zero).into());
            }
            Err(format!("{cfg:?} gave {}", a.name()))
        })
    };
    let mut v = v.clone();
    v["algorithm"] = "ETraceConfig".into();
    let algos = learn_support::e2e::Algorithms {
        resolve: Some(&resolve),
        ..Default::default()
    };
    learn_support::e2e::check_e2e_with(name, &v, &algos)
}

#[test]
fn golden_snap2_cases_through_etrace_config_sparse_n() {
    let names: Vec<String> = cases("snap__")
        .into_iter()
        .filter(|n| n.contains("__n2"))
        .collect();
    assert!(names.len() >= 4, "{names:?}");
    let mut failures = Vec::new();
    for name in &names {
        let fails = by_config(&load(name), name, 2);
        println!(
            "{name} (ETraceConfig sparse_n=2): {} failure(s)",
            fails.len()
        );
        failures.extend(fails);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The check can fail: sparse_n = 1 (the coupled scope) disagrees.
    let fails = by_config(
        &load("snap__gru__n2.json"),
        "snap__gru__n2.json (sparse_n=1)",
        1,
    );
    assert!(
        fails.iter().any(|f| f.contains("etrace.grads")),
        "{fails:?}"
    );
}
