"""The Python package: PyTorch models trained by Ashlar's workers, in a local job and as
worker processes of a cluster beside Ashlar's own workers. Real processes on loopback,
real Fashion-MNIST (a slice), real token handshakes.

Run from ctest (which sets ASHLAR_TEST_BIN, ASHLAR_TEST_SRC and PYTHONPATH to the build's package)."""
import json
import os
import pathlib
import secrets
import subprocess
import sys
import time

import pytest
import torch

import ashlar
import ashlar.torch as at
from ashlar import ashlar_torch

BIN = os.environ["ASHLAR_TEST_BIN"]
SRC = pathlib.Path(os.environ["ASHLAR_TEST_SRC"])
MLP = SRC / "ops/configs/fmnist-mlp.toml"
SLICE = {"data.train_limit": 6000, "data.test_limit": 2000, "run.log_level": "warn", "run.progress_interval": 0}


def mlp():
    return ashlar_torch.build(ashlar_torch.read_config(MLP))


def script_loop(opt, model, stop_after=None):
    """A training script's loop over a DistributedOptimizer; leaves it after `stop_after`
    steps when given. Returns the steps taken."""
    steps = 0
    for x, y in opt.batches():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if steps == stop_after:
            break
    return steps


class Counting(at.ModelBackend):
    def __init__(self, model):
        super().__init__(model)
        self.steps = 0

    def train_step(self, params, x, y, grad):
        self.steps += 1
        return super().train_step(params, x, y, grad)


def test_a_local_job_trains_a_pytorch_model_in_ashlars_workers_and_ashlar_evaluates_it():
    backend = Counting(mlp())
    rep = ashlar.train(MLP, backend=backend,
                       settings=dict(SLICE, **{"train.workers": 2, "train.policy": "asp", "train.epochs": 2}))
    # Ashlar's own CPU backend evaluates the parameters the PyTorch gradients trained: the
    # layouts agree or this accuracy would be chance.
    assert rep["test_accuracy"] >= 0.7
    assert backend.steps > 0
    # Every step the report counts went through the PyTorch backend; a worker the job's end
    # stopped while it computed drops that step's gradient (README: "Any stop ... drops the
    # gradient a worker is still computing"), so the backend may count one more per worker.
    trained = sum(w["steps"] for w in rep["per_worker"])
    assert trained <= backend.steps <= trained + len(rep["per_worker"])


def test_a_backend_that_raises_fails_the_job_naming_its_exception():
    class Broken(at.ModelBackend):
        def train_step(self, params, x, y, grad):
            raise ValueError("a bug in the user's step")

    with pytest.raises(ashlar.Error) as err:
        ashlar.train(MLP, backend=Broken(mlp()), settings=dict(SLICE, **{"train.workers": 1, "train.epochs": 1}))
    assert "a bug in the user's step" in str(err.value)
    assert "train_step" in str(err.value)


def test_a_model_of_another_size_is_refused_naming_both_parameter_counts():
    small = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    with pytest.raises(ashlar.Error) as err:
        ashlar.train(MLP, backend=at.ModelBackend(small), settings=dict(SLICE, **{"train.workers": 1, "train.epochs": 1}))
    assert "7850 parameters" in str(err.value)
    assert "235146" in str(err.value)


def test_a_backend_without_the_methods_is_refused_before_anything_runs():
    with pytest.raises(TypeError, match="no train_step"):
        ashlar.run(["version"], backend=object())


def test_a_bad_setting_is_refused_with_the_usage_exit_code_and_the_commands_message():
    with pytest.raises(ashlar.Error) as err:
        ashlar.train(MLP, backend=at.ModelBackend(mlp()), settings={"train.polcy": "ashl"})
    assert err.value.code == 2
    # The message the command wrote to stderr is the exception's too (a notebook shows no stderr).
    assert "unknown config key 'train.polcy'" in str(err.value), str(err.value)
    assert "train.policy" in str(err.value), str(err.value)


