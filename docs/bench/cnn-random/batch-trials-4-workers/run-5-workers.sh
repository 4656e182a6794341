#!/usr/bin/env bash
# ASHL at batch 16 on the 5-worker profiles 3 and 4 of the CNN random table (seeds 1-3).
# Usage (from anywhere): run.sh [OUT_DIR]
cd "$(dirname "$0")/../../../.."
src=docs/bench/cnn-random/batch-rule
out=${1:-/tmp/b16-5}
mkdir -p $out
cp $src/profile-4/contention.txt $out/contention-4.txt
./build/apps/ashlar bench hetero ops/configs/fmnist-cnn.toml --speeds 3,1,1,1,6 --seed 1 --repeat 3 \
  --ideal-rate 1333 --time-cap 400 --eval-interval 5 --target 0.9 --stop-at-target --policies ashl \
  --policy-set ashl:train.batch_size=16 --out $out/profile-3
./build/apps/ashlar bench hetero ops/configs/fmnist-cnn.toml --speeds 5,1,2,5,8 --contention $out/contention-4.txt \
  --seed 1 --repeat 3 --ideal-rate 1333 --time-cap 400 --eval-interval 5 --target 0.9 --stop-at-target \
  --policies ashl --policy-set ashl:train.batch_size=16 --out $out/profile-4
echo done
