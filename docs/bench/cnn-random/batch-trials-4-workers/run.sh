#!/usr/bin/env bash
# ASHL at batch 16 on profiles of the CNN random table (seed 1's profiles; runs at seeds 1-3).
# Usage (from anywhere): run.sh [OUT_DIR] [PROFILE ...]   (profiles 1-8; default: 1 2, the
# 4-worker ones; run-5-workers.log is `run.sh /tmp/b16-5 3 4`)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
src=docs/bench/cnn-random/batch-rule
out=${1:-/tmp/b16}
shift || true
profiles=("${@:-1 2}")
speeds=(2,4,1,1 5,6,1,1 3,1,1,1,6 5,1,2,5,8 8,5,1,7,2,7 1,4,2,1,2,1,1 6,7,8,5,1,2,8 5,6,6,4,6,1)
mkdir -p "$out"
for k in ${profiles[*]}; do
  contention=()
  if [[ -f $src/profile-$k/contention.txt ]]; then
    cp "$src/profile-$k/contention.txt" "$out/contention-$k.txt"
    contention=(--contention "$out/contention-$k.txt")
  fi
  ./build/apps/ashlar bench hetero ops/configs/fmnist-cnn.toml --speeds "${speeds[$((k - 1))]}" "${contention[@]}" \
    --seed 1 --repeat 3 --ideal-rate 1333 --time-cap 400 --eval-interval 5 --target 0.9 --stop-at-target \
    --policies ashl --policy-set ashl:train.batch_size=16 --out "$out/profile-$k"
done
echo done