def test_job_model_is_the_jobs_model_with_its_overrides(tmp_path):
    ashlar.init(config=MLP, settings=dict(SLICE, **{"train.workers": 1, "train.epochs": 1, "model.hidden": "32"}))
    spec = ashlar.job_model(timeout=60)
    model = ashlar_torch.build(spec)
    assert sum(p.numel() for p in model.parameters()) == 784 * 32 + 32 + 32 * 10 + 10
    assert spec["input"] == [1, 28, 28] and spec["classes"] == 10
    script_loop(at.DistributedOptimizer(model), model)
    assert ashlar.shutdown() == 0


def test_job_model_raises_when_the_worker_ends_before_it_came():
    ashlar.init(join="127.0.0.1:1", args=["--connect-timeout", "1"])
    with pytest.raises(ashlar.Error, match="before the job's model came"):
        ashlar.job_model(timeout=60)
    ashlar.shutdown()


WORKER_SCRIPT = r"""
import json, sys
import torch.nn.functional as F
import ashlar, ashlar.torch as at
from ashlar import ashlar_torch

ashlar.init()  # ASHLAR_JOIN, ASHLAR_TOKEN_FILE, ASHLAR_NAME
model = ashlar_torch.build(ashlar_torch.read_config(sys.argv[1]))
opt = at.DistributedOptimizer(model)
steps, sizes = 0, set()
for x, y in opt.batches():
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    steps += 1
    sizes.add(ashlar.batch_size())
print(json.dumps({"steps": steps, "sizes": sorted(sizes), "code": ashlar.shutdown()}), flush=True)
"""


def start_scheduler(tmp, settings):
    token = tmp / "cluster.token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)  # a token file others may read is refused
    token.chmod(0o600)
    port_file, report = tmp / "port", tmp / "report.json"
    args = [BIN, "node", "--role", "scheduler,server", "--listen", "127.0.0.1:0", "--port-file", str(port_file),
            "--token-file", str(token), "--exit-after-job", str(MLP), "--report", str(report)]
    for k, v in settings.items():
        args += ["--set", f"{k}={v}"]
    sched = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while not port_file.exists():
        assert sched.poll() is None, sched.stdout.read()
        assert time.time() < deadline, "the scheduler wrote no port file"
        time.sleep(0.1)
    return sched, f"127.0.0.1:{port_file.read_text().strip()}", token, report


