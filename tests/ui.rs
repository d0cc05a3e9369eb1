//! Compile-fail and compile-pass cases of the macros (trybuild), grouped by
//! category folder under `tests/ui/`. Each failing case has a committed
//! `.stderr`; regenerate with `TRYBUILD=overwrite cargo test --test ui` and
//! read every changed file before committing it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/missing_rule/*.rs");
    t.compile_fail("tests/ui/bad_companion/*.rs");
    t.compile_fail("tests/ui/bad_flags/*.rs");
    t.compile_fail("tests/ui/bad_primitive/*.rs");
    t.compile_fail("tests/ui/bad_trace_kernel/*.rs");
}
