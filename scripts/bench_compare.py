#!/usr/bin/env python3
"""Side-by-side table of two bench_learn JSON-line outputs, with ratios.

Reads the lines starting with ``{`` of two files (or ``-`` for stdin) --
typically ``cargo run --release --example bench_learn`` (braintrace-rs) and
``scripts/bench_ref/bench_learn_ref.py`` (braintrace 0.2.6) -- matches
configurations on (model, algo, n_in, n_rec, n_out, batch, T) and prints
ms/step (wall and CPU time), compile time and peak RSS of both.
``speed-up`` is ms_per_step(reference) / ms_per_step(ours), ``cpu speed-up``
the same with cpu_ms_per_step: above 1 means ours is faster.
Configurations present in only one file are listed at the end. Standard
library only.

With ``--floor FILE`` (JSON lines of ``examples/bench_floor.rs``) two more
columns show the floor of each configuration on this machine and ours over
it: for D-RTRL the trace-bandwidth floor (``"bench": "floor"``: the two GRU
relations' traces, the same bytes as the LIF relation's two states), for
pp_prop the model's matrix products alone (``"bench": "pp_products_floor"``).
Where our line carries its own floor (``bench_learn --floor``: the same
trace loop or products, timed alternately with the learner, in the same
process and the same minutes), the columns use that one instead
(``floor_cpu_ms_per_step`` and ``vs_floor``), marked ``(alt)``: on a noisy
machine a floor timed minutes apart can be off by more than the ratio
itself.

A configuration may appear several times in both files (``REPEAT=N
scripts/bench_ref/side_by_side.sh`` runs ours and the reference N times
in turn): the k-th line of ours and the k-th of the reference are a pair,
measured seconds apart. The table then shows each column's median over
the lines (peak RSS: the largest), the speed-ups as the median of the
pairs' ratios (a ratio within a pair is not moved by the machine's speed
drifting between pairs), and the number of pairs.

    python3 scripts/bench_compare.py rs.jsonl ref.jsonl
    python3 scripts/bench_compare.py --markdown rs.jsonl ref.jsonl
    python3 scripts/bench_compare.py --floor floor.jsonl rs.jsonl ref.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys

KEY = ("model", "algo", "n_in", "n_rec", "n_out", "batch", "T")


def load(path):
    f = sys.stdin if path == "-" else open(path)
    rows = {}
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            missing = [k for k in KEY + ("ms_per_step",) if k not in r]
            if missing:
                sys.exit(f"{path}:{n}: missing {', '.join(missing)}")
            rows.setdefault(tuple(r[k] for k in KEY), []).append(r)
    return rows


def median(vs):
    vs = sorted(v for v in vs if v is not None)
    if not vs:
        return None
    m = len(vs) // 2
    return vs[m] if len(vs) % 2 else (vs[m - 1] + vs[m]) / 2


def merged(rs):
    """One line of a configuration's lines: the median of every measured
    value (the largest peak RSS, the fewest steps timed), the settings
    from the first line."""
    out = dict(rs[0])
    for k, v in rs[0].items():
        vals = [x for x in (r.get(k) for r in rs) if x is not None]
        if k == "steps_timed":
            out[k] = min(vals)
        elif k == "peak_rss_mb":
            out[k] = max(vals)
        elif isinstance(v, float):
            out[k] = median(vals)
    return out


def paired(os_, rs, field):
    """The median over pairs of ref / ours for ``field``."""
    return median(ratio(r.get(field), o.get(field)) for o, r in zip(os_, rs))


def load_floors(path):
    """(bench, model or None, n_rec, batch) -> ms_per_step from bench_floor."""
    floors = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                floors[(r["bench"], r.get("model"), r["n_rec"], r["batch"])] = r["ms_per_step"]
    return floors


def floor_of(floors, key):
    model, algo, _, n_rec, _, batch, _ = key
    if algo == "d_rtrl":
        return floors.get(("floor", None, n_rec, batch))
    return floors.get(("pp_products_floor", model, n_rec, batch))


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def times(v):
    return "-" if v is None else format(v, ".3g") + "x"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ours", help="JSON lines of braintrace-rs (bench_learn)")
    p.add_argument("ref", help="JSON lines of the reference (bench_learn_ref.py)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--floor", help="JSON lines of bench_floor: adds floor columns")
    a = p.parse_args(argv)
    ours, ref = load(a.ours), load(a.ref)
    floors = load_floors(a.floor) if a.floor else None
    order = {"gru": 0, "lif": 1, "d_rtrl": 0, "pp_prop": 1}
    keys = sorted(set(ours) & set(ref),
                  key=lambda k: (order.get(k[0], 9), k[0], order.get(k[1], 9), k[1]) + k[2:])
    name_o = next(iter(ours.values()), [{}])[0].get("impl", "ours")
    name_r = next(iter(ref.values()), [{}])[0].get("impl", "ref")
    pairs = {k: min(len(ours[k]), len(ref[k])) for k in keys}
    repeated = any(n > 1 for n in pairs.values())

    head = ["model", "algo", "hidden x batch", "T",
            "ms/step ours", "ms/step ref", "speed-up",
            "cpu ms/step ours", "cpu ms/step ref", "cpu speed-up",
            "compile ms ours", "compile ms ref", "RSS MiB ours", "RSS MiB ref",
            "steps timed ours"]
    if repeated:
        head += ["pairs"]
    if floors is not None:
        head += ["floor ms", "ours / floor"]
    lines = []
    for k in keys:
        o, r = merged(ours[k]), merged(ref[k])
        lines.append([
            k[0], k[1], f"{k[3]} x {k[5]}", str(k[6]),
            fmt(o["ms_per_step"], ".4g"), fmt(r["ms_per_step"], ".4g"),
            times(paired(ours[k], ref[k], "ms_per_step")),
            fmt(o.get("cpu_ms_per_step"), ".4g"), fmt(r.get("cpu_ms_per_step"), ".4g"),
            times(paired(ours[k], ref[k], "cpu_ms_per_step")),
            fmt(o.get("compile_ms"), ".1f"), fmt(r.get("compile_ms"), ".1f"),
            fmt(o.get("peak_rss_mb"), ".1f"), fmt(r.get("peak_rss_mb"), ".1f"),
            str(o.get("steps_timed", k[6])),
        ])
        if repeated:
            lines[-1] += [str(pairs[k])]
        if floors is not None:
            if o.get("vs_floor") is not None:
                lines[-1] += [fmt(o.get("floor_cpu_ms_per_step"), ".4g") + " (alt)",
                              times(o["vs_floor"])]
            else:
                fl = floor_of(floors, k)
                lines[-1] += [fmt(fl, ".4g"), times(ratio(o.get("cpu_ms_per_step"), fl))]
    print(f"ours = {name_o}, ref = {name_r}; speed-up = ref / ours "
          "(above 1: ours is faster)", file=sys.stderr)
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for l in lines:
            print("| " + " | ".join(l) + " |")
    else:
        widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
                  for i, h in enumerate(head)]
        print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        for l in lines:
            print("  ".join(c.rjust(w) for c, w in zip(l, widths)))
    only_o = sorted(set(ours) - set(ref))
    only_r = sorted(set(ref) - set(ours))
    for label, ks in (("only in " + a.ours, only_o), ("only in " + a.ref, only_r)):
        for k in ks:
            print(f"{label}: {dict(zip(KEY, k))}", file=sys.stderr)
    if not keys:
        sys.exit("no configuration in common")


if __name__ == "__main__":
    main()
