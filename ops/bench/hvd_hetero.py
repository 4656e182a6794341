#!/usr/bin/env python3
"""One Horovod-style script on unequal workers, under PyTorch DDP (gloo) and under Ashlar's
policies: its own MLP, Fashion-MNIST as tensors in its own DataLoader, AdamW with a cosine
schedule, 4 workers paced at speeds 1,1,2,4 (each step takes at least batch x sample_ms /
speed; under Ashlar train.speeds paces it, under DDP the script sleeps the rest before its
gradients are all-reduced). Rank 0 evaluates the test set every --eval-every seconds of
its own training time (the evaluation is not counted) and writes the curve; the bench
prints each run's time to --target.

    /usr/bin/python3 ops/bench/hvd_hetero.py [--runs ddp,bsp,bsp-speed,ashl] [--seeds 1,2,3]

Throughput where the wire matters: a 20M-parameter MLP, equal unpaced workers, samples/s of
DDP and of Ashlar's bsp over --max-steps steps, and each process's peak RSS:

    /usr/bin/python3 ops/bench/hvd_hetero.py --throughput

ddp: torch's DistributedSampler, equal batches. bsp: the same under Ashlar. bsp-speed:
hvd.SpeedSampler with train.allocation=proportional (batches by speed). ashl: ASHL's local
steps with hvd.SpeedSampler (slices by speed).
"""
import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
FMNIST = "/usr/share/datasets/fashion-mnist"


def load(split):
    import numpy as np
    import torch
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(f"{FMNIST}/{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
    with gzip.open(f"{FMNIST}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy((x - 0.2860) / 0.3530), torch.from_numpy(y)


def train(a, rank, size, hvd=None, pace=None):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    x, y = load("train")
    tx, ty = load("test")
    ds = torch.utils.data.TensorDataset(x, y)
    if hvd is not None and a.sampler == "speed":
        sampler = hvd.SpeedSampler(ds, batch_size=a.batch, seed=a.seed)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler)
    else:
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=size, rank=rank, seed=a.seed)
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler)
    sizes = [784] + [int(h) for h in a.hidden.split(",")] + [10]
    layers = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    if hvd is not None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif size > 1 or pace is not None:
        model = nn.parallel.DistributedDataParallel(model)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * len(loader))
    curve, trained, last_eval, t0 = [], 0.0, 0.0, time.monotonic()
    steps, samples, start = 0, 0, None
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        if a.max_steps and steps >= a.max_steps:
            break
        for bx, by in loader:
            if a.max_steps:
                if steps == 2:  # (the first steps set things up)
                    start, samples = time.monotonic(), 0
                if steps >= a.max_steps:
                    break
                steps += 1
                samples += len(bx)
            step0 = time.monotonic()
            opt.zero_grad()
            loss = F.cross_entropy(model(bx), by)
            if pace is not None and a.sample_ms > 0:  # DDP: the step's paced budget, slept before the all-reduce
                rest = len(bx) * a.sample_ms / 1000 / pace - (time.monotonic() - step0)
                if rest > 0:
                    time.sleep(rest)
            loss.backward()
            opt.step()
            sched.step()
            now = time.monotonic()
            if rank == 0 and now - t0 - last_eval >= a.eval_every:
                e0 = time.monotonic()
                trained = e0 - t0
                with torch.no_grad():
                    acc = (model(tx).argmax(1) == ty).float().mean().item()
                curve.append((trained, acc))
                last_eval = trained
                t0 += time.monotonic() - e0  # the evaluation is not training time
                if acc >= a.target and a.out:
                    pathlib.Path(a.out).write_text(json.dumps(curve))
    if a.max_steps:
        import resource
        rate = samples / (time.monotonic() - start)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        params = sum(p.numel() for p in model.parameters())
        pathlib.Path(f"{a.out}.{rank}").write_text(json.dumps({"rate": rate, "rss_mb": rss, "params": params}))
        return
    if rank == 0 and a.out:
        pathlib.Path(a.out).write_text(json.dumps(curve))


def ddp_worker(rank, a, speeds):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=len(speeds))
    train(a, rank, len(speeds), pace=speeds[rank])
    dist.destroy_process_group()


