#!/usr/bin/env bash
# A user's own data and network, end to end through the real command:
#   1. NumPy arrays written by numpy.save (a slice of Fashion-MNIST as uint8, channels last),
#   2. a CNN given on the command line (conv2d, pooling, group norm, a residual add, dropout),
#      trained by 3 workers and 2 shards with augmentation and checkpoints,
#   3. `checkpoint export --out model.npz`: arrays by layer name with PyTorch's shapes,
#   4. with PyTorch installed (python3-torch), ops/torch_eval.py evaluates the export and
#      must get Ashlar's test accuracy within 0.001 (exit 77 = skipped without PyTorch).
#   5. a bad file is refused naming it.
# The run uses a cosine learning-rate schedule with warmup: every progress line's lr must
# be train.lr times the schedule's factor at that line's epoch.
# Usage: user_model_test.sh ASHLAR_BINARY SOURCE_DIR [torch]
set -euo pipefail
ashlar="$1"
src="$2"
mode="${3:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3
if [[ "$mode" == torch ]] && ! $py -c "import torch" 2>/dev/null; then
  echo "SKIPPED: PyTorch is not installed (bash ops/install-deps.sh --bench)"
  exit 77
fi
$py - "$work/data" <<'EOF'
import gzip, os, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out)
src = "/usr/share/datasets/fashion-mnist"
def idx(name):
    p = os.path.join(src, name)
    data = gzip.open(p + ".gz").read() if os.path.exists(p + ".gz") else open(p, "rb").read()
    return data
for split, prefix, n in (("train", "train", 3000), ("test", "t10k", 1000)):
    img = np.frombuffer(idx(prefix + "-images-idx3-ubyte"), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    lbl = np.frombuffer(idx(prefix + "-labels-idx1-ubyte"), np.uint8, offset=8)[:n].astype(np.int64)
    np.save(os.path.join(out, f"x_{split}.npy"), np.ascontiguousarray(img[:, :, :, None]))  # N, H, W, C
    np.save(os.path.join(out, f"y_{split}.npy"), lbl)
EOF
layers="conv2d name=c1 out=8 kernel=3 padding=1; relu name=r1; conv2d out=8 kernel=3 padding=1; groupnorm groups=2; add from=r1; relu; maxpool kernel=2; conv2d out=16 kernel=3 stride=2 padding=1; relu; flatten; dropout p=0.1; dense name=out out=10"
"$ashlar" train --workers 3 --servers 2 --epochs 4 --gpus none \
  --set data.source=npy --set data.dir="$work/data" --set model.input=1,28,28 \
  --set "model.layers=$layers" --set data.crop_padding=2 --set data.hflip=true \
  --set train.lr=0.05 --set train.lr_schedule=cosine --set train.warmup_epochs=0.5 \
  --set run.progress_interval=0.2 \
  --checkpoint-dir "$work/ck" --report "$work/report.json" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; exit 1; }
$py - "$work/train.log" <<'EOF'
import math, re, sys
lines = re.findall(r"epoch\s+([0-9.]+)/4 .* lr ([0-9.e-]+)", open(sys.argv[1]).read())
assert len(lines) >= 3, "too few progress lines: %r" % lines
def schedule(e):
    return 0.05 * 0.5 * (1 + math.cos(math.pi * min(e / 4, 1))) * (max(0.01, e / 0.5) if e < 0.5 else 1)
for epoch, lr in lines:
    # The line prints the epoch to 2 decimals: the lr may be the schedule's anywhere within.
    e, lr = float(epoch), float(lr)
    lo, hi = sorted((schedule(max(e - 0.005, 0)), schedule(e + 0.005)))
    assert lo * 0.99 - 2e-4 <= lr <= hi * 1.01 + 2e-4, "epoch %.2f: lr %g, the cosine schedule says %g-%g" % (e, lr, lo, hi)
print("lr schedule: %d progress lines follow cosine with warmup" % len(lines))
EOF
acc=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$work/report.json")
echo "ashlar: test accuracy $acc"
# (4 epochs of 3,000 samples: 0.635-0.69 over runs, the rounds' float sums land in arrival
# order; chance is 0.10, so 0.5 says it trained without failing on that spread.)
$py -c "import sys; a=float(sys.argv[1]); sys.exit(0 if a > 0.5 else 'accuracy %.3f: the CNN did not train' % a)" "$acc"
"$ashlar" checkpoint export "$work/ck" --out "$work/model.npz"
$py - "$work/model.npz" <<'EOF'
import json, sys
import numpy as np
z = np.load(sys.argv[1])
assert z["c1.weight"].shape == (8, 1, 3, 3), z["c1.weight"].shape
assert z["c1.bias"].shape == (8,)
assert z["groupnorm3.weight"].shape == (8,)
assert z["conv2d7.weight"].shape == (16, 8, 3, 3)
assert z["out.weight"].shape == (10, 16 * 7 * 7), z["out.weight"].shape
spec = json.loads(bytes(z["ashlar_model"]).decode())
assert spec["input"] == [1, 28, 28] and spec["classes"] == 10 and len(spec["layers"]) == 12, spec
total = sum(z[k].size for k in z.files if k != "ashlar_model")
assert total == spec["params"], (total, spec["params"])
print("export: by layer name, PyTorch shapes,", total, "parameters")
EOF
if [[ "$mode" == torch ]]; then
  out=$($py "$src/ops/torch_eval.py" "$work/model.npz" --npy "$work/data")
  echo "pytorch: $out"
  $py -c "
import json, sys
t = json.loads(sys.argv[1])['test_accuracy']; a = float(sys.argv[2])
sys.exit(0 if abs(t - a) <= 0.001 else 'PyTorch %.4f against Ashlar %.4f' % (t, a))" "$out" "$acc"
fi
# A label file whose count differs is refused, naming it.
$py -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros(7, np.int64))" "$work/data/y_test.npy"
if "$ashlar" train --workers 1 --servers 1 --epochs 1 --set data.source=npy --set data.dir="$work/data" \
    --set "model.layers=$layers" > "$work/bad.log" 2>&1; then
  echo "a label file with 7 labels for 1000 samples was accepted"; exit 1
fi
grep -q "$work/data/y_test.npy: 7 labels for the 1000 samples of $work/data/x_test.npy" "$work/bad.log" \
  || { echo "unexpected error:"; cat "$work/bad.log"; exit 1; }
echo "ok"
