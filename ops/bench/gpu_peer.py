#!/usr/bin/env python3
"""PyTorch on the same GPU and models as `ashlar bench gpu`: samples/s of a training step.

Models: MLPs by hidden widths (--hidden, repeatable) and the models of Ashlar config files
(--config, repeatable; built by ops/ashlar_torch.py with Ashlar's layout), named as Ashlar
names them so tables can join the two.

Two figures per model:
  same_work    what an Ashlar GPU worker does each step: parameters in from pinned host
               memory, the batch in, forward and backward, the flat gradient out to pinned
               host memory (a parameter-server worker pulls and pushes every step);
  device_only  a plain PyTorch loop: forward, backward and an SGD step on the device.
Appends one JSON line per model and mode to --json, and prints a table.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


def model_for(hidden, device):
    widths = [784] + hidden + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def config_model(path, device):
    """The model of an Ashlar config, and the name Ashlar gives it (model_spec::to_string)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import ashlar_torch
    spec = ashlar_torch.read_config(path)
    net = ashlar_torch.build(spec).to(device)
    aliases = {"linear": "dense", "conv": "conv2d"}
    c, h, w = spec["input"]
    shape = f"{c}x{h}x{w}" if (h, w) != (1, 1) else f"{c}"
    kinds = "-".join(aliases.get(d["kind"], d["kind"]) for d in spec["layers"])
    n = sum(p.numel() for p in net.parameters())
    return net, f"{shape} {kinds} ({n} params)", c * h * w, spec["classes"]


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(step, warmup, steps, dev):
    for _ in range(warmup):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", action="append", default=None)
    ap.add_argument("--config", action="append", default=[], help="also the model of this Ashlar config")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check this script without a GPU")
    a = ap.parse_args()
    hiddens = a.hidden if a.hidden is not None else ([] if a.config else ["256,128", "4096,4096"])
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    dev = torch.device(a.device)
    pin = (lambda t: t.pin_memory()) if dev.type == "cuda" else (lambda t: t)
    g = torch.Generator().manual_seed(7)
    rows = []
    models = []
    for h in hiddens:
        hidden = [int(x) for x in h.split(",")]
        models.append((model_for(hidden, dev), "784-" + "-".join(str(x) for x in hidden) + "-10", 784, 10))
    models += [config_model(path, dev) for path in a.config]
    for model, name, dim, classes in models:
        params = list(model.parameters())
        n = sum(p.numel() for p in params)
        host_params = pin(torch.nn.utils.parameters_to_vector(params).detach().cpu())
        host_grad = pin(torch.empty(n, dtype=torch.float32))
        flat = torch.empty(n, dtype=torch.float32, device=dev)
        xs = pin(torch.randn(8 * a.batch, dim, generator=g))
        ys = pin(torch.randint(0, classes, (8 * a.batch,), generator=g))
        k = [0]

        def batch():
            i = k[0] % 8
            k[0] += 1
            return (xs[i * a.batch:(i + 1) * a.batch].to(dev, non_blocking=True),
                    ys[i * a.batch:(i + 1) * a.batch].to(dev, non_blocking=True))

        def same_work():
            flat.copy_(host_params, non_blocking=True)
            torch.nn.utils.vector_to_parameters(flat, params)
            x, y = batch()
            for p in params:
                p.grad = None
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            host_grad.copy_(torch.cat([p.grad.reshape(-1) for p in params]), non_blocking=True)
            sync(dev)  # the gradient is in host memory

        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def device_only():
            x, y = batch()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        for mode, fn in (("same_work", same_work), ("device_only", device_only)):
            secs = timed(fn, a.warmup, a.steps, dev)
            rate = a.steps * a.batch / secs
            rows.append((name, mode, rate))
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps({"system": "pytorch", "mode": mode, "model": name, "batch": a.batch,
                                        "tf32": a.tf32, "samples_per_second": rate, "device": a.device,
                                        "torch": torch.__version__}) + "\n")
    print(f"{'model':<22} {'pytorch mode':<12} {'samples/s':>12}")
    for name, mode, rate in rows:
        print(f"{name:<22} {mode:<12} {rate:>12.0f}")


if __name__ == "__main__":
    main()
