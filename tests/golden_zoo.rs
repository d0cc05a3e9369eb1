//! Golden test of the recurrent-cell zoo: every `e2e__zoo_*` case of
//! `tests/golden_zoo` (recorded from braintrace 0.2.6 by
//! `scripts/golden_gen/generate_zoo_rnn.py`: a cell and a `Linear` readout,
//! D-RTRL and pp_prop, single- and multi-step, batch 1 and 2) is rebuilt
//! from `braintrace::nn`'s cells and checked field by field to 1e-9
//! (`tests/learn_support/e2e.rs`): BPTT gradients, losses, outputs and
//! hidden states, the online (etrace) gradients and losses, the compiled
//! hidden groups and relations, and the compile warnings.

mod learn_support;

use std::collections::BTreeMap;
use std::path::Path;

#[test]
fn golden_zoo_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_zoo");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("golden zoo: {}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("e2e__zoo_") && n.ends_with(".json"))
        .collect();
    names.sort();
    let mut per_cell: BTreeMap<String, usize> = BTreeMap::new();
    for name in &names {
        let cell = name["e2e__zoo_".len()..].split("__").next().unwrap_or("");
        *per_cell.entry(cell.to_string()).or_default() += 1;
    }
    let failures = learn_support::e2e::check_files(&dir, &names, &Default::default());
    println!("golden zoo: {} cases {per_cell:?}", names.len());
    for c in learn_support::zoo::CELLS {
        assert!(
            per_cell.get(*c).copied().unwrap_or(0) >= 4,
            "golden zoo: fewer than 4 cases for `{c}`"
        );
    }
    assert!(failures.is_empty(), "golden zoo:\n{}", failures.join("\n"));
}