def python_worker(tmp, address, token, name):
    script = tmp / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = dict(os.environ, ASHLAR_JOIN=address, ASHLAR_TOKEN_FILE=str(token), ASHLAR_NAME=name)
    return subprocess.Popen([sys.executable, str(script), str(MLP)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError("no result line in:\n" + text)


def test_python_workers_and_an_ashlar_worker_train_one_ashl_job_in_a_cluster(tmp_path):
    sched, address, token, report = start_scheduler(
        tmp_path, dict(SLICE, **{"train.workers": 3, "train.policy": "ashl", "train.epochs": 6,
                                 "train.speeds": "1,1,2", "train.sample_ms": 0.2}))
    procs = [python_worker(tmp_path, address, token, f"py-{i}") for i in range(2)]
    native = subprocess.Popen([BIN, "node", "--role", "worker", "--join", address, "--token-file", str(token),
                               "--name", "native-0", "--rejoin-timeout", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = sched.communicate(timeout=240)
        assert sched.returncode == 0, out
        results = [last_json(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs + [native, sched]:
            if p.poll() is None:
                p.kill()
    rep = json.loads(report.read_text())
    assert rep["test_accuracy"] >= 0.7, rep
    assert len(rep["per_worker"]) == 3
    assert all(w["steps"] > 0 for w in rep["per_worker"])
    for r in results:
        assert r["steps"] > 0, results
        assert r["code"] == 0, results
    # ASHL's stages reached the Python workers as well: they took local steps (the report
    # counts every worker's stage changes).
    assert all(w["stage_changes"] >= 1 for w in rep["per_worker"]), rep["per_worker"]


ELASTIC_SCRIPT = r"""
import json, sys
import torch.nn.functional as F
import ashlar, ashlar.torch as at
from ashlar import ashlar_torch

ashlar.init()
model = ashlar_torch.build(ashlar_torch.read_config(sys.argv[1]))
opt = at.DistributedOptimizer(model)
steps = 0
try:
    for x, y in opt.batches():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if steps == 1:
            print("first step", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print(json.dumps({"steps": steps, "code": ashlar.shutdown()}), flush=True)
"""


class Lines:
    """A process's output lines as they come (a reader thread)."""

    def __init__(self, proc):
        import threading
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for line in self.lines):
                return
            assert self.proc.poll() is None or any(text in line for line in self.lines), "\n".join(self.lines)
            time.sleep(0.1)
        raise AssertionError(f"no '{text}' within {timeout} s:\n" + "\n".join(self.lines))

    def text(self):
        self.thread.join(30)
        return "\n".join(self.lines)


def test_a_script_started_mid_job_joins_it_and_one_interrupted_leaves_it_while_the_job_goes_on(tmp_path):
    sched, address, token, report = start_scheduler(
        tmp_path, dict(SLICE, **{"train.workers": 2, "train.policy": "asp", "train.epochs": 20,
                                 "train.speeds": "1,1", "train.sample_ms": 0.5}))
    script = tmp_path / "elastic.py"
    script.write_text(ELASTIC_SCRIPT)

    def start(name):
        env = dict(os.environ, ASHLAR_JOIN=address, ASHLAR_TOKEN_FILE=str(token), ASHLAR_NAME=name)
        return Lines(subprocess.Popen([sys.executable, str(script), str(MLP)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))

    first = [start("py-0"), start("py-1")]
    procs = [w.proc for w in first]
    sched_out = Lines(sched)
    try:
        for w in first:
            w.wait_for("first step", 60)
        late = start("py-late")
        procs.append(late.proc)
        late.wait_for("first step", 60)
        import signal
        first[1].proc.send_signal(signal.SIGINT)
        first[1].wait_for('"steps"', 60)
        sched.wait(timeout=240)
        assert sched.returncode == 0, sched_out.text()
        results = {name: last_json(w.text()) for name, w in (("py-0", first[0]), ("py-1", first[1]), ("late", late))}
    finally:
        for p in procs + [sched]:
            if p.poll() is None:
                p.kill()
    rep = json.loads(report.read_text())
    assert results["late"]["steps"] > 0, results
    assert results["py-1"]["steps"] > 0, results
    assert results["py-0"]["code"] == 0 and results["late"]["code"] == 0, results
    # Three workers trained in the one job; the one interrupted left it, the others went on
    # without a restart, and the job trained its epochs.
    assert len(rep["per_worker"]) == 3, rep["per_worker"]
    assert rep["epochs_trained"] >= 19.9, rep
    assert rep["test_accuracy"] >= 0.7, rep


def test_ashlar_launch_python_runs_the_script_as_every_worker_process_and_lets_it_finish(tmp_path):
    report = tmp_path / "report.json"
    out = subprocess.run([BIN, "launch", str(MLP), "--python", str(SRC / "apps/python/examples/fmnist_torch.py"),
                          "--set", "train.workers=2", "--set", "train.policy=adsp", "--set", "model.hidden=128",
                          "--set", "data.train_limit=6000",
                          "--set", "data.test_limit=2000", "--epochs", "3", "--report", str(report)],
                         cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0, out.stdout
    # Each script's loop ended with the job and it printed its last line on its own
    # (launch waits for a worker script before stopping it).
    assert out.stdout.count("the job is over (exit code 0)") == 2, out.stdout
    # Each process knows its local rank and device (no GPU here, or none given it: the CPU).
    for rank in (0, 1):
        assert f"worker-{rank}: local rank {rank}, computing on " in out.stdout, out.stdout
    if not torch.cuda.is_available():
        assert out.stdout.count("computing on cpu") == 2, out.stdout
    rep = json.loads(report.read_text())
    # It trained (chance is 0.1): 3 epochs of 6,000 samples under ADSP, whose commits
    # follow the processes' timing, end between 0.69 and 0.80 on this machine.
    assert rep["test_accuracy"] >= 0.6, rep
    assert len(rep["per_worker"]) == 2
    # The scripts built the job's model, --set included (ashlar.job_model()): a model of
    # the config file's size would have been refused naming both parameter counts.
    assert rep["model"] == "784-128-10", rep["model"]


def test_a_local_job_of_a_model_ashlar_does_not_describe_trains_and_evaluates_through_the_script(tmp_path):
    # An `external` model: the script's loop computes every step, the job's evaluations go
    # through the optimizer's own copy of the model.
    report = tmp_path / "report.json"
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    ashlar.init(config=MLP, settings=dict(SLICE, **{"train.workers": 1, "train.epochs": 2,
                                                    "model.layers": "external name=host params=7850"}),
                args=["--report", str(report)])
    steps = script_loop(at.DistributedOptimizer(model), model)
    assert ashlar.shutdown() == 0
    rep = json.loads(report.read_text())
    assert steps == sum(w["steps"] for w in rep["per_worker"]) and steps > 0
    assert rep["test_accuracy"] >= 0.7, rep


def test_a_shutdown_right_after_init_stops_the_worker():
    ashlar.init(config=MLP, settings=dict(SLICE, **{"train.workers": 1, "train.epochs": 50}))
    start = time.time()
    assert ashlar.shutdown(timeout=60) == 0  # stopped cleanly: no worker failed
    assert not ashlar.is_running()
    assert time.time() - start < 30


def test_a_local_job_whose_script_leaves_its_loop_early_stops_cleanly_with_its_report(tmp_path):
    # The script takes 30 steps of a long job, leaves its loop (holding no step, while
    # the other workers' steps wait for it) and shuts down: the job stops, evaluates and
    # writes its report; no worker fails.
    report = tmp_path / "report.json"
    model = mlp()
    ashlar.init(config=MLP, settings=dict(SLICE, **{"train.workers": 3, "train.epochs": 50, "train.policy": "asp"}),
                args=["--report", str(report)])
    assert script_loop(at.DistributedOptimizer(model), model, stop_after=30) == 30
    assert ashlar.shutdown(timeout=60) == 0
    rep = json.loads(report.read_text())
    assert "error" not in rep, rep
    assert rep["epochs_trained"] < 1, rep  # ended where the script left, not at its 50 epochs
    assert 30 <= sum(w["steps"] for w in rep["per_worker"]) < 50 * 6000 // 64
    assert rep["test_accuracy"] > 0.3, rep  # 30 steps trained a model, and it was evaluated


RAISING_SCRIPT = r"""
import sys
import torch.nn.functional as F
import ashlar, ashlar.torch as at
from ashlar import ashlar_torch

ashlar.init()
model = ashlar_torch.build(ashlar_torch.read_config(sys.argv[1] if len(sys.argv) > 1 else ashlar.config_path()))
opt = at.DistributedOptimizer(model)
for step, (x, y) in enumerate(opt.batches()):
    if step == 3 and ashlar.local_rank() == 1:
        raise ValueError("bad batch at step 3")
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
"""


def test_a_worker_script_that_raises_fails_the_launched_job_naming_the_exception(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(RAISING_SCRIPT.replace("sys.argv[1] if len(sys.argv) > 1 else ashlar.config_path()",
                                             repr(str(MLP))))
    report = tmp_path / "report.json"
    out = subprocess.run([BIN, "launch", str(MLP), "--python", str(script), "--set", "train.workers=2",
                          "--set", "data.train_limit=6000", "--set", "data.test_limit=2000", "--epochs", "1",
                          "--report", str(report)],
                         cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode != 0, out.stdout
    assert "ValueError: bad batch at step 3" in out.stdout, out.stdout
    assert "the job failed: worker" in out.stdout, out.stdout
    assert "(2 finished, 0 failed)" not in out.stdout, out.stdout
    rep = json.loads(report.read_text())
    assert "ValueError: bad batch at step 3" in rep.get("error", ""), rep
