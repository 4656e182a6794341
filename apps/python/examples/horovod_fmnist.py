"""A training script written against Horovod's API, run on Ashlar by its import line:
its own model, torchvision dataset and DataLoader, torch optimizer, LR scheduler, loss and
evaluation. Under Horovod it would read `import horovod.torch as hvd` and run with
`horovodrun -np 4 python3 horovod_fmnist.py`; here:

    ashlar launch --workers 4 --python apps/python/examples/horovod_fmnist.py -- --epochs 2

and any policy (`--policy ashl --set train.speeds=1,1,2,4`) with the same script.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import datasets, transforms

import ashlar.data
import ashlar.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="Fashion-MNIST, Horovod style")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate for one worker")
parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
parser.add_argument("--clip", type=float, default=1.0, help="clip the gradient's norm (0: no clipping)")
parser.add_argument("--data", default=None, help="torchvision root (default: Debian's files, unpacked once)")
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 5, padding=2)
        self.fc1 = nn.Linear(16 * 14 * 14, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


hvd.init()
torch.manual_seed(1)
torch.set_num_threads(1)
root = args.data or ashlar.data.fashion_mnist()
tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
train_set = datasets.FashionMNIST(root, train=True, transform=tf)
test_set = datasets.FashionMNIST(root, train=False, transform=tf)
train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
test_sampler = torch.utils.data.distributed.DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                                               shuffle=False)
test_loader = torch.utils.data.DataLoader(test_set, batch_size=1000, sampler=test_sampler)

model = Net()
lr = args.lr * hvd.size()  # the linear scaling rule, as Horovod's examples scale it
if args.optimizer == "adamw":
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
steps = args.epochs * len(train_loader)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps) if steps else None


def evaluate():
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in test_loader:
            out = model(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    model.train()
    n = len(test_sampler)
    return hvd.allreduce(torch.tensor(loss / n)).item(), hvd.allreduce(torch.tensor(correct / n)).item()


start = time.time()
for epoch in range(args.epochs):
    train_sampler.set_epoch(epoch)
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if args.clip > 0:
            optimizer.synchronize()  # the gradient the optimizer steps on, then clipped
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        scheduler.step()
    test_loss, accuracy = evaluate()
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: test accuracy {accuracy:.4f}, test loss {test_loss:.4f}, "
              f"{time.time() - start:.1f} s ({hvd.policy()}, {hvd.size()} workers)", flush=True)
