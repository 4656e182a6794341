#!/usr/bin/env bash
# ASHL at batch 16 on the 4-worker profiles 1 and 2 of the CNN random table (seeds 1-3).
# Usage (from anywhere): run.sh [OUT_DIR]
cd "$(dirname "$0")/../../../.."
src=docs/bench/cnn-random/batch-rule
out=${1:-/tmp/b16}
mkdir -p $out
cp $src/profile-2/contention.txt $out/contention-2.txt
./build/apps/ashlar bench hetero ops/configs/fmnist-cnn.toml --speeds 2,4,1,1 --seed 1 --repeat 3 \
  --ideal-rate 1333 --time-cap 400 --eval-interval 5 --target 0.9 --stop-at-target --policies ashl \
  --policy-set ashl:train.batch_size=16 --out $out/profile-1
./build/apps/ashlar bench hetero ops/configs/fmnist-cnn.toml --speeds 5,6,1,1 --contention $out/contention-2.txt \
  --seed 1 --repeat 3 --ideal-rate 1333 --time-cap 400 --eval-interval 5 --target 0.9 --stop-at-target \
  --policies ashl --policy-set ashl:train.batch_size=16 --out $out/profile-2
echo done
