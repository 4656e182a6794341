#!/usr/bin/env python3
"""A membership storm on a cluster of real processes on this host.

A scheduler node, 2 server nodes and --nodes worker-node processes of --slots slots each
(1,024 workers over 32 nodes by default) train the shipped MLP on Fashion-MNIST under BSP.
First the job undisturbed; then the same job while, every --every seconds for --minutes,
--kill worker nodes are SIGKILLed and --join new ones (as many slots each) join; then the
job is left to finish.

Printed, and written to OUT/storm.json: each run's exit status, seconds, test accuracy,
epochs trained against the job's epochs (as the workers reported them, and as shard 0
applied them: the latter is what trained, the former misses the last steps of killed
workers), rounds (parameter versions) and seconds per round; the resident memory of the scheduler, the servers and the worker nodes (peak), a
worker node's memory before the job (idle) and while it trains, and the memory per slot
beyond the node's one copy of the training set. The goals: both runs end with rc 0 and a
report, the storm's job trains its epochs once (1.00-1.05x, as applied) and ends within 0.01 of the
undisturbed run's accuracy, no node loses the scheduler, and a slot costs at most 8 MB
beyond the node's copy of the data.

  python3 ops/bench/storm.py --out /tmp/storm                 # 1,024 workers, 32 nodes, 2 min of storm
  python3 ops/bench/storm.py --nodes 8 --slots 8 --minutes 0.5 --out /tmp/storm-small
"""
import argparse
import json
import os
import random
import secrets
import signal
import sys
import threading
import time

import chaos  # ops/bench/chaos.py: its Proc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_FLOATS = 784  # Fashion-MNIST's 28 x 28 pixels, held as float32


class Proc(chaos.Proc):
    """A node process (chaos.py's), with its peak memory and its log's text."""

    def __init__(self, name, argv, log):
        super().__init__(name, argv, log)
        self.peak_kb = 0

    def kill(self, sig=signal.SIGKILL):
        self.signal(sig)

    def text(self):
        try:
            return open(self.log, errors="replace").read()
        except OSError:
            return ""


def wait_for(pred, seconds, step=0.1):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


class Run:
    def __init__(self, a, tag):
        self.a, self.tag = a, tag
        self.procs, self.workers = [], []
        self.count = 0
        self.lock = threading.Lock()
        self.idle_kb = []  # worker nodes' RSS once joined, before the job gives them work
        self.busy_kb = []  # worker nodes' RSS while they train

    def path(self, name):
        return os.path.join(self.a.out, f"{self.tag}-{name}")

    def start(self, name, argv):
        p = Proc(name, [self.a.ashlar] + argv, self.path(name + ".log"))
        with self.lock:
            self.procs.append(p)
        return p

    def node(self, role, slots=None):
        self.count += 1
        name = f"{role}-{self.count}"
        extra = ["--slots", str(slots)] if slots else []
        return self.start(name, ["node", "--role", role, "--name", name, "--join", self.join, "--token-file",
                                 self.a.token_file, "--work-dir", self.a.out, *extra])

    def launch(self):
        a = self.a
        port = self.path("port")
        if os.path.exists(port):
            os.remove(port)
        self.report = self.path("report.json")
        if os.path.exists(self.report):
            os.remove(self.report)
        self.sched = self.start("scheduler", [
            "node", "--role", "scheduler", "--listen", "127.0.0.1:0", "--port-file", port, "--token-file",
            a.token_file, "--work-dir", a.out, a.config, "--exit-after-job", "--workers", str(a.workers),
            "--servers", "2", "--epochs", str(a.epochs), "--report", self.report,
            "--set", "run.progress_interval=2", "--wait-timeout", "300"])
        if not wait_for(lambda: os.path.exists(port) and open(port).read().strip(), 60):
            raise SystemExit(f"the scheduler did not start: see {self.sched.log}")
        self.join = "127.0.0.1:" + open(port).read().strip()
        self.servers = [self.node("server") for _ in range(2)]
        # The first worker node alone, idle: the job waits for all the slots it needs.
        first = self.node("worker", a.slots)
        self.workers.append(first)
        wait_for(lambda: "joined the cluster" in first.text(), 30)
        time.sleep(1.0)
        self.idle_kb.append(first.rss_kb() or 0)
        for _ in range(a.nodes - 1):
            self.workers.append(self.node("worker", a.slots))

    def sample(self, stop):
        while not stop.is_set():
            with self.lock:
                procs = list(self.procs)
            for p in procs:
                kb = p.rss_kb() if p.alive() else None
                if kb is None:
                    continue
                p.peak_kb = max(p.peak_kb, kb)
                if p.name.startswith("worker"):
                    if "shards over" in p.text():
                        self.busy_kb.append(kb)
            stop.wait(1.0)


