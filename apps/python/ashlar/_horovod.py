"""Horovod's contract on Ashlar's policies: `import ashlar.torch as hvd`.

A Horovod script keeps its model, its torch optimizer and LR scheduler, its DataLoader and
its loss; it changes its import line and its launcher
(`ashlar launch [CONFIG] --workers N --python SCRIPT -- ARGS`). The job's policy decides
how the workers' updates meet, by one rule per family (train.optimizer = script):

  bsp, ring      lockstep: optimizer.step() sends this worker's gradient and waits for the
                 round's batch-weighted mean gradient (the shards hold it, as an
                 all-reduce would), puts it into every parameter's .grad and steps the
                 script's optimizer on it. Every worker's copy takes the same step from
                 the same state: with equal speeds the trajectory is PyTorch DDP's.
  the others     local: optimizer.step() steps the script's optimizer on this worker's
  (asp, ssp,     own gradient, then sends the step's parameter delta; the shards apply the
  ksync, kasync, deltas by the policy's staleness rule (BytePS's asynchronous mode), and
  adaptive,      under adsp and ashl the worker takes local steps, its script's optimizer
  adsp, ashl)    steps, between commits of their summed delta (Async Local-SGD). The
                 model then holds the parameters the policy gives the next step: its
                 initial value (rank 0's) plus what the shards hold. Optimizer state
                 (Adam's moments) is each worker's own.

The collectives (broadcast_parameters, broadcast_optimizer_state, allreduce, allgather,
broadcast_object) carry metrics and state between the scripts (ashlar/store.py); the
training goes through the shards.
"""
import contextlib
import io
import os
import time

import numpy as np
import torch

from . import Error
from .store import Store, CollectiveError

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size", "cross_rank",
           "cross_size", "policy", "lockstep", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_optimizer_state", "broadcast_object", "allgather_object", "broadcast", "broadcast_",
           "allreduce", "allreduce_", "allgather", "barrier", "join", "Compression", "Average", "Sum", "Adasum",
           "JobEnded", "CollectiveError", "report", "reported", "elastic", "ManualOptimizer", "SpeedSampler", "mpi_threads_supported", "nccl_built", "gloo_enabled",
           "mpi_enabled"]

Average, Sum, Adasum = "average", "sum", "adasum"
LOCKSTEP = ("bsp", "ring")


class JobEnded(SystemExit):
    """The job ended before the script's loop did (a stop, a time limit, a target reached, or
    its failure): raised by optimizer.step(); an uncaught one ends the script with `code`."""


class _World:
    def __init__(self):
        env = os.environ
        self.rank = int(env.get("ASHLAR_RANK", env.get("RANK", "0")))
        self.size = int(env.get("ASHLAR_SIZE", env.get("WORLD_SIZE", "1")))
        self.local_rank = int(env.get("ASHLAR_LOCAL_RANK", env.get("LOCAL_RANK", "0")))
        self.local_size = int(env.get("ASHLAR_LOCAL_SIZE", env.get("LOCAL_WORLD_SIZE", str(self.size))))
        self.policy = env.get("ASHLAR_POLICY", "bsp")
        if not (0 <= self.rank < self.size):
            raise Error(2, f"ashlar.torch.init: rank {self.rank} is not in [0, {self.size}) (ASHLAR_RANK, ASHLAR_SIZE)")
        path = env.get("ASHLAR_STORE_DIR")
        if self.size > 1 and not path:
            raise Error(2, f"ashlar.torch.init: {self.size} ranks but no store for their collectives: run the script "
                           "under `ashlar launch --python`, which sets ASHLAR_STORE_DIR")
        self.store = Store(path, self.rank, self.size)
        self.optimizer = None  # the DistributedOptimizer, once made (one per process)
        self.metrics = {}      # named metrics reported since the last step (they go with the next)
        self.reported = {}     # the last value of each metric this process reported


_world = None


