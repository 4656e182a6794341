"""Ashlar in a Python process: a training script becomes an Ashlar worker.

Ashlar's scheduler, server shards and sync policies (bsp, asp, ssp, ksync, kasync,
adaptive, adsp, ashl, ring) move the parameters; this process computes the gradients with
its own model (PyTorch, through ashlar.torch). Two ways to use it:

A Horovod script, its import line changed (its own model, data and optimizer):

    import ashlar.torch as hvd          # was: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters()), named_parameters=...)
    ...                                 # ashlar launch --workers N --python SCRIPT -- ARGS

A script that drives its own loop on the job's data and update (one worker per process):

    import ashlar, ashlar.torch
    ashlar.init(join="10.0.0.1:7000", token_file="cluster.token")   # or from ASHLAR_* variables
    opt = ashlar.torch.BatchLoop(model)
    for x, y in opt.batches():          # this worker's batches, its size from the scheduler
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()                      # the gradient goes to Ashlar's shards, as the policy says
    ashlar.shutdown()

A whole job in this process whose workers compute with the model:

    report = ashlar.train("ops/configs/fmnist-mlp.toml", backend=ashlar.torch.ModelBackend(model),
                          settings={"train.policy": "ashl", "train.workers": 3})

Any `ashlar` command runs in-process with ashlar.run(["status", "--join", ...]).
"""
import atexit
import json
import os
import tempfile
import sys
import threading
import time
import traceback

from . import _ashlar

__all__ = ["Error", "run", "train", "init", "shutdown", "is_running", "batch_size", "job_model", "device",
           "local_rank"]


