#!/usr/bin/python3
"""Checks a run's --trace and --metrics files (written by a 4-worker BSP run at speeds
1,1,2,4) as Perfetto and a reader of the JSONL would see them. Exit 0 when they hold
up; else prints what is wrong and exits 1. Usage: check_run_files.py TRACE.json METRICS.jsonl"""
import collections
import json
import sys

trace_path, metrics_path = sys.argv[1], sys.argv[2]
problems = []

# The trace: a JSON array of trace events (Chrome's trace-event format).
events = json.load(open(trace_path))
if not isinstance(events, list) or not events:
    sys.exit("trace: not a non-empty JSON array")
names = {}
spans = collections.defaultdict(lambda: collections.defaultdict(float))
counts = collections.Counter()
track_spans = collections.defaultdict(list)
for e in events:
    for key in ("ph", "pid", "name"):
        if key not in e:
            problems.append(f"trace event without {key}: {e}")
    ph = e.get("ph")
    if ph == "M" and e["name"] == "thread_name":
        names[e["tid"]] = e["args"]["name"]
    elif ph == "X":
        if e["dur"] < 0 or e["ts"] < 0:
            problems.append(f"negative time: {e}")
        if not isinstance(e["ts"], int) or not isinstance(e["dur"], int):
            problems.append(f"time not in whole microseconds: {e}")
        spans[e["tid"]][e["name"]] += e["dur"]
        counts[(e["tid"], e["name"])] += 1
        track_spans[e["tid"]].append((e["ts"], e["dur"], e["name"]))
    elif ph in ("i", "C"):
        if "ts" not in e:
            problems.append(f"event without ts: {e}")
    elif ph != "M":
        problems.append(f"unexpected phase {ph}: {e}")
# The spans of one track never overlap: a worker does one thing at a time.
for tid, ss in track_spans.items():
    ss.sort()
    for (t0, d0, n0), (t1, _, n1) in zip(ss, ss[1:]):
        if t0 + d0 > t1:
            problems.append(f"track {tid}: {n0} at {t0} us for {d0} us overlaps {n1} at {t1} us")
            break
workers = {tid: int(n.split()[1]) for tid, n in names.items() if n.startswith("worker ")}
if sorted(workers.values()) != [0, 1, 2, 3]:
    problems.append(f"worker tracks: {sorted(workers.values())}, expected 0..3")
by_id = {w: spans[tid] for tid, w in workers.items()}
for w, s in sorted(by_id.items()):
    print(f"worker {w}: compute {s['compute'] / 1e6:.2f} s, wait {s['wait'] / 1e6:.2f} s, "
          f"pull {s['pull'] / 1e6:.2f} s, push {s['push'] / 1e6:.2f} s")
for kind in ("compute", "pull", "push"):
    for w in range(4):
        if by_id.get(w, {}).get(kind, 0) <= 0:
            problems.append(f"worker {w} has no {kind} spans")
# Worker 0 runs at speed 1, worker 3 at speed 4: under BSP the fast one waits for the
# slow one, and the slow one computes longer.
if by_id and by_id[3]["wait"] <= 2 * by_id[0]["wait"]:
    problems.append("the fast worker 3 does not wait (much) longer than the slow worker 0")
if by_id and by_id[0]["compute"] <= 2 * by_id[3]["compute"]:
    problems.append("the slow worker 0 does not compute (much) longer than worker 3")
if not any(e.get("ph") == "i" and e["name"] == "training starts" for e in events):
    problems.append("no 'training starts' event")
if not any(e.get("ph") == "C" for e in events):
    problems.append("no test-accuracy counter")

# The metrics: JSON lines, a run line, step lines per worker, evaluation lines.
kinds = collections.Counter()
step_workers = set()
for n, line in enumerate(open(metrics_path), 1):
    rec = json.loads(line)
    kinds[rec["type"]] += 1
    if rec["type"] == "step":
        step_workers.add(rec["worker"])
        for key in ("t", "step", "samples", "step_seconds", "compute_seconds", "wait_seconds",
                    "samples_per_second", "staleness", "bytes", "loss"):
            if key not in rec:
                problems.append(f"metrics line {n}: no {key}")
                break
print("metrics records:", dict(kinds))
if kinds["run"] != 1 or kinds["step"] < 40 or kinds["eval"] < 1 or step_workers != {0, 1, 2, 3}:
    problems.append(f"metrics: records {dict(kinds)}, workers {sorted(step_workers)}")

for p in problems[:20]:
    print("PROBLEM:", p)
sys.exit(1 if problems else 0)
