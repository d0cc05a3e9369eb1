//! Golden test: every built-in ETP primitive against the vectors recorded from
//! the reference library (braintrace 0.2.6), folder from `BRAINTRACE_GOLDEN_DIR`
//! when set, otherwise the vendored copy in `tests/golden` (schema: that
//! folder's README.md).
//!
//! For each `etp_*.json` case it checks forward, JVP, VJP, vmap (values and
//! identity preservation), `xy_to_dw`, `yw_to_w` (`dt_to_t` in the files),
//! `instant_drtrl`, `solve_drtrl`, the initialisers' shapes/dtypes/zeros, the
//! state-vmapped `yw_to_w` and the instantaneous D-RTRL term, to 1e-10
//! relative. For each `e2e__*` case it builds the case's model, runs the
//! online learner (D-RTRL or pp_prop, single- or multi-step) and the BPTT
//! rollout and checks every recorded field to 1e-9
//! (`tests/learn_support/e2e.rs`). All failures of all files are collected
//! and reported together at the end. A second test runs the
//! same harness over `tests/golden_extra` (variant set B, recorded from the
//! reference library by `scripts/golden_gen/generate.py` for the primitives and
//! `scripts/golden_gen/generate_e2e.py` for the e2e cases).

mod golden_support;
mod learn_support;

use golden_support::{check_case_str, check_folder, golden_dir, registry_lookup, CaseReport};
use std::path::Path;

#[test]
fn golden_cases() {
    let dir = golden_dir().unwrap_or_else(|e| panic!("golden: {e}"));
    run_golden_folder("golden", &dir);
}

/// The second set (variant set B), recorded from the reference library by
/// `scripts/golden_gen/generate.py` (primitives) and `generate_e2e.py` (e2e
/// cases) into `tests/golden_extra` (other shapes, dims, hyperparameters,
/// seeds and variants than the shared set); always checked, whatever
/// `BRAINTRACE_GOLDEN_DIR` says.
#[test]
fn golden_extra_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_extra");
    assert!(dir.is_dir(), "golden extra: no folder {}", dir.display());
    run_golden_folder("golden extra", &dir);
}

/// Check every case of `dir`, print a summary line per case and
/// `<label>: N cases checked`, and panic with all failures.
fn run_golden_folder(label: &str, dir: &Path) {
    println!("{label}: folder {}", dir.display());
    let rep = check_folder(dir, &registry_lookup);
    for c in &rep.cases {
        println!("{}", c.summary());
    }
    let mut e2e_failures = Vec::new();
    for name in &rep.deferred {
        let failures = match std::fs::read_to_string(dir.join(name))
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => learn_support::e2e::check_e2e(name, &v),
            Err(e) => vec![format!("{name}: cannot read: {e}")],
        };
        println!(
            "{name}: {}",
            if failures.is_empty() {
                "ok".to_string()
            } else {
                format!("{} failure(s)", failures.len())
            }
        );
        e2e_failures.extend(failures);
    }
    println!(
        "{label}: {} cases checked ({} primitive, {} e2e)",
        rep.cases.len() + rep.deferred.len(),
        rep.cases.len(),
        rep.deferred.len()
    );
    let failures: Vec<String> = rep
        .failures
        .iter()
        .chain(rep.cases.iter().flat_map(|c| &c.failures))
        .map(ToString::to_string)
        .chain(e2e_failures)
        .collect();
    if !failures.is_empty() {
        let failed_cases = rep.cases.iter().filter(|c| !c.failures.is_empty()).count();
        panic!(
            "{label}: {} failures in {} of {} cases:\n  {}",
            failures.len(),
            failed_cases,
            rep.cases.len(),
            failures.join("\n  ")
        );
    }
}

// ------------------------------------------------------------ the harness itself

