"""Faults of a Horovod script's worker under `ashlar launch --python` (label long: each waits
out a deadline). Real processes on loopback; run from ctest, which sets ASHLAR_TEST_BIN and
PYTHONPATH to the build's package."""
import json
import os
import pathlib
import subprocess
import time

import torch

BIN = os.environ["ASHLAR_TEST_BIN"]
SCRIPT = pathlib.Path(__file__).with_name("hvd_script.py")


def test_a_worker_hung_in_its_step_is_the_one_removed_by_its_deadline_and_the_other_trains_its_epochs(tmp_path):
    out, report = tmp_path / "hung", tmp_path / "r.json"
    cmd = [BIN, "launch", "--workers", "2", "--servers", "1", "--policy", "bsp", "--report", str(report),
           "--python", str(SCRIPT), "--", "--out", str(out), "--samples", "4096", "--epochs", "3", "--hang-at", "1",
           "--local-metrics"]
    began = time.time()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    took = time.time() - began
    said = run.stdout + run.stderr
    assert "rank 1 hangs in a step of epoch 1" in said, said
    assert run.returncode == 0, said
    # The hung worker is the one removed, within the deadline (60 s for steps this fast), and
    # the healthy one is never removed for waiting on it.
    assert "worker 1 stalled the job: the others waited" in said, said
    assert "worker 0 stalled" not in said and "worker 0 removed" not in said, said
    assert took < 200, said
    rep = json.loads(report.read_text())
    assert rep["lost_workers"] == 1 and "error" not in rep, rep
    res = torch.load(f"{out}.0")
    assert len(res["losses"]) == 3 and res["losses"][-1] < 0.2 * res["initial_loss"], res["losses"]
