#!/usr/bin/python3
"""The peer: PyTorch DistributedDataParallel (gloo) training the same MLP on the same
Fashion-MNIST data as `ashlar train ops/configs/fmnist-mlp.toml`, with the same pacing:
one process per worker, each step's computation takes at least batch x sample_ms / speed
(the rest slept, before the gradients are all-reduced, as Ashlar's paced workers do).
Rank 0 evaluates the test set every --eval-interval seconds of training (evaluation time
is not counted) and the run stops at --target accuracy or --time-cap seconds.
Prints one JSON line per seed: time to target, samples/s, final accuracy.

  /usr/bin/python3 ops/bench/ddp_peer.py --speeds 1,1,2,4 --seeds 1,2,3
  /usr/bin/python3 ops/bench/ddp_peer.py --config ops/configs/fmnist-cnn.toml --lr 0.1 --sample-ms 6 --target 0.9

With --config, the network is the config's [model] built by ops/ashlar_torch.py (the
same layers, shapes and parameter layout Ashlar trains); without, the MLP of --hidden.
The learning rate follows the config's schedule (train.lr_schedule, train.warmup_epochs,
train.epochs) as Ashlar's does: over the epochs or the time cap, whichever is further.

--controller omnilearn: the stronger peer. Per-worker batch sizes set by OmniLearn's BSP
controller (TPDS 2025): at every adjustment each worker's batch b_i changes by
-(b_i / t_i)(t_i - mean t), t_i its iteration time without waiting, unless every t_i is
within the dead band (--dead-band, 5%) of the mean; the global batch (--batch x workers)
stays fixed, and the gradients are averaged weighted by batch (each worker's loss is
scaled by b_i x workers / global batch before DDP's equal average). OmniLearn adjusts
once an epoch; these runs reach the target within about one, so the same rule runs every
--adjust-steps steps (default 20).
"""
import argparse
import datetime
import faulthandler
import gzip
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

MEAN, STD = 0.2860, 0.3530  # as Ashlar's reader standardizes


def load_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        sys.exit(f"ddp_peer: no {stem}[.gz] in {data_dir}")
    x = load_idx(find(f"{split}-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32)
    y = load_idx(find(f"{split}-labels-idx1-ubyte")).astype(np.int64)
    x = (x / 255.0 - MEAN) / STD
    return torch.from_numpy(x), torch.from_numpy(y)


def load_contention(path):
    """Ashlar's contention file: lines WORKER START_S END_S FACTOR (`*`: every worker)."""
    out = []
    if not path:
        return out
    for line in open(path):
        words = line.split("#")[0].split()
        if len(words) == 4:
            out.append((None if words[0] == "*" else int(words[0]), float(words[1]), float(words[2]), float(words[3])))
    return out


def slowdown(contention, rank, t):
    f = 1.0
    for w, a, b, factor in contention:
        if (w is None or w == rank) and a <= t < b:
            f *= factor
    return f


def make_model(hidden, seed):
    torch.manual_seed(seed)
    sizes = [784] + hidden + [10]
    layers = []
    for i in range(len(sizes) - 1):
        lin = torch.nn.Linear(sizes[i], sizes[i + 1])
        torch.nn.init.normal_(lin.weight, 0.0, (2.0 / sizes[i]) ** 0.5)  # He, as Ashlar
        torch.nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_net(args):
    if not args.config:
        return make_model(args.hidden, args.seed)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import ashlar_torch
    torch.manual_seed(args.seed)
    return ashlar_torch.build(ashlar_torch.read_config(args.config))


def lr_factor(schedule, warmup, epoch, epochs):
    """Ashlar's learning-rate factor (runtime/optim/lr_schedule.cpp): constant, cosine or
    step over `epochs`, times a linear warmup over the first `warmup` epochs."""
    t = min(max(epoch / epochs, 0.0), 1.0) if epochs > 0 else 0.0
    f = 1.0
    if schedule == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * t))
    elif schedule == "step":
        f = 0.01 if t >= 0.75 else 0.1 if t >= 0.5 else 1.0
    warmup = min(warmup, epochs / 2)
    if warmup > 0 and epoch < warmup:
        f *= max(0.01, max(epoch, 0.0) / warmup)
    return f


