#!/usr/bin/env bash
# bench_learn (braintrace-rs) and bench_learn_ref.py (braintrace 0.2.6) run
# configuration by configuration, back to back, so that both see the same
# machine load; then the side-by-side table. Both are pinned to one CPU
# (taskset for ours, which is single-threaded anyway; the reference pins
# itself and restricts XLA to one thread).
#
#   scripts/bench_ref/side_by_side.sh [OUT_DIR]     (default: target/bench_learn)
#
# THREADS=2 runs both on both cores instead: ours with `--threads 2`
# (fused trace kernels and matrix products), the reference with
# `--all-cores`; compare wall time (`ms_per_step`) then, since CPU time
# adds up over threads.
#
# REPEAT=N runs each configuration's pair (ours, then the reference) N
# times in turn; the table shows medians and the median of the pairs'
# ratios (scripts/bench_compare.py), so one slow moment of this shared
# machine moves one pair, not the comparison.
#
# Environment: BRAINTRACE_REF_PY (the reference python; default the repository's
# .venv-ref, made by scripts/ref_venv.sh), CPU (default 0),
# THREADS (default 1), REPEAT (default 1),
# MODELS, ALGOS, NRECS, BATCHES (space-separated; default the full grid),
# BENCH_QUICK=1 for a smoke run (hidden 32, batch 4, T 5).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PY="$(scripts/ref_python.sh)"
OUT="${1:-target/bench_learn}"
CPU="${CPU:-0}"
MODELS="${MODELS:-gru lif}"
ALGOS="${ALGOS:-d_rtrl pp_prop}"
if [[ -n "${BENCH_QUICK:-}" ]]; then
    NRECS="${NRECS:-32}" BATCHES="${BATCHES:-4}" T=5
else
    NRECS="${NRECS:-128 512}" BATCHES="${BATCHES:-16 64}" T=100
fi
THREADS="${THREADS:-1}"
REPEAT="${REPEAT:-1}"
PIN=()
REF_CORES=(--cpu "${CPU}")
FLOOR=()
if [[ "${THREADS}" == 1 ]]; then
    # The floors (D-RTRL's trace bandwidth, pp_prop's products), timed
    # alternately with our learner in its process (single-threaded, so
    # only with one thread).
    FLOOR=(--floor)
    if command -v taskset >/dev/null 2>&1; then
        PIN=(taskset -c "${CPU}")
    fi
else
    REF_CORES=(--all-cores)
fi

cargo build --release --example bench_learn --example bench_floor
RS=target/release/examples/bench_learn
mkdir -p "${OUT}"
: >"${OUT}/rs.jsonl"
: >"${OUT}/ref.jsonl"
: >"${OUT}/floor.jsonl"
{
    date -u +"start %FT%TZ"
    git rev-parse HEAD
    echo "threads ${THREADS} repeat ${REPEAT}"
    uptime
} >"${OUT}/meta.txt"
for model in ${MODELS}; do
    for algo in ${ALGOS}; do
        for n in ${NRECS}; do
            for b in ${BATCHES}; do
                args=(--model "${model}" --algo "${algo}" --n-rec "${n}" --batch "${b}" --T "${T}")
                for ((r = 1; r <= REPEAT; r++)); do
                    echo "== ${args[*]}  [${r}/${REPEAT}]  (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
                    "${PIN[@]}" "${RS}" "${args[@]}" --threads "${THREADS}" "${FLOOR[@]}" >>"${OUT}/rs.jsonl" 2>/dev/null ||
                        echo "braintrace-rs failed: ${args[*]}" >&2
                    "${PY}" scripts/bench_ref/bench_learn_ref.py "${REF_CORES[@]}" "${args[@]}" \
                        >>"${OUT}/ref.jsonl" 2>/dev/null ||
                        echo "reference failed: ${args[*]}" >&2
                done
            done
        done
    done
done
# The floors of each size on this machine (examples/bench_floor.rs), in the
# same run: D-RTRL's trace bandwidth, pp_prop's matrix products (best
# times; the table prefers the alternated ones of `--floor`). They are
# single-threaded, so only with one thread.
if [[ "${THREADS}" == 1 ]]; then
    for n in ${NRECS}; do
        for b in ${BATCHES}; do
            "${PIN[@]}" target/release/examples/bench_floor "${n}" "${b}" >>"${OUT}/floor.jsonl" 2>/dev/null ||
                echo "bench_floor failed: ${n} ${b}" >&2
        done
    done
fi
{
    date -u +"end %FT%TZ"
    uptime
} >>"${OUT}/meta.txt"
python3 scripts/bench_compare.py --floor "${OUT}/floor.jsonl" "${OUT}/rs.jsonl" "${OUT}/ref.jsonl"
python3 scripts/bench_compare.py --markdown --floor "${OUT}/floor.jsonl" "${OUT}/rs.jsonl" "${OUT}/ref.jsonl" \
    >"${OUT}/table.md"
