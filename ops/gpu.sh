#!/usr/bin/env bash
# GPU tests and the GPU benchmark on a machine with an NVIDIA GPU that has CUDA and
# PyTorch but none of Ashlar's Debian libraries.
#
#   bash ops/gpu.sh pack        here, after `bash ops/build.sh` with the CUDA toolkit:
#                               copies the binaries, their non-CUDA shared libraries and
#                               Fashion-MNIST into .device/ (in .gitignore)
#   bash ops/gpu.sh test [OUT]  there: the GPU tests alone (gpu_tests' log in OUT)
#   bash ops/gpu.sh job [OUT]   there: one GPU worker inside an ashl job against its rate
#                               alone, the model kept on the device or sent every step,
#                               on the wide MLP and the CNN (OUT/gpu-job.md; JOB_SECONDS
#                               per run, default 20)
#   bash ops/gpu.sh run [OUT]   there, from the repository root with .device/ beside it:
#                               the GPU tests, then ROUNDS (default 3) rounds of
#                               `ashlar bench gpu` and PyTorch on the same models (FP32
#                               and TF32); the table of medians in OUT/gpu-bench.md
#
# With this workplace's device tool: pack here, then run `bash ops/gpu.sh run $OUT`
# there with carry [".device"].
set -euo pipefail
cd "$(dirname "$0")/.."

# One GPU worker inside an ashl job of one worker and the config's shards (its progress
# lines' samples/s over the run's second half), with its model kept on the device under
# local steps (run.gpu_local_model, the default) or sent every step; at batch 256 and at
# the batch ashl's rules give it; against the same worker alone at that batch (ashlar
# bench gpu: training steps with parameters in and gradient out, and local steps with
# the model kept).
job_bench() {
  local bin=$1 out=$2 secs=${JOB_SECONDS:-20}
  rm -f "$out/job-bench.jsonl" "$out/job-runs.txt"
  local name args keep batch flag
  for name in mlp-4096 cnn; do
    if [[ $name == mlp-4096 ]]; then
      args="ops/configs/fmnist-mlp.toml --set model.hidden=4096,4096"
    else
      args="ops/configs/fmnist-cnn.toml"
    fi
    for batch in 256 rule; do
      flag=""
      [[ $batch == rule ]] || flag="--set train.batch_size=$batch"
      for keep in false true; do
        local log="$out/job-$name-$batch-$keep.log"
        echo "== $name in an ashl job, batch $batch, run.gpu_local_model=$keep"
        # shellcheck disable=SC2086
        # (2000 test samples: the evaluations of the wide model run on the CPU, and the
        # full test set's final one took 30 s.)
        "$bin/ashlar" train $args $flag --workers 1 --gpus 0 --policy ashl --set run.time_limit="$secs" \
          --set run.gpu_local_model=$keep --set data.test_limit=2000 --data-dir "$ASHLAR_DATA_DIR" > "$log" 2>&1 \
          || return 1
        grep -E "ASHL stage|local steps per commit|samples/s \(" "$log" | cut -c1-220
        echo "$name $batch $keep $log" >> "$out/job-runs.txt"
      done
    done
  done
  # The worker alone, at each batch the jobs ran.
  local batches
  batches=$(grep -ho "policy ashl, batch [0-9]* per worker" "$out"/job-*.log | awk '{print $4}' | sort -un)
  for batch in $batches; do
    "$bin/ashlar" bench gpu --hidden 4096,4096 --config ops/configs/fmnist-cnn.toml --batch "$batch" \
      --json "$out/job-bench.jsonl" || return 1
  done
  python3 - "$out" "$secs" > "$out/gpu-job.md" <<'PY'
import json, re, statistics, sys
out, secs = sys.argv[1], float(sys.argv[2])
alone = {}
for line in open(f"{out}/job-bench.jsonl"):
    r = json.loads(line)
    alone[("mlp-4096" if r["model"].startswith("784-") else "cnn", r["batch"])] = r
def job(path):
    rates, batch = [], None
    for line in open(path):
        m = re.search(r"policy ashl, batch (\d+) per worker", line)
        if m:
            batch = int(m.group(1))
        m = re.match(r"\[\s*([\d.]+)s\] epoch .*?(\d+) samples/s", line)
        if m and float(m.group(1)) >= secs / 2:
            rates.append(float(m.group(2)))
    return (statistics.median(rates) if rates else float("nan")), batch
runs = {}
for line in open(f"{out}/job-runs.txt"):
    name, b, keep, path = line.split()
    runs[(name, b, keep)] = job(path)
print(f"One GPU worker inside an ashl job of one worker and the config's shards, {secs:.0f} s a run: its progress "
      f"lines' samples/s over the second half (median); alone: ashlar bench gpu at the same batch.\n")
print("| model | batch | alone: steps (params in, gradient out) | alone: local steps, model kept | in the job: model "
      "sent every step | in the job: model kept | kept in the job / alone steps | / alone local steps |")
print("|---|---|---|---|---|---|---|---|")
for name in ("mlp-4096", "cnn"):
    for b in ("256", "rule"):
        sent, batch = runs[(name, b, "false")]
        kept, _ = runs[(name, b, "true")]
        a = alone.get((name, batch))
        if not a:
            continue
        label = f"{batch}" + (" (ashl's rule)" if b == "rule" else "")
        print(f"| {a['model'][:40]} | {label} | {a['samples_per_second']:.0f} | {a['kept_samples_per_second']:.0f} | "
              f"{sent:.0f} | {kept:.0f} | {kept / a['samples_per_second']:.2f} | "
              f"{kept / a['kept_samples_per_second']:.2f} |")
PY
  cat "$out/gpu-job.md"
}