/// A tiny `etp_mm` case: x (2,2) @ W (2,1) + b (1,), cotangent ones.
/// y = [[-1.25], [-2.25]]; grads x = [[0.5,-1],[0.5,-1]], W = [[4],[6]], b = [2].
fn synthetic_mm(forward_output: &str) -> String {
    format!(
        r#"{{
  "schema_version": 1, "kind": "primitive", "case_id": "etp_mm__synthetic",
  "primitive": "etp_mm", "batched_primitive": true, "batched_counterpart": null,
  "arg_names": ["x", "weight", "bias"], "float_arg_names": ["x", "weight", "bias"],
  "x_invar_index": 0, "trainable_invars": {{"weight": 1, "bias": 2}},
  "params": {{"has_bias": true, "weight_fn": null, "bias_fn": null}},
  "inputs": {{
    "x": {{"dtype": "float64", "shape": [2, 2], "data": [[1.0, 2.0], [3.0, 4.0]]}},
    "weight": {{"dtype": "float64", "shape": [2, 1], "data": [[0.5], [-1.0]]}},
    "bias": {{"dtype": "float64", "shape": [1], "data": [0.25]}}
  }},
  "forward": {{"output": {{"dtype": "float64", "shape": [2, 1], "data": {forward_output}}}}},
  "vjp": {{
    "cotangent": {{"dtype": "float64", "shape": [2, 1], "data": [[1.0], [1.0]]}},
    "grads": {{
      "x": {{"dtype": "float64", "shape": [2, 2], "data": [[0.5, -1.0], [0.5, -1.0]]}},
      "weight": {{"dtype": "float64", "shape": [2, 1], "data": [[4.0], [6.0]]}},
      "bias": {{"dtype": "float64", "shape": [1], "data": [2.0]}}
    }}
  }},
  "warnings": {{}}
}}"#
    )
}

fn require_etp_mm() {
    if let Err(e) = braintrace::etp::lookup_primitive("etp_mm") {
        panic!("the harness self-test needs the built-in etp_mm: {e}");
    }
}

fn print_report(r: &CaseReport) {
    for f in &r.failures {
        println!("  {f}");
    }
}

#[test]
fn harness_reports_a_wrong_forward_output() {
    require_etp_mm();
    let r = check_case_str(
        "etp_mm__synthetic.json",
        &synthetic_mm("[[-1.25], [99.0]]"),
        &registry_lookup,
    );
    print_report(&r);
    let fwd = r.failures_in("forward.output");
    assert_eq!(
        fwd.len(),
        1,
        "expected one forward failure, got {:?}",
        r.failures
    );
    let msg = fwd[0].to_string();
    for part in [
        "etp_mm__synthetic.json",
        "forward.output",
        "index [1, 0]",
        "got -2.25e0",
        "want 9.9e1",
    ] {
        assert!(msg.contains(part), "failure message lacks `{part}`: {msg}");
    }
    // The sections the synthetic case leaves out are failures, not skips.
    for missing in ["jvp", "vmap", "rules"] {
        assert!(
            r.failures_in(missing)
                .iter()
                .any(|f| f.msg.contains("missing")),
            "a missing `{missing}` section must be a failure: {:?}",
            r.failures
        );
    }
}

#[test]
fn harness_accepts_a_right_forward_output() {
    require_etp_mm();
    let r = check_case_str(
        "etp_mm__synthetic.json",
        &synthetic_mm("[[-1.25], [-2.25]]"),
        &registry_lookup,
    );
    print_report(&r);
    assert!(r.failures_in("forward").is_empty(), "{:?}", r.failures);
    assert!(r.failures_in("vjp").is_empty(), "{:?}", r.failures);
    assert!(r.failures_in("case").is_empty(), "{:?}", r.failures);
}

#[test]
fn harness_fails_unknown_fields_and_primitives() {
    let unknown_prim =
        synthetic_mm("[[-1.25], [-2.25]]").replace("\"etp_mm\"", "\"etp_no_such_op\"");
    let r = check_case_str("etp_no_such_op.json", &unknown_prim, &registry_lookup);
    assert!(
        r.failures
            .iter()
            .any(|f| f.msg.contains("unknown primitive `etp_no_such_op`")),
        "{:?}",
        r.failures
    );

    require_etp_mm();
    let extra = synthetic_mm("[[-1.25], [-2.25]]")
        .replace("\"warnings\": {}", "\"warnings\": {}, \"new_check\": 1");
    let r = check_case_str("etp_mm__synthetic.json", &extra, &registry_lookup);
    assert!(
        r.failures
            .iter()
            .any(|f| f.msg.contains("unknown field `new_check`")),
        "{:?}",
        r.failures
    );
}
