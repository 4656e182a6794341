#!/usr/bin/env python3
"""The WikiText-2 language model (apps/python/examples/word_lm.py: an LSTM, hand-written
SGD with clipping, the hidden state carried across batches) on Ashlar against its one-process
run of the same semantics, and bsp against ashl at heterogeneous speeds. Prints a table:

  same semantics   one process with workers x the columns, then `ashlar launch --policy bsp`
                   with N workers of the columns each: the test perplexity after each epoch,
                   and their gap (the goal: within 3%);
  speeds           bsp and ashl with train.speeds (default 1,1,2,4) and run.target =
                   "val_ppl <= P": the seconds until a report met it (the job stops there).

    /usr/bin/python3 ops/bench/wikitext_lm.py --workers 4 --epochs 2
    /usr/bin/python3 ops/bench/wikitext_lm.py --speeds 1,1,2,4 --target-ppl 600 --skip-same
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
SCRIPT = ROOT / "apps/python/examples/word_lm.py"
ASHLAR = ROOT / "build/apps/ashlar"


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "build/python") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def alone(a, out):
    cmd = [PY, str(SCRIPT), "--epochs", str(a.epochs), "--batch-size", str(a.batch * a.workers), "--out", out,
           "--max-steps", str(a.max_steps)]
    subprocess.run(cmd, check=True, env=env(), stdout=subprocess.DEVNULL)
    return json.load(open(out))


def launched(a, policy, out, report, speeds=None, target=None, epochs=None):
    cmd = [str(ASHLAR), "launch", "--workers", str(a.workers), "--servers", "1", "--policy", policy,
           "--set", "run.log_level=warn", "--set", "run.progress_interval=0", "--report", report]
    if speeds:
        cmd += ["--set", f"train.speeds={speeds}"]
    if target:
        cmd += ["--set", f"run.target=val_ppl <= {target}"]
    cmd += ["--python", str(SCRIPT), "--", "--epochs", str(epochs or a.epochs), "--batch-size", str(a.batch),
            "--out", out, "--max-steps", str(a.max_steps)]
    t0 = time.time()
    run = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"wikitext_lm: {' '.join(cmd)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    rep = json.load(open(report))
    return rep, time.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=10, help="columns per worker")
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (0: the whole text)")
    p.add_argument("--speeds", default="1,1,2,4")
    p.add_argument("--target-ppl", type=float, default=0, help="run the speeds part to this perplexity (0: skip it)")
    p.add_argument("--target-epochs", type=int, default=30, help="epochs the speeds part may take at most")
    p.add_argument("--skip-same", action="store_true", help="leave out the same-semantics part")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="wikitext-lm-")
    print(f"# WikiText-2 LSTM LM, {a.workers} workers x {a.batch} columns, bptt 35, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}")
    if not a.skip_same:
        one = alone(a, f"{tmp}/alone.json")
        rep, secs = launched(a, "bsp", f"{tmp}/bsp.json", f"{tmp}/bsp-report.json")
        ash = json.load(open(f"{tmp}/bsp.json"))
        print("| epoch | one process ppl | ashlar bsp ppl | gap |")
        print("|---|---|---|---|")
        for x, y in zip(one["history"], ash["history"]):
            gap = (y["val_ppl"] - x["val_ppl"]) / x["val_ppl"] * 100
            print(f"| {x['epoch']} | {x['val_ppl']:.2f} | {y['val_ppl']:.2f} | {gap:+.2f}% |")
        reported = [m["values"]["val_ppl"] for m in rep["metrics"]]
        print(f"(the job's report holds the same perplexities: {', '.join(f'{v:.2f}' for v in reported)}; "
              f"one process {one['history'][-1]['seconds']:.0f} s, ashlar {secs:.0f} s)")
    if a.target_ppl > 0:
        print(f"\n| policy at speeds {a.speeds} | seconds to val_ppl <= {a.target_ppl:g} | reports | reached |")
        print("|---|---|---|---|")
        times = {}
        for policy in ("bsp", "ashl"):
            rep, secs = launched(a, policy, f"{tmp}/{policy}-t.json", f"{tmp}/{policy}-t-report.json", a.speeds,
                                 a.target_ppl, a.target_epochs)
            met = next((m for m in rep["metrics"] if m["values"]["val_ppl"] <= a.target_ppl), None)
            times[policy] = met["seconds"] if met else float("inf")
            print(f"| {policy} | {times[policy]:.1f} | {len(rep['metrics'])} | {rep['target_reached']} |")
        print(f"ashl / bsp: {times['ashl'] / times['bsp']:.2f}x")


if __name__ == "__main__":
    main()
