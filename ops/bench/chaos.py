#!/usr/bin/env python3
"""Chaos and soak benchmark of a cluster of real processes on loopback.

A scheduler node, 2 server nodes and 4 worker nodes train the MLP on Fashion-MNIST under
BSP (or --policy) with checkpoints on. First an undisturbed run of the job; then the same job while a
seeded schedule injects faults, one every --every seconds, until the job ends:

  worker-kill     SIGKILL a worker node; a new worker node joins 2 s later
  worker-stop     SIGSTOP a worker node for 8 s (past the heartbeat timeout), then SIGCONT;
                  a new worker node joins if the stopped one has exited
  worker-leave    SIGTERM a worker node (scaling down: its worker leaves after its step,
                  the node exits 0); a new worker node joins 2 s after it exited (scaling
                  up). Not among the default kinds (their seeded order stays that of the
                  figures measured before it): `--kinds` names it
  server-kill     SIGKILL a server node; `node --role server --shard ID` takes over 2 s later,
                  restoring the shard from its checkpoint cuts
  server-stop     SIGSTOP a server node for 3 s, then SIGCONT
  server-freeze   SIGSTOP a server node for 8 s, past the heartbeat timeout, then SIGCONT
  server-hang     SIGSTOP a server node for good (a hung machine: its process still holds
                  its files, sockets and its checkpoint stores' locks); `node --role server
                  --shard ID` is started 4 s later and, once the store's lease has not
                  changed for 6 s, takes the store over (a new generation) and serves the
                  shard. Not among the default kinds (their seeded order stays that of the
                  figures measured before it): `--kinds` names it
  scheduler-stop  SIGSTOP the scheduler for 1 s (a stall well within the 3 s heartbeat
                  timeout), then SIGCONT: the job goes on
  scheduler-freeze  SIGSTOP the scheduler for 8 s, past the heartbeat timeout: every node
                  notices it lost, stops its shards and workers and joins the same scheduler
                  again when it answers; the scheduler serves the job's shards again from their
                  checkpoint cuts, and the rejoined workers take up the steps the lost ones left
  scheduler-kill  SIGKILL the scheduler: every node stops its shards and workers and waits
                  for it (--rejoin-timeout); the scheduler is started again on the same port
                  with --resume, takes the job up from its checkpoint cuts, and the same
                  node processes join it again

Faults come for as long as the undisturbed job took, each --every seconds after the
previous one has recovered; then the job is left to finish. A fault is survived when the job's progress (the epoch in the scheduler's progress lines)
moves past where it was when the fault came, or the job ends well, within --grace seconds
of the recovery. Printed and written to OUT/chaos.json: faults injected and survived, the
final test accuracy against the undisturbed run's, the work redone (samples trained again
after resumes, lost workers' samples taken over by others), and each process's resident
memory over time (OUT/rss.csv). The goals: every fault survived, rc 0, the job's epochs
trained once (0.98-1.05x) and, but for --smoke, an accuracy at most 0.01 below the
undisturbed run's. With --soak, no faults: the memory of every process over
the run, and its growth over the last two thirds (the goal: < 5%).

  python3 ops/bench/chaos.py --minutes 10 --seed 1 --out /tmp/chaos
  python3 ops/bench/chaos.py --soak --minutes 30 --out /tmp/soak
"""
import argparse
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Proc:
    def __init__(self, name, argv, log):
        self.name = name
        self.log = log
        self.f = open(log, "ab")
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def rss_kb(self):
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None


