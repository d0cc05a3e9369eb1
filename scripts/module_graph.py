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
print("cycle" if any(state.get(m) is None and dfs(m, []) for m in sorted(edges)) else "no cycles")
