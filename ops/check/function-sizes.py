#!/usr/bin/env python3
"""Lists the functions of C++ sources longer than a bound, longest first.

A function's length is the lines from its signature's first line to its closing brace,
lambdas inside it included. Used for the rule that no function in actors/ or apps/ is
longer than 80 lines (and `run_node` not longer than 60); exits 1 when one is.

  python3 ops/check/function-sizes.py                      # actors/ and apps/, bound 80
  python3 ops/check/function-sizes.py --max 60 runtime     # any folders, any bound
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Bounds tighter than --max for named functions.
TIGHTER = {"run_node": 60}


def strip(text):
    """Comments, string and character literals blanked out (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^;()]*$|extern\s+\"C\"\s*$")


def functions(path):
    text = strip(open(path, errors="replace").read())
    found = []
    stack = []  # per open brace: "scope" or "code"
    last_end = 0  # where the text before the next top-level brace starts
    i = 0
    while i < len(text):
        c = text[i]
        if c == "{":
            if all(k == "scope" for k in stack):
                head = text[last_end:i]
                head_clean = re.sub(r"\s+", " ", head).strip()
                if SCOPE.search(head_clean) or "(" not in head or head_clean.endswith("="):
                    stack.append("scope")
                    last_end = i + 1
                else:
                    # A function body: find its end.
                    depth, j = 1, i + 1
                    while j < len(text) and depth:
                        depth += {"{": 1, "}": -1}.get(text[j], 0)
                        j += 1
                    first = len(head) - len(head.lstrip())
                    start_line = text.count("\n", 0, last_end + first) + 1
                    end_line = text.count("\n", 0, j) + 1
                    m = re.search(r"([~\w:]+)\s*\((?!.*\b\w+\s*\()", head_clean.split("(")[0] + "(")
                    name = m.group(1) if m else head_clean[:40]
                    found.append((end_line - start_line + 1, name, start_line))
                    i = j
                    last_end = j
                    continue
            else:
                stack.append("code")
        elif c == "}":
            if stack:
                stack.pop()
            last_end = i + 1
        elif c == ";" and all(k == "scope" for k in stack):
            last_end = i + 1
        i += 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", default=["actors", "apps"])
    ap.add_argument("--max", type=int, default=80)
    a = ap.parse_args()
    over = []
    for d in a.dirs:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if f.endswith((".cpp", ".hpp", ".cu")):
                    path = os.path.join(base, f)
                    for lines, name, line in functions(path):
                        bound = min(a.max, TIGHTER.get(name.split("::")[-1], a.max))
                        if lines > bound:
                            over.append((lines, bound, name, os.path.relpath(path, ROOT), line))
    for lines, bound, name, path, line in sorted(over, reverse=True):
        print(f"{lines:5d} lines (bound {bound}) {name}  {path}:{line}")
    print(f"{len(over)} functions over the bound" if over else "no function over the bound")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