mode=${1:-}
case "$mode" in
pack)
  build=${BUILD_DIR:-build}
  for f in "$build/apps/ashlar" "$build/tests/gpu_tests"; do
    [[ -x $f ]] || { echo "ops/gpu.sh: $f is missing: run bash ops/build.sh first" >&2; exit 1; }
  done
  # The CUDA backend is a module the programs open on first use (gpu/cuda_module.hpp).
  module="$build/gpu/libashlar_cuda.so"
  if [[ ! -f $module ]]; then
    echo "ops/gpu.sh: $module is missing: this build has no CUDA backend (no CUDA toolkit at configure time?)" >&2
    exit 1
  fi
  rm -rf .device
  mkdir -p .device/lib .device/data
  # The module beside the programs, where they look for it first.
  cp "$build/apps/ashlar" "$build/tests/gpu_tests" "$module" .device/
  strip .device/ashlar .device/gpu_tests
  strip --strip-unneeded .device/libashlar_cuda.so
  # Every shared library they load except the C library's own and CUDA's (the GPU
  # machine has its own CUDA, matching its driver).
  { ldd "$build/apps/ashlar"; ldd "$build/tests/gpu_tests"; ldd "$module"; } | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda*|libcublas*|libcudart*) ;;
    *) cp -L "$lib" .device/lib/ ;;
    esac
  done
  strip --strip-unneeded .device/lib/* 2>/dev/null || true
  # Compressed, to fit the device tool's 64 MiB with the data set beside it.
  tar cJf .device/bin.tar.xz -C .device ashlar gpu_tests libashlar_cuda.so lib
  rm -rf .device/ashlar .device/gpu_tests .device/libashlar_cuda.so .device/lib
  cp /usr/share/datasets/fashion-mnist/*.gz .device/data/
  du -sh .device
  echo "packed: now run 'bash ops/gpu.sh run OUT' on the GPU machine with .device/ carried"
  ;;
run|test|job)
  out=${2:-gpu-results}
  mkdir -p "$out"
  [[ -f .device/bin.tar.xz ]] || { echo "ops/gpu.sh: .device/ is missing: run 'bash ops/gpu.sh pack' first" >&2; exit 1; }
  bin=$(mktemp -d)
  tar xJf .device/bin.tar.xz -C "$bin"
  # CUDA's runtime and cuBLAS come from the GPU machine: its toolkit (lib64 or lib), or
  # else the CUDA wheels beside its PyTorch.
  cuda_libs=""
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    found=$(find "${CUDA_HOME:-/usr/local/cuda}/" /usr/local/cuda*/ /usr/lib /opt -name "$lib" 2>/dev/null | head -1 || true)
    [[ -n $found ]] || { echo "ops/gpu.sh: $lib not found on this machine (CUDA 13 toolkit or its wheels needed)" >&2; exit 1; }
    cuda_libs="$cuda_libs:$(dirname "$found")"
  done
  export LD_LIBRARY_PATH="$bin/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "libraries: $LD_LIBRARY_PATH"
  export ASHLAR_DATA_DIR="$PWD/.device/data" ASHLAR_TEST_BINARY="$bin/ashlar" ASHLAR_TEST_SOURCE="$PWD"
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt" \
    || echo "ops/gpu.sh: nvidia-smi found no GPU" | tee "$out/gpu.txt"
  status=0
  if [[ $mode == job ]]; then
    job_bench "$bin" "$out"
    exit $?
  fi
  echo "== GPU tests"
  (cd "$out" && "$bin/gpu_tests" --durations yes) 2>&1 | tee "$out/gpu-tests.log" || status=1
  [[ $mode == test ]] && exit $status
  rm -f "$out/bench.jsonl" "$out/bench.log"
  # Rounds of Ashlar then PyTorch, each precision in turn: the table gives medians over
  # rounds and each ratio's range (the machine's figures move by several percent).
  rounds=${ROUNDS:-3}
  for round in $(seq "$rounds"); do
    for precision in fp32 tf32; do
      flag=""
      [[ $precision == tf32 ]] && flag="--tf32"
      echo "== round $round: ashlar bench gpu ($precision)"
      "$bin/ashlar" bench gpu --hidden 256,128 --hidden 4096,4096 --config ops/configs/fmnist-cnn.toml --batch 256 \
        --json "$out/bench.jsonl" $flag \
        | tee -a "$out/bench.log" || status=1
      echo "== round $round: PyTorch on the same models ($precision)"
      python3 ops/bench/gpu_peer.py --hidden 256,128 --hidden 4096,4096 --config ops/configs/fmnist-cnn.toml \
        --batch 256 --json "$out/bench.jsonl" $flag \
        | tee -a "$out/bench.log" || status=1
    done
  done
  [[ -s $out/bench.jsonl ]] || { echo "ops/gpu.sh: no benchmark figures" >&2; exit 1; }
  python3 - "$out/bench.jsonl" "$(cat "$out/gpu.txt")" "$rounds" > "$out/gpu-bench.md" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# The k-th figure of a (system, mode, model, precision) is round k's.
