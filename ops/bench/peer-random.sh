#!/usr/bin/env bash
# Ashlar against PyTorch DDP and the stronger OmniLearn-controller peer on the random
# heterogeneity profiles of an `ashlar bench hetero --profiles random:N` run: for each of
# its profile-K directories, DDP (ops/bench/ddp_peer.py) and DDP with OmniLearn's batch
# controller (--controller omnilearn) run at the profile's speeds and contention, with the
# same cap and evaluation interval; the table puts their time to 85% beside Ashlar's best
# policy's on that profile (each Ashlar policy with its defaults).
#   [SEEDS=1] [CAP=12] [EVAL=0.25] bash ops/bench/peer-random.sh [ashlar-dir (default docs/bench/random)] [out-dir (default ASHLAR-DIR/peer)]
# With TABLE_ONLY=1 the peers are not run again: the table is made from OUT-DIR/peers.jsonl
# and the Ashlar side as it is now (after a rerun of the Ashlar side alone).
# Make the Ashlar side first (about 20 minutes), e.g.:
#   ./build/apps/ashlar bench hetero ops/configs/fmnist-mlp.toml --profiles random:8 --seed 1 --time-cap 12 \
#     --eval-interval 0.25 --policies bsp,ssp,ksync,kasync,adaptive,ring,asp,adsp,ashl --out docs/bench/random
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-docs/bench/random}"
out="${2:-$dir/peer}"
seeds="${SEEDS:-1}"
cap="${CAP:-12}"
eval="${EVAL:-0.25}"
[[ ${TABLE_ONLY:-0} == 1 ]] || /usr/bin/python3 -c "import torch" 2>/dev/null \
  || { echo "PyTorch missing: bash ops/install-deps.sh" >&2; exit 1; }
ls -d "$dir"/profile-* > /dev/null 2>&1 || { echo "no $dir/profile-K: run ashlar bench hetero --profiles random:N --out $dir first" >&2; exit 1; }
mkdir -p "$out"
if [[ ${TABLE_ONLY:-0} == 1 ]]; then
  [[ -s "$out/peers.jsonl" ]] || { echo "TABLE_ONLY=1: no $out/peers.jsonl to make the table from" >&2; exit 1; }
else
: > "$out/peers.jsonl"
for p in $(ls -d "$dir"/profile-* | sort -V); do
  k=${p##*-}
  speeds=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['speeds'])" "$p/bench.json")
  # The pacing and cap the Ashlar side trained under (bench hetero fits them to the machine).
  sample_ms=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('sample_ms', 0.5))" "$p/bench.json")
  pcap=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('time_cap', float(sys.argv[2])))" "$p/bench.json" "$cap")
  contention=()
  [[ -f "$p/contention.txt" ]] && contention=(--contention "$p/contention.txt")
  for controller in none omnilearn; do
    echo "== profile $k: speeds $speeds, $sample_ms ms per sample at speed 1, cap $pcap s, DDP controller $controller"
    # A peer run that fails or hangs (a gloo collective that never completes) is left out
    # of the table, named, after three times its cap and three minutes per seed (its cap
    # counts training time only: rank 0's evaluations and the start come on top).
    limit=$(/usr/bin/python3 -c "import sys; print(int((3 * float(sys.argv[1]) + 180) * int(sys.argv[2])))" "$pcap" "$seeds")
    # (--foreground: Ctrl-C reaches it; its ranks end with it, ddp_peer.die_with_parent.)
    { timeout --foreground -k 10 "$limit" /usr/bin/python3 ops/bench/ddp_peer.py --speeds "$speeds" \
        --sample-ms "$sample_ms" --time-cap "$pcap" --eval-interval "$eval" --seeds "$(seq -s, 1 "$seeds")" \
        --controller "$controller" "${contention[@]}" \
        || { rc=$?; [[ $rc == 124 || $rc == 137 ]] && why="timed out after $limit s" || why="failed (exit $rc)"
             echo "== profile $k: the $controller peer run $why; the seeds it did not finish are left out" >&2; }; } \
      | /usr/bin/python3 -c "import json, sys
