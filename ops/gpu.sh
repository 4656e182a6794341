#!/usr/bin/env bash
# GPU tests and the GPU benchmark on a machine with an NVIDIA GPU that has CUDA and
# PyTorch but none of Ashlar's Debian libraries.
#
#   bash ops/gpu.sh pack        here, after `bash ops/build.sh` with the CUDA toolkit:
#                               copies the binaries, their non-CUDA shared libraries and
#                               Fashion-MNIST into .device/ (in .gitignore)
#   bash ops/gpu.sh run [OUT]   there, from the repository root with .device/ beside it:
#                               the GPU tests, `ashlar bench gpu` and PyTorch on the same
#                               models (FP32 and TF32), a table in OUT/gpu-bench.md
#
# With this workplace's device tool: pack here, then run `bash ops/gpu.sh run $OUT`
# there with carry [".device"].
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
pack)
  build=${BUILD_DIR:-build}
  for f in "$build/apps/ashlar" "$build/tests/gpu_tests"; do
    [[ -x $f ]] || { echo "ops/gpu.sh: $f is missing: run bash ops/build.sh first" >&2; exit 1; }
  done
  if ! ldd "$build/apps/ashlar" | grep libcublas > /dev/null; then
    echo "ops/gpu.sh: $build/apps/ashlar has no CUDA backend (no CUDA toolkit at configure time?)" >&2
    exit 1
  fi
  rm -rf .device
  mkdir -p .device/lib .device/data
  cp "$build/apps/ashlar" "$build/tests/gpu_tests" .device/
  strip .device/ashlar .device/gpu_tests
  # Every shared library they load except the C library's own and CUDA's (the GPU
  # machine has its own CUDA, matching its driver).
  { ldd "$build/apps/ashlar"; ldd "$build/tests/gpu_tests"; } | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda*|libcublas*|libcudart*) ;;
    *) cp -L "$lib" .device/lib/ ;;
    esac
  done
  strip --strip-unneeded .device/lib/* 2>/dev/null || true
  # Compressed, to fit the device tool's 64 MiB with the data set beside it.
  tar cJf .device/bin.tar.xz -C .device ashlar gpu_tests lib
  rm -rf .device/ashlar .device/gpu_tests .device/lib
  cp /usr/share/datasets/fashion-mnist/*.gz .device/data/
  du -sh .device
  echo "packed: now run 'bash ops/gpu.sh run OUT' on the GPU machine with .device/ carried"
  ;;
run)
  out=${2:-gpu-results}
  mkdir -p "$out"
  [[ -f .device/bin.tar.xz ]] || { echo "ops/gpu.sh: .device/ is missing: run 'bash ops/gpu.sh pack' first" >&2; exit 1; }
  bin=$(mktemp -d)
  tar xJf .device/bin.tar.xz -C "$bin"
  export LD_LIBRARY_PATH="$bin/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export ASHLAR_DATA_DIR="$PWD/.device/data" ASHLAR_TEST_BINARY="$bin/ashlar" ASHLAR_TEST_SOURCE="$PWD"
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt" \
    || echo "ops/gpu.sh: nvidia-smi found no GPU" | tee "$out/gpu.txt"
  status=0
  echo "== GPU tests"
  (cd "$out" && "$bin/gpu_tests" --durations yes) 2>&1 | tee "$out/gpu-tests.log" || status=1
  rm -f "$out/bench.jsonl"
  for precision in fp32 tf32; do
    flag=""
    [[ $precision == tf32 ]] && flag="--tf32"
    echo "== ashlar bench gpu ($precision)"
    "$bin/ashlar" bench gpu --hidden 256,128 --hidden 4096,4096 --batch 256 --json "$out/bench.jsonl" $flag \
      | tee "$out/bench-$precision.txt" || status=1
    echo "== PyTorch on the same models ($precision)"
    python3 ops/bench/gpu_peer.py --hidden 256,128 --hidden 4096,4096 --batch 256 --json "$out/bench.jsonl" $flag \
      | tee "$out/torch-$precision.txt" || status=1
  done
  [[ -s $out/bench.jsonl ]] || { echo "ops/gpu.sh: no benchmark figures" >&2; exit 1; }
  python3 - "$out/bench.jsonl" > "$out/gpu-bench.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | precision | ashlar samples/s | pytorch same work | ratio | pytorch device only | ratio | gemm TFLOP/s | cuBLAS alone | fraction |")
print("|---|---|---|---|---|---|---|---|---|---|")
for a in (r for r in rows if r["system"] == "ashlar"):
    def torch(mode):
        for r in rows:
            if r["system"] == "pytorch" and r["mode"] == mode and r["model"] == a["model"] and r["tf32"] == a["tf32"]:
                return r["samples_per_second"]
        return float("nan")
    same, dev = torch("same_work"), torch("device_only")
    print(f"| {a['model']} | {'tf32' if a['tf32'] else 'fp32'} | {a['samples_per_second']:.0f} | {same:.0f} | "
          f"{a['samples_per_second'] / same:.2f} | {dev:.0f} | {a['samples_per_second'] / dev:.2f} | "
          f"{a['gemm_tflops']:.2f} | {a['cublas_alone_tflops']:.2f} | {a['gemm_tflops'] / a['cublas_alone_tflops']:.2f} |")
PY
  cat "$out/gpu-bench.md"
  exit $status
  ;;
*)
  echo "usage: bash ops/gpu.sh pack | run [OUT]" >&2
  exit 2
  ;;
esac
