#!/usr/bin/env bash
# Build-time measurement of the macros: generate a crate with N (default 50)
# `#[etp_primitive]` primitives, each with its four companion rules,
# depending on braintrace by path; build its dependencies once, then time a
# clean build of that crate alone (debug, then release). With `--baseline`
# the same functions are generated without the attributes, for comparison.
#
#   scripts/gen_many_prims.sh [N] [DIR] [--baseline]
#
# The generated crate denies warnings and missing docs, so it also checks
# that the expansion is lint-clean in a user crate.
set -euo pipefail

N="${1:-50}"
DIR="${2:-/tmp/braintrace_many_prims}"
MODE="${3:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

rm -rf "$DIR/src"
mkdir -p "$DIR/src"
cat >"$DIR/Cargo.toml" <<TOML
[package]
name = "many_prims"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
braintrace = { path = "$ROOT" }

[workspace]
TOML
cp "$ROOT/rust-toolchain.toml" "$DIR/" 2>/dev/null || true

lib="$DIR/src/lib.rs"
{
    echo '//! Generated: many macro-defined ETP primitives.'
    echo '#![deny(warnings, missing_docs)]'
    echo 'use braintrace::prelude::*;'
    for i in $(seq 1 "$N"); do
        # Baseline: no attributes; the rules are then unused, which is allowed.
        if [ "$MODE" = "--baseline" ]; then attr() { echo "#[allow(dead_code)]"; }; else attr() { echo "$1"; }; fi
        [ "$MODE" = "--baseline" ] || attr "#[etp_primitive(name = \"etp_gen_$i\", batched)]"
        cat <<RS
/// y = scale * (x @ w), number $i.
pub fn op_$i(x: &Tensor, w: &Tensor, $( [ "$MODE" = "--baseline" ] || echo "#[param]") scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}
RS
        attr "#[yw_to_w(op_$i)]"
        cat <<RS
fn op_${i}_yw_to_w(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}
RS
        attr "#[xy_to_dw(op_$i)]"
        cat <<RS
fn op_${i}_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, $( [ "$MODE" = "--baseline" ] && echo "scale: f64" || echo "p: &op_$i::Params")) -> Result<Tensor> {
    x.transpose(&[1, 0])?.matmul(hidden)?.mul_scalar($( [ "$MODE" = "--baseline" ] && echo "scale" || echo "p.scale"))
}
RS
        attr "#[init_drtrl(op_$i)]"
        cat <<RS
fn op_${i}_init_drtrl(x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[&x.shape()[..1], w.shape(), &[n]].concat(), y.dtype()))
}
RS
        attr "#[init_pp(op_$i)]"
        cat <<RS
fn op_${i}_init_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}
RS
    done
} >"$lib"

cd "$DIR"
export CARGO_TARGET_DIR="$DIR/target"
echo "generated $N primitives ($([ "$MODE" = "--baseline" ] && echo baseline, no attributes || echo with the macros)) in $DIR"
for profile in dev release; do
    flag=$([ "$profile" = release ] && echo --release || true)
    cargo build $flag --quiet 2>&1 | tail -20      # dependencies (and a first build)
    cargo clean $flag -p many_prims --quiet
    start=$(date +%s.%N)
    cargo build $flag --quiet
    end=$(date +%s.%N)
    printf '%s: clean build of many_prims alone: %.2f s\n' "$profile" "$(echo "$end - $start" | bc)"
done
