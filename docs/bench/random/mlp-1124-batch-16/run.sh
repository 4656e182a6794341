#!/usr/bin/env bash
# The MLP at speeds 1,1,2,4: ashl (its rule: batch 32), bsp and adsp, then ashl at batch 16
# paced to the machine the first measured. Usage: run.sh [OUT_DIR]
cd "$(dirname "$0")/../../../.."
out=${1:-/tmp/mlp16}
./build/apps/ashlar bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 --time-cap 20 --repeat 7 \
  --eval-interval 0.25 --target 0.85 --stop-at-target --policies ashl,bsp,adsp --out $out/default
m=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("machine_capacity",""))' $out/default/bench.json)
./build/apps/ashlar bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 --time-cap 20 --repeat 7 \
  --eval-interval 0.25 --target 0.85 --stop-at-target --policies ashl --policy-set ashl:train.batch_size=16 \
  --machine-capacity "$m" --out $out/ashl-16
echo done
