#!/usr/bin/env bash
# Every sync policy on the same paced heterogeneous workers (default speeds 1,1,2,4):
# time to 85% test accuracy on Fashion-MNIST, throughput against the ideal, staleness,
# bytes. Writes DIR/results.md, results.csv, series.csv and accuracy.png.
#   [REPEAT=7] [EVAL=0.25] bash ops/bench/hetero.sh [out-dir] [extra ashlar bench hetero flags...]
# Each policy runs REPEAT times (seeds 1..REPEAT; the table gives medians); test accuracy
# is evaluated every EVAL seconds, the resolution of every time to target.
# Every policy runs with its defaults: the rules of runtime/config/policy_rules.hpp derive
# its lr, momentum, batch and commit scaling from the config's values (the table's last
# column gives what each trained with); no per-policy settings.
# A second run compares batch allocations under a periodic contention profile.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-docs/bench/hetero}"
shift || true
ashlar=build/apps/ashlar
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
repeat="${REPEAT:-7}"
eval="${EVAL:-0.25}"
"$ashlar" bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 --time-cap 20 --repeat "$repeat" \
  --eval-interval "$eval" --policies bsp,bsp+proportional,bsp+predicted,ring,ring+proportional,ksync,adaptive,ssp,kasync,asp,adsp,ashl \
  --out "$out" "$@"
# The contention run is paced as the first was: the machine the first measured (its
# bench.json), not measured again, so that both tables fit the same pacing.
same_machine=()
machine=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("machine_capacity", ""))' "$out/bench.json")
if [[ -n "$machine" && " $* " != *" --machine-capacity"* ]]; then
  same_machine=(--machine-capacity "$machine")
fi
"$ashlar" bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 --time-cap 20 --repeat "$repeat" \
  --eval-interval "$eval" --contention ops/configs/contention-periodic.txt \
  --policies bsp+proportional,bsp+adaptive,bsp+predicted,ring+proportional,ring+predicted \
  --out "$out/contention" "${same_machine[@]}" "$@"
ops/plot "$out/series.csv"
ops/plot "$out/contention/series.csv"
# The goals, from the tables: ASHL's time to the target against BSP's and ADSP's, the
# best ideal fraction, and predicted against proportional allocation under contention.
python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
def rows(path):
    with open(path) as f:
        return {r["policy"]: r for r in csv.DictReader(f)}
main, cont = rows(out + "/results.csv"), rows(out + "/contention/results.csv")
def t(r, p):
    v = r.get(p, {}).get("time_to_target_s", "")
    return float(v) if v else None
lines = ["", "## Goals", ""]
a, b, d = t(main, "ashl"), t(main, "bsp"), t(main, "adsp")
if a and b:
    lines.append(f"- ashl time to target / bsp: {a / b:.2f} (goal <= 0.5)")
if a and d:
    lines.append(f"- ashl time to target / adsp: {a / d:.2f} (goal <= 0.65)")
best = max(main.values(), key=lambda r: float(r["ideal_fraction"] or 0))
lines.append(f"- best ideal fraction: {float(best['ideal_fraction']):.3f} ({best['policy']}; goal >= 0.95)")
for alloc in ("bsp", "ring"):
    p, q = t(cont, alloc + "+predicted"), t(cont, alloc + "+proportional")
    if p and q:
        lines.append(f"- under contention, {alloc}+predicted / {alloc}+proportional time to target: {p / q:.2f} (goal < 1)")
text = "\n".join(lines) + "\n"
with open(out + "/results.md", "a") as f:
    f.write(text)
print(text)
PY
{
  echo
  echo "Reproduce (after \`bash ops/install-deps.sh --bench && bash ops/build.sh\`):"
  echo
  echo "    REPEAT=$repeat EVAL=$eval bash ops/bench/hetero.sh $out $*"
  echo
  echo "Measured on: $(nproc) cores, $(uname -sr), $(date -u +%Y-%m-%d)."
} >> "$out/results.md"
