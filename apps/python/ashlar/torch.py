"""PyTorch models as Ashlar workers' compute.

The model's parameters, in model.parameters() order, are Ashlar's flat parameter vector:
for the models Ashlar describes (ops/ashlar_torch.py builds them, or an nn.Sequential of
the same layers) that is each layer's weight then its bias, as Ashlar lays them out, so
Python workers and Ashlar's own workers train the same model in one job. A model Ashlar
does not describe is declared in the job's config as one `external` layer with its
parameter count; then every worker must be a Python one.

    ModelBackend(model)           a backend for ashlar.train / ashlar.run: Ashlar's worker
                                  loop calls it (forward, backward) with its batches
    BatchLoop(model)              for a script's own loop on the job's data, after ashlar.init()

Horovod's contract is here too (`import ashlar.torch as hvd`: init, rank, size,
DistributedOptimizer(optimizer, ...), broadcast_parameters, allreduce, SpeedSampler, ...):
the script's own model, data and optimizer, see ashlar/_horovod.py.
"""
import copy
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import _node, Error, is_running
from .bridge import Closed

__all__ = ["ModelBackend", "BatchLoop", "load_flat", "flat_grad"]


# Ashlar's arrays are read-only views of its buffers: PyTorch shares them (no copy) and
# warns that it could write to them; it does not here. (One filter for the process:
# warnings.catch_warnings is not safe across Ashlar's worker threads.)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def _tensor(a):
    return torch.from_numpy(a)


def _check_count(model, n):
    have = sum(p.numel() for p in model.parameters())
    if have != n:
        raise ValueError(f"the PyTorch model has {have} parameters and the job's model {n}: they must be the same "
                         "network, its layers in Ashlar's order (see ops/ashlar_torch.py)")


@torch.no_grad()
def load_flat(model, params):
    """Copies Ashlar's flat parameters (a NumPy array or a tensor) into `model`."""
    flat = _tensor(params) if isinstance(params, np.ndarray) else params
    _check_count(model, flat.numel())
    o = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[o:o + n].view_as(p))
        o += n


@torch.no_grad()
def flat_grad(model, out):
    """Writes the model's gradients into `out` (Ashlar's gradient buffer, a NumPy array),
    in Ashlar's layout; a parameter without a gradient contributes zeros."""
    dst = _tensor(out)
    o = 0
    for p in model.parameters():
        n = p.numel()
        if p.grad is None:
            dst[o:o + n].zero_()
        else:
            dst[o:o + n].copy_(p.grad.reshape(-1))
        o += n


def _device(model):
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@torch.no_grad()
def _evaluate(model, params, x, y):
    load_flat(model, params)
    was = model.training
    model.eval()
    dev = _device(model)
    out = model(_tensor(x).to(dev))
    model.train(was)
    target = _tensor(y).to(dev).long()
    return float(F.cross_entropy(out, target, reduction="sum")), int((out.argmax(1) == target).sum())


class ModelBackend:
    """Ashlar's worker loop computes its steps with `model`: each train_step loads the
    parameters Ashlar gives it, runs forward and backward on the batch with `loss`
    (default cross entropy, mean over the batch) and hands the gradient back. Workers in
    one process each get their own copy of the model; a model on a GPU computes there (the
    batch goes to it, the gradient comes back to Ashlar's buffer)."""

    def __init__(self, model, loss=F.cross_entropy):
        self.model = model
        self.loss = loss
        self._lock = threading.Lock()
        self._free = [model]  # models no call is using; a call takes one (or a new copy)

    def _take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return copy.deepcopy(self.model)

    def _give(self, m):
        with self._lock:
            self._free.append(m)

    def train_step(self, params, x, y, grad):
        model = self._take()
        try:
            return self._train_step(model, params, x, y, grad)
        finally:
            self._give(model)

    def _train_step(self, model, params, x, y, grad):
        load_flat(model, params)
        model.zero_grad(set_to_none=False)
        dev = _device(model)  # a model on a GPU gets the batch there; its gradient comes back
        out = model(_tensor(x).to(dev))
        target = _tensor(y).to(dev).long()
        loss = self.loss(out, target)
        loss.backward()
        flat_grad(model, grad)
        with torch.no_grad():
            return float(loss) * len(target), int((out.argmax(1) == target).sum())

    def evaluate(self, params, x, y):
        model = self._take()
        try:
            return _evaluate(model, params, x, y)
        finally:
            self._give(model)


