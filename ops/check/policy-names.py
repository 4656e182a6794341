#!/usr/bin/env python3
"""Fails where code outside the policies' registry compares a string with a policy's name
(`policy == "ring"`, `"ashl" != p`): a policy-specific rule is reached through its row in
runtime/policy/registry.cpp (policy_traits: its family, ring, commits, its own rules), so
that adding a policy is one file and one row. The names are read from the registry's table.
A comparison of the same word that is not a policy's name is marked on its line with
`not-a-policy-name` and says what it is.

  python3 ops/check/policy-names.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTRY = os.path.join("runtime", "policy", "registry.cpp")
FOLDERS = ["runtime", "actors", "apps", "gpu"]


def names():
    with open(os.path.join(ROOT, REGISTRY), encoding="utf-8") as f:
        found = re.findall(r'^\s*\{"([a-z0-9_-]+)",\s*\[', f.read(), re.M)
    if len(found) < 5:
        sys.exit(f"policy-names: cannot read the policy table of {REGISTRY} (found {found})")
    return found


def main():
    words = "|".join(re.escape(n) for n in names())
    compare = re.compile(rf'(==|!=)\s*"({words})"|"({words})"\s*(==|!=)')
    bad = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if not name.endswith((".hpp", ".cpp", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                if rel == REGISTRY:
                    continue
                with open(path, encoding="utf-8", errors="replace") as src:
                    for n, line in enumerate(src, 1):
                        code = line.split("//", 1)[0]
                        if compare.search(code) and "not-a-policy-name" not in line:
                            bad.append(f"{rel}:{n}: {line.strip()}")
    if not bad:
        print(f"no policy name compared outside {REGISTRY} ({', '.join(names())})")
        return 0
    print("\n".join(bad))
    print(f"{len(bad)} comparison(s) with a policy's name outside {REGISTRY}: reach the rule through the "
          "policy's row (traits_of(name): rules, ring, commits, own_rules)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
