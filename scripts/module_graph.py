#!/usr/bin/env python3
"""Print braintrace-core's top-level module dependency graph (non-test code):
for each module, the other top-level modules its sources name through
`crate::`, then whether the graph has a cycle. `tests/layers.rs` enforces the
layer order; this prints the edges themselves (for notes and reviews).

    python3 scripts/module_graph.py [braintrace-core/src]
"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "braintrace-core/src"
def code(text):
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        t = lines[i].lstrip()
        if t.startswith("#[cfg(test)]"):
            depth, opened = 0, False
            i += 1
            while i < len(lines):
                l = lines[i].split("//")[0]
                depth += l.count("{"); opened |= "{" in l; depth -= l.count("}")
                i += 1
                if (opened and depth <= 0) or (not opened and l.rstrip().endswith(";")):
                    break
            continue
        if not t.startswith("//"):
            out.append(lines[i].split("//")[0])
        i += 1
    return "\n".join(out)
edges = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"): continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        mod = rel.split(os.sep)[0].removesuffix(".rs")
        if rel.endswith("tests.rs") or "/tests/" in rel: continue
        txt = code(open(p).read())
        names = set(re.findall(r"crate::([a-z_0-9]+)", txt))
        # `use crate::{a, b::c}` groups
        for grp in re.findall(r"crate::\{([^}]*)\}", txt, re.S):
            for n in re.findall(r"(?:^|,)\s*([a-z_0-9]+)", grp):
                names.add(n)
        mods = {m.removesuffix(".rs") for m in os.listdir(root)}
        edges.setdefault(mod, set()).update(n for n in names if n in mods and n != mod)
for m in sorted(edges):
    print(f"{m:10} -> {', '.join(sorted(edges[m])) or '-'}")
# cycle check (Tarjan-lite via DFS)
state = {}
def dfs(u, stack):
    state[u] = 1; stack.append(u)
    for v in edges.get(u, ()):
        if state.get(v) == 1:
            print("CYCLE:", " -> ".join(stack[stack.index(v):] + [v])); return True
        if state.get(v) is None and dfs(v, stack): return True
    state[u] = 2; stack.pop(); return False
print("top level: cycle" if any(state.get(m) is None and dfs(m, []) for m in sorted(edges)) else "top level: no cycles")

# The second level: within each top-level module, which of its submodules
# name which others (`super::x` from a file directly under it, or
# `crate::<top>::x`); strongly connected groups of two or more are cycles.
sub = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(d, f), root)
        parts = rel.removesuffix(".rs").split(os.sep)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if len(parts) < 2 or "tests" in parts or parts[-1].startswith("tests"):
            continue
        top, me = parts[0], parts[1]
        folder = os.path.join(root, top)
        siblings = {x.removesuffix(".rs") for x in os.listdir(folder)} - {"mod", me}
        txt = code(open(os.path.join(d, f)).read())
        names = set(re.findall(r"crate::%s::([a-z_0-9]+)" % top, txt))
        for grp in re.findall(r"crate::%s::\{([^}]*)\}" % top, txt, re.S):
            names.update(re.findall(r"(?:^|,)\s*([a-z_0-9]+)", grp))
        if len(parts) == 2:
            names.update(re.findall(r"super::([a-z_0-9]+)", txt))
        sub.setdefault(f"{top}/{me}", set()).update(f"{top}/{n}" for n in names & siblings)
index, low, stack, on, groups, n = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def scc(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in sub.get(v, ()):
        if w not in index:
            scc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        g = []
        while True:
            w = stack.pop(); on.discard(w); g.append(w)
            if w == v:
                break
        if len(g) > 1:
            groups.append(sorted(g))
for v in sorted(sub):
    if v not in index:
        scc(v)
for g in groups:
    print("second-level cycle:", " <-> ".join(g))
print(f"second level ({len(sub)} modules): " + ("no cycles" if not groups else f"{len(groups)} cycles"))