def throughput(a):
    a.hidden, a.max_steps, a.speeds, a.sample_ms, a.eval_every = "4096,4096", a.max_steps or 60, "1,1,1,1", 0, 1e9
    rows = {}
    alone = "/tmp/hvd-throughput-alone"
    subprocess.run(["/usr/bin/python3", os.path.abspath(__file__), "--worker", "alone", "--hidden", a.hidden,
                    "--max-steps", str(a.max_steps), "--sample-ms", "0", "--eval-every", "1e9", "--out", alone],
                   check=True)
    base = json.loads(pathlib.Path(f"{alone}.0").read_text())["rss_mb"]
    print(f"PyTorch alone (one process, no DDP): peak RSS {base:.0f} MB", flush=True)
    for kind in ["ddp", "bsp"]:
        out = f"/tmp/hvd-throughput-{kind}"
        run_one(kind, a, 1, out, curve=False)
        got = [json.loads(pathlib.Path(f"{out}.{r}").read_text()) for r in range(4)]
        rows[kind] = got
        print(f"{kind}: {sum(g['rate'] for g in got):.0f} samples/s over 4 workers, peak RSS per process "
              f"{', '.join(str(round(g['rss_mb'])) for g in got)} MB ({got[0]['params']} parameters)", flush=True)
    ratio = sum(g["rate"] for g in rows["bsp"]) / sum(g["rate"] for g in rows["ddp"])
    extra = max(g["rss_mb"] for g in rows["bsp"]) - base
    ddp_extra = max(g["rss_mb"] for g in rows["ddp"]) - base
    print(f"\nAshlar bsp / DDP samples/s: {ratio:.2f}; peak RSS over PyTorch alone: Ashlar {extra:+.0f} MB, "
          f"DDP {ddp_extra:+.0f} MB (one copy of the parameters: {rows['bsp'][0]['params'] * 4 / 2**20:.0f} MB)")


def run_one(kind, a, seed, out, curve=True):
    me = os.path.abspath(__file__)
    common = ["--epochs", str(a.epochs), "--hidden", a.hidden, "--max-steps", str(a.max_steps), "--batch", str(a.batch), "--lr", str(a.lr), "--seed", str(seed),
              "--eval-every", str(a.eval_every), "--target", str(a.target), "--out", out,
              "--sample-ms", str(a.sample_ms)]
    t0 = time.time()
    if kind == "ddp":
        cmd = ["/usr/bin/python3", me, "--worker", "ddp", "--speeds", a.speeds, "--port", str(29500 + seed)] + common
    else:
        policy = "ashl" if kind == "ashl" else "bsp"
        cmd = [str(ROOT / "build/apps/ashlar"), "launch", "--workers", str(len(a.speeds.split(","))), "--servers", "1",
               "--policy", policy, "--set", "run.log_level=warn", "--set", "run.progress_interval=0"]
        if a.sample_ms > 0:
            cmd += ["--set", f"train.speeds={a.speeds}", "--set", f"train.sample_ms={a.sample_ms}"]
        if kind == "bsp-speed":
            cmd += ["--set", "train.allocation=proportional"]
        cmd += ["--python", me, "--", "--worker", "ashlar", "--sampler", "torch" if kind == "bsp" else "speed"] + common
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "build/python")))
    if p.returncode != 0:
        sys.exit(f"hvd_hetero: {kind} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    if not curve:
        return None
    curve = json.loads(pathlib.Path(out).read_text())
    t = next((s for s, acc in curve if acc >= a.target), None)
    return t, max(acc for _, acc in curve), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["ddp", "ashlar", "alone"])
    ap.add_argument("--runs", default="ddp,bsp,bsp-speed,ashl")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--speeds", default="1,1,2,4")
    ap.add_argument("--sample-ms", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=float, default=0.5)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--sampler", default="torch")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--out", default="")
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--max-steps", type=int, default=0, help="throughput: stop after this many steps")
    ap.add_argument("--throughput", action="store_true",
                    help="784-4096-4096-10, equal unpaced workers, 60 steps: samples/s and RSS of DDP and bsp")
    a = ap.parse_args()
    if a.throughput and not a.worker:
        return throughput(a)
    if a.worker == "ddp":
        import torch.multiprocessing as mp
        os.environ["MASTER_PORT"] = str(a.port)
        speeds = [float(s) for s in a.speeds.split(",")]
        mp.spawn(ddp_worker, args=(a, speeds), nprocs=len(speeds))
        return
    if a.worker == "alone":  # PyTorch alone: one process, no DDP
        train(a, 0, 1)
        return
    if a.worker == "ashlar":
        import ashlar.torch as hvd
        hvd.init()
        train(a, hvd.rank(), hvd.size(), hvd=hvd)
        return
    rows = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        for kind in a.runs.split(","):
            t, best, wall = run_one(kind, a, seed, f"/tmp/hvd-hetero-{kind}-{seed}.json")
            rows.setdefault(kind, []).append(t)
            print(f"{kind} seed {seed}: {a.target} after {t if t is None else round(t, 2)} s of training "
                  f"(best {best:.4f}, {wall:.0f} s wall)", flush=True)
    import statistics
    ddp = statistics.median([t for t in rows.get("ddp", []) if t is not None] or [float("nan")])
    print(f"\n| run | time to {a.target} (median s) | / DDP |\n|---|---|---|")
    for kind, ts in rows.items():
        ok = [t for t in ts if t is not None]
        m = statistics.median(ok) if ok else float("nan")
        print(f"| {kind} | {m:.2f} ({len(ok)}/{len(ts)} reached) | {m / ddp:.2f} |")


if __name__ == "__main__":
    main()