class Cluster:
    def __init__(self, a, out, tag):
        self.a, self.out, self.tag = a, out, tag
        self.procs = []  # every process started, alive or not
        self.runs = 0
        self.lock = threading.Lock()
        self.sched = None
        self.join = None
        self.count = {"server": 0, "worker": 0}

    def log(self, name):
        return os.path.join(self.out, f"{self.tag}-{name}.log")

    def start(self, name, argv):
        p = Proc(name, [self.a.ashlar] + argv, self.log(name))
        with self.lock:
            self.procs.append(p)
        return p

    def node(self, role, extra=()):
        self.count[role] += 1
        name = f"{role}-{self.count[role]}"
        return self.start(name, ["node", "--role", role, "--name", name, "--join", self.join,
                                 "--token-file", self.a.token_file, "--work-dir", self.out, *extra])

    def scheduler(self, listen, port_file, resume):
        self.runs += 1
        a = self.a
        argv = ["node", "--role", "scheduler", "--listen", listen, "--port-file", port_file,
                "--token-file", a.token_file, "--work-dir", self.out, a.config,
                "--exit-after-job", "--workers", "4", "--servers", "2", "--epochs", str(a.epochs),
                "--checkpoint-dir", os.path.join(self.out, f"{self.tag}-ck"), "--checkpoint-every", "50",
                "--report", os.path.join(self.out, f"{self.tag}-report-{self.runs}.json"),
                "--set", f"data.train_limit={a.train_limit}", "--set", "data.test_limit=10000",
                "--set", "train.speeds=1,1,1,1", "--set", f"train.sample_ms={a.sample_ms}",
                "--set", "run.progress_interval=1", "--set", "run.shard_wait=60"]
        if a.policy:
            argv += ["--policy", a.policy]
        if resume:
            argv.append("--resume")
        self.sched = self.start(f"scheduler-{self.runs}", argv)

    def launch(self):
        port = os.path.join(self.out, f"{self.tag}-port")
        if os.path.exists(port):
            os.remove(port)
        self.scheduler("127.0.0.1:0", port, resume=False)
        deadline = time.time() + 30
        while time.time() < deadline and not (os.path.exists(port) and open(port).read().strip()):
            time.sleep(0.1)
        self.join = "127.0.0.1:" + open(port).read().strip()
        self.servers = [self.node("server") for _ in range(2)]
        self.workers = [self.node("worker") for _ in range(4)]

    def restart_scheduler(self):
        """The scheduler again, on its port, taking the job up from its checkpoints."""
        port = self.join.rsplit(":", 1)[1]
        self.scheduler("127.0.0.1:" + port, os.path.join(self.out, f"{self.tag}-port"), resume=True)

    def sched_log(self):
        try:
            return open(self.sched.log, errors="replace").read()
        except OSError:
            return ""

    def epoch(self):
        found = re.findall(r"epoch\s+([0-9.]+)/", self.sched_log())
        return float(found[-1]) if found else 0.0

    def live(self, procs):
        return [p for p in procs if p.alive()]


def sample_memory(cluster, rows, stop, t0):
    while not stop.is_set():
        with cluster.lock:
            procs = list(cluster.procs)
        now = time.time() - t0
        for p in procs:
            if p.alive():
                kb = p.rss_kb()
                if kb is not None:
                    rows.append((round(now, 1), p.name, p.p.pid, kb))
        stop.wait(2.0)