class Error(RuntimeError):
    """An Ashlar command failed: `code` is its exit code (1 failure, 2 bad usage or config);
    the message says what, as the command's own error did on stderr."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def run(args, backend=None):
    """Runs `ashlar ARGS...` in this process and returns its exit code. Workers it starts
    here compute with `backend` (see ashlar.torch.ModelBackend), or with Ashlar's own
    (the CPU, GPUs) when None. Blocks until the command ends; a KeyboardInterrupt stops
    it as Ctrl-C stops `ashlar` (a job after its workers' current step)."""
    args = [str(a) for a in args]
    result = {}

    def target():
        try:
            result["code"] = _ashlar.run(args, backend)
        except BaseException as e:  # raised again in the caller's thread
            result["error"] = e

    t = threading.Thread(target=target, name="ashlar " + " ".join(args[:1]), daemon=True)
    _ashlar.reset_stop()  # before the thread: a KeyboardInterrupt from now on stops the command
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    except KeyboardInterrupt:
        _ashlar.request_stop()
        t.join()
    if "error" in result:
        raise result["error"]
    return result.get("code", 1)


def _messages():
    """The last command's own error lines ("ashlar train: invalid_config: ..."), joined."""
    return "; ".join(_ashlar.messages())


def _setting_args(settings):
    out = []
    for key, value in (settings or {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out += ["--set", f"{key}={value}"]
    return out


def train(config=None, backend=None, settings=None, args=()):
    """Trains a job in this process (`ashlar train CONFIG`) and returns its report (a dict:
    test_accuracy, history, per_worker, bytes, ...). `settings` are config keys
    ({"train.policy": "ashl", "train.epochs": 3}); `args` further command-line flags.
    Raises ashlar.Error when the job fails or the configuration is refused."""
    with tempfile.TemporaryDirectory(prefix="ashlar-") as tmp:
        report = os.path.join(tmp, "report.json")
        argv = ["train"] + ([str(config)] if config else []) + _setting_args(settings) + list(args)
        argv += ["--report", report]
        code = run(argv, backend)
        data = None
        if os.path.exists(report):
            with open(report) as f:
                data = json.load(f)
        if code != 0:
            why = (data or {}).get("error") or _messages() or "see the messages above"
            raise Error(code, f"ashlar train failed (exit code {code}): {why}")
        return data


# The worker node this process runs (init .. shutdown).
_node = {"thread": None, "code": None, "bridge": None}
_before_leave = []  # called by shutdown() while the worker still runs


def _join_from_launch(script_model):
    # `ashlar launch --python` starts the scripts before the scheduler: rank 0 says which
    # model the job trains (the job's own here, unless the script brings one), then every
    # script waits for the scheduler's address.
    path = os.environ.get("ASHLAR_JOIN_FILE")
    if not path:
        return None
    store = os.environ.get("ASHLAR_STORE_DIR")
    if store and not script_model and os.environ.get("ASHLAR_RANK", "0") == "0":
        from .store import Store
        Store(store, 0, 1).put("model", b"job\n")
    while True:
        try:
            with open(path) as f:
                address = f.read().strip()
            if address:
                return address
        except FileNotFoundError:
            pass
        time.sleep(0.05)


def init(join=None, token_file=None, name=None, tls=None, config=None, settings=None, args=(), _script_model=False):
    """Makes this process an Ashlar worker, in the background, and returns at once.

    join="HOST:PORT": joins the cluster whose scheduler listens there as a worker node
    (`ashlar node --role worker --join HOST:PORT`), with the cluster's token file (or
    `tls`, the directory `ashlar cert` wrote; or $ASHLAR_TOKEN, $ASHLAR_TLS_DIR as for
    `ashlar node`). Without `join`, the ASHLAR_JOIN, ASHLAR_TOKEN_FILE and ASHLAR_NAME
    variables are read (ashlar launch --python sets ASHLAR_JOIN_FILE instead: the file
    the scheduler's address is written to once it runs); without those either, `config` runs a local job in this process
    (`ashlar train CONFIG`) whose workers all take their steps from this script.

    The script then takes its steps through ashlar.torch.DistributedOptimizer."""
    from . import bridge as _bridge

    if _node["thread"] is not None and _node["thread"].is_alive():
        raise Error(2, "ashlar.init: this process already runs an Ashlar worker (ashlar.shutdown() first)")
    join = join or os.environ.get("ASHLAR_JOIN") or _join_from_launch(_script_model)
    token_file = token_file or os.environ.get("ASHLAR_TOKEN_FILE")
    name = name or os.environ.get("ASHLAR_NAME")
    if join:
        argv = ["node", "--role", "worker", "--join", join]
        if token_file:
            argv += ["--token-file", token_file]
        if tls:
            argv += ["--tls", tls]
        if name:
            argv += ["--name", name]
        argv += list(args)
    elif config:
        argv = ["train", str(config)] + _setting_args(settings) + list(args)
    else:
        raise Error(2, "ashlar.init: give join='HOST:PORT' (a cluster's scheduler) or config=FILE (a local job); "
                       "ASHLAR_JOIN is not set either")
    bridge = _bridge.Bridge()
    _node["bridge"] = bridge
    _node["code"] = None

    def target():
        try:
            _node["code"] = _ashlar.run([str(a) for a in argv], bridge)
        finally:
            bridge.close()

    t = threading.Thread(target=target, name="ashlar worker", daemon=True)
    _node["thread"] = t
    _ashlar.reset_stop()  # before the thread: a shutdown() from now on stops the worker
    _stop_on_sigterm(bridge)
    _fail_on_uncaught(bridge)
    t.start()
    return bridge


def _fail_on_uncaught(bridge):
    # A script that ends on an exception it did not catch fails its worker, naming the
    # exception, and so the job (the interpreter calls the hook before the exit handlers,
    # where the worker would otherwise leave as if the script had stopped on purpose).
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            from .bridge import ScriptFailed
            where = ""
            frames = traceback.extract_tb(tb)
            if frames:
                where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"
            bridge.close(ScriptFailed(f"the worker script raised {kind.__name__}: {value}{where}"))
        previous(kind, value, tb)

    sys.excepthook = hook


def _stop_on_sigterm(bridge):
    # SIGTERM (ashlar launch's polite stop, a scheduler's kill) ends the script's loop as
    # the job's end would: the worker leaves, the loop returns, the code after it runs.
    # Only the main thread may set a handler; a script that set its own keeps it.
    import signal
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return

    def on_sigterm(signum, frame):
        _ashlar.request_stop()
        bridge.close()

    signal.signal(signal.SIGTERM, on_sigterm)


def is_running():
    """Whether the worker ashlar.init started is still in the cluster (or its job runs)."""
    return _node["thread"] is not None and _node["thread"].is_alive()


def shutdown(timeout=60):
    """Leaves the cluster (a local job stops after its workers' current step: a script
    may leave its loop early and call this) and waits for the worker to end. Returns its
    exit code (0: it ended cleanly, a local job stopped by this call included)."""
    t = _node["thread"]
    if t is None:
        return 0
    stopped_here = False
    if t.is_alive():
        for hook in list(_before_leave):  # (ashlar.torch: metrics reported since the last step go first)
            try:
                hook()
            except Exception as e:  # the leave goes on whatever a hook does
                print(f"ashlar.shutdown: {e}", file=sys.stderr, flush=True)
        stopped_here = True
        _ashlar.request_stop()
        if _node["bridge"] is not None:
            _node["bridge"].close()
        t.join(timeout)
    if t.is_alive():
        return 1  # still leaving: a later init() is refused until it has
    _node["thread"] = None
    code = _node["code"] if _node["code"] is not None else 1
    # A local job stopped on request exits as `ashlar train` does on a signal (130 for
    # SIGINT, 143 for SIGTERM, which request_stop stands for); here the stop is what the
    # caller asked for.
    return 0 if stopped_here and code in (130, 143) else code


@atexit.register
def _leave_at_exit():
    # A script that ends without ashlar.shutdown() leaves the cluster before the
    # interpreter goes (Ashlar's threads still call into it until then).
    if is_running():
        bridge = _node["bridge"]
        if bridge is not None and bridge._error is not None:
            # The script raised: a worker's step fails with it first (it tells the
            # scheduler, which fails the job), then the node leaves.
            bridge.error_delivered.wait(10)
            time.sleep(0.5)
        shutdown(timeout=30)


def _bridge_or_fail(what):
    b = _node["bridge"]
    if b is None:
        raise Error(2, f"ashlar.{what}: call ashlar.init() first")
    return b


def batch_size():
    """The batch size of this worker's latest step: the share the scheduler allocates
    (train.allocation: equal, proportional to speed, adaptive, predicted). 0 before the
    first step."""
    return _bridge_or_fail("batch_size").batch_size


def job_model(timeout=None):
    """The model of the job this process works for, as its scheduler has it (the config's
    [model] with every --set applied): a dict with `input` [C, H, W], `classes` and
    `layers` (Ashlar's text form), which ashlar.ashlar_torch.build() turns into a
    torch.nn.Module of the same parameter layout. Waits until the scheduler has given this
    process its worker (the job started, or it was admitted to a running one); raises
    ashlar.Error if the worker ended first or `timeout` seconds passed."""
    b = _bridge_or_fail("job_model")
    model = b.wait_model(is_running, timeout)
    if model is None:
        code = _node["code"]
        why = f"the worker node ended (exit code {code})" if code is not None else \
            f"no worker within {timeout} s" if timeout is not None else "the worker ended"
        said = _messages() if code else ""
        raise Error(1, f"ashlar.job_model: {why} before the job's model came" + (f": {said}" if said else ""))
    from . import ashlar_torch
    return ashlar_torch.model_of(model)


def local_rank():
    """This worker process's index on its machine (ashlar launch --python sets
    ASHLAR_LOCAL_RANK, as torchrun sets LOCAL_RANK); 0 when started by hand."""
    return int(os.environ.get("ASHLAR_LOCAL_RANK", "0"))


def device():
    """The torch.device this worker computes on: "cuda" when PyTorch sees a GPU (ashlar
    launch leaves each worker process only its own in CUDA_VISIBLE_DEVICES, empty when it
    has none), else "cpu". Move the model there; ashlar.torch moves each batch to it."""
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
