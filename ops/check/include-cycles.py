#!/usr/bin/env python3
"""Fails when the folders of runtime/ include each other in a cycle (runtime/A includes
runtime/B, which includes ... runtime/A): each folder is a module, and modules form layers
(config below the policies, the policies below the workers and shards). Prints every cycle
with one include of each step, file and line.

  python3 ops/check/include-cycles.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s+"runtime/([A-Za-z0-9_]+)/')


def graph():
    edges = {}  # (a, b) -> "file:line"
    base = os.path.join(ROOT, "runtime")
    for folder in sorted(os.listdir(base)):
        path = os.path.join(base, folder)
        if not os.path.isdir(path):
            continue
        for dirpath, _, files in os.walk(path):
            for name in sorted(files):
                if not name.endswith((".hpp", ".cpp", ".h", ".cu", ".cuh")):
                    continue
                f = os.path.join(dirpath, name)
                with open(f, encoding="utf-8", errors="replace") as src:
                    for n, line in enumerate(src, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) != folder:
                            edges.setdefault((folder, m.group(1)), f"{os.path.relpath(f, ROOT)}:{n}")
    return edges


def cycles(edges):
    """One cycle through each include edge that closes one (the shortest), deduplicated."""
    nodes = sorted({a for a, _ in edges} | {b for _, b in edges})
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    out = {}
    for a, b in sorted(edges):
        prev = {b: None}
        queue = [b]
        while queue and a not in prev:
            nxt = []
            for n in queue:
                for m in succ[n]:
                    if m not in prev:
                        prev[m] = n
                        nxt.append(m)
            queue = nxt
        if a not in prev:
            continue
        path = [a]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cyc = [a] + list(reversed(path))  # a -> b -> ... -> a
        key = frozenset(zip(cyc, cyc[1:]))
        out.setdefault(key, cyc)
    return list(out.values())


def main():
    edges = graph()
    found = cycles(edges)
    if not found:
        print(f"runtime/: {len({a for a, _ in edges})} folders, {len(edges)} include edges, no cycle")
        return 0
    for cyc in found:
        print("cycle: " + " -> ".join(cyc))
        for a, b in zip(cyc, cyc[1:]):
            print(f"  {a} -> {b}: {edges[(a, b)]}")
    print(f"{len(found)} include cycle(s) between runtime/'s folders: move the shared part down a layer")
    return 1


if __name__ == "__main__":
    sys.exit(main())