def run_job(a, out, tag, faults, window=0.0):
    """Runs the job to its end, injecting `faults` (kinds, in order) on the way: one every
    --every seconds after the previous one has recovered, for `window` seconds, and after
    that until every kind in `faults` has come once (while the job runs)."""
    # A run starts from nothing: no checkpoints, logs or reports of an earlier one.
    for name in os.listdir(out):
        if name.startswith(tag + "-"):
            path = os.path.join(out, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    c = Cluster(a, out, tag)
    rows, stop, t0 = [], threading.Event(), time.time()
    sampler = threading.Thread(target=sample_memory, args=(c, rows, stop, t0), daemon=True)
    c.launch()
    sampler.start()
    log = []
    rng = random.Random(a.seed)
    pending = list(faults)
    next_at = t0 + a.every
    deadline = t0 + a.timeout
    while time.time() < deadline:
        if not c.sched.alive() and c.sched.p.returncode == 0:
            break
        if not c.sched.alive():
            break  # failed: reported below
        unseen = set(faults) - {e["kind"] for e in log}
        if pending and time.time() >= next_at and (time.time() - t0 < window or unseen):
            log.append(inject(c, pending.pop(0), rng, t0, a))
            next_at = time.time() + a.every
            continue
        time.sleep(0.2)
    if c.sched.alive():
        c.sched.signal(signal.SIGKILL)
        hung = True
    else:
        hung = False
    took = time.time() - t0
    time.sleep(2)
    for p in c.procs:
        p.signal(signal.SIGTERM)
    time.sleep(2)
    for p in c.procs:
        p.signal(signal.SIGKILL)
    stop.set()
    sampler.join()
    # Faults are judged on the scheduler logs of the runs they fell in.
    for entry in log:
        entry["survived"] = bool(entry.get("survived"))
    reports = []
    for i in range(1, c.runs + 1):
        path = os.path.join(out, f"{tag}-report-{i}.json")
        if os.path.exists(path):
            try:
                reports.append(json.load(open(path)))
            except ValueError:
                pass
    return {"hung": hung, "rc": c.sched.p.returncode, "seconds": took, "faults": log, "reports": reports,
            "rss": rows, "runs": c.runs}


def log_count(path, text):
    try:
        return open(path, errors="replace").read().count(text)
    except OSError:
        return 0


def wait_progress(c, before, grace):
    """True once the job's epoch moves past `before` or it ends well, within `grace` s."""
    deadline = time.time() + grace
    while time.time() < deadline:
        if c.epoch() > before + 1e-9:
            return True
        if not c.sched.alive():
            return c.sched.p.returncode == 0
        time.sleep(0.5)
    return False


def wait_rejoined(nodes, joined, entry, grace):
    """Waits up to `grace` s until every node of `nodes` logs one more rejoin than `joined`
    counted; notes in `entry` how many did."""
    deadline = time.time() + grace
    while time.time() < deadline and not all(log_count(p.log, "again as node") > joined[p.name] for p in nodes):
        time.sleep(0.5)
    back = [p for p in nodes if log_count(p.log, "again as node") > joined[p.name]]
    entry["nodes_rejoined"] = f"{len(back)}/{len(nodes)}"
    entry["rejoined_all"] = len(back) == len(nodes)


def pick(procs, rng, entry):
    """A live process of `procs` at random (named in `entry`), or None."""
    victims = [p for p in procs if p.alive()]
    if not victims:
        return None
    v = rng.choice(victims)
    entry["target"] = v.name
    return v


def inject(c, kind, rng, t0, a):
    at = round(time.time() - t0, 1)
    before = c.epoch()
    entry = {"at_s": at, "kind": kind, "epoch": before}
    if kind == "worker-kill":
        v = pick(c.workers, rng, entry)
        if v:
            v.signal(signal.SIGKILL)
            time.sleep(2)
            c.workers.append(c.node("worker"))
    elif kind == "worker-stop":
        v = pick(c.workers, rng, entry)
        if v:
            v.signal(signal.SIGSTOP)
            time.sleep(8)
            v.signal(signal.SIGCONT)
            time.sleep(3)
            if not v.alive() or "left" in open(v.log, errors="replace").read()[-2000:]:
                c.workers.append(c.node("worker"))
    elif kind == "worker-leave":
        v = pick(c.workers, rng, entry)
        if v:
            v.signal(signal.SIGTERM)
            try:
                entry["exit"] = v.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                entry["exit"] = None  # still running: not survived, and killed
                v.signal(signal.SIGKILL)
            time.sleep(2)
            c.workers.append(c.node("worker"))
    elif kind in ("server-kill", "server-hang"):
        v = pick(c.servers, rng, entry)
        if v:
            shard = re.findall(r"hosting shard (\d+)", open(v.log, errors="replace").read())
            if kind == "server-kill":
                v.signal(signal.SIGKILL)
                time.sleep(2)
            else:
                v.signal(signal.SIGSTOP)
                c.servers.remove(v)  # stopped for good: no later fault resumes it
                time.sleep(4)
            if shard:  # a node that serves its shard from the checkpoint cuts
                entry["shard"] = int(shard[-1])
                c.servers.append(c.node("server", ["--shard", shard[-1]]))
    elif kind in ("server-stop", "server-freeze"):
        v = pick(c.servers, rng, entry)
        if v:
            v.signal(signal.SIGSTOP)
            time.sleep(3 if kind == "server-stop" else 8)
            v.signal(signal.SIGCONT)
    elif kind == "scheduler-stop":
        entry["target"] = c.sched.name
        c.sched.signal(signal.SIGSTOP)
        time.sleep(1)
        c.sched.signal(signal.SIGCONT)
    elif kind == "scheduler-freeze":
        entry["target"] = c.sched.name
        nodes = c.live(c.servers + c.workers)
        joined = {p.name: log_count(p.log, "again as node") for p in nodes}
        c.sched.signal(signal.SIGSTOP)
        time.sleep(8)
        c.sched.signal(signal.SIGCONT)
        wait_rejoined(nodes, joined, entry, a.grace)
    elif kind == "scheduler-kill":
        entry["target"] = c.sched.name
        c.sched.signal(signal.SIGKILL)
        # Every node notices, stops what it hosts and waits; the scheduler starts again
        # on its port and the same node processes join it.
        nodes = c.live(c.servers + c.workers)
        joined = {p.name: log_count(p.log, "again as node") for p in nodes}
        deadline = time.time() + 15
        while time.time() < deadline and not all(log_count(p.log, "waiting up to") > joined[p.name] for p in nodes):
            time.sleep(0.2)
        c.sched.p.wait()
        c.restart_scheduler()
        before = 0.0  # the new scheduler's log starts over
        wait_rejoined(nodes, joined, entry, a.grace)
    entry["survived"] = (wait_progress(c, before, a.grace) and entry.get("rejoined_all", True)
                         and entry.get("exit", 0) == 0)
    print(f"  [{at:7.1f}s] {kind:15s} {entry.get('target', '-'):12s} at epoch {entry['epoch']:.2f}: "
          f"{'survived' if entry['survived'] else 'NOT SURVIVED'}"
          + (f" ({entry['nodes_rejoined']} node processes joined it again)" if "nodes_rejoined" in entry else ""),
          flush=True)
    return entry


def rss_summary(rows, window_from):
    by = {}
    for t, name, pid, kb in rows:
        by.setdefault(name, []).append((t, kb))
    out = {}
    for name, pts in sorted(by.items()):
        peak = max(kb for _, kb in pts)
        win = [kb for t, kb in pts if t >= window_from]
        growth = None
        if len(win) >= 10:
            k = max(1, len(win) // 10)
            first = sorted(win[:k])[k // 2]
            last = sorted(win[-k:])[k // 2]
            growth = (last - first) / first if first else None
        out[name] = {"peak_mb": round(peak / 1024, 1), "growth": None if growth is None else round(growth, 4),
                     "samples": len(pts)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10, help="length of the undisturbed job (default 10)")
    ap.add_argument("--every", type=float, default=20, help="seconds between faults (default 20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--soak", action="store_true", help="no faults: memory over a long run")
    ap.add_argument("--out", default="/tmp/ashlar-chaos")
    ap.add_argument("--ashlar", default=os.path.join(ROOT, "build", "apps", "ashlar"))
    ap.add_argument("--config", default=os.path.join(ROOT, "ops", "configs", "fmnist-mlp.toml"))
    ap.add_argument("--policy", help="the job's sync policy (default: the config's, bsp for the MLP's)")
    ap.add_argument("--train-limit", type=int, default=12000)
    ap.add_argument("--sample-ms", type=float, default=0.5, help="paced ms per sample per worker")
    ap.add_argument("--grace", type=float, default=90, help="seconds a fault may take to recover from")
    ap.add_argument("--kinds", default="worker-kill,worker-stop,server-kill,server-stop,server-freeze,scheduler-kill,"
                    "scheduler-stop,scheduler-freeze")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run: judged on faults survived, no hang and a clean end; the accuracy of a job "
                         "this short is printed, not judged")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    a.token_file = os.path.join(a.out, "token")
    with open(os.open(a.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    rate = 4 * 1000.0 / a.sample_ms  # samples/s of the paced job
    a.epochs = max(1, math.ceil(a.minutes * 60 * rate / a.train_limit))
    a.timeout = a.minutes * 60 * 4 + 300
    print(f"job: {a.epochs} epochs of {a.train_limit} samples, about {a.minutes:g} min undisturbed; out {a.out}",
          flush=True)
    summary = {"minutes": a.minutes, "seed": a.seed, "epochs": a.epochs}
    if a.soak:
        r = run_job(a, a.out, "soak", [])
        window = r["seconds"] / 3
        mem = rss_summary(r["rss"], window)
        acc = r["reports"][-1]["test_accuracy"] if r["reports"] else None
        summary.update({"rc": r["rc"], "hung": r["hung"], "seconds": round(r["seconds"], 1), "accuracy": acc,
                        "memory": mem})
        print(f"soak: rc {r['rc']}, {r['seconds']:.0f} s, test accuracy {acc}")
        print(f"{'process':14s} {'peak MB':>8s} {'growth over the last 2/3':>26s}")
        for name, m in mem.items():
            g = "-" if m["growth"] is None else f"{100 * m['growth']:+.1f}%"
            print(f"{name:14s} {m['peak_mb']:8.1f} {g:>26s}")
        ok = r["rc"] == 0 and all(m["growth"] is None or m["growth"] < 0.05 for m in mem.values())
        write_rows(a.out, r["rss"])
    else:
        base = run_job(a, a.out, "undisturbed", [])
        base_acc = base["reports"][-1]["test_accuracy"] if base["reports"] else None
        print(f"undisturbed: rc {base['rc']}, {base['seconds']:.0f} s, test accuracy {base_acc}", flush=True)
        kinds = a.kinds.split(",")
        rng = random.Random(a.seed)
        # Every kind once per cycle, in a seeded order: each is exercised, even in a short run.
        faults = []
        while len(faults) <= base["seconds"] / a.every:
            cycle = list(kinds)
            rng.shuffle(cycle)
            faults += cycle
        # Faults come for as long as the undisturbed job took; then the job finishes.
        r = run_job(a, a.out, "chaos", faults, window=base["seconds"])
        acc = r["reports"][-1]["test_accuracy"] if r["reports"] else None
        redone = sum(x.get("redone_samples", 0) for x in r["reports"])
        taken = sum(x.get("reassigned_samples", 0) for x in r["reports"])
        injected = len(r["faults"])
        survived = sum(1 for f in r["faults"] if f["survived"])
        mem = rss_summary(r["rss"], 0)
        summary.update({"undisturbed": {"rc": base["rc"], "seconds": round(base["seconds"], 1), "accuracy": base_acc},
                        "chaos": {"rc": r["rc"], "hung": r["hung"], "seconds": round(r["seconds"], 1),
                                  "accuracy": acc, "scheduler_restarts": r["runs"] - 1},
                        "faults_injected": injected, "faults_survived": survived, "faults": r["faults"],
                        "redone_samples": redone, "reassigned_samples": taken, "memory": mem})
        delta = None if acc is None or base_acc is None else acc - base_acc
        print(f"chaos: rc {r['rc']}{' (HUNG: killed at the timeout)' if r['hung'] else ''}, {r['seconds']:.0f} s, "
              f"{injected} faults injected, {survived} survived, test accuracy {acc} "
              f"(undisturbed {base_acc}, {'n/a' if delta is None else f'{delta:+.4f}'})")
        print(f"work redone: {redone} samples trained again after {r['runs'] - 1} resume(s), {taken} samples of lost "
              f"workers taken over by others")
        print(f"{'process':14s} {'peak MB':>8s}")
        for name, m in mem.items():
            print(f"{name:14s} {m['peak_mb']:8.1f}")
        # The job trains its epochs once: faults neither cut it short nor make it train on
        # (a lost worker's rounds spread over the others, newcomers taking up what is owed).
        last = r["reports"][-1] if r["reports"] else {}
        epochs, trained = last.get("epochs"), last.get("epochs_trained")
        once = epochs is not None and trained is not None and 0.98 * epochs <= trained <= 1.05 * epochs
        print(f"epochs trained: {trained} of {epochs}" + ("" if once else " (NOT within 0.98-1.05x)"))
        summary["epochs_trained"] = trained
        # Every kind asked for came at least once (the job may have ended before one did).
        missed = sorted(set(kinds) - {f["kind"] for f in r["faults"]})
        if missed:
            print(f"kinds never injected (the job ended first; a longer --minutes gives them time): "
                  f"{', '.join(missed)}")
        ok = r["rc"] == 0 and not r["hung"] and survived == injected and injected > 0 and once and not missed
        # Faults cost at most 0.01 of the undisturbed run's accuracy. (Above it is no fault
        # of theirs: the epochs check above holds the training to the job's, and the MLP's
        # accuracy moves by 0.01 between evaluations of a run this short.)
        if not a.smoke:
            ok = ok and delta is not None and delta >= -0.01
        write_rows(a.out, r["rss"])
    summary["goals_met"] = ok
    with open(os.path.join(a.out, "chaos.json" if not a.soak else "soak.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("goals met" if ok else "goals NOT met", flush=True)
    return 0 if ok else 1


def write_rows(out, rows):
    with open(os.path.join(out, "rss.csv"), "w") as f:
        f.write("t_s,process,pid,rss_kb\n")
        for row in rows:
            f.write(",".join(str(x) for x in row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
