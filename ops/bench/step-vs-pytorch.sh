#!/usr/bin/env bash
# Training step time per sample of Ashlar's CPU backend against PyTorch's, on the same
# model, batch size and one thread, measured back to back in one run. Prints a table and
# the ratio ashlar/pytorch (below 1: Ashlar is faster). The model: an MLP's hidden widths,
# or a config file whose [model] both build (ops/ashlar_torch.py on PyTorch's side).
#   bash ops/bench/step-vs-pytorch.sh [build-dir] [hidden widths | CONFIG.toml] [batch sizes...]
#   bash ops/bench/step-vs-pytorch.sh build ops/configs/fmnist-cnn.toml 64
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
hidden="${2:-256,128}"
shift 2 2>/dev/null || shift $#
batches=("$@")
[[ ${#batches[@]} -gt 0 ]] || batches=(32 64 128 256)
ashlar="$build/apps/ashlar"
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null \
  || { echo "PyTorch missing: bash ops/install-deps.sh --bench (Debian's python3-torch)" >&2; exit 1; }
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
printf "%-16s %6s %16s %16s %8s\n" model batch "ashlar us/sample" "torch us/sample" ratio
model_args=(--hidden "$hidden")
[[ "$hidden" == *.toml ]] && model_args=(--config "$hidden")
for b in "${batches[@]}"; do
  a=$("$ashlar" bench step --batch "$b" "${model_args[@]}" --threads 1 --json)
  t=$(OMP_NUM_THREADS=1 /usr/bin/python3 ops/bench/torch_step.py --batch "$b" "${model_args[@]}" --threads 1)
  au=$(echo "$a" | field us_per_sample)
  tu=$(echo "$t" | field us_per_sample)
  model=$(echo "$a" | field model)
  ratio=$(/usr/bin/python3 -c "print(f'{$au/$tu:.2f}')")
  printf "%-16s %6s %16.2f %16.2f %8s\n" "$model" "$b" "$au" "$tu" "$ratio"
done
echo "torch: $(echo "$t" | field framework)"