def init(*args, **kwargs):
    """Reads this process's place in the job (rank, size, local rank, the policy) from what
    `ashlar launch --python` set (ASHLAR_RANK, ASHLAR_SIZE, ASHLAR_LOCAL_RANK,
    ASHLAR_LOCAL_SIZE, ASHLAR_POLICY; torchrun's RANK, WORLD_SIZE, LOCAL_RANK otherwise).
    The worker joins the job when DistributedOptimizer is made: the job's model is the
    script's, known then. Horovod's arguments (comm, process_sets) are accepted and unused."""
    global _world
    if _world is None:
        _world = _World()


def _w(what):
    if _world is None:
        raise ValueError(f"ashlar.torch.{what}: ashlar.torch.init() has not been called")
    return _world


def is_initialized():
    return _world is not None


def size():
    """The number of workers the job was launched with."""
    return _w("size").size


def rank():
    return _w("rank").rank


def local_rank():
    return _w("local_rank").local_rank


def local_size():
    return _w("local_size").local_size


def cross_rank():
    return 0


def cross_size():
    return 1


def policy():
    """The job's sync policy (bsp, asp, ..., ashl)."""
    return _w("policy").policy


def lockstep():
    """Whether the policy is lockstep (bsp, ring: mean gradients, one step everywhere)."""
    return policy() in LOCKSTEP


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def nccl_built():
    return False


def gloo_enabled():
    return False


# --- the script's metrics -----------------------------------------------------------

_METRIC_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def report(metrics=None, **values):
    """Hands named metrics of the script's own evaluation to the job:
    `hvd.report(val_ppl=141.2)` or `hvd.report({"val_loss": 4.95, "val_ppl": 141.2})`.
    They reach the job's progress lines, a line of their own, its report ("metrics",
    "final_metrics"), its metrics file (run.metrics), Prometheus (ashlar_script_metric)
    and its target: `run.target = "val_ppl <= 150"` stops the job at the first report
    that meets it (the scripts then end with JobEnded, exit code 0).

    Rank 0's reports are the job's, as Ray Train takes rank 0's: a script whose ranks each
    evaluate a part reduces them first (allreduce), and may call report on every rank.
    The metrics go with this worker's next step (or, at the script's end, with one more
    step that trains nothing). Names: 1 to 64 letters, digits, '_', '.', '-'; values: numbers
    or one-element tensors. In one process started by hand they are kept (reported())."""
    merged = dict(metrics or {})
    merged.update(values)
    clean = {}
    for name, v in merged.items():
        if not isinstance(name, str) or not (1 <= len(name) <= 64) or not set(name) <= _METRIC_CHARS:
            raise ValueError(f"ashlar.torch.report: metric name {name!r}: 1 to 64 letters, digits, '_', '.' or '-'")
        try:
            clean[name] = float(v.item() if hasattr(v, "item") else v)
        except (TypeError, ValueError):
            raise TypeError(f"ashlar.torch.report: metric '{name}' is {type(v).__name__}, not a number") from None
    if len(clean) > 64:
        raise ValueError("ashlar.torch.report: at most 64 metrics a report")
    w = _w("report")
    w.reported.update(clean)
    if w.rank == 0:
        w.metrics.update(clean)


def reported():
    """The last value of each metric this process reported."""
    return dict(_w("reported").reported)


def _take_metrics():
    if _world is None or not _world.metrics:
        return None
    m, _world.metrics = _world.metrics, {}
    return m


# --- collectives among the scripts ----------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Rank `root_rank`'s `obj` (any picklable object) on every rank."""
    return _w("broadcast_object").store.exchange(obj, "broadcast_object", root=root_rank)[root_rank]


