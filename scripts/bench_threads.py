#!/usr/bin/env python3
"""The library's choice of threads against one thread and all cores.

Runs `bench_learn --threads auto,1,N` (N: all cores) over a grid of sizes,
each configuration with the three settings one after the other and the
whole grid `--rounds` times (so the settings alternate over the minutes of
the run), and prints one JSON line per configuration: the median wall
ms/step of each setting over the rounds, the better of one thread and all
cores, and the default over it (the goal: at most 1.1). Then a markdown
table.

    python3 scripts/bench_threads.py [--bin target/release/examples/bench_learn]
        [--models gru,lif] [--algos d_rtrl,pp_prop] [--n-rec 64,128,256,512]
        [--batch 1,16,64] [--rounds 2] [--T 20] [--budget-s 3]

Say the load (`uptime`) with the numbers: the machine may be shared.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/examples/bench_learn")
    ap.add_argument("--models", default="gru,lif")
    ap.add_argument("--algos", default="d_rtrl,pp_prop")
    ap.add_argument("--n-rec", default="64,128,256,512")
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--T", default="20")
    ap.add_argument("--budget-s", default="3")
    ap.add_argument("--runs", default="3")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    cmd = [
        a.bin, "--model", a.models, "--algo", a.algos, "--n-rec", a.n_rec,
        "--batch", a.batch, "--T", a.T, "--budget-s", a.budget_s, "--runs", a.runs,
        "--threads", f"auto,1,{cores}", "--rounds", str(a.rounds),
    ]
    print("load before:", open("/proc/loadavg").read().strip(), file=sys.stderr)
    out = subprocess.run(cmd, capture_output=True, text=True)
    print("load after:", open("/proc/loadavg").read().strip(), file=sys.stderr)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
    by = {}
    for r in rows:
        key = (r["model"], r["algo"], r["n_rec"], r["batch"])
        by.setdefault(key, {}).setdefault(str(r["threads"]), []).append(r)
    table = []
    for key, modes in by.items():
        med = {m: statistics.median(x["ms_per_step"] for x in v) for m, v in modes.items()}
        auto, one, all_ = med.get("auto"), med.get("1"), med.get(str(cores))
        if None in (auto, one, all_):
            continue
        best = min(one, all_)
        line = {
            "model": key[0], "algo": key[1], "n_rec": key[2], "batch": key[3],
            "default_ms": round(auto, 4), "one_thread_ms": round(one, 4),
            "all_cores_ms": round(all_, 4), "cores": cores,
            "default_over_best": round(auto / best, 3),
            "default_splits": modes["auto"][0].get("auto_splits"),
            "work_est_ms": modes["auto"][0].get("work_est_ms"),
            "rounds": len(modes["auto"]),
        }
        print(json.dumps(line))
        table.append(line)
    print("\n| model | algo | hidden × batch | est. ms | default | 1 thread | all cores | default / best |")
    print("|---|---|---|---|---|---|---|---|")
    for l in table:
        print(f"| {l['model']} | {l['algo']} | {l['n_rec']}×{l['batch']} | {l['work_est_ms']} "
              f"| {l['default_ms']} ({'split' if l['default_splits'] else '1 thread'}) "
              f"| {l['one_thread_ms']} | {l['all_cores_ms']} | {l['default_over_best']} |")
    worst = max((l["default_over_best"] for l in table), default=None)
    print(f"\nworst default / best: {worst}")


if __name__ == "__main__":
    main()
