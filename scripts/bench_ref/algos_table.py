#!/usr/bin/env python3
"""The table of scripts/bench_ref/algos_side_by_side.sh from its output
directory (rs.jsonl, ref.jsonl, notes.txt, meta.txt); it also reads a
partial run. Several directories (runs of parts of the grid, e.g. with
ALGOS/NRECS and SIDE) are merged, later ones winning. Standard library
only.

    python3 scripts/bench_ref/algos_table.py target/algos_side_by_side [MORE_DIRS..]
"""
import json, sys
import os
dirs = sys.argv[1:]
out = dirs[0]
def load(name):
    rows = {}
    for d in dirs:
        if not os.path.exists(f"{d}/{name}.jsonl"):
            continue
        for line in open(f"{d}/{name}.jsonl"):
            r = json.loads(line)
            rows[(r["algo"], r["n_rec"])] = r
    return rows
rs, ref = load("rs"), load("ref")
notes = [l.split() for d in dirs for l in open(f"{d}/notes.txt")]
loads = {}
for l in notes:
    if len(l) > 2 and l[2] == "load":
        side = l[6] if len(l) > 6 else "both"
        prev = loads.get((l[0], int(l[1])))
        now = " ".join(l[3:6])
        loads[(l[0], int(l[1]))] = now if side == "both" else (
            f"{prev}; {'ours' if side == 'rs' else 'braintrace'} {now}" if prev else
            f"{'ours' if side == 'rs' else 'braintrace'} {now}")
# "<algo> <n> ours:|braintrace: <why>": `not done in Ns`, `failed (exit N)`
# or, from older runs, `failed or timed out (Ns)`.
failed = {(l[0], int(l[1]), l[2].rstrip(":")): " ".join(l[3:]) for l in notes if len(l) > 2 and l[2] in ("ours:", "braintrace:")}
skipped = {(l[0], int(l[1])) for l in notes if len(l) == 3 and l[2] == "skipped"}
meta = open(f"{out}/meta.txt").read().split("\n")
print(f"GRU, batch 16, f32, one core each; CPU ms per step (wall in brackets); peak RSS MiB. {meta[2]}\n")
print("| algorithm | hidden | ours | braintrace 0.2.6 | braintrace / ours (CPU) | RSS ours | RSS braintrace | load (1/5/15 min) |")
print("|---|---|---|---|---|---|---|---|")
algos = []
for l in notes:
    if l[0] not in algos:
        algos.append(l[0])
def cell(rows, key, side):
    r = rows.get(key)
    if r is None:
        if key in skipped:
            return "not run"
        f = failed.get((key[0], key[1], side))
        return f"no result: {f}" if f else "—"
    return f"{r['cpu_ms_per_step']:.3f} ({r['ms_per_step']:.3f})"
for n in sorted({k[1] for k in loads} | {k[1] for k in skipped}):
    for a in algos:
        key = (a, n)
        if key not in loads and key not in skipped:
            continue
        o, b = rs.get(key), ref.get(key)
        ratio = f"{b['cpu_ms_per_step'] / o['cpu_ms_per_step']:.2f}" if o and b else "—"
        rss = lambda r: "—" if r is None or r.get("peak_rss_mb") is None else f"{r['peak_rss_mb']:.0f}"
        print(f"| {a} | {n} | {cell(rs, key, 'ours')} | {cell(ref, key, 'braintrace')} | {ratio} | {rss(o)} | {rss(b)} | {loads.get(key, '')} |")
