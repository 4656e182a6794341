#!/usr/bin/env python3
"""The CNN table of README.md with ASHL's rule of one recipe batch per round: three runs per
policy and profile. ashl's three runs (seeds 1-3) are one invocation of `ashlar bench hetero`
(ashl/); adsp's are those of the table before the change (its defaults have not changed
since): run 1 (seed 1) from ../batch-rule/ (adsp-seed-1/ here where it exists, a rerun), runs
2-3 (seeds 2 and 3) from ../batch-rule-seeds-2-3/. Prints each
policy's runs and median time to 90% per profile, the ratio ashl / adsp of the medians, and
the median and worst of those ratios, with bytes to 90% (each invocation keeps its median over
the runs that reached the target).
Usage: combine.py [ASHL_DIR] [ADSP_SEED1_DIR] [ADSP_SEEDS23_DIR]"""
import csv, os, re, statistics, sys

here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:] + [None] * 3
ashl_dir = args[0] or os.path.join(here, "ashl")
adsp1_dir = args[1] or next(d for d in (os.path.join(here, "adsp-seed-1"), os.path.join(here, "..", "batch-rule"))
                            if os.path.isdir(d))
adsp23_dir = args[2] or os.path.join(here, "..", "batch-rule-seeds-2-3")
cap = 400.0


def run_times(directory):
    """{(profile, policy): [time of each run, the cap where it missed]}: from run.log's run
    lines, or where an invocation ran once (no run lines) from profile-K/results.csv."""
    log = open(os.path.join(directory, "run.log")).read()
    blocks = re.split(r"^=== profile (\d+) of 8.*$", log, flags=re.M)
    out = {}
    for k, body in zip(blocks[1::2], blocks[2::2]):
        for pol in re.findall(r"^== (\w+): ", body, flags=re.M):
            runs = re.search(r"^== %s: .*?\n((?:   run .*\n)*)" % pol, body, flags=re.M).group(1)
            times = [float(m.group(1)) if m.group(1) else cap for m in
                     re.finditer(r"run \d+ \(seed \d+\): (?:target at ([\d.]+) s|target NOT reached)", runs)]
            if not times:
                with open(os.path.join(directory, "profile-%s" % k, "results.csv")) as f:
                    r = next(r for r in csv.DictReader(f) if r["policy"] == pol)
                times = [float(r["time_to_target_s"]) if int(r["runs_reached"]) else cap]
            out[(int(k), pol)] = times
    return out


def bytes_to_target(directory, k, policy):
    with open(os.path.join(directory, "profile-%d" % k, "results.csv")) as f:
        for r in csv.DictReader(f):
            if r["policy"] == policy:
                return float(r["bytes_to_target"] or "nan")
    return float("nan")


ashl, adsp1, adsp23 = run_times(ashl_dir), run_times(adsp1_dir), run_times(adsp23_dir)
print("| profile | speeds | ashl runs (s) | ashl median | adsp runs (s) | adsp median | ashl / adsp "
      "| bytes to target ashl / adsp |")
print("|---|---|---|---|---|---|---|---|")
ratios, byte_ratios, med = [], [], {"ashl": [], "adsp": []}
for k in range(1, 9):
    speeds = open(os.path.join(ashl_dir, "profile-%d" % k, "results.md")).read().split("Speeds ")[1].split(" ")[0]
    t = {"ashl": ashl[(k, "ashl")], "adsp": adsp1[(k, "adsp")] + adsp23[(k, "adsp")]}
    cells, m = [], {}
    for p in ("ashl", "adsp"):
        assert len(t[p]) == 3, (k, p, t[p])
        m[p] = statistics.median(t[p])
        med[p].append(m[p])
        cells += [", ".join("%.1f" % x for x in t[p]), "%.1f" % m[p]]
    ratios.append(m["ashl"] / m["adsp"])
    b = bytes_to_target(ashl_dir, k, "ashl") / bytes_to_target(adsp1_dir, k, "adsp")
    byte_ratios.append(b)
    print("| %d | %s | %s | %s | %s | %s | %.2f | %.2f |" % (k, speeds, *cells, ratios[-1], b))
print("| **median** | | | **%.1f** | | **%.1f** | **%.3f** (worst %.3f) | %.2f (worst %.2f) |" % (
    statistics.median(med["ashl"]), statistics.median(med["adsp"]), statistics.median(ratios), max(ratios),
    statistics.median(byte_ratios), max(byte_ratios)))