class BatchLoop:
    """Takes this process's Ashlar worker steps from the script's own loop (after
    ashlar.init()), on the job's data and with the job's update (train.lr on the shards):

        opt = BatchLoop(model)        # or DistributedOptimizer(model), its older name
        for x, y in opt.batches():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    Each batch comes with the parameters Ashlar's policy gives this step (pulled from the
    shards, or the local model between commits under adsp and ashl) already loaded into
    `model`; step() hands the gradient to Ashlar, which pushes it (top-k compressed where
    the policy or train.topk_ratio says) or applies it as a local step. The learning rate,
    momentum and the update itself are the job's (train.lr, the policy's rules): there is
    no PyTorch optimizer to step. The batch size is the one the scheduler allocates to this
    worker (ashlar.batch_size()). The loop ends when the job does or the node leaves."""

    def __init__(self, model):
        bridge = _node["bridge"]
        if bridge is None:
            raise Error(2, "ashlar.torch.BatchLoop: call ashlar.init() first")
        self.model = model
        self._bridge = bridge
        self._step = None
        self._out = None
        self._target = None
        # The evaluations' own copy, made before the hook below (a copy would take the hook,
        # and with it this optimizer and its bridge, along).
        eval_model = copy.deepcopy(model)
        eval_lock = threading.Lock()
        self._hook = model.register_forward_hook(self._keep_output)

        def evaluator(params, x, y):
            with eval_lock:
                return _evaluate(eval_model, params, x, y)

        bridge.evaluator = evaluator

    def _keep_output(self, module, inputs, output):
        self._out = output

    def batches(self):
        """This worker's batches as (x, y) tensors, until the job ends or the worker
        leaves. x is a view of Ashlar's buffer, valid until step() (copy what you keep);
        y is the batch's own."""
        taken = 0
        while True:
            if self._step is not None:
                raise Error(2, "ashlar.torch.BatchLoop: the last batch's step() was not called")
            try:
                step = self._bridge.next_step(is_running)
            except Closed:
                code = _node["code"]
                if taken == 0 and code not in (None, 0):
                    raise Error(code, f"ashlar: the worker ended with exit code {code} before its first step "
                                      "(its error is above: the cluster unreachable, credentials refused, ...)") from None
                return
            taken += 1
            try:
                load_flat(self.model, step.params)
            except ValueError as e:
                step.fail(e)
                raise
            self._step = step
            self._out = None
            self._target = _tensor(step.y).long()  # a copy: valid after step()
            yield _tensor(step.x), self._target  # CPU tensors: x.to(device) as with any DataLoader

    def zero_grad(self, set_to_none=False):
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self, loss=None):
        """Hands this batch's gradient to Ashlar. The loss Ashlar's planners follow is the
        cross entropy of the model's last output on the batch, or `loss` (the batch's
        mean) when given."""
        step = self._step
        if step is None:
            raise Error(2, "ashlar.torch.BatchLoop.step: no batch is waiting (iterate batches())")
        self._step = None
        if step.abandoned:
            return  # shut down meanwhile: Ashlar no longer holds the buffers
        flat_grad(self.model, step.grad)
        n = len(step.y)
        with torch.no_grad():
            out = self._out
            target = self._target.to(out.device) if out is not None else None
            correct = int((out.argmax(1) == target).sum()) if out is not None else 0
            if loss is not None:
                loss_sum = float(loss) * n
            elif out is not None:
                loss_sum = float(F.cross_entropy(out, target, reduction="sum"))
            else:
                step.fail(Error(2, "step(): the model was not run on the batch; pass step(loss=...)"))
                raise Error(2, "ashlar.torch.BatchLoop.step: the model was not run on the batch")
        step.finish(loss_sum, correct)


# Horovod's contract (`import ashlar.torch as hvd`): see ashlar/_horovod.py.
from ._horovod import *  # noqa: E402,F401,F403
from ._horovod import __all__ as _horovod_all  # noqa: E402

__all__ += _horovod_all