def free_port():
    """A TCP port on the loopback that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """A spawned process ends when its parent does (Linux's PR_SET_PDEATHSIG), so a peer
    run stopped by a signal leaves no DDP processes behind."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent ended before the call
            os._exit(1)
    except OSError:
        pass


def worker(rank, args, port, result_path):
    die_with_parent()
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    world = len(args.speeds)
    # A collective that waits longer than --collective-timeout fails (naming it) instead
    # of leaving every rank idle until the caller's own time limit.
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.collective_timeout))
    x, y = load(args.data_dir, "train")
    if rank == 0:
        tx, ty = load(args.data_dir, "t10k")
    if args.config:  # images keep their shape
        x = x.view(-1, 1, 28, 28)
        if rank == 0:
            tx = tx.view(-1, 1, 28, 28)
    model = DDP(make_net(args))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = args.batch  # this worker's; the controller changes it
    global_batch = args.batch * world
    gen = torch.Generator().manual_seed(args.seed)
    # The local computation of one step (forward and backward, no all-reduce), measured
    # once, so that sleeping budget - compute leaves each step as long as its budget.
    with model.no_sync():
        for _ in range(5):  # warm-up
            loss_fn(model(x[:args.batch]), y[:args.batch]).backward()
        t0 = time.perf_counter()
        for _ in range(5):
            out = model(x[:args.batch])
            loss_fn(out, y[:args.batch]).backward()
        compute = (time.perf_counter() - t0) / 5
    per_sample = compute / args.batch  # the controller's measure of this worker's compute
    opt.zero_grad()
    dist.barrier()
    train_time, eval_time, samples, history = 0.0, 0.0, 0, []
    start = time.perf_counter()
    next_eval = args.eval_interval
    # stop[0]: agreed to stop; stop[1]: rank 0's share of the time cap spent, which every
    # rank's learning-rate schedule reads alike (set at the same steps everywhere).
    stop = torch.zeros(2)
    step = 0
    time_share = 0.0
    epoch = 0
    done = False
    omni = args.controller == "omnilearn"
    while not done:
        perm = torch.randperm(x.shape[0], generator=gen)
        mine = perm[rank::world]
        b = 0
        while b + batch <= mine.shape[0]:
            idx = mine[b:b + batch]
            b += batch
            budget = batch * args.sample_ms * 1e-3 / args.speeds[rank]
            budget *= slowdown(args.contention, rank, time.perf_counter() - start)
            step_compute = per_sample * batch
            if budget > step_compute:
                time.sleep(budget - step_compute)
            # The schedule as Ashlar runs it: over the epochs (of the global batch) or the
            # time cap, whichever is further along (runtime/optim/lr_schedule.cpp).
            progress = max(step * global_batch / x.shape[0], args.epochs * time_share)
            for g in opt.param_groups:
                g["lr"] = args.lr * lr_factor(args.schedule, args.warmup_epochs, progress, args.epochs)
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            if omni:  # DDP averages equally: weigh each worker's gradient by its batch
                loss = loss * (batch * world / global_batch)
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            samples += batch
            step += 1
            if omni and step % args.adjust_steps == 0:
                # Iteration time without waiting, as a controller on each worker measures it.
                t = torch.tensor([max(budget, step_compute)])
                ts = [torch.zeros(1) for _ in range(world)]
                dist.all_gather(ts, t)
                bs = [torch.zeros(1) for _ in range(world)]
                dist.all_gather(bs, torch.tensor([float(batch)]))
                ts = [v.item() for v in ts]
                bs = [v.item() for v in bs]
                mean = sum(ts) / world
                if any(abs(ti - mean) > args.dead_band * mean for ti in ts):
                    new = [max(1.0, bi - (bi / ti) * (ti - mean)) for bi, ti in zip(bs, ts)]
                    scale = global_batch / sum(new)  # the global batch stays fixed
                    ints = [max(1, int(round(v * scale))) for v in new]
                    ints[ints.index(max(ints))] += global_batch - sum(ints)
                    batch = ints[rank]
            if rank == 0:
                train_time = time.perf_counter() - start - eval_time
                if train_time >= next_eval:
                    t_eval = time.perf_counter()
                    with torch.no_grad():
                        acc = (model.module(tx).argmax(1) == ty).float().mean().item()
                    history.append((train_time, acc))
                    eval_time += time.perf_counter() - t_eval
                    next_eval = train_time + args.eval_interval
                    if acc >= args.target or train_time >= args.time_cap:
                        stop[0] = 1
            if step % 10 == 0:  # agree on stopping and on the time spent, every 10 steps
                if rank == 0:
                    stop[1] = min(1.0, train_time / args.time_cap) if args.time_cap > 0 else 0.0
                else:
                    stop[1] = 0.0
                dist.all_reduce(stop)
                time_share = stop[1].item()
                if stop[0] > 0:
                    done = True
                    break
        epoch += 1
    total = torch.tensor([float(samples)])
    dist.all_reduce(total)
    batches = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(batches, torch.tensor([float(batch)]))
    batch = [int(v.item()) for v in batches]
    if rank == 0:
        t85 = next((t for t, a in history if a >= args.target), None)
        # Written whole, then renamed: the parent takes the file's presence as the result.
        with open(result_path + ".part", "w") as f:
            json.dump({"seed": args.seed, "controller": args.controller, "final_batches": batch, "t_target": t85, "accuracy": history[-1][1] if history else 0.0,
                       "seconds": train_time, "samples_per_second": total.item() / max(train_time, 1e-9),
                       "compute_ms": compute * 1e3}, f)
        os.replace(result_path + ".part", result_path)
    # A rank still alive well after this (a teardown that hangs) prints where it is.
    faulthandler.dump_traceback_later(max(10.0, args.exit_grace / 2), exit=False)
    dist.destroy_process_group()
    # Leave now: with the work done and the process group gone, the destructors of DDP
    # and of gloo's objects as this function returns can hang (a rank was seen idle there,
    # in about one run of ten, every Python frame but the spawn wrapper's gone).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speeds", default="1,1,2,4")
    p.add_argument("--sample-ms", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", default="256,128")
    p.add_argument("--config", default="", help="an Ashlar config whose [model] to train instead of the MLP")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--schedule", choices=["constant", "cosine", "step"], default=None,
                   help="learning-rate schedule (default: the config's train.lr_schedule, else constant), over "
                        "--epochs or the time cap, whichever is further along, as Ashlar runs it")
    p.add_argument("--warmup-epochs", type=float, default=None, help="linear warmup (default: the config's)")
    p.add_argument("--epochs", type=float, default=None, help="the schedule's length (default: the config's "
                   "train.epochs, else 10)")
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--time-cap", type=float, default=60)
    p.add_argument("--eval-interval", type=float, default=1.0)
    p.add_argument("--contention", default="", help="Ashlar's contention file (WORKER START_S END_S FACTOR): "
                   "a worker's pace is slowed by FACTOR in that interval of the run's wall time")
    p.add_argument("--seeds", default="1")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--port", type=int, default=0,
                   help="the rendezvous port (default: a free one per run, so that a run never meets the store of "
                        "one still shutting down)")
    p.add_argument("--collective-timeout", type=float, default=300,
                   help="seconds a collective (all-reduce, barrier) may wait for the other ranks before the run "
                        "fails naming it (default 300)")
    p.add_argument("--exit-grace", type=float, default=60,
                   help="seconds the ranks may take to exit after rank 0 wrote the result; then they are stopped "
                        "and the result stands (default 60)")
    p.add_argument("--controller", choices=["none", "omnilearn"], default="none",
                   help="omnilearn: per-worker batches by OmniLearn's proportional controller, batch-weighted average")
    p.add_argument("--adjust-steps", type=int, default=20, help="omnilearn: steps between adjustments")
    p.add_argument("--dead-band", type=float, default=0.05, help="omnilearn: no change while every t_i is this close "
                   "to the mean (relative)")
    args = p.parse_args()
    train = {}
    if args.config:
        import tomllib
        with open(args.config, "rb") as f:
            train = tomllib.load(f).get("train", {})
    if args.schedule is None:
        args.schedule = train.get("lr_schedule", "constant")
    if args.warmup_epochs is None:
        args.warmup_epochs = float(train.get("warmup_epochs", 0))
    if args.epochs is None:
        args.epochs = float(train.get("epochs", 10))
    args.speeds = [float(s) for s in args.speeds.split(",")]
    args.hidden = [int(h) for h in args.hidden.split(",") if h]
    args.contention = load_contention(args.contention)
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        args.seed = seed
        result = f"/tmp/ashlar-ddp-{os.getpid()}-{seed}.json"
        port = args.port + i if args.port else free_port()
        ctx = mp.spawn(worker, args=(args, port, result), nprocs=len(args.speeds), join=False)
        written = None
        while not ctx.join(timeout=5):
            # The result is written before the ranks leave the process group: ranks that
            # do not exit after it (a process group's teardown can hang) do not hold it back.
            if os.path.exists(result):
                written = written or time.monotonic()
                if time.monotonic() - written > args.exit_grace:
                    print(f"ddp_peer: seed {seed}: the ranks had not exited {args.exit_grace:g} s after the result "
                          "was written; stopping them", file=sys.stderr, flush=True)
                    for proc in ctx.processes:
                        proc.terminate()
                    for proc in ctx.processes:
                        proc.join(10)
                        if proc.is_alive():
                            proc.kill()
                            proc.join()
                    break
        with open(result) as f:
            print(f.read(), flush=True)
        os.remove(result)


if __name__ == "__main__":
    main()
