#!/usr/bin/env bash
# What checkpoints cost: the README's job (4 workers, 2 shards, BSP, 2 epochs of
# Fashion-MNIST, unpaced) without checkpoints and with a checkpoint every K = 100, 10 and
# 1 versions (RocksDB, synced writes, the newest 3 kept), each run REPEAT times (default 3).
# Prints samples/s (median) against no checkpoints, and the shards' write rate.
#   bash ops/bench/checkpoint.sh [REPEAT] [DIR for the stores (default: a temporary one)]
set -euo pipefail
cd "$(dirname "$0")/../.."
repeat="${1:-3}"
base="${2:-$(mktemp -d)}"
exe=build/apps/ashlar
[[ -x "$exe" ]] || { echo "no $exe: build first (bash ops/build.sh)" >&2; exit 1; }
echo "checkpoint cost: 4 workers, 2 shards (117573 floats, 0.94 MB a checkpoint each), bsp, 2 epochs, $repeat runs each; stores in $base ($(df -h --output=source "$base" | tail -1))"
printf "%-14s %12s %10s %14s %12s\n" setting "samples/s" "vs none" "checkpoints" "write MB/s"
none=""
for k in none 100 10 1; do
  rates=()
  mbs=()
  count=0
  for r in $(seq 1 "$repeat"); do
    dir="$base/k$k-$r"
    rm -rf "$dir"
    args=()
    [[ "$k" != none ]] && args=(--checkpoint-dir "$dir" --checkpoint-every "$k")
    out=$("$exe" train ops/configs/fmnist-mlp.toml --epochs 2 --set run.progress_interval=0 \
          --set run.eval_every_epoch=false "${args[@]}" 2>&1)
    rates+=("$(echo "$out" | sed -n 's/.*(\([0-9]*\) samples\/s).*/\1/p' | tail -1)")
    while read -r n mb s; do
      count=$((count + n)); mbs+=("$(awk -v a="$mb" -v b="$s" 'BEGIN { printf "%.0f", a / b }')")
    done < <(echo "$out" | sed -n 's/.*shard [0-9]*: \([0-9]*\) checkpoints ([0-9]* skipped[^)]*), \([0-9.]*\) MB written in \([0-9.]*\) s.*/\1 \2 \3/p')
  done
  median=$(printf "%s\n" "${rates[@]}" | sort -n | sed -n "$(( (repeat + 1) / 2 ))p")
  [[ -z "$none" ]] && none=$median
  mb="-"
  [[ ${#mbs[@]} -gt 0 ]] && mb=$(printf "%s\n" "${mbs[@]}" | sort -n | sed -n "$(( (${#mbs[@]} + 1) / 2 ))p")
  printf "%-14s %12s %10s %14s %12s\n" "K=$k" "$median" "$(awk -v a="$median" -v b="$none" 'BEGIN { printf "%.2f", a / b }')" \
    "$((count / repeat))" "$mb"
done
