#!/usr/bin/env bash
# Every sync policy on the same paced heterogeneous workers (default speeds 1,1,2,4):
# time to 85% test accuracy on Fashion-MNIST, throughput against the ideal, staleness,
# bytes. Writes DIR/results.md, results.csv, series.csv and accuracy.png.
#   bash ops/bench/hetero.sh [out-dir] [extra ashlar bench hetero flags...]
# Policies whose workers apply gradients one by one (asp, ssp, kasync, adsp) get a
# smaller learning rate and momentum than the round-based ones (bsp, ksync), which
# average several workers' gradients per step.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-docs/bench/hetero}"
shift || true
ashlar=build/apps/ashlar
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
async=()
for p in asp ssp kasync adsp adaptive; do
  async+=(--policy-set "$p:train.lr=0.05" --policy-set "$p:train.momentum=0.5")
done
"$ashlar" bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 \
  --policies bsp,bsp+proportional,bsp+predicted,ksync,adaptive,ssp,kasync,asp,adsp "${async[@]}" --out "$out" "$@"
{
  echo
  echo "Reproduce (after \`bash ops/install-deps.sh --bench && bash ops/build.sh\`):"
  echo
  echo "    bash ops/bench/hetero.sh $out $*"
  echo
  echo "Measured on: $(nproc) cores, $(uname -sr), $(date -u +%Y-%m-%d)."
} >> "$out/results.md"