series = defaultdict(list)
for r in rows:
    series[(r["system"], r.get("mode", ""), r["model"], r["tf32"])].append(r)
med = statistics.median
print(f"GPU: {sys.argv[2]}; batch 256; medians of {sys.argv[3]} rounds (Ashlar, then PyTorch, per precision).\n")
print("| model | precision | ashlar samples/s | pytorch same work | ratio (range) | pytorch device only | ratio | "
      "step ms | transfer floor ms | compute ms | GEMM TFLOP/s in compute | cuBLAS alone | fraction | model kept: local steps/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for (system, _, model, tf32), a in series.items():
    if system != "ashlar":
        continue
    kept = med(x.get("kept_samples_per_second", float("nan")) for x in a)
    same = series.get(("pytorch", "same_work", model, tf32), [])
    dev = series.get(("pytorch", "device_only", model, tf32), [])
    ratios = [x["samples_per_second"] / y["samples_per_second"] for x, y in zip(a, same)]
    rate = med(x["samples_per_second"] for x in a)
    same_rate = med(x["samples_per_second"] for x in same) if same else float("nan")
    dev_rate = med(x["samples_per_second"] for x in dev) if dev else float("nan")
    span = f" ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
    if "gemm_tflops" not in a[0]:  # a layered model: no transfer floor or GEMM columns
        print(f"| {model} | {'tf32' if tf32 else 'fp32'} | {rate:.0f} | {same_rate:.0f} | "
              f"{med(ratios) if ratios else float('nan'):.2f}{span} | {dev_rate:.0f} | {rate / dev_rate:.2f} | "
              f"{med(256 / x['samples_per_second'] * 1e3 for x in a):.3f} | - | - | - | - | - | {kept:.0f} |")
        continue
    gemm, alone = med(x["gemm_tflops"] for x in a), med(x["cublas_alone_tflops"] for x in a)
    print(f"| {model} | {'tf32' if tf32 else 'fp32'} | {rate:.0f} | {same_rate:.0f} | "
          f"{med(ratios) if ratios else float('nan'):.2f}{span} | {dev_rate:.0f} | {rate / dev_rate:.2f} | "
          f"{med(x['step_ms'] for x in a):.3f} | {med(x['floor_ms'] for x in a):.3f} | "
          f"{med(x['compute_ms'] for x in a):.3f} | {gemm:.2f} | {alone:.2f} | {gemm / alone:.2f} | {kept:.0f} |")
PY
  cat "$out/gpu-bench.md"
  job_bench "$bin" "$out" || status=1
  exit $status
  ;;
*)
  echo "usage: bash ops/gpu.sh pack | test [OUT] | job [OUT] | run [OUT]" >&2
  exit 2
  ;;
esac
