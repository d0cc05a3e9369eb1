//! The book must not drift from the code: every trybuild case is listed in
//! the compile-time-checks chapter, and every `{{#include}}` in the book
//! names a file that exists (mdbook only warns about a missing one).

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_trybuild_case_is_listed_in_the_book() {
    let chapter =
        fs::read_to_string(root().join("book/src/compile-time-checks.md")).expect("chapter exists");
    let mut missing = Vec::new();
    for dir in fs::read_dir(root().join("tests/ui")).expect("tests/ui exists") {
        let dir = dir.expect("readable").path();
        for case in fs::read_dir(&dir).expect("readable") {
            let case = case.expect("readable").path();
            if case.extension().is_some_and(|e| e == "rs") {
                let stem = case
                    .file_stem()
                    .expect("file name")
                    .to_string_lossy()
                    .to_string();
                if !chapter.contains(&format!("`{stem}`")) {
                    missing.push(case.display().to_string());
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "trybuild cases not listed in book/src/compile-time-checks.md: {missing:?}"
    );
}

#[test]
fn every_book_include_exists() {
    let src = root().join("book/src");
    let mut broken = Vec::new();
    for page in fs::read_dir(&src).expect("book/src exists") {
        let page = page.expect("readable").path();
        if page.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = fs::read_to_string(&page).expect("readable");
        for part in text.split("{{#include ").skip(1) {
            let target = part.split("}}").next().expect("closed include").trim();
            let target = target.split(':').next().expect("path");
            if !Path::new(&src).join(target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "includes that name no file: {broken:?}");
}
