#!/usr/bin/env bash
# The same PyTorch model through Ashlar's Python package against PyTorch DDP (gloo): 4
# processes paced at speeds 1,1,2,4 (0.5 ms per sample at speed 1), Fashion-MNIST, the
# config's [model] built by ops/ashlar_torch.py on both sides. Ashlar's workers are
# `ashlar launch --python apps/python/examples/fmnist_torch.py` processes (PyTorch computes
# every gradient, Ashlar moves them) under each policy in POLICIES with its defaults; DDP
# is ops/bench/ddp_peer.py. Then the overhead: equal speeds 1,1,1,1 under BSP, samples/s
# through Ashlar against DDP's. Time to TARGET and samples/s, SEEDS seeds each, medians.
#   [SEEDS=3] [POLICIES=bsp,ashl] [CAP=20] [EVAL=0.25] bash ops/bench/python-vs-ddp.sh [out-dir]
# Writes OUT/results.md, OUT/ashlar.jsonl, OUT/ddp.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-docs/bench/python}"
ashlar=build/apps/ashlar
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
[[ -f build/python/ashlar/__init__.py ]] || { echo "no Python package in build/python: install pybind11-dev and build again" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch missing: bash ops/install-deps.sh" >&2; exit 1; }
mkdir -p "$out"
seeds="${SEEDS:-3}"
policies="${POLICIES:-bsp,ashl}"
cap="${CAP:-20}"
eval="${EVAL:-0.25}"
config="${CONFIG:-ops/configs/fmnist-mlp.toml}"
target="${TARGET:-0.85}"
sample_ms="${SAMPLE_MS:-0.5}"
: > "$out/ashlar.jsonl"
: > "$out/ddp.jsonl"
run_ashlar() { # POLICY SPEEDS SEED
  local rep="$out/report-$1-$2-$3.json"
  "$ashlar" launch "$config" --python apps/python/examples/fmnist_torch.py --set train.workers=4 \
    --set train.speeds="$2" --set train.sample_ms="$sample_ms" --set train.policy="$1" --set train.seed="$3" \
    --set run.time_limit="$cap" --set run.eval_interval="$eval" --set run.eval_every_epoch=false \
    --set train.epochs=1000 --set run.progress_interval=0 --report "$rep" > "$out/launch.log" 2>&1 \
    || { echo "ashlar launch failed: $out/launch.log" >&2; tail -20 "$out/launch.log" >&2; exit 1; }
  /usr/bin/python3 - "$rep" "$1" "$2" "$3" "$target" >> "$out/ashlar.jsonl" <<'PY'
import json, sys
rep, policy, speeds, seed, target = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
t = next((h["seconds"] for h in rep["history"] if h["test_accuracy"] >= target), None)
print(json.dumps({"policy": policy, "speeds": speeds, "seed": seed, "t_target": t,
                  "samples_per_second": rep["samples_per_second"], "final_accuracy": rep["test_accuracy"]}))
PY
  rm -f "$rep"
}
ddp_model=(--config "$config")
for speeds in 1,1,2,4 1,1,1,1; do
  for p in $(echo "$policies" | tr ',' ' '); do
    [[ $speeds == 1,1,1,1 && $p != bsp ]] && continue
    for s in $(seq 1 "$seeds"); do
      echo "== ashlar --python $p at speeds $speeds, seed $s"
      run_ashlar "$p" "$speeds" "$s"
      tail -1 "$out/ashlar.jsonl"
    done
  done
  echo "== DDP at speeds $speeds"
  /usr/bin/python3 ops/bench/ddp_peer.py --speeds "$speeds" --sample-ms "$sample_ms" --time-cap "$cap" \
    --eval-interval "$eval" --target "$target" "${ddp_model[@]}" --seeds "$(seq -s, 1 "$seeds")" \
    | /usr/bin/python3 -c "import json,sys
for l in sys.stdin:
    if l.strip(): d = json.loads(l); d['speeds'] = sys.argv[1]; print(json.dumps(d), flush=True)" "$speeds" \
    | tee -a "$out/ddp.jsonl"
done
/usr/bin/python3 - "$out" "$target" "$sample_ms" "$config" "$seeds" <<'PY'
import json, statistics, sys
out, target, sample_ms, config, seeds = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ash = [json.loads(l) for l in open(out + "/ashlar.jsonl") if l.strip()]
ddp = [json.loads(l) for l in open(out + "/ddp.jsonl") if l.strip()]
def med_t(rows):
    ts = sorted(r["t_target"] if r["t_target"] is not None else float("inf") for r in rows)
    return ts[len(ts) // 2] if ts else None
def fmt(t):
    return "missed" if t is None or t == float("inf") else f"{t:.2f}"
pct = f"{target * 100:g}%"
lines = [f"# The same PyTorch model: through Ashlar's Python package against PyTorch DDP", "",
         f"{config}'s model built by ops/ashlar_torch.py on both sides; 4 processes paced at {sample_ms} ms per "
         f"sample at speed 1; Ashlar's workers are `ashlar launch --python apps/python/examples/fmnist_torch.py` "
         f"(PyTorch computes each gradient); each policy with its defaults; {seeds} seeds each, medians.", "",
         f"| speeds | system | time to {pct} (s) | samples/s | vs DDP (time) | vs DDP (samples/s) |", "|---|---|---|---|---|---|"]
for speeds in ("1,1,2,4", "1,1,1,1"):
    d = [r for r in ddp if r.get("speeds") == speeds]
    if not d:
        continue
    dt, dr = med_t(d), statistics.median(r["samples_per_second"] for r in d)
    lines.append(f"| {speeds} | PyTorch DDP (gloo) | {fmt(dt)} | {dr:.0f} | 1.00 | 1.00 |")
    for policy in sorted({r["policy"] for r in ash if r["speeds"] == speeds}):
        a = [r for r in ash if r["speeds"] == speeds and r["policy"] == policy]
        at, ar = med_t(a), statistics.median(r["samples_per_second"] for r in a)
        ratio = f"{at / dt:.2f}" if at not in (None, float("inf")) and dt not in (None, float("inf")) else "-"
        lines.append(f"| {speeds} | Ashlar {policy} (Python workers) | {fmt(at)} | {ar:.0f} | {ratio} | {ar / dr:.2f} |")
text = "\n".join(lines) + "\n"
open(out + "/results.md", "w").write(text)
print(text)
PY
{
  echo
  echo "Reproduce: \`SEEDS=$seeds POLICIES=$policies CAP=$cap EVAL=$eval bash ops/bench/python-vs-ddp.sh $out\`"
  echo
  echo "Measured on: $(nproc) cores, $(uname -sr), $(date -u +%Y-%m-%d)."
} >> "$out/results.md"
