#!/usr/bin/env bash
# Ashlar against its peer, PyTorch DistributedDataParallel (gloo, Debian's python3-torch):
# the same MLP on the same Fashion-MNIST data, 4 processes paced at speeds 1,1,2,4
# (0.5 ms per sample at speed 1), time to 85% test accuracy and samples/s, 3 seeds each,
# medians. Ashlar runs bsp (what DDP does), bsp with speed-proportional batches, asp,
# adsp and ashl, each with its defaults (the policy rules of runtime/config/policy_rules.hpp,
# no per-policy settings). Beside plain DDP runs the stronger peer: DDP with per-worker
# batches from OmniLearn's proportional controller and a batch-weighted average
# (ddp_peer.py --controller omnilearn). About 10 minutes.
#   [SEEDS=3] [POLICIES=bsp,bsp+proportional,asp,adsp,ashl] bash ops/bench/peer-ddp.sh [out-dir (default docs/bench/peer)]
# Another network: CONFIG=ops/configs/fmnist-cnn.toml TARGET=0.9 SAMPLE_MS=6 CAP=900 EVAL=5 (the
# pace must leave the fastest worker time for the real compute: with 4 workers sharing
# this machine's cores, about 1.5 ms per CNN sample). DDP trains the config's [model]
# (ops/ashlar_torch.py) at the config's learning rate.
# Single runs' times to 85% spread widely (DDP's from 7 to 11 s here): more seeds give
# steadier medians (an odd count gives an unambiguous one).
# Writes OUT/results.md (the table), OUT/ddp.jsonl and OUT/ashlar/ (bench hetero's files).
# Test accuracy is evaluated every EVAL seconds (default 0.25), which is also the
# resolution of every time to 85%. Each run trains at most CAP seconds (default 30); one
# that misses 85% counts as the slowest.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-docs/bench/peer}"
ashlar=build/apps/ashlar
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null \
  || { echo "PyTorch missing: bash ops/install-deps.sh --bench (Debian's python3-torch)" >&2; exit 1; }
