#!/usr/bin/env bash
# Every online algorithm side by side with braintrace 0.2.6 (issue 35's
# acceptance table): GRU net, batch 16, hidden 128 and 512, T 10, f32.
#
#   scripts/bench_ref/algos_side_by_side.sh [OUT_DIR]  (default: target/algos_side_by_side)
#
# Each configuration runs ours and the reference at the same time, ours
# (`bench_learn`, single-threaded) pinned with `taskset -c $CPU_RS`
# (default 0), the reference (`bench_learn_ref.py`, which restricts XLA to
# one thread) pinned to `$CPU_REF` (default 1), so both see the same
# minutes of the machine's load. The comparison is CPU time per step
# (`cpu_ms_per_step`), steadier than wall time on a loaded machine; the
# load average is recorded before each pair and in meta.txt.
#
# A run that does not finish within TIMEOUT seconds (default 600) is
# killed and shown as such. SKIP lists `algo:hidden` pairs not run at all
# (default `snap2:512`: SnAp-2's traces of a GRU at hidden 512 hold
# B·I·O·H ≈ 16·528·512·512 elements per relation, about 9 GB in f32, on
# both sides).
#
# SIDE=rs or SIDE=ref runs one side only, appending to the output of the
# other (when one side must wait, e.g. for a build); the table is then of
# two passes, each with its own load column (default: both, in pairs).
#
# Environment: BRAINTRACE_REF_PY (see scripts/ref_python.sh), BUILD=0
# (use target/release/examples/bench_learn as it is), ALGOS,
# NRECS, BATCH, T, TIMEOUT, SKIP, CPU_RS, CPU_REF,
# BENCH_NON_TEMPORAL (passed to bench_learn: `in_step` measures the
# library's default in-step gradient for parameters without a relation
# instead of braintrace's zeros).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PY="$(scripts/ref_python.sh)"
OUT="${1:-target/algos_side_by_side}"
ALGOS="${ALGOS:-d_rtrl pp_prop eprop ostl_recurrent ostl_feedforward three_factor snap1 snap2 uoro random_projection}"
NRECS="${NRECS:-128 512}"
BATCH="${BATCH:-16}"
T="${T:-10}"
TIMEOUT="${TIMEOUT:-600}"
SKIP="${SKIP:-snap2:512}"
CPU_RS="${CPU_RS:-0}"
CPU_REF="${CPU_REF:-1}"
SIDE="${SIDE:-both}"

RS=target/release/examples/bench_learn
mkdir -p "${OUT}"
if [[ "${SIDE}" != ref ]]; then
    [[ "${BUILD:-1}" == 0 ]] || cargo build --release --example bench_learn
    : >"${OUT}/rs.jsonl"
fi
if [[ "${SIDE}" != rs ]]; then
    : >"${OUT}/ref.jsonl"
fi
if [[ "${SIDE}" == both ]]; then
    : >"${OUT}/notes.txt"
    : >"${OUT}/meta.txt"
fi
{
    date -u +"start %FT%TZ"
    git rev-parse HEAD
    echo "algos ${ALGOS}; hidden ${NRECS}; batch ${BATCH}; T ${T}; timeout ${TIMEOUT}s; skip ${SKIP}"
    uptime
    echo "side ${SIDE}"
} >>"${OUT}/meta.txt"
# A note on a run without a result: timed out (`timeout`'s 124) or failed.
why() {
    if [[ "$1" == 124 ]]; then
        echo "$2 not done in ${TIMEOUT}s" >>"${OUT}/notes.txt"
    else
        echo "$2 failed (exit $1)" >>"${OUT}/notes.txt"
    fi
}
for n in ${NRECS}; do
    for algo in ${ALGOS}; do
        if [[ " ${SKIP} " == *" ${algo}:${n} "* ]]; then
            [[ "${SIDE}" == rs ]] || echo "${algo} ${n} skipped" >>"${OUT}/notes.txt"
            continue
        fi
        args=(--model gru --algo "${algo}" --n-rec "${n}" --batch "${BATCH}" --T "${T}")
        load="$(cut -d' ' -f1-3 /proc/loadavg)"
        echo "== ${args[*]}  (load: ${load})" >&2
        echo "${algo} ${n} load ${load} ${SIDE}" >>"${OUT}/notes.txt"
        rs_pid=""
        ref_pid=""
        [[ "${SIDE}" == ref ]] || : >"${OUT}/rs.part"
        [[ "${SIDE}" == rs ]] || : >"${OUT}/ref.part"
        [[ "${SIDE}" == ref ]] || (timeout "${TIMEOUT}" taskset -c "${CPU_RS}" "${RS}" "${args[@]}" --threads 1 \
            >"${OUT}/rs.part" 2>/dev/null || why "$?" "${algo} ${n} ours:") &
        [[ "${SIDE}" == ref ]] || rs_pid=$!
        [[ "${SIDE}" == rs ]] || (timeout "${TIMEOUT}" "${PY}" scripts/bench_ref/bench_learn_ref.py --cpu "${CPU_REF}" "${args[@]}" \
            >"${OUT}/ref.part" 2>/dev/null || why "$?" "${algo} ${n} braintrace:") &
        [[ "${SIDE}" == rs ]] || ref_pid=$!
        # shellcheck disable=SC2086
        wait ${rs_pid} ${ref_pid} || true
        [[ "${SIDE}" == ref ]] || grep '^{' "${OUT}/rs.part" >>"${OUT}/rs.jsonl" || true
        [[ "${SIDE}" == rs ]] || grep '^{' "${OUT}/ref.part" >>"${OUT}/ref.jsonl" || true
    done
done
[[ "${SIDE}" == ref ]] || rm -f "${OUT}/rs.part"
[[ "${SIDE}" == rs ]] || rm -f "${OUT}/ref.part"
{
    date -u +"end %FT%TZ"
    uptime
} >>"${OUT}/meta.txt"

python3 scripts/bench_ref/algos_table.py "${OUT}" | tee "${OUT}/table.md"
