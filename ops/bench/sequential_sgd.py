#!/usr/bin/python3
"""Samples to a target test accuracy for plain sequential SGD (one process, PyTorch) on
Fashion-MNIST: the sample-efficiency reference for the distributed policies (how many
samples a policy needs to a target, against how many one process needs). The model is
the MLP of ops/configs/fmnist-mlp.toml, or a recipe's [model] with --config (built as
ops/ashlar_torch.py builds it, Ashlar's initialization). --schedule cosine --warmup 1
--epochs 15 applies a recipe's learning-rate schedule (as ops/bench/ddp_peer.py does).
Each SPEC is BATCH,LR,MOMENTUM; prints one line per spec with the samples each seed needed
(None: not within --cap samples).

  /usr/bin/python3 ops/bench/sequential_sgd.py 32,0.15,0 32,0.3,0 256,0.1,0.9
  /usr/bin/python3 ops/bench/sequential_sgd.py --config ops/configs/fmnist-cnn.toml \
      --target 0.9 --cap 240000 --every 4096 64,0.05,0.9
  (--average 3750: the running average of the parameters is what is evaluated)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_peer import load, lr_factor, make_net  # noqa: E402  (same reader, model, schedule)


def samples_to_target(x, y, xte, yte, batch, lr, momentum, seed, a):
    target, every, cap = a.target, a.every, a.cap
    m = make_net(argparse.Namespace(config=a.config, hidden=[256, 128], seed=seed))
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=a.weight_decay)
    # --average H: evaluate a running average of the parameters instead, as Ashlar's
    # shards keep it (train.average_epochs): half-life H samples, at most a tenth of the
    # samples seen.
    avg = [p.detach().clone() for p in m.parameters()] if a.average > 0 else None
    g = torch.Generator().manual_seed(seed)
    seen, next_eval = 0, every
    while seen < cap:
        perm = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - batch + 1, batch):
            idx = perm[i:i + batch]
            for group in opt.param_groups:
                group["lr"] = lr * lr_factor(a.schedule, a.warmup, seen / x.shape[0], a.epochs)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x[idx]), y[idx]).backward()
            opt.step()
            seen += batch
            if avg is not None:
                step = 1 - 0.5 ** (batch / min(a.average, 0.1 * seen))
                with torch.no_grad():
                    for q, p in zip(avg, m.parameters()):
                        q.add_(p - q, alpha=step)
            if seen >= next_eval:
                next_eval += every
                m.eval()
                with torch.no_grad():
                    if avg is not None:  # the average in the model's place for the evaluation
                        live = [p.detach().clone() for p in m.parameters()]
                        for p, q in zip(m.parameters(), avg):
                            p.copy_(q)
                    accuracy = (m(xte).argmax(1) == yte).float().mean().item()
                    if avg is not None:
                        for p, q in zip(m.parameters(), live):
                            p.copy_(q)
                    if accuracy >= target:
                        return seen
                m.train()
            if seen >= cap:
                return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", help="BATCH,LR,MOMENTUM")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--every", type=int, default=2048, help="samples between test evaluations")
    ap.add_argument("--cap", type=int, default=150000, help="samples before giving up")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--config", help="a recipe whose [model] to train (default: the MLP)")
    ap.add_argument("--schedule", default="constant", choices=["constant", "cosine", "step"])
    ap.add_argument("--warmup", type=float, default=0.0, help="epochs of linear warmup")
    ap.add_argument("--epochs", type=float, default=15.0, help="the schedule's length in epochs")
    ap.add_argument("--average", type=float, default=0.0,
                    help="evaluate a running average of the parameters, this half-life in samples (at most a "
                         "tenth of the samples seen), as train.average_epochs does; 0 = the parameters")
    a = ap.parse_args()
    torch.set_num_threads(2)
    x, y = load(a.data_dir, "train")
    xte, yte = load(a.data_dir, "t10k")
    seeds = [int(s) for s in a.seeds.split(",")]
    for spec in a.specs:
        try:
            b, lr, mom = spec.split(",")
            b, lr, mom = int(b), float(lr), float(mom)
        except ValueError:
            sys.exit(f"sequential_sgd: spec '{spec}' is not BATCH,LR,MOMENTUM")
        r = [samples_to_target(x, y, xte, yte, b, lr, mom, s, a) for s in seeds]
        sched = ("" if a.schedule == "constant" and not a.warmup else
                 f", {a.schedule} over {a.epochs:g} epochs, warmup {a.warmup:g}") + \
            (f", running average (half-life {a.average:g} samples)" if a.average > 0 else "")
        print(f"batch {b}, lr {lr}, momentum {mom}{sched}: samples to {a.target} per seed {r}", flush=True)


if __name__ == "__main__":
    main()
