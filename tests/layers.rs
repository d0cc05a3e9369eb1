//! The layers of `braintrace-core` import downward only (see
//! `design/ARCHITECTURE.md`): this test reads the crate's sources and fails
//! on any `crate::<module>` path in non-test code that names a module of a
//! higher layer than the file's own. Comments and `#[cfg(test)]` modules
//! are not read (a unit test may drive the whole stack).

use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, bottom first. Modules of one layer may use each
/// other; a module may use any layer below its own.
const LAYERS: &[&[&str]] = &[
    &["dtype", "error", "random", "threads"],
    &["tensor"],
    &["kernels"],
    &["graph"],
    &["ops"],
    &["exec"],
    &["transform"],
    &["etp"],
    &["prims"],
    &["learn"],
    &["nn"],
    // The macros' glue and the crate root re-export everything.
    &["__private", "lib"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading the source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/graph/mod.rs` and
/// `src/graph.rs` are both `graph`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("a file under src");
    let first = rel.components().next().expect("a path component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The code of `text` outside comments and `#[cfg(test)]` items (a test
/// module is skipped from its attribute to its closing brace).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            // Skip the attribute's item: up to the brace that closes it,
            // or its `;` when it has no body.
            let mut depth = 0i32;
            let mut opened = false;
            for (_, l) in lines.by_ref() {
                let l = l.split("//").next().unwrap_or("");
                depth += l.matches('{').count() as i32;
                opened |= l.contains('{');
                depth -= l.matches('}').count() as i32;
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        let code = line.split("//").next().unwrap_or("").to_string();
        out.push((i + 1, code));
    }
    out
}

/// Every `crate::<module>` named in `code` (including `crate::{a, b}`).
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `$crate::` (in macros) is the crate root as well.
        let after = &rest[at + "crate::".len()..];
        let before_ok = at == 0 || {
            let c = rest.as_bytes()[at - 1];
            !(c.is_ascii_alphanumeric() || c == b'_') || c == b'$'
        };
        if before_ok {
            if let Some(list) = after.strip_prefix('{') {
                let end = list.find('}').unwrap_or(list.len());
                for item in list[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        found.push(name);
                    }
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push(name);
                }
            }
        }
        rest = after;
    }
    found
}

/// A unit-test module kept in a file of its own (`mod tests;` under
/// `#[cfg(test)]`): read as a test, not as the layer's code.
fn is_test_file(file: &Path) -> bool {
    file.file_name().is_some_and(|n| n == "tests.rs")
}

#[test]
fn core_modules_import_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("braintrace-core/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut violations = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let Some(own) = layer_of(&module) else {
            violations.push(format!(
                "{}: module `{module}` is in no layer of this test's table",
                file.display()
            ));
            continue;
        };
        if is_test_file(file) {
            continue;
        }
        let text = fs::read_to_string(file).expect("reading a source file");
        for (line, code) in code_lines(&text) {
            for used in crate_paths(&code) {
                // Items re-exported at the crate root (`crate::Error`,
                // `crate::Tensor`, ...) start with a capital letter and are
                // defined in the bottom layers; lower-case names are modules
                // or root functions.
                let Some(layer) = layer_of(&used) else {
                    continue;
                };
                if layer > own {
                    violations.push(format!(
                        "{}:{line}: `{module}` (layer {own}) uses `crate::{used}` (layer {layer})",
                        file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "upward imports:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_scanner_finds_paths_and_skips_tests_and_comments() {
    let text = "use crate::{tensor, learn::X};\n// crate::nn in a comment\nfn f() { crate::ops::g() }\n#[cfg(test)]\nmod tests {\n    use crate::nn;\n}\nuse crate::etp;\n";
    let names: Vec<String> = code_lines(text)
        .into_iter()
        .flat_map(|(_, c)| crate_paths(&c))
        .collect();
    assert_eq!(names, ["tensor", "learn", "ops", "etp"]);
}

/// Where `unsafe` may appear: the numeric kernels and the executor's
/// buffer views (ARCHITECTURE.md), each block documented (clippy's
/// `undocumented_unsafe_blocks`, denied in lib.rs).
fn unsafe_allowed(rel: &Path) -> bool {
    rel.starts_with("kernels") || rel == Path::new("exec/buffer.rs")
}

#[test]
fn unsafe_code_stays_in_kernels_and_the_executor_buffers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("braintrace-core/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if unsafe_allowed(rel) {
            continue;
        }
        let text = fs::read_to_string(file).expect("reading a source file");
        for (line, code) in code_lines(&text) {
            let words = code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            if words.into_iter().any(|w| w == "unsafe") {
                found.push(format!("{}:{line}: {}", rel.display(), code.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "unsafe outside kernels/ and exec/buffer.rs:\n{}",
        found.join("\n")
    );
}
