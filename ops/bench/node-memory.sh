#!/usr/bin/env bash
# Memory of worker-node processes on one host: a scheduler, `servers` server nodes and
# `nodes` worker nodes of `slots` slots each train the shipped MLP (BSP, 2 epochs of
# Fashion-MNIST) on this machine. Each worker node's RSS and PSS (its share of what it maps
# with others: the decoded data set's one copy per host, the libraries) are sampled
# twice a second while the job runs; the peak of each is printed per node, with the
# job's figures.
#   bash ops/bench/node-memory.sh [build-dir] [nodes] [slots] [servers]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
nodes="${2:-16}"
slots="${3:-32}"
servers="${4:-1}"
ashlar="$PWD/$build/apps/ashlar"
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ASHLAR_TOKEN="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export ASHLAR_TOKEN
"$ashlar" node --role scheduler --listen 127.0.0.1:0 --port-file "$work/port" ops/configs/fmnist-mlp.toml \
  --exit-after-job --workers $((nodes * slots)) --servers "$servers" --epochs 2 \
  --set run.progress_interval=0 > "$work/scheduler.log" 2>&1 &
sched=$!
pids+=("$sched")
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
[[ -s "$work/port" ]] || { echo "the scheduler did not start:" >&2; cat "$work/scheduler.log" >&2; exit 1; }
join="127.0.0.1:$(cat "$work/port")"
for k in $(seq "$servers"); do
  "$ashlar" node --role server --join "$join" > "$work/server$k.log" 2>&1 &
  pids+=("$!")
done
workers=()
for k in $(seq "$nodes"); do
  "$ashlar" node --role worker --slots "$slots" --name "w$k" --join "$join" > "$work/worker$k.log" 2>&1 &
  workers+=("$!")
  pids+=("$!")
done
declare -A rss pss
while kill -0 "$sched" 2>/dev/null; do
  for w in "${workers[@]}"; do
    read -r r p < <(awk '/^Rss:/{r=$2} /^Pss:/{p=$2} END{print r+0, p+0}' "/proc/$w/smaps_rollup" 2>/dev/null || echo "0 0")
    (( r > ${rss[$w]:-0} )) && rss[$w]=$r
    (( p > ${pss[$w]:-0} )) && pss[$w]=$p
  done
  sleep 0.5
done
echo "worker nodes: $nodes x $slots slots, $servers server node(s), BSP, MLP 784-256-128-10 ($(nproc) cores, $(date +%F))"
echo "node  peak RSS MB  peak PSS MB"
k=0; max_r=0; max_p=0
for w in "${workers[@]}"; do
  k=$((k + 1))
  printf "w%-4d %11d  %11d\n" "$k" $(( ${rss[$w]:-0} / 1024 )) $(( ${pss[$w]:-0} / 1024 ))
  (( ${rss[$w]:-0} > max_r )) && max_r=${rss[$w]}
  (( ${pss[$w]:-0} > max_p )) && max_p=${pss[$w]}
done
echo "largest peak: RSS $((max_r / 1024)) MB, PSS $((max_p / 1024)) MB per worker node"
grep -h "test accuracy.*samples" "$work/scheduler.log" | tail -1
