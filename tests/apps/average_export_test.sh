#!/usr/bin/env bash
# The model a job reports is the model it exports: an adsp job (whose shards keep a
# running average of the parameters, the policy's rule) on Fashion-MNIST with checkpoints,
#   1. `checkpoint show` names the stored average,
#   2. `checkpoint export --out model.npz` writes the average (the "weights" field says so),
#      and PyTorch (ops/torch_eval.py) gets the job's reported test accuracy from it within
#      0.001 and its test loss within 1e-4 (relative), nearer than the parameters' loss is,
#   3. `--params` exports the parameters themselves: other arrays, "weights": "parameters".
# Exit 77 (skipped) without python3-torch.
# Usage: average_export_test.sh ASHLAR_BINARY SOURCE_DIR
set -euo pipefail
ashlar="$1"
src="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3
if ! $py -c "import torch" 2>/dev/null; then
  echo "SKIPPED: PyTorch is not installed (bash ops/install-deps.sh --bench)"
  exit 77
fi
"$ashlar" train "$src/ops/configs/fmnist-mlp.toml" --policy adsp --workers 2 --epochs 2 --gpus none \
  --set data.train_limit=20000 --set run.progress_interval=0 \
  --checkpoint-dir "$work/ck" --report "$work/report.json" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; exit 1; }
grep -q "policy adsp: train.average_epochs 0.0625" "$work/train.log" \
  || { echo "the adsp rule did not give the job a running average:"; cat "$work/train.log"; exit 1; }
"$ashlar" checkpoint show "$work/ck" > "$work/show.txt"
grep -q "running average: L2 norm" "$work/show.txt" || { echo "show names no average:"; cat "$work/show.txt"; exit 1; }
"$ashlar" checkpoint export "$work/ck" --out "$work/average.npz" > "$work/export.txt"
grep -q "exporting the running average" "$work/export.txt" || { cat "$work/export.txt"; exit 1; }
"$ashlar" checkpoint export "$work/ck" --out "$work/params.npz" --params > "$work/export-params.txt"
grep -q "exporting the parameters (--params)" "$work/export-params.txt" || { cat "$work/export-params.txt"; exit 1; }
out=$($py "$src/ops/torch_eval.py" "$work/average.npz")
out_params=$($py "$src/ops/torch_eval.py" "$work/params.npz")
echo "ashlar: $(grep -o 'test accuracy [0-9.]* (loss [0-9.]*)' "$work/train.log" | tail -1)"
echo "pytorch on the exported average: $out"
echo "pytorch on the exported parameters: $out_params"
$py - "$work/average.npz" "$work/params.npz" "$out" "$out_params" "$work/report.json" <<'PY'
import json, sys
import numpy as np
avg, par = np.load(sys.argv[1]), np.load(sys.argv[2])
meta = lambda z: json.loads(bytes(z["ashlar_model"]).decode())
assert meta(avg)["weights"] == "average", meta(avg)
assert meta(par)["weights"] == "parameters", meta(par)
keys = [k for k in avg.files if k != "ashlar_model"]
assert any(not np.array_equal(avg[k], par[k]) for k in keys), "the average and the parameters are the same arrays"
t, p, r = json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.load(open(sys.argv[5]))
assert abs(t["test_accuracy"] - r["test_accuracy"]) <= 0.001, \
    "PyTorch %.4f on the exported average against the job's %.4f" % (t["test_accuracy"], r["test_accuracy"])
# The test loss tells the two apart where the accuracy may not: the job's is the average's
# (float32 sums in another order: within 1e-4 of it), not the parameters'.
near = lambda x: abs(x - r["test_loss"]) <= 1e-4 * r["test_loss"]
assert near(t["test_loss"]), "PyTorch's loss %.6f on the average against the job's %.6f" % (t["test_loss"], r["test_loss"])
# The parameters' loss may by chance come within 1e-4 of the average's (a run whose last
# updates moved little): the job's loss is the average's, nearer it than the parameters' is.
assert abs(t["test_loss"] - r["test_loss"]) < abs(p["test_loss"] - r["test_loss"]), \
    "the parameters' loss %.7f is as near the job's %.7f as the average's %.7f" % (p["test_loss"], r["test_loss"], t["test_loss"])
print("ok: the export is the model the job reported")
PY
