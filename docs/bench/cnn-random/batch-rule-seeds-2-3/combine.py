#!/usr/bin/env python3
"""Three runs per policy and profile from two invocations of `ashlar bench hetero`: run 1
(seed 1) from ../batch-rule/ and runs 2-3 (seeds 2 and 3) from this directory. Prints the
table of README.md: each policy's median time to 90% over its three runs per profile, the
ratio ashl / adsp per profile, and the median and worst of those ratios.
Usage: combine.py [SEED1_DIR] [SEEDS23_DIR]"""
import csv, os, re, statistics, sys

here = os.path.dirname(os.path.abspath(__file__))
first = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "batch-rule")
rest = sys.argv[2] if len(sys.argv) > 2 else here
cap = 400.0
policies = ("ashl", "adsp")


def rows(path):
    with open(path) as f:
        return {r["policy"]: r for r in csv.DictReader(f)}


# Runs 2-3: each run's time from run.log; bytes to target from results.csv.
log = open(os.path.join(rest, "run.log")).read()
blocks = re.split(r"^=== profile (\d+) of 8.*$", log, flags=re.M)
times23 = {}
for k, body in zip(blocks[1::2], blocks[2::2]):
    for pol, runs in re.findall(r"^== (\w+): .*?\n((?:   run .*\n)+)", body, flags=re.M):
        t = []
        for m in re.finditer(r"run \d+ \(seed (\d+)\): (?:target at ([\d.]+) s|target NOT reached)", runs):
            t.append(float(m.group(2)) if m.group(2) else cap)
        times23[(int(k), pol)] = t

print("| profile | speeds | ashl runs (s) | ashl median | adsp runs (s) | adsp median | ashl / adsp | bytes to target ashl / adsp (run 1, runs 2-3) |")
print("|---|---|---|---|---|---|---|---|")
ratios, byte_ratios, med = [], [], {p: [] for p in policies}
for k in range(1, 9):
    r1 = rows(os.path.join(first, "profile-%d" % k, "results.csv"))
    r23 = rows(os.path.join(rest, "profile-%d" % k, "results.csv"))
    speeds = open(os.path.join(first, "profile-%d" % k, "results.md")).read().split("Speeds ")[1].split(" ")[0]
    cells, m, b = [], {}, {}
    for p in policies:
        t1 = float(r1[p]["time_to_target_s"]) if int(r1[p]["runs_reached"]) else cap
        t = [t1] + times23[(k, p)]
        assert len(t) == 3, (k, p, t)
        m[p] = statistics.median(t)
        med[p].append(m[p])
        # Bytes: the bench keeps each invocation's median over the runs that reached the
        # target, not each run's, so each invocation's ratio is shown apart.
        b[p] = (float(r1[p]["bytes_to_target"] or "nan"), float(r23[p]["bytes_to_target"] or "nan"))
        cells += [", ".join("%.1f" % x for x in t), "%.1f" % m[p]]
    ratio = m["ashl"] / m["adsp"]
    ratios.append(ratio)
    pair = [b["ashl"][i] / b["adsp"][i] for i in range(2)]
    byte_ratios += pair
    print("| %d | %s | %s | %s | %s | %s | %.2f | %.2f, %.2f |" % (k, speeds, *cells, ratio, *pair))
print("| **median** | | | **%.1f** | | **%.1f** | **%.2f** (worst %.2f) | %.2f (worst %.2f) |" % (
    statistics.median(med["ashl"]), statistics.median(med["adsp"]), statistics.median(ratios), max(ratios),
    statistics.median(byte_ratios), max(byte_ratios)))