def run_job(a, tag, storm):
    r = Run(a, tag)
    t0 = time.time()
    r.launch()
    stop = threading.Event()
    sampler = threading.Thread(target=r.sample, args=(stop,), daemon=True)
    sampler.start()
    rng = random.Random(a.seed)
    events = []
    # The storm starts once the job trains, and lasts --minutes.
    wait_for(lambda: "samples/s" in r.sched.text() or not r.sched.alive(), 300, 0.5)
    storm_from = time.time()
    next_at = storm_from + a.every
    while r.sched.alive() and time.time() - t0 < a.timeout:
        if storm and time.time() >= next_at and time.time() - storm_from < a.minutes * 60:
            live = [p for p in r.workers if p.alive()]
            victims = rng.sample(live, min(a.kill, len(live)))
            for v in victims:
                v.kill()
            for _ in range(a.join):
                r.workers.append(r.node("worker", a.slots))
            at = time.time() - t0
            events.append({"at_s": round(at, 1), "killed": [v.name for v in victims], "joined": a.join})
            print(f"  [{at:6.1f}s] killed {len(victims)} worker nodes ({', '.join(v.name for v in victims)}), "
                  f"{a.join} joined", flush=True)
            next_at += a.every
        time.sleep(0.2)
    hung = r.sched.alive()
    # Node processes that ended on their own with an error while the job ran (not killed by
    # the storm): each names why in its last log line.
    killed = {name for e in events for name in e["killed"]}
    failed_nodes = [f"{p.name}: {p.text().strip().splitlines()[-1] if p.text().strip() else ''}"
                    for p in r.procs if p is not r.sched and p.name not in killed and not p.alive()
                    and p.p.returncode not in (0, None)]
    r.sched.kill()
    r.sched.p.wait()
    took = time.time() - t0
    for p in r.procs:
        p.kill(signal.SIGTERM)
    time.sleep(1)
    for p in r.procs:
        p.kill()
    stop.set()
    sampler.join()
    report = None
    if os.path.exists(r.report):
        try:
            report = json.load(open(r.report))
        except ValueError:
            pass
    lost = sum(p.text().count("lost the scheduler") for p in r.procs if p is not r.sched)
    servers_peak = max((p.peak_kb for p in r.servers), default=0)
    nodes_peak = max((p.peak_kb for p in r.procs if p.name.startswith("worker")), default=0)
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0
    return {"rc": r.sched.p.returncode, "hung": hung, "seconds": round(took, 1), "report": report,
            "storm_events": events, "nodes_lost_scheduler": lost, "failed_nodes": failed_nodes,
            "worker_nodes": len(r.workers),
            "scheduler_peak_mb": round(r.sched.peak_kb / 1024, 1), "server_peak_mb": round(servers_peak / 1024, 1),
            "worker_node_peak_mb": round(nodes_peak / 1024, 1), "worker_node_idle_mb": round(med(r.idle_kb) / 1024, 1),
            "worker_node_training_mb": round(med(r.busy_kb) / 1024, 1), "log": r.sched.log}


