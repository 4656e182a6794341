#!/usr/bin/python3
"""PyTorch's CPU training step time per sample on the same MLP as `ashlar bench step`:
forward, softmax cross-entropy, backward and an SGD (momentum) update, one thread."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--hidden", default="256,128")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=30)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
widths = [784] + [int(x) for x in a.hidden.split(",") if x] + [10]
layers = []
for i in range(len(widths) - 1):
    layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    if i + 2 < len(widths):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(a.batch * 16, 784)
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
print(json.dumps({"framework": "pytorch " + torch.__version__, "model": "-".join(map(str, widths)),
                  "batch": a.batch, "threads": a.threads, "us_per_step": round(us_step, 3),
                  "us_per_sample": round(us_step / a.batch, 4)}))
