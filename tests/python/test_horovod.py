"""Horovod's contract on Ashlar's policies (`import ashlar.torch as hvd`): a script with its
own model, DataLoader, torch optimizer and loss runs under `ashlar launch --python SCRIPT
-- ARGS` with no config; its optimizer is what updates the model. Real processes on
loopback (a scheduler, a server, worker scripts), the trajectory checked against the same
script's semantics in one process.

Run from ctest (which sets ASHLAR_TEST_BIN, ASHLAR_TEST_SRC and PYTHONPATH to the build's package)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

BIN = os.environ["ASHLAR_TEST_BIN"]
SCRIPT = pathlib.Path(__file__).with_name("hvd_script.py")


def launch(tmp_path, policy, workers=2, script_args=(), extra=(), timeout=240):
    out = tmp_path / f"run-{policy}"
    cmd = [BIN, "launch", "--workers", str(workers), "--servers", "1", "--policy", policy,
           "--set", "run.log_level=warn", *extra, "--python", str(SCRIPT), "--", "--out", str(out), *script_args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    results = []
    for r in range(workers):
        f = pathlib.Path(f"{out}.{r}")
        results.append(torch.load(f) if f.exists() else None)
    return run, results


def script_data(samples=2048):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(samples, 1, generator=g)


def reference(epochs, batch, opt, lr, clip=0.0, step_lr=False, samples=2048):
    """The script's semantics in one process: the same data, model and sample order
    (DistributedSampler of one replica), a batch of every worker's batches together."""
    x, y = script_data(samples)
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 1))
    o = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if opt == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) if step_lr else None
    ds = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=1, rank=0, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for bx, by in loader:
            o.zero_grad()
            F.mse_loss(model(bx), by).backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            o.step()
        if sched is not None:
            sched.step()
    return [p.detach() for p in model.parameters()]


def assert_close_params(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, rtol=1e-4, atol=2e-5), f"{what}: parameter {i} differs by {(a - b).abs().max()}"


def test_under_bsp_the_scripts_sgd_steps_every_copy_on_the_mean_gradient_as_one_process_with_the_joint_batch(tmp_path):
    run, res = launch(tmp_path, "bsp", script_args=["--opt", "sgd", "--lr", "0.05", "--epochs", "2"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the scripts train their own model: 353 parameters" in run.stdout
    want = reference(2, 64, "sgd", 0.05)
    for r, got in enumerate(res):
        assert_close_params(got["params"], want, f"rank {r} against one process")
    assert all(torch.equal(a, b) for a, b in zip(res[0]["params"], res[1]["params"])), "the copies differ"
    assert res[0]["losses"][-1] < 0.2 * res[0]["initial_loss"]


def test_under_bsp_adamw_with_clipping_and_a_scheduler_matches_one_process(tmp_path):
    run, res = launch(tmp_path, "bsp", script_args=["--opt", "adamw", "--lr", "0.01", "--epochs", "2", "--clip",
                                                     "0.5", "--step-lr"])
    assert run.returncode == 0, run.stdout + run.stderr
    want = reference(2, 64, "adamw", 0.01, clip=0.5, step_lr=True)
    for r, got in enumerate(res):
        assert_close_params(got["params"], want, f"rank {r} against one process")
        assert got["lr_end"] == pytest.approx(0.0025), "the script's scheduler sets the rate"


def test_a_horovod_style_checkpoint_resumes_model_optimizer_and_scheduler_under_bsp_as_if_uninterrupted(tmp_path):
    args = ["--opt", "adamw", "--lr", "0.01", "--step-lr"]
    run, whole = launch(tmp_path, "bsp", script_args=args + ["--epochs", "2"])
    assert run.returncode == 0, run.stdout + run.stderr
    ck = tmp_path / "ck.pt"
    run, first = launch(tmp_path, "bsp", script_args=args + ["--epochs", "1", "--save", str(ck)])
    assert run.returncode == 0, run.stdout + run.stderr
    run, resumed = launch(tmp_path, "bsp", script_args=args + ["--epochs", "2", "--resume", str(ck)])
    assert run.returncode == 0, run.stdout + run.stderr
    for r, got in enumerate(resumed):
        assert got["initial_loss"] == pytest.approx(first[0]["losses"][-1], rel=1e-5), "it starts where it stopped"
        # (Adam's moments and step count and the scheduler's halved rate: without them
        # the second epoch's steps differ)
        assert_close_params(got["params"], whole[0]["params"], f"rank {r}, resumed, against the uninterrupted run")
        assert got["lr_end"] == pytest.approx(0.0025)


def test_under_a_local_policy_a_resumed_scripts_broadcast_moves_the_base_and_training_goes_on_from_the_checkpoint(
        tmp_path):
    args = ["--opt", "adamw", "--lr", "0.01"]
    ck = tmp_path / "ck.pt"
    run, first = launch(tmp_path, "asp", script_args=args + ["--epochs", "2", "--save", str(ck)])
    assert run.returncode == 0, run.stdout + run.stderr
    run, resumed = launch(tmp_path, "asp", script_args=args + ["--epochs", "3", "--resume", str(ck)])
    assert run.returncode == 0, run.stdout + run.stderr
    model = nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 1))
    model.load_state_dict(torch.load(ck)["model"])
    x, y = script_data()
    with torch.no_grad():
        stopped = F.mse_loss(model(x), y).item()
    for got in resumed:
        assert got["initial_loss"] == pytest.approx(stopped, rel=1e-5), "every rank starts from the checkpoint"
        # (were the jump to the loaded model committed as a delta, every worker would add it
        # once more: the model would land past it, at many times the loss)
        assert got["losses"][-1] < 1.5 * stopped, (stopped, got["losses"])


