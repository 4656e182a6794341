"""A PyTorch training loop as an Ashlar worker: the model is PyTorch's, the batches, the
parameters and the policy (bsp, asp, adsp, ashl, ...) are the Ashlar job's.

Three such workers at paced speeds 1, 2 and 4 under ASHL, the CNN on Fashion-MNIST:

    ashlar launch ops/configs/fmnist-cnn.toml --python apps/python/examples/fmnist_torch.py \
      --set train.workers=3 --set train.policy=ashl --set train.speeds=1,2,4

By hand, each worker joins a running scheduler:

    ASHLAR_JOIN=127.0.0.1:7400 ASHLAR_TOKEN_FILE=~/.ashlar/cluster-7400.token \
      python3 apps/python/examples/fmnist_torch.py

The network is built from the job's model as the scheduler has it (ashlar.job_model():
the config's [model] with every --set applied; ops/ashlar_torch.py builds it), so Ashlar's
own workers can train beside these; any nn.Module with the same layers in the same order
works.
"""
import os
import sys
import time

import torch.nn.functional as F

import ashlar
import ashlar.torch
from ashlar import ashlar_torch

name = os.environ.get("ASHLAR_NAME", "python worker")
ashlar.init()  # joins the cluster ASHLAR_JOIN names (set by ashlar launch --python)
model = ashlar_torch.build(ashlar.job_model())  # waits for the job to give this process its worker
model.to(ashlar.device())  # this worker's GPU (ashlar launch pins one per process), else the CPU
print(f"{name}: local rank {ashlar.local_rank()}, computing on {ashlar.device()}", flush=True)
opt = ashlar.torch.BatchLoop(model)

steps, start, last = 0, time.time(), time.time()
for x, y in opt.batches():
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    steps += 1
    if time.time() - last >= 5:
        last = time.time()
        print(f"{name}: step {steps}, batch {ashlar.batch_size()}, loss {loss.item():.3f}", flush=True)
code = ashlar.shutdown()
print(f"{name}: {steps} steps in {time.time() - start:.1f} s; the job is over (exit code {code})", flush=True)
sys.exit(code)
