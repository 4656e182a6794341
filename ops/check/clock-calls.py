#!/usr/bin/env python3
"""Lists direct reads of the machine's clocks and direct sleeps in runtime/, actors/ and
apps/: time is read and waited on only through runtime/core/clock.hpp (system_clock(),
steady_now(), pause_for(), a clock_source), so that tests and the simulator can drive it.
Exits 1 when one is found.

  python3 ops/check/clock-calls.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLOCK = os.path.join("runtime", "core", "clock.hpp")
DIRECT = re.compile(r"\b(?:steady_clock|system_clock|high_resolution_clock)::now\s*\(|this_thread::sleep_(?:for|until)"
                    r"|\b(?:usleep|nanosleep|clock_gettime|gettimeofday)\s*\(|(?<![\w:.>])sleep\s*\(\s*\d")


def main():
    found = []
    for d in ("runtime", "actors", "apps"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if not f.endswith((".cpp", ".hpp", ".cu")):
                    continue
                path = os.path.join(base, f)
                rel = os.path.relpath(path, ROOT)
                if rel == CLOCK:
                    continue
                for n, line in enumerate(open(path, errors="replace"), 1):
                    code = line.split("//", 1)[0]
                    if DIRECT.search(code):
                        found.append(f"{rel}:{n}: {line.strip()}")
    for f in found:
        print(f)
    print(f"{len(found)} direct clock reads or sleeps outside {CLOCK}" if found else "no direct clock read or sleep")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