mkdir -p "$out"
seeds="${SEEDS:-3}"
policies="${POLICIES:-bsp,bsp+proportional,asp,adsp,ashl}"
eval="${EVAL:-0.25}"
cap="${CAP:-30}"
config="${CONFIG:-ops/configs/fmnist-mlp.toml}"
target="${TARGET:-0.85}"
sample_ms="${SAMPLE_MS:-0.5}"
# Every policy with its defaults; DDP trains the config's [model] at the config's lr.
ddp_model=()
if [[ "$config" != ops/configs/fmnist-mlp.toml ]]; then
  lr=$(/usr/bin/python3 -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb')).get('train', {}).get('lr', 0.05))" "$config")
  ddp_model=(--config "$config" --lr "$lr")
fi
# Each Ashlar run ends at the target, as each DDP run does (--stop-at-target).
"$ashlar" bench hetero "$config" --speeds 1,1,2,4 --time-cap "$cap" --repeat "$seeds" --target "$target" \
  --sample-ms "$sample_ms" --policies "$policies" --eval-interval "$eval" --stop-at-target --out "$out/ashlar"
ops/plot "$out/ashlar/series.csv"
# DDP: the config's lr 0.1, momentum 0.9, weight decay 1e-4, batch 64 per process.
/usr/bin/python3 ops/bench/ddp_peer.py --speeds 1,1,2,4 --sample-ms "$sample_ms" --time-cap "$cap" --eval-interval "$eval" \
  --target "$target" "${ddp_model[@]}" --seeds "$(seq -s, 1 "$seeds")" | tee "$out/ddp.jsonl"
/usr/bin/python3 ops/bench/ddp_peer.py --speeds 1,1,2,4 --sample-ms "$sample_ms" --time-cap "$cap" --eval-interval "$eval" \
  --target "$target" "${ddp_model[@]}" --seeds "$(seq -s, 1 "$seeds")" --controller omnilearn | tee "$out/omnilearn.jsonl"
/usr/bin/python3 - "$out" "$eval" "$target" "$config" "$sample_ms" <<'PY'
import csv, json, statistics, sys
out = sys.argv[1]
pct = f"{float(sys.argv[3]) * 100:g}%"
config, sample_ms = sys.argv[4], sys.argv[5]
rows = list(csv.DictReader(open(out + "/ashlar/results.csv")))
ddp = [json.loads(l) for l in open(out + "/ddp.jsonl") if l.strip()]
times = sorted(d["t_target"] if d["t_target"] is not None else float("inf") for d in ddp)
ddp_t = times[len(times) // 2]
ddp_rate = statistics.median(d["samples_per_second"] for d in ddp)
lines = [f"| system | time to {pct} (s), median | range | samples/s | vs DDP |", "|---|---|---|---|---|"]
lines.append(f"| PyTorch DDP (gloo) | {ddp_t:.1f} | {times[0]:.1f}-{times[-1]:.1f} | {ddp_rate:.0f} | 1.00 |")
omni = [json.loads(l) for l in open(out + "/omnilearn.jsonl") if l.strip()]
otimes = sorted(d["t_target"] if d["t_target"] is not None else float("inf") for d in omni)
omni_t = otimes[len(otimes) // 2]
omni_rate = statistics.median(d["samples_per_second"] for d in omni)
lines.append(f"| PyTorch DDP + OmniLearn controller | {omni_t:.1f} | {otimes[0]:.1f}-{otimes[-1]:.1f} | {omni_rate:.0f} | "
             f"{omni_t / ddp_t:.2f} |")
best = None
for r in rows:
    t = float(r["time_to_target_s"]) if r["time_to_target_s"] else None
    if t is not None and (best is None or t < best[1]):
        best = (r["policy"], t)
    ratio = f"{t / ddp_t:.2f}" if t else "-"
    span = f"{float(r['time_min_s']):.1f}-{float(r['time_max_s']):.1f}" if r["time_min_s"] else "-"
    lines.append(f"| ashlar {r['policy']} | {t if t else 'not reached'} | {span} | "
                 f"{float(r['samples_per_second']):.0f} | {ratio} |")
bsp = next((float(r["time_to_target_s"]) for r in rows if r["policy"] == "bsp" and r["time_to_target_s"]), None)
lines += ["", f"Ashlar's best ({best[0]}) / DDP: {best[1] / ddp_t:.2f} (goal <= 0.5)" if best else f"Ashlar: no policy reached {pct}",
          f"Ashlar's best ({best[0]}) / DDP + OmniLearn: {best[1] / omni_t:.2f} (goal <= 0.8); its batches at the end: "
          f"{omni[0].get('final_batches')}" if best else "",
          f"Ashlar bsp / DDP: {bsp / ddp_t:.2f}" if bsp else ""]
text = "\n".join(lines) + "\n"
print(text)
with open(out + "/results.md", "w") as f:
    f.write("# Ashlar against PyTorch DDP\n\nSpeeds 1,1,2,4 paced (" + sample_ms + " ms per sample at speed 1), 4 processes, "
            + ("MLP 784-256-128-10" if config.endswith("fmnist-mlp.toml") else "the network of " + config) + ", batch 64 per worker ("
            + "every Ashlar policy with its defaults, the policy rules; the OmniLearn peer moves batches between "
              "workers, the global batch fixed), Fashion-MNIST; evaluations every " + sys.argv[2] + " s; "
            f"{len(ddp)} seeds each, medians.\n\n" + text)
PY
{
  echo
  echo "Reproduce (after \`bash ops/install-deps.sh --bench && bash ops/build.sh\`):"
  echo
  echo "    CONFIG=$config TARGET=$target SAMPLE_MS=$sample_ms SEEDS=$seeds CAP=$cap POLICIES=$policies bash ops/bench/peer-ddp.sh $out"
  echo
  echo "Measured on: $(nproc) cores, $(uname -sr), $(date -u +%Y-%m-%d)."
} >> "$out/results.md"