def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj`, in rank order (ranks whose process has ended left out)."""
    got = _w("allgather_object").store.exchange(obj, "allgather_object")
    return [got[r] for r in sorted(got)]


def _cpu(t, copy=False):
    return t.detach().to("cpu", copy=copy)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """The mean (op=Average, the default) or sum (op=Sum) of `tensor` over the ranks, as a new
    tensor of its dtype and device. For metrics and small tensors: the training's
    gradients go through the shards."""
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise ValueError("ashlar.torch.allreduce: op=Adasum is not supported (Average or Sum)")
    got = _w("allreduce").store.exchange(_cpu(tensor) * prescale_factor, "allreduce")
    parts = [got[r] for r in sorted(got)]
    total = torch.stack([p.to(torch.float64) if p.is_floating_point() else p for p in parts]).sum(0)
    if op == Average:
        total = total / len(parts)
    return (total * postscale_factor).to(dtype=tensor.dtype, device=tensor.device)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, None, op, prescale_factor, postscale_factor))
    return tensor


def allgather(tensor, name=None, process_set=None):
    """The ranks' tensors concatenated along the first dimension (their first dimensions may
    differ), in rank order."""
    got = _w("allgather").store.exchange(_cpu(tensor), "allgather")
    return torch.cat([got[r] for r in sorted(got)]).to(tensor.device)


def broadcast(tensor, root_rank, name=None, process_set=None):
    return broadcast_object(_cpu(tensor), root_rank).to(dtype=tensor.dtype, device=tensor.device)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank))
    return tensor


def barrier(process_set=None):
    _w("barrier").store.exchange(None, "barrier")


def join(device=-1):
    """Waits until every rank has called join(); returns the last rank to join (here: the
    highest rank still present)."""
    got = _w("join").store.exchange(rank(), "join")
    return max(got)


def _named_tensors(params):
    if isinstance(params, dict):
        return list(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return items
    return [(str(i), p) for i, p in enumerate(items)]


def broadcast_parameters(params, root_rank=0, process_set=None):
    """Copies rank `root_rank`'s tensors into every rank's, in place: a model.state_dict()
    (parameters and buffers) or model.named_parameters(), as Horovod's."""
    named = _named_tensors(params)
    src = None
    if rank() == root_rank:
        src = {n: _cpu(t, copy=True) for n, t in named}  # (not views: the wait may move the model)
    src = broadcast_object(src, root_rank)
    with torch.no_grad():
        for n, t in named:
            if n not in src:
                raise ValueError(f"ashlar.torch.broadcast_parameters: rank {root_rank} has no tensor '{n}'")
            if tuple(src[n].shape) != tuple(t.shape):
                raise ValueError(f"ashlar.torch.broadcast_parameters: '{n}' is {tuple(t.shape)} here and "
                                 f"{tuple(src[n].shape)} on rank {root_rank}")
            t.copy_(src[n])
    opt = _w("broadcast_parameters").optimizer
    if opt is not None:
        opt._rebase()


def broadcast_optimizer_state(optimizer, root_rank=0, process_set=None):
    """Loads rank `root_rank`'s optimizer state (its state_dict: hyperparameters of every
    group and per-parameter state) into every rank's optimizer."""
    state = None
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        state = buf.getvalue()
    state = broadcast_object(state, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(state)))


# --- compression ----------------------------------------------------------------------

class _NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    """The gradient rounded to float16 (Horovod's fp16: what the peers receive is the
    float16 value)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    none = _NoneCompressor
    fp16 = _FP16Compressor


# --- the optimizer ----------------------------------------------------------------------

_loss_seen = {"loss": None, "n": None, "want_n": True}
_hooks_installed = False
_trained = set()        # ids of the parameters the DistributedOptimizer steps
_module_trains = {}     # id(module) -> whether its first parameter is one of them


def _trains(module):
    key = id(module)
    known = _module_trains.get(key)
    if known is None:
        first = next(module.parameters(), None)
        known = _module_trains[key] = first is not None and id(first) in _trained
    return known


def _install_hooks():
    # The loss the job's progress and planners follow is the one the script calls
    # backward() on (its last scalar), and a step's batch is the first dimension of the
    # first input a module holding the optimizer's parameters is called with, in training
    # mode and gradients on, after the last step (a model whose input is sequence-first
    # sets optimizer.batch_size).
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    original = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        if isinstance(tensors, torch.Tensor) and tensors.dim() == 0:
            _loss_seen["loss"] = tensors.detach()
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = backward

    def pre_hook(module, inputs):
        # (Evaluations, in eval mode or without gradients, are not a step's batch, nor are
        # modules that hold none of the optimizer's parameters: torchvision's transforms.)
        if _loss_seen["want_n"] and inputs and module.training and torch.is_grad_enabled() and _trains(module):
            first = inputs[0]
            if isinstance(first, torch.Tensor) and first.dim() > 0:
                _loss_seen["n"] = int(first.shape[0])
                _loss_seen["want_n"] = False

    torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor):
        super(self.__class__, self).__init__(params)
        if op == Adasum:
            raise ValueError("ashlar.torch.DistributedOptimizer: op=Adasum is not supported (Average)")
        self._compression = compression or Compression.none
        self.backward_passes_per_step = backward_passes_per_step
        self._params = [p for g in self.param_groups for p in g["params"]]
        names = {}
        if named_parameters is not None:
            for n, p in named_parameters:
                names[id(p)] = n
        self._names = [names.get(id(p), f"param.{i}") for i, p in enumerate(self._params)]
        self._sizes = [p.numel() for p in self._params]
        self._n = sum(self._sizes)
        _trained.update(id(p) for p in self._params)
        _module_trains.clear()
        self._synchronized = False
        self._should_sync = True
        self._step = None      # the Ashlar step this worker holds: what its next update goes with
        self._versions = []    # the parameters' in-place write counts when the step's were loaded
        self._ended = None     # JobEnded, once the job is over
        self._lockstep = lockstep()
        self.batch_size = None  # a step's batch, when the script says it (else seen from the model's input)
        self._timing = [0, 0.0]  # samples and wall seconds of this worker's steps since the last look (SpeedSampler)
        self._last_step_end = None
        _install_hooks()
        w = _w("DistributedOptimizer")
        if w.optimizer is not None:
            raise Error(2, "ashlar.torch.DistributedOptimizer: this process has one already (one worker per process)")
        w.optimizer = self
        # One process started by hand (no launcher, no cluster to join): the optimizer as it
        # is, as a Horovod script run without horovodrun.
        self._alone = w.size == 1 and not (os.environ.get("ASHLAR_JOIN_FILE") or os.environ.get("ASHLAR_JOIN"))
        if self._alone:
            return
        self._check_same_model()
        # Every worker starts from rank 0's parameters (as DDP and Horovod's
        # broadcast_parameters make it), kept for the local rule: the shards hold what is
        # added to them.
        broadcast_parameters([(n, p) for n, p in zip(self._names, self._params)], root_rank=0)
        self._w0 = None if self._lockstep else self._flat_params()  # (torch.cat: a copy already)
        self._join()
        import ashlar
        ashlar._before_leave.append(self._flush_metrics)
        self._next()  # the job's first step: training starts (the barrier)
        if not self._lockstep:
            w.store.idle = self._idle
            self._load_step_params()

    # -- joining the job -------------------------------------------------------------
    def _check_same_model(self):
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._names, self._params)]
        theirs = broadcast_object(mine, 0)
        if mine != theirs:
            for i, (a, b) in enumerate(zip(mine, theirs)):
                if a != b:
                    raise ValueError(f"ashlar.torch.DistributedOptimizer: rank {rank()}'s parameter {i} is {a[0]} "
                                     f"{a[1]} {a[2]}, rank 0's {b[0]} {b[1]} {b[2]}: every worker must train the same "
                                     "model")
            raise ValueError(f"ashlar.torch.DistributedOptimizer: rank {rank()} has {len(mine)} parameters, rank 0 "
                             f"{len(theirs)}: every worker must train the same model")
        for name, p in zip(self._names, self._params):
            if p.dtype != torch.float32:
                raise ValueError(f"ashlar.torch.DistributedOptimizer: parameter {name} "
                                 f"is {p.dtype}: Ashlar's shards hold float32 (keep the parameters float32; AMP's "
                                 "autocast computes in lower precision)")

    def _join(self):
        import ashlar
        w = _w("DistributedOptimizer")
        store = os.environ.get("ASHLAR_STORE_DIR")
        if w.rank == 0 and store and os.environ.get("ASHLAR_JOIN_FILE"):
            w.store.put("model", f"params {self._n}\n".encode())  # the launcher starts the job with it
        self._bridge = ashlar.init(_script_model=True)

    def _next(self):
        from .bridge import Closed
        import ashlar
        try:
            self._step = self._bridge.next_step(ashlar.is_running)
        except Closed:
            self._step = None
            code = ashlar._node["code"]
            self._ended = JobEnded(code or 0)
            if code:
                print(f"ashlar.torch: the job ended with exit code {code}" +
                      (f": {ashlar._messages()}" if ashlar._messages() else ""), flush=True)
            raise self._ended from None
        if self._step.params.size != self._n:
            err = ValueError(f"ashlar.torch.DistributedOptimizer: the job's model has {self._step.params.size} "
                             f"parameters and this script's {self._n}")
            self._step.fail(err)
            raise err
        _loss_seen["want_n"] = True

    # -- flat views --------------------------------------------------------------------
    def _flat_params(self):
        return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in self._params])

    # (Each writes parameter by parameter into Ashlar's buffer: no flat copy of the model
    # in between.)
    def _slices(self):
        o = 0
        for p, n in zip(self._params, self._sizes):
            yield p, o, n
            o += n

    @torch.no_grad()
    def _write_held_minus_grad(self, out):
        held = torch.from_numpy(self._step.params)
        for p, o, n in self._slices():
            if p.grad is None:
                out[o:o + n].copy_(held[o:o + n])
                continue
            g, ctx = self._compression.compress(p.grad.detach())
            g = self._compression.decompress(g, ctx).reshape(-1).to("cpu", torch.float32)
            torch.sub(held[o:o + n], g, out=out[o:o + n])

    @torch.no_grad()
    def _write_delta(self, out):
        x = torch.from_numpy(self._step.params)
        for p, o, n in self._slices():
            # x - (w - w0): from where this step began to where the script's optimizer took it
            torch.sub(p.detach().reshape(-1).to("cpu", torch.float32), self._w0[o:o + n], out=out[o:o + n])
            torch.sub(x[o:o + n], out[o:o + n], out=out[o:o + n])

    @torch.no_grad()
    def _scatter(self, flat, into_grad):
        o = 0
        for p, n in zip(self._params, self._sizes):
            part = flat[o:o + n].view_as(p)
            if into_grad:
                if p.grad is None:
                    p.grad = part.to(p.device).clone()
                else:
                    p.grad.copy_(part)
            else:
                p.copy_(part)
            o += n

    @torch.no_grad()
    def _rebase(self):
        # The script set its model between steps (load_state_dict of a checkpoint,
        # broadcast_parameters, an in-place edit): under the local rule the model is its base
        # plus what the shards hold, so the base moves to (the model as set) - (what this
        # step holds), and the next delta is the optimizer's step from there, not the jump to
        # the set values (which every worker would otherwise commit once more).
        if self._alone or self._lockstep or self._step is None or self._step.abandoned or self._w0 is None:
            return
        torch.sub(self._flat_params(), torch.from_numpy(self._step.params), out=self._w0)
        self._mark()

    def _mark(self):
        # (torch counts a tensor's in-place writes: a parameter whose count moved since the
        # step's parameters were loaded was set by the script)
        self._versions = [p._version for p in self._params]

    def _rebase_if_set(self):
        if any(p._version != v for p, v in zip(self._params, self._versions)):
            self._rebase()

    @torch.no_grad()
    def _load_step_params(self):
        # The model: its initial parameters plus what the shards (or this worker's local
        # steps) hold.
        x = torch.from_numpy(self._step.params)
        for p, o, n in self._slices():
            if p.device.type == "cpu" and p.is_contiguous():
                torch.add(self._w0[o:o + n], x[o:o + n], out=p.data.view(-1))
            else:
                p.copy_((self._w0[o:o + n] + x[o:o + n]).view_as(p))
        self._mark()

    def _finish(self, write):
        step = self._step
        if step.abandoned:  # shut down meanwhile: Ashlar no longer holds the buffers
            self._step = None
            return
        write(torch.from_numpy(step.grad))
        loss = _loss_seen["loss"]
        n = self.batch_size or _loss_seen["n"] or len(step.y)
        loss_sum = float(loss) * n if loss is not None else 0.0
        if not np.isfinite(loss_sum):
            loss_sum = 0.0 if loss is None else loss_sum
        step.finish(loss_sum, 0, n, _take_metrics())
        self._step = None
        now = time.monotonic()
        if self._last_step_end is not None:
            self._timing[0] += n
            self._timing[1] += now - self._last_step_end
        self._last_step_end = now

    def _idle(self):
        # A collective waits for the other scripts: the held step goes back empty (no
        # samples, a zero delta) and the model takes up what the shards hold now. Under
        # ssp's bound or ashl's commit gap the others would otherwise wait for this
        # worker's commits while it waits for them.
        step = self._step
        if step is None or step.abandoned or self._ended is not None:
            return
        self._rebase_if_set()  # (what the script set stays: the reload below adds to it)
        step.grad.fill(0)
        step.finish(0.0, 0, 0, _take_metrics())
        self._step = None
        self._next()
        self._load_step_params()
        self._last_step_end = None  # (the wait is no step of this worker's: its rate leaves it out)

    def _flush_metrics(self):
        # The script ends with metrics reported since its last step (its final
        # evaluation): the step it holds goes back with them, training nothing (no
        # samples; a zero delta, or under lockstep what the shards hold, after the end).
        step = self._step
        if _world is None or not _world.metrics or step is None or step.abandoned or self._ended is not None:
            return
        if self._lockstep:
            step.grad[:] = step.params
        else:
            step.grad.fill(0)
        step.finish(0.0, 0, 0, _take_metrics())
        self._step = None
        # Its next step comes once this one's push and report are done (at most 30 s: a
        # round whose peers neither step nor leave); the step waits until the bridge closes.
        import ashlar
        deadline = time.monotonic() + 30
        try:
            self._bridge.next_step(lambda: ashlar.is_running() and time.monotonic() < deadline)
        except Exception:
            return

    # -- Horovod's interface -------------------------------------------------------------
    def synchronize(self):
        """Lockstep policies: sends this worker's gradients and waits for the round's mean,
        which replaces every parameter's .grad (call it before clipping the gradient, then
        step inside skip_synchronize()). Local policies: nothing (each worker steps on its
        own gradient; the parameter deltas meet at step())."""
        if self._ended is not None:
            raise self._ended
        if self._alone or not self._lockstep or self._synchronized:
            if not (self._alone or self._lockstep or self._synchronized):
                # What the script set since the step began (a loaded checkpoint) is the
                # model from here; what it changes after this (a hand-written update) is
                # the step.
                self._rebase_if_set()
            self._synchronized = True
            return
        # What the shards average is (what they hold) - gradient, at a unit rate: what they
        # hold next is the mean gradient.
        self._finish(self._write_held_minus_grad)
        self._next()
        self._scatter(torch.from_numpy(self._step.params), into_grad=True)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not synchronize (synchronize() was called already)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._ended is not None:
            raise self._ended
        if self._alone:
            return super(self.__class__, self).step(closure)
        if self._step is None:
            raise Error(1, "ashlar.torch.DistributedOptimizer.step: the worker holds no step (its job has ended)")
        if self._should_sync and not self._synchronized:
            self.synchronize()
        result = super(self.__class__, self).step(closure)
        self._synchronized = False
        if not self._lockstep:
            # The delta the shards apply (x - lr * delta).
            self._finish(self._write_delta)
            self._next()
            self._load_step_params()
        return result

    def zero_grad(self, set_to_none=False):
        self._synchronized = False
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


class ManualOptimizer(torch.optim.Optimizer):
    """For a script that updates its parameters by hand (`p.data.add_(p.grad, alpha=-lr)`):
    an optimizer whose step() changes nothing. Wrapped, its updates meet as any
    optimizer's do when the hand-written update sits between synchronize() and step():

        opt = hvd.DistributedOptimizer(hvd.ManualOptimizer(model.parameters()))
        loss.backward()
        opt.synchronize()                  # lockstep: .grad is the round's mean gradient
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        opt.step()                         # local policies: the delta goes to the shards
    """

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        return closure() if closure is not None else None


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None):
    """Wraps a torch optimizer as Horovod's DistributedOptimizer does (an instance of a
    subclass of its class, with its param_groups and state): step() updates the model by
    the job's policy (see this module's text). Joins the job: returns once training has
    started. In one process started by hand (no `ashlar launch`, no ASHLAR_JOIN) it is the
    optimizer as it is. An nn.Module in place of an optimizer gives the older BatchLoop (the job's
    data and update)."""
    if isinstance(optimizer, torch.nn.Module):
        from .torch import BatchLoop
        return BatchLoop(optimizer)
    if _world is None:
        init()
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    dist = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor)
    if optimizer.state:
        dist.load_state_dict(optimizer.state_dict())
    return dist


def shutdown():
    """Leaves the job (the worker's node leaves the cluster)."""
    import ashlar
    return ashlar.shutdown()


# --- the script's data, in shares by speed ---------------------------------------------------

class SpeedSampler(torch.utils.data.Sampler):
    """Torch's DistributedSampler, with each worker's share of an epoch (and, as a
    batch_sampler, its batch) sized to its speed, for any map-style Dataset:

        sampler = hvd.SpeedSampler(train_set, batch_size=64)
        loader = DataLoader(train_set, batch_sampler=sampler, num_workers=2)
        for epoch in ...: sampler.set_epoch(epoch); for x, y in loader: ...

    Every epoch is one permutation of the set (seeded by `seed` and the epoch, the same on
    every rank, as DistributedSampler's) cut into one contiguous slice per worker, so each
    sample is trained once per epoch. At each epoch's start (its __iter__, a collective:
    every rank starts its epochs together) the ranks agree on the cut:

      lockstep policies (bsp, ring): each worker's batch is `batch_size` x workers x its
        share of the job's allocation (train.allocation: equal under plain bsp, by
        measured or predicted speed under proportional, adaptive, predicted), and its
        slice is as many of its batches as every worker takes: one round per step;
      the other policies: every batch is `batch_size` and each slice is proportional to
        the worker's measured rate over the last epoch (samples per second of wall time
        between its steps; equal in the first), so that the workers end their epochs
        about together.

    As `sampler=` (the DataLoader's own batch_size) the batches stay the DataLoader's: the
    slices follow the rates under local policies and are equal under lockstep ones."""

    def __init__(self, dataset, batch_size=None, shuffle=True, seed=0, drop_last=False):
        self.n = len(dataset)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._length = None  # this rank's count (samples, or batches as a batch_sampler) of the last plan
        if self.n < size():
            raise ValueError(f"ashlar.torch.SpeedSampler: {self.n} samples cannot be shared by {size()} workers")

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _weights(self, opt):
        if lockstep():
            if self.batch_size is None or opt is None or opt._step is None:
                return None  # equal
            return float(len(opt._step.y))  # this worker's allocation (its batch share)
        if opt is None:
            return None
        done, seconds = opt._timing
        opt._timing = [0, 0.0]
        rate = done / seconds if done > 0 and seconds > 0 else None
        return rate

    def _plan(self):
        w = _w("SpeedSampler")
        got = w.store.exchange(self._weights(w.optimizer), "SpeedSampler")  # the live ranks'
        if w.optimizer is not None:
            w.optimizer._last_step_end = None  # the wait for the others here is no step's
        ranks = sorted(got)
        weights = [got[r] for r in ranks]
        k = len(weights)
        me = ranks.index(w.rank)
        if any(x is None for x in weights):
            weights = [1.0] * k
        total = sum(weights)
        shares = [x / total for x in weights]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if lockstep() and self.batch_size is not None:
            batches = [max(1, round(self.batch_size * k * s)) for s in shares]
            steps = self.n // sum(batches) if self.drop_last else -(-self.n // sum(batches))
            if not self.drop_last:  # the last round's batches wrap around the epoch, as DistributedSampler pads
                order = (order * (1 + (steps * sum(batches)) // self.n))[:steps * sum(batches)]
            start = sum(b * steps for b in batches[:me])
            mine = order[start:start + batches[me] * steps]
            return [mine[i * batches[me]:(i + 1) * batches[me]] for i in range(steps)]
        if lockstep():
            shares = [1.0 / k] * k  # the DataLoader's batches: equal slices, equal steps
        cuts = [round(self.n * sum(shares[:i])) for i in range(k + 1)]
        mine = order[cuts[me]:cuts[me + 1]]
        if self.batch_size is None:
            return mine
        b = self.batch_size
        out = [mine[i:i + b] for i in range(0, len(mine), b)]
        if self.drop_last and out and len(out[-1]) < b:
            out.pop()
        return out

    def __iter__(self):
        # The plan is made at the first batch asked for, not when the iterator is: a
        # DataLoader with worker processes makes an iterator it never uses before its own.
        plan = self._plan()
        self._length = len(plan)
        yield from plan

    def __len__(self):
        if self._length is not None:
            return self._length
        share = self.n // size() if self.drop_last else -(-self.n // size())
        if self.batch_size is None:
            return share
        return share // self.batch_size if self.drop_last else -(-share // self.batch_size)


# --- elastic ----------------------------------------------------------------------------

class _Elastic:
    """Horovod's elastic API. Ashlar's membership is elastic by itself: a worker process
    that is lost leaves the job and the others go on (under local policies its share of
    the updates goes on with the others'; under lockstep ones the next round completes
    without it), and a worker that joins a running job starts from rank 0's parameters
    plus the shards' state. So `run` needs no reset: it calls the function once, and
    State.commit() keeps an in-memory copy that restore() puts back."""

    class State:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)
            self._saved = None

        def commit(self):
            self.save()

        def save(self):
            import copy
            self._saved = {k: copy.deepcopy(v.state_dict() if hasattr(v, "state_dict") else v)
                           for k, v in self.__dict__.items() if not k.startswith("_")}

        def restore(self):
            if self._saved is None:
                return
            for k, v in self._saved.items():
                cur = self.__dict__.get(k)
                if hasattr(cur, "load_state_dict"):
                    cur.load_state_dict(v)
                else:
                    self.__dict__[k] = v

        def sync(self):
            for k, v in list(self.__dict__.items()):
                if k.startswith("_"):
                    continue
                if isinstance(v, torch.nn.Module):
                    broadcast_parameters(v.state_dict(), 0)
                elif isinstance(v, torch.optim.Optimizer):
                    broadcast_optimizer_state(v, 0)
                else:
                    self.__dict__[k] = broadcast_object(v, 0)

        def register_reset_callbacks(self, callbacks):
            pass

    class TorchState(State):
        def __init__(self, model=None, optimizer=None, **kwargs):
            super().__init__(model=model, optimizer=optimizer, **kwargs)

    @staticmethod
    def run(func):
        def wrapper(state, *args, **kwargs):
            return func(state, *args, **kwargs)
        return wrapper


elastic = _Elastic()
