//! End-to-end golden cases: the online learners (D-RTRL, pp_prop, single-
//! and multi-step) and the BPTT reference against runs recorded from the
//! reference library (braintrace 0.2.6), in f64, to 1e-9.

mod learn_support;

use learn_support::e2e::check_e2e;
use std::path::PathBuf;

fn e2e_dir() -> PathBuf {
    if let Ok(d) = std::env::var("BRAINTRACE_GOLDEN_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let vendored = root.join("tests").join("golden");
    if vendored.is_dir() {
        vendored
    } else {
        root.join("..").join("shared").join("golden")
    }
}

#[test]
fn e2e_golden_cases() {
    let dir = e2e_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("e2e golden: cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("e2e__")
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "e2e golden: no e2e__*.json in {}",
        dir.display()
    );
    let mut fails = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let fl = check_e2e(&name, &v);
        println!(
            "{name}: {}",
            if fl.is_empty() {
                "ok".to_string()
            } else {
                format!("{} failure(s)", fl.len())
            }
        );
        fails.extend(fl);
    }
    println!("e2e golden: {} cases checked", files.len());
    assert!(
        fails.is_empty(),
        "e2e golden: {} failures:\n  {}",
        fails.len(),
        fails.join("\n  ")
    );
}
