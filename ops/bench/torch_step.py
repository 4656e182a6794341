#!/usr/bin/python3
"""PyTorch's CPU training step time per sample on the same model as `ashlar bench step`
(the MLP of --hidden, or the model of --config): forward, softmax cross-entropy, backward
and an SGD (momentum) update, one thread."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ashlar_torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--hidden", default="256,128")
p.add_argument("--config", default="", help="an Ashlar config: its [model]")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=30)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
if a.config:
    spec = ashlar_torch.read_config(a.config)
else:
    spec = ashlar_torch.model_of({"input": [784], "hidden": [int(x) for x in a.hidden.split(",") if x]})
model = ashlar_torch.build(spec)
model.train()
c, h, w = spec["input"]
dim = c * h * w
name = ("-".join(map(str, [dim] + [int(x) for x in a.hidden.split(",") if x] + [10])) if not a.config
        else os.path.basename(a.config))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(a.batch * 16, c, h, w) if (h, w) != (1, 1) else torch.randn(a.batch * 16, dim)
y = torch.randint(0, 10, (a.batch * 16,))


def step(i):
    lo = (i % 16) * a.batch
    xb, yb = x[lo:lo + a.batch], y[lo:lo + a.batch]
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()


for i in range(a.warmup):
    step(i)
t0 = time.perf_counter()
for i in range(a.steps):
    step(i)
secs = time.perf_counter() - t0
us_step = secs * 1e6 / a.steps
print(json.dumps({"framework": "pytorch " + torch.__version__, "model": name,
                  "batch": a.batch, "threads": a.threads, "us_per_step": round(us_step, 3),
                  "us_per_sample": round(us_step / a.batch, 4)}))