for l in sys.stdin:
    if l.strip():
        try:
            d = json.loads(l)
        except ValueError:  # a run cut off mid-line
            continue
        d['profile'] = int(sys.argv[1]); d['speeds'] = sys.argv[2]; d['cap'] = float(sys.argv[3])
        d['sample_ms'] = float(sys.argv[4])
        print(json.dumps(d), flush=True)" "$k" "$speeds" "$pcap" "$sample_ms" \
      | tee -a "$out/peers.jsonl"
  done
done
fi
/usr/bin/python3 - "$dir" "$out" "$cap" <<'PY'
import csv, glob, json, os, statistics, sys
d, out, cap = sys.argv[1], sys.argv[2], float(sys.argv[3])
peers = [json.loads(l) for l in open(out + "/peers.jsonl") if l.strip()]
def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None
rows, r_ddp, r_omni, missing = [], [], [], []
for p in sorted(glob.glob(d + "/profile-*"), key=lambda s: int(s.rsplit("-", 1)[1])):
    k = int(p.rsplit("-", 1)[1])
    meta = json.load(open(p + "/bench.json"))
    speeds = meta["speeds"]
    pcap = float(meta.get("time_cap", cap))  # the profile's cap (fit to the machine with its pacing)
    def t(x):
        return x if x is not None else pcap  # a miss counts as the cap
    ash = {r["policy"]: t(float(r["time_to_target_s"]) if r["time_to_target_s"] else None)
           for r in csv.DictReader(open(p + "/results.csv"))}
    best = min(ash, key=ash.get)
    # The peers' runs must be of this profile and cap (TABLE_ONLY pairs runs made apart).
    for x in (x for x in peers if x["profile"] == k):
        n = len(str(speeds).split(","))
        if ("speeds" in x and x["speeds"] != str(speeds)) or len(x.get("final_batches", [0] * n)) != n \
                or ("cap" in x and abs(x["cap"] - pcap) > 1e-6 * pcap) \
                or ("sample_ms" in x and abs(x["sample_ms"] - float(meta.get("sample_ms", 0.5))) > 1e-6 * x["sample_ms"]):
            sys.exit(f"{out}/peers.jsonl: profile {k}'s peer run is not of speeds {speeds}, cap {pcap:g} and the "
                     f"pacing of its bench.json: {x}")
    ddp = med([t(x["t_target"]) for x in peers if x["profile"] == k and x["controller"] == "none"])
    omni = med([t(x["t_target"]) for x in peers if x["profile"] == k and x["controller"] == "omnilearn"])
    if ddp is None or omni is None:
        missing.append(k)
        continue
    r_ddp.append(ash[best] / ddp)
    r_omni.append(ash[best] / omni)
    rows.append(f"| {k} | {speeds} | {ddp:.2f} | {omni:.2f} | {best} {ash[best]:.2f} | ashl {ash.get('ashl', pcap):.2f} "
                f"| {r_ddp[-1]:.2f} | {r_omni[-1]:.2f} |")
lines = ["# Ashlar against DDP and the OmniLearn-controller peer on random heterogeneity profiles", "",
         f"Time to 85% (s; a miss counts as the profile's cap, its bench.json's time_cap). Ashlar: every policy with its defaults, from {d}/profile-K/results.csv; its best policy per "
         "profile. DDP and DDP with OmniLearn's controller: ops/bench/ddp_peer.py at the profile's speeds, pacing "
         "(profile-K/bench.json) and contention (lr 0.1, momentum 0.9, batch 64).", "",
         "| profile | speeds | DDP | OmniLearn | Ashlar best | Ashlar ashl | best / DDP | best / OmniLearn |",
         "|---|---|---|---|---|---|---|---|"] + rows
if r_ddp:
    lines += ["", f"Median best / DDP: {statistics.median(r_ddp):.2f} (goal <= 0.5); worst {max(r_ddp):.2f}.",
              f"Median best / OmniLearn: {statistics.median(r_omni):.2f} (goal <= 0.8); worst {max(r_omni):.2f}."]
if missing:
    lines += ["", "Left out (a peer run failed or timed out, see the script's output): profile "
              + ", ".join(str(k) for k in missing) + "."]
text = "\n".join(lines) + "\n"
open(out + "/results.md", "w").write(text)
print(text)
if missing:
    sys.exit(f"peer runs missing for profile {', '.join(str(k) for k in missing)}: the medians leave them out")
PY
