"""A Horovod-style training script for the tests (tests/python/test_horovod.py): its own
model, data (a seeded regression or classification set), DataLoader with torch's
DistributedSampler, optimizer and loss; run under `ashlar launch --python` with
`import ashlar.torch as hvd`. Rank r writes what it ended with to OUT.r (torch.save): the
final parameters, the initial ones, the loss per epoch and what the collectives gave."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ashlar.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--opt", default="sgd", choices=["sgd", "adamw", "adadelta", "manual"])
p.add_argument("--clip", type=float, default=0.0, help="clip the gradient's norm (after synchronize)")
p.add_argument("--step-lr", action="store_true", help="a StepLR scheduler, x0.5 every epoch")
p.add_argument("--hidden", type=int, default=16)
p.add_argument("--rank1-hidden", type=int, default=0, help="rank 1 builds another model (a refused worker)")
p.add_argument("--samples", type=int, default=2048)
p.add_argument("--fp16", action="store_true")
p.add_argument("--no-broadcast", action="store_true", help="leave out broadcast_parameters (DistributedOptimizer checks)")
p.add_argument("--sampler", default="torch", choices=["torch", "speed", "speed-sampler"],
               help="torch's DistributedSampler, or hvd.SpeedSampler as batch_sampler= or sampler=")
p.add_argument("--report", action="store_true", help="hvd.report(val_mse=...) after each epoch (every rank)")
p.add_argument("--save", help="rank 0 saves model, optimizer, scheduler and epoch here at the end (Horovod's way)")
p.add_argument("--resume", help="rank 0 loads a --save checkpoint and broadcasts it; --epochs counts from 0")
p.add_argument("--fail-at", type=int, default=-1, help="rank 1 raises at the start of this epoch (a script bug)")
p.add_argument("--hang-at", type=int, default=-1, help="rank 1 hangs inside a step of this epoch (a stuck script)")
p.add_argument("--local-metrics", action="store_true",
               help="each rank's own loss and no collectives after training (a rank removed while alive is waited "
                    "for by the script's collectives)")
p.add_argument("--out", required=True)
a = p.parse_args()


def make_data(n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


def make_model(hidden):
    torch.manual_seed(7)  # (every rank the same; broadcast_parameters makes it so anyway)
    return nn.Sequential(nn.Linear(20, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def make_optimizer(kind, params, lr):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if kind == "adadelta":
        return torch.optim.Adadelta(params, lr=lr)
    return hvd.ManualOptimizer(params)


hvd.init()
torch.set_num_threads(1)
X, Y = make_data(a.samples)
dataset = torch.utils.data.TensorDataset(X, Y, torch.arange(len(X)))
if a.sampler == "speed":
    sampler = hvd.SpeedSampler(dataset, batch_size=a.batch, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=1)
elif a.sampler == "speed-sampler":
    sampler = hvd.SpeedSampler(dataset, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch, sampler=sampler)
else:
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch, sampler=sampler)
hidden = a.rank1_hidden if a.rank1_hidden and hvd.rank() == 1 else a.hidden
model = make_model(hidden)
initial = [q.detach().clone() for q in model.parameters()]
opt = make_optimizer(a.opt, model.parameters(), a.lr)
if not a.no_broadcast:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                               compression=hvd.Compression.fp16 if a.fp16 else hvd.Compression.none)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if a.step_lr else None
start_epoch = 0
if a.resume:  # as Horovod's examples resume: rank 0 loads, the broadcasts hand it to every rank
    ck = torch.load(a.resume) if hvd.rank() == 0 else None
    start_epoch = hvd.broadcast_object(ck["epoch"] if ck else None, root_rank=0)
    if hvd.rank() == 0:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if sched is not None:
        sched.load_state_dict(hvd.broadcast_object(ck["sched"] if ck else None, root_rank=0))

with torch.no_grad():
    initial_loss = F.mse_loss(model(X), Y).item()
losses = []
seen = []  # per epoch, the indices of this rank's batches, and their sizes
start = time.time()
for epoch in range(start_epoch, a.epochs):
    sampler.set_epoch(epoch)
    if epoch == a.fail_at and hvd.rank() == 1:
        raise ValueError(f"rank 1 fails at epoch {epoch}")
    seen.append(([], []))
    for x, y, i in loader:
        seen[-1][0].extend(i.tolist())
        seen[-1][1].append(len(i))
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if epoch == a.hang_at and hvd.rank() == 1 and len(seen[-1][1]) == 3:
            print(f"rank 1 hangs in a step of epoch {epoch}", flush=True)
            while True:
                time.sleep(1)
        if a.opt == "manual":
            opt.synchronize()
            with torch.no_grad():
                for q in model.parameters():
                    q.add_(q.grad, alpha=-a.lr)
            opt.step()
        elif a.clip > 0:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    if sched is not None:
        sched.step()
    with torch.no_grad():
        local = torch.tensor(F.mse_loss(model(X), Y).item())
        losses.append(local.item() if a.local_metrics else hvd.allreduce(local).item())
    if a.report:
        hvd.report(val_mse=losses[-1], epoch=epoch + 1)
    if hvd.rank() == 0:
        print(f"epoch {epoch}: loss {losses[-1]:.5f} ({time.time() - start:.1f} s)", flush=True)

if a.save and hvd.rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": a.epochs,
                "sched": sched.state_dict() if sched is not None else None}, a.save)
gathered = summed = names = None
if not a.local_metrics:
    gathered = hvd.allgather(torch.tensor([[float(hvd.rank())]]))
    summed = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    names = hvd.allgather_object(f"rank{hvd.rank()}")
torch.save({"params": [q.detach().clone() for q in model.parameters()], "initial": initial, "losses": losses, "initial_loss": initial_loss, "seen": seen,
            "gathered": gathered, "summed": summed, "names": names, "size": hvd.size(), "policy": hvd.policy(),
            "lr_end": opt.param_groups[0].get("lr")},
           f"{a.out}.{hvd.rank()}")