def test_the_ring_takes_the_same_steps_as_bsp(tmp_path):
    _, bsp = launch(tmp_path, "bsp", script_args=["--opt", "sgd", "--epochs", "1"])
    run, ring = launch(tmp_path, "ring", script_args=["--opt", "sgd", "--epochs", "1"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert_close_params(ring[0]["params"], bsp[0]["params"], "ring against bsp")


@pytest.mark.parametrize("policy", ["asp", "adsp", "ashl"])
def test_under_local_and_asynchronous_policies_the_scripts_adamw_trains_by_parameter_deltas(tmp_path, policy):
    run, res = launch(tmp_path, policy, script_args=["--opt", "adamw", "--lr", "0.01", "--epochs", "3"])
    assert run.returncode == 0, run.stdout + run.stderr
    for got in res:
        assert got["losses"][-1] < 0.2 * got["initial_loss"], (got["initial_loss"], got["losses"])
        assert got["policy"] == policy


@pytest.mark.parametrize("policy", ["bsp", "asp", "ashl"])
def test_an_sgd_with_lr_0_leaves_the_model_untrained(tmp_path, policy):
    run, res = launch(tmp_path, policy, script_args=["--opt", "sgd", "--lr", "0", "--epochs", "1"])
    assert run.returncode == 0, run.stdout + run.stderr
    for got in res:
        # (rank 0's initial parameters, which every rank starts from)
        assert_close_params(got["params"], res[0]["initial"], "lr 0")


@pytest.mark.parametrize("policy", ["bsp", "asp"])
def test_a_hand_written_update_between_synchronize_and_step_trains(tmp_path, policy):
    run, res = launch(tmp_path, policy, script_args=["--opt", "manual", "--lr", "0.05", "--epochs", "2"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert res[0]["losses"][-1] < 0.2 * res[0]["initial_loss"], (res[0]["initial_loss"], res[0]["losses"])
    if policy == "bsp":
        assert all(torch.equal(a, b) for a, b in zip(res[0]["params"], res[1]["params"]))


def test_the_collectives_give_every_rank_the_others_values(tmp_path):
    run, res = launch(tmp_path, "bsp", workers=3, script_args=["--epochs", "1"])
    assert run.returncode == 0, run.stdout + run.stderr
    for got in res:
        assert got["size"] == 3
        assert got["gathered"].flatten().tolist() == [0.0, 1.0, 2.0]
        assert got["summed"].item() == 6.0
        assert got["names"] == ["rank0", "rank1", "rank2"]
        assert got["losses"] == res[0]["losses"], "allreduce gives every rank the same mean"


@pytest.mark.parametrize("where", ["broadcast_parameters", "DistributedOptimizer"])
def test_a_worker_whose_model_differs_is_refused_naming_the_first_differing_parameter(tmp_path, where):
    args = ["--rank1-hidden", "8"] + (["--no-broadcast"] if where == "DistributedOptimizer" else [])
    run, res = launch(tmp_path, "bsp", script_args=args, timeout=120)
    said = run.stdout + run.stderr
    assert run.returncode != 0
    assert "exited with code 1 before the job started" in said
    if where == "broadcast_parameters":
        assert "broadcast_parameters: '0.weight' is (8, 20) here and (16, 20) on rank 0" in said
    else:
        assert "rank 1's parameter 0 is 0.weight (8, 20)" in said and "rank 0's 0.weight (16, 20)" in said


def test_fp16_compression_rounds_the_gradients_and_still_trains(tmp_path):
    run, res = launch(tmp_path, "bsp", script_args=["--fp16", "--epochs", "2"])
    assert run.returncode == 0, run.stdout + run.stderr
    want = reference(2, 64, "sgd", 0.05)
    assert res[0]["losses"][-1] < 0.2 * res[0]["initial_loss"]
    assert not all(torch.equal(a, b) for a, b in zip(res[0]["params"], want)), "float16 gradients are not exact"


def test_speed_shares_under_asp_cut_each_epoch_by_measured_rate_and_train_every_sample_once(tmp_path):
    run, res = launch(tmp_path, "asp", script_args=["--sampler", "speed", "--epochs", "3", "--samples", "4096"],
                      extra=["--set", "train.speeds=1,4", "--set", "train.sample_ms=1"])
    assert run.returncode == 0, run.stdout + run.stderr
    for epoch in range(3):
        both = res[0]["seen"][epoch][0] + res[1]["seen"][epoch][0]
        assert sorted(both) == list(range(4096)), f"epoch {epoch}: every sample once"
        assert set(res[0]["seen"][epoch][1][:-1]) == {32}, "local policies keep the batch"
    slow, fast = len(res[0]["seen"][0][0]), len(res[1]["seen"][0][0])
    assert slow == fast == 2048, "the first epoch is cut equally"
    # (which rank is the Ashlar worker paced at 4 is the order they joined in)
    slow, fast = sorted([len(res[0]["seen"][2][0]), len(res[1]["seen"][2][0])])
    assert 2.0 < fast / slow < 6.0, f"the 4x faster worker's share: {fast} against {slow}"


def test_speed_shares_under_bsp_follow_the_allocation_with_one_round_per_step(tmp_path):
    run, res = launch(tmp_path, "bsp", script_args=["--sampler", "speed", "--epochs", "3", "--samples", "4096"],
                      extra=["--set", "train.speeds=1,4", "--set", "train.sample_ms=2",
                             "--set", "train.allocation=proportional"])
    assert run.returncode == 0, run.stdout + run.stderr
    for epoch in range(3):
        a, b = res[0]["seen"][epoch], res[1]["seen"][epoch]
        assert len(a[1]) == len(b[1]), f"epoch {epoch}: the same number of steps on every worker"
        covered = set(a[0]) | set(b[0])
        assert covered == set(range(4096)), f"epoch {epoch}: every sample"
    slow, fast = sorted([res[0]["seen"][2][1][0], res[1]["seen"][2][1][0]])
    # (the pace is 4x; the rates the allocation follows also hold each step's host time,
    # which on a loaded machine weighs on the fast worker's most)
    assert fast > 1.3 * slow, f"the faster worker's batch: {fast} against {slow}"
    assert slow + fast == pytest.approx(64, abs=2), "the global batch stays workers x batch_size"
    assert all(torch.equal(x, y) for x, y in zip(res[0]["params"], res[1]["params"])), "one model"


def test_the_speed_sampler_as_sampler_keeps_the_dataloaders_batch_and_equal_slices_under_bsp(tmp_path):
    run, res = launch(tmp_path, "bsp", script_args=["--sampler", "speed-sampler", "--epochs", "2"])
    assert run.returncode == 0, run.stdout + run.stderr
    for epoch in range(2):
        both = res[0]["seen"][epoch][0] + res[1]["seen"][epoch][0]
        assert sorted(both) == list(range(2048))
        assert len(res[0]["seen"][epoch][1]) == len(res[1]["seen"][epoch][1]) == 32


def test_pip_installs_the_built_package_with_its_native_module(tmp_path):
    built = pathlib.Path(BIN).resolve().parent.parent / "python"
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--target", str(target), str(built)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert list((target / "ashlar").glob("_ashlar*.so")), "the native module is installed"
    check = subprocess.run([sys.executable, "-c", "import ashlar, ashlar.torch as hvd; hvd.init(); "
                            "print(ashlar.__file__, hvd.size(), hvd.rank())"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(target), "PATH": os.environ["PATH"]})
    assert check.returncode == 0, check.stderr
    path, size, rank = check.stdout.split()
    assert path.startswith(str(target)) and (size, rank) == ("1", "0")


@pytest.mark.parametrize("policy", ["ashl", "ssp"])
def test_a_worker_waiting_in_a_collective_does_not_hold_its_peers_under_a_drift_bound(tmp_path, policy):
    # Speed shares give the fast worker more steps an epoch; it waits for the others at the
    # epoch's end (the sampler's cut, the loss's allreduce) while ashl's commit gap or ssp's
    # staleness bound would hold them for its commits: its worker steps on, empty.
    run, res = launch(tmp_path, policy, script_args=["--sampler", "speed", "--epochs", "3", "--samples", "4096",
                                                      "--opt", "adamw", "--lr", "0.01"],
                      extra=["--set", "train.speeds=1,4", "--set", "train.sample_ms=1"], timeout=200)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "request_timeout" not in run.stdout + run.stderr
    for epoch in range(3):
        assert sorted(res[0]["seen"][epoch][0] + res[1]["seen"][epoch][0]) == list(range(4096))
    assert res[0]["losses"][-1] < 0.5 * res[0]["initial_loss"]


def test_a_job_that_ends_first_ends_the_scripts_at_their_next_step_with_the_report_saying_why(tmp_path):
    report = tmp_path / "r.json"
    run, res = launch(tmp_path, "asp", script_args=["--epochs", "100000"],
                      extra=["--set", "run.time_limit=3", "--report", str(report)], timeout=120)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "stopped at the time limit" in said
    rep = __import__("json").loads(report.read_text())
    assert rep["optimizer"] == "script" and rep["time_limited"] is True and rep["samples"] > 0
    assert rep["test_accuracy"] is None, "the job evaluates nothing of the scripts' model"
    assert all(r is None for r in res), "the scripts ended in their loop, before writing what they ended with"


def test_the_scripts_metrics_reach_the_report_the_metrics_file_and_the_progress_lines(tmp_path):
    report, metrics = tmp_path / "r.json", tmp_path / "m.jsonl"
    run, res = launch(tmp_path, "bsp", script_args=["--epochs", "3", "--report"],
                      extra=["--report", str(report), "--set", f"run.metrics={metrics}", "--set",
                             "run.log_level=info"])
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    rep = json.loads(report.read_text())
    losses = res[0]["losses"]
    got = [m["values"] for m in rep["metrics"]]
    # rank 0's reports, each once, in order; the last went with one more step at the end
    assert got == [{"val_mse": pytest.approx(v, rel=1e-6), "epoch": e + 1} for e, v in enumerate(losses)], said
    assert all(m["worker"] == rep["metrics"][0]["worker"] for m in rep["metrics"])
    assert [m["samples"] for m in rep["metrics"]] == sorted(m["samples"] for m in rep["metrics"])
    assert rep["final_metrics"] == {"val_mse": pytest.approx(losses[-1], rel=1e-6), "epoch": 3}
    assert rep["target"] is None and rep["target_reached"] is False
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    reported = [x["values"]["val_mse"] for x in lines if x.get("type") == "metrics"]
    assert reported == pytest.approx(losses, rel=1e-6)
    assert "metrics from worker" in said and "val_mse" in said


def test_run_target_on_a_scripts_metric_stops_the_job_at_the_first_report_that_meets_it(tmp_path):
    report = tmp_path / "r.json"
    run, res = launch(tmp_path, "asp", script_args=["--epochs", "100000", "--report", "--opt", "adamw", "--lr", "0.01"],
                      extra=["--set", "run.target=val_mse <= 0.3", "--set", "run.time_limit=100", "--report",
                             str(report)], timeout=180)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "stopped at the target" in said
    rep = json.loads(report.read_text())
    assert rep["target"] == "val_mse <= 0.3" and rep["target_reached"] is True and rep["time_limited"] is False
    values = [m["values"]["val_mse"] for m in rep["metrics"]]
    assert values and values[0] > 0.3, "the first epoch is not yet at the target"
    first = next(i for i, v in enumerate(values) if v <= 0.3)
    assert first >= len(values) - 2, f"the job trained on past the report that met its target: {values}"
    assert all(r is None for r in res), "the scripts ended in their loop (JobEnded), before writing their end"


def test_a_bad_target_or_metric_is_refused_naming_it(tmp_path):
    run, _ = launch(tmp_path, "bsp", script_args=["--epochs", "1"], extra=["--set", "run.target=val_mse == 1"],
                    timeout=60)
    assert run.returncode != 0
    assert "run.target" in run.stderr and "val_mse == 1" in run.stderr
    import ashlar.torch as hvd
    hvd.init()
    with pytest.raises(ValueError, match="metric name 'val ppl'"):
        hvd.report({"val ppl": 1.0})
    with pytest.raises(TypeError, match="metric 'ppl' is str"):
        hvd.report(ppl="high")
    hvd.report(ppl=torch.tensor(3.5))
    assert hvd.reported() == {"ppl": 3.5}


def test_a_worker_script_killed_mid_job_is_lost_and_the_others_train_on_while_one_that_raises_fails_the_job(tmp_path):
    out, report = tmp_path / "killed", tmp_path / "r.json"
    cmd = [BIN, "launch", "--workers", "3", "--servers", "1", "--policy", "bsp", "--report", str(report),
           "--python", str(SCRIPT), "--", "--out", str(out), "--samples", "30000", "--epochs", "3"]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    for line in run.stdout:  # rank 1's process is killed once rank 0 has trained an epoch
        said.append(line)
        if "[worker 0] epoch 0:" in line:
            pids = subprocess.run(["pgrep", "-P", str(run.pid), "-f", "hvd_script.py"], capture_output=True,
                                  text=True).stdout.split()
            victims = [p for p in pids if f"ASHLAR_RANK=1" in pathlib.Path(f"/proc/{p}/environ").read_text()
                       .replace("\0", " ")]
            assert len(victims) == 1, pids
            os.kill(int(victims[0]), 9)
    said = "".join(said)
    assert run.wait(timeout=240) == 0, said
    assert "[launch] worker 1 was lost (exited with killed by SIGKILL)" in said
    assert "stopping the job" not in said and "waiting up to" not in said, said
    rep = json.loads(report.read_text())
    assert rep["lost_workers"] == 1 and "error" not in rep
    for r in (0, 2):  # the others trained their epochs, their collectives not held by the lost one
        res = torch.load(f"{out}.{r}")
        assert len(res["losses"]) == 3 and res["losses"][-1] < 0.2 * res["initial_loss"]
    # A script that raises: every worker runs it, so the job fails, naming the worker and the error.
    run, _ = launch(tmp_path, "bsp", workers=3, script_args=["--fail-at", "1"])
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    # (The scheduler hears of it from the worker's bridge, or the launcher from its exit.)
    assert ("the job failed: worker 1's computation failed" in said
            or "ashlar launch: the job failed: worker 1 exited with code 1" in said), said
    assert "ValueError: rank 1 fails at epoch 1" in said
