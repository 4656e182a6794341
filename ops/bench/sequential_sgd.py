#!/usr/bin/python3
"""Samples to a target test accuracy for plain sequential SGD (one process, PyTorch) on
the MLP and Fashion-MNIST data of ops/configs/fmnist-mlp.toml: the sample-efficiency
reference for the distributed policies (how many samples a policy needs to 85%, against
how many one process needs). Each SPEC is BATCH,LR,MOMENTUM; prints one line per spec
with the samples each seed needed (None: not within --cap samples).

  /usr/bin/python3 ops/bench/sequential_sgd.py 32,0.15,0 32,0.3,0 256,0.1,0.9
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_peer import load, make_model  # noqa: E402  (same reader and initialization)


def samples_to_target(x, y, xte, yte, batch, lr, momentum, seed, target, every, cap, wd):
    m = make_model([256, 128], seed)
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    g = torch.Generator().manual_seed(seed)
    seen, next_eval = 0, every
    while seen < cap:
        perm = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - batch + 1, batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x[idx]), y[idx]).backward()
            opt.step()
            seen += batch
            if seen >= next_eval:
                next_eval += every
                with torch.no_grad():
                    if (m(xte).argmax(1) == yte).float().mean().item() >= target:
                        return seen
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
        r = [samples_to_target(x, y, xte, yte, b, lr, mom, s, a.target, a.every, a.cap, a.weight_decay) for s in seeds]
        print(f"batch {b}, lr {lr}, momentum {mom}: samples to {a.target} per seed {r}", flush=True)


if __name__ == "__main__":
    main()