def describe(name, run, a):
    rep = run["report"] or {}
    # Each shard makes one version a round.
    rounds = rep["versions"] // max(1, rep.get("servers", 1)) if rep.get("versions") else None
    secs = rep.get("seconds")
    per_round = secs / rounds * 1000 if rounds and secs else None
    print(f"{name}: rc {run['rc']}{' (HUNG: killed at the timeout)' if run['hung'] else ''}, {run['seconds']:.0f} s "
          f"wall, test accuracy {rep.get('test_accuracy')}, epochs trained {rep.get('epochs_trained')} of "
          f"{rep.get('epochs')}"
          + (f" (applied by shard 0: {rep['applied_samples'] / rep['train_samples']:.4f})"
             if rep.get("applied_samples") and rep.get("train_samples") else "")
          + f", {rounds} rounds"
          + (f" ({per_round:.1f} ms a round)" if per_round else "")
          + (f", error: {rep['error']}" if rep.get("error") else ""), flush=True)
    if not run["report"]:
        print(f"  no report: see {run['log']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32, help="worker-node processes at the start (default 32)")
    ap.add_argument("--slots", type=int, default=32, help="worker slots per node (default 32)")
    ap.add_argument("--kill", type=int, default=4, help="worker nodes SIGKILLed each --every seconds (default 4)")
    ap.add_argument("--join", type=int, default=4, help="worker nodes that join each --every seconds (default 4)")
    ap.add_argument("--every", type=float, default=10, help="seconds between storm rounds (default 10)")
    ap.add_argument("--minutes", type=float, default=2, help="how long the storm lasts (default 2)")
    ap.add_argument("--epochs", type=int, default=0,
                    help="the job's epochs (default: enough for the undisturbed job to outlast the storm)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="/tmp/ashlar-storm")
    ap.add_argument("--ashlar", default=os.path.join(ROOT, "build", "apps", "ashlar"))
    ap.add_argument("--config", default=os.path.join(ROOT, "ops", "configs", "fmnist-mlp.toml"))
    a = ap.parse_args()
    a.workers = a.nodes * a.slots
    os.makedirs(a.out, exist_ok=True)
    a.token_file = os.path.join(a.out, "token")
    with open(os.open(a.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    if a.epochs <= 0:
        # About 14,000 samples/s on 2 cores with 1,024 workers (more with fewer): the
        # undisturbed job lasts about the storm and a half.
        a.epochs = max(2, round(a.minutes * 60 * 1.5 * 14000 / 60000))
    a.timeout = a.minutes * 60 * 6 + 600
    print(f"job: {a.workers} workers over {a.nodes} worker nodes of {a.slots} slots, 2 servers, {a.epochs} epochs; "
          f"storm: {a.kill} killed and {a.join} joined every {a.every:g} s for {a.minutes:g} min; out {a.out}",
          flush=True)
    base = run_job(a, "undisturbed", storm=False)
    describe("undisturbed", base, a)
    storm = run_job(a, "storm", storm=True)
    describe("storm", storm, a)
    data_mb = 60000 * (IMAGE_FLOATS * 4 + 1) / 2**20
    beyond = storm["worker_node_training_mb"] - storm["worker_node_idle_mb"] - data_mb
    per_slot = beyond / a.slots
    print(f"memory (MB): scheduler {storm['scheduler_peak_mb']}, server {storm['server_peak_mb']}, worker node "
          f"{storm['worker_node_idle_mb']} idle, {storm['worker_node_training_mb']} training "
          f"(peak {storm['worker_node_peak_mb']}); training set {data_mb:.0f}; per slot beyond the node's copy "
          f"of the data {per_slot:.1f}", flush=True)
    b, s = base["report"] or {}, storm["report"] or {}
    delta = None
    if b.get("test_accuracy") is not None and s.get("test_accuracy") is not None:
        delta = s["test_accuracy"] - b["test_accuracy"]
    # Trained = what the shards applied (shard 0's count of the samples in the gradients it
    # took into updates); the workers' own count misses the last steps of killed workers,
    # which pushed before they could report them.
    trained = s["applied_samples"] / s["train_samples"] if s.get("applied_samples") and s.get("train_samples") \
        else s.get("epochs_trained")
    once = s.get("epochs") and trained is not None and 1.0 * s["epochs"] - 1e-9 <= trained <= 1.05 * s["epochs"]
    checks = {
        "both runs end rc 0 with a report": base["rc"] == 0 and storm["rc"] == 0 and bool(b) and bool(s),
        "epochs trained once (1.00-1.05x, as shard 0 applied them)": bool(once),
        "accuracy within 0.01 of undisturbed": delta is not None and delta >= -0.01,
        "no node lost the scheduler": storm["nodes_lost_scheduler"] == 0,
        "no node process not killed ended with an error": not storm["failed_nodes"],
        "a slot costs <= 8 MB beyond the data": per_slot <= 8,
    }
    for k, v in checks.items():
        print(f"  {'ok ' if v else 'NOT'} {k}")
    for f in storm["failed_nodes"]:
        print(f"    {f}")
    summary = {"workers": a.workers, "nodes": a.nodes, "slots": a.slots, "epochs": a.epochs, "kill": a.kill,
               "join": a.join, "every_s": a.every, "minutes": a.minutes, "seed": a.seed,
               "undisturbed": {k: v for k, v in base.items() if k != "report"},
               "storm": {k: v for k, v in storm.items() if k != "report"},
               "undisturbed_report": b, "storm_report": {k: v for k, v in s.items() if k != "per_worker"},
               "accuracy_delta": delta, "slot_mb": round(per_slot, 2), "checks": checks}
    with open(os.path.join(a.out, "storm.json"), "w") as f:
        json.dump(summary, f, indent=1)
    ok = all(checks.values())
    print("goals met" if ok else "goals NOT met", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
