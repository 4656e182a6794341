#!/usr/bin/env bash
# Policies across a bandwidth-limited link: the scheduler and the server shards in one
# network namespace, the paced workers (speeds 1,1,2,4) in another, joined by a veth pair
# shaped with tc (token bucket, RATE). What compression is for: on loopback in one process
# top-k costs CPU and saves nothing; here every dense pull and push crosses the link.
# Needs root and iproute2. Prints time to the target test accuracy, samples/s and bytes per
# policy, each policy with its defaults (the policy rules).
#   bash ops/bench/hetero-link.sh [RATE (default 1gbit)] [policies (default bsp,asp,adsp,ashl)] [OUT.md]
# The table is also appended to OUT.md when given. SEEDS="1 2 3" runs each policy once per
# seed and prints each run and the median; LIMIT=60 caps each run at 60 s (default 20).
# CONFIG=ops/configs/fmnist-cnn.toml trains another recipe (default the MLP's), TARGET=0.9
# sets the accuracy (default 0.85), SAMPLE_MS=6 the pacing per sample at speed 1 (default
# the recipe's, 0.5 ms unless it says), EVAL=5 the seconds between evaluations (default 1).
# ASHL_SETTINGS="--set ashl.shl_local_steps=2 ..." adds settings to the ashl run.
# LEGACY=1 runs without the policy rules (train.policy_rules=false) and gives
# asp/ssp/kasync/adaptive lr 0.05 and momentum 0.5, adsp and ashl lr 0.3 and no momentum,
# as the tables of 2026-11-22 were run (before the policy rules).
set -euo pipefail
# CONFIG and OUT.md as given, from the caller's directory.
config=$(realpath -e "${CONFIG:-$(dirname "$0")/../configs/fmnist-mlp.toml}" 2>/dev/null) ||
  { echo "hetero-link: no config file ${CONFIG:-}" >&2; exit 1; }
[[ -z "${3:-}" || "$3" == /* ]] || set -- "$1" "$2" "$PWD/$3"
cd "$(dirname "$0")/../.."
rate="${1:-1gbit}"
policies="${2:-bsp,asp,adsp,ashl}"
out="${3:-/dev/null}"
seeds="${SEEDS:-1}"
limit="${LIMIT:-20}"
target="${TARGET:-0.85}"
eval_s="${EVAL:-1}"
exe=$PWD/build/apps/ashlar
pacing=()
[[ -n "${SAMPLE_MS:-}" ]] && pacing=(--set train.sample_ms="$SAMPLE_MS")
[[ -x "$exe" ]] || { echo "no $exe: build first (bash ops/build.sh)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "network namespaces need root" >&2; exit 1; }
id=$$
a="ashlar-la-$id"
b="ashlar-lb-$id"
va="asla$((id % 100000))"
vb="aslb$((id % 100000))"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$a"
ip link set "$vb" netns "$b"
ip -n "$a" addr add 10.231.8.1/24 dev "$va"
ip -n "$b" addr add 10.231.8.2/24 dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up
ip -n "$b" link set "$vb" up
# Both directions: pulls (shards -> workers) and pushes (workers -> shards).
ip netns exec "$a" tc qdisc add dev "$va" root tbf rate "$rate" burst 256kb latency 50ms
ip netns exec "$b" tc qdisc add dev "$vb" root tbf rate "$rate" burst 256kb latency 50ms

# Table lines go to the terminal and, indented (a code block in Markdown), to OUT.md.
row() { tee /dev/stderr | sed 's/^/    /' >> "$out"; }
printf "\nLink %s, %s, speeds 1,1,2,4%s, 1 shard, target %s, at most %s s per run, seeds %s, %s%s%s:\n\n" \
  "$rate" "$(basename "$config")" "${SAMPLE_MS:+ at $SAMPLE_MS ms per sample}" "$target" "$limit" "$seeds" \
  "$(date -u +%Y-%m-%d)" "${ASHL_SETTINGS:+; ashl with $ASHL_SETTINGS}" "${LEGACY:+; legacy per-policy settings}" \
  | tee -a "$out"
printf "%-10s %5s %10s %10s %12s %14s\n" policy seed "time (s)" accuracy "samples/s" "bytes" | row
for policy in ${policies//,/ }; do
  times=()
  for seed in $seeds; do
    extra=()
    if [[ -n "${LEGACY:-}" ]]; then
      extra=(--set train.policy_rules=false)
      case "$policy" in
        asp|ssp|kasync|adaptive) extra+=(--set train.lr=0.05 --set train.momentum=0.5) ;;
        adsp|ashl) extra+=(--set train.lr=0.3 --set train.momentum=0) ;;
      esac
    fi
    case "$policy" in
      ashl) extra+=(${ASHL_SETTINGS:-}) ;;
    esac
    rm -f "$dir/port" "$dir/r.json"
    # A private link between two namespaces: plain TCP with the token (--insecure), as the
    # peers' numbers are taken without encryption.
    export ASHLAR_TOKEN=${ASHLAR_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
    ip netns exec "$a" "$exe" node --role scheduler,server --listen 10.231.8.1:0 --port-file "$dir/port" --insecure \
      "$config" --exit-after-job --policy "$policy" --workers 4 --servers 1 \
      --set train.speeds=1,1,2,4 "${pacing[@]}" --set run.eval_interval="$eval_s" --set run.eval_every_epoch=false \
      --set run.target_accuracy="$target" \
      --set run.time_limit="$limit" --set run.progress_interval=0 --set train.seed="$seed" "${extra[@]}" \
      --report "$dir/r.json" \
      >"$dir/sched-$policy.log" 2>&1 &
    sched=$!
    pids+=("$sched")
    for _ in $(seq 1 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
    port=$(cat "$dir/port")
    ip netns exec "$b" "$exe" node --role worker --slots 4 --name workers --join "10.231.8.1:$port" \
      >"$dir/workers-$policy.log" 2>&1 &
    pids+=("$!")
    wait "$sched" || { echo "$policy: the job failed"; tail -5 "$dir/sched-$policy.log"; continue; }
    line=$(python3 - "$dir/r.json" "$policy" "$seed" "$target" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = next((h["seconds"] for h in r["history"] if h["test_accuracy"] >= float(sys.argv[4])), None)
print(f"{sys.argv[2]:<10} {sys.argv[3]:>5} {('%.1f' % t) if t else 'not reached':>10} "
      f"{r['test_accuracy']:>10.4f} {r['samples_per_second']:>12.0f} {r['bytes']:>14}")
PY
    )
    echo "$line" | row
    times+=("$(echo "$line" | awk '{print $3}')")
  done
  # Median over seeds; a run that did not reach the target counts as longer than the cap.
  printf "%s\n" "${times[@]}" | python3 -c "
import sys
ts = sorted(float(t) if t[0].isdigit() else float('inf') for t in sys.stdin.read().split())
m = ts[len(ts) // 2]
print(f'{sys.argv[1]:<10} {\"median\":>5} {(\"%.1f\" % m) if m != float(\"inf\") else \"> \" + sys.argv[2]:>10}')
" "$policy" "$limit" | row
done
