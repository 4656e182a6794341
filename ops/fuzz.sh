#!/usr/bin/env bash
# libFuzzer over Ashlar's decoders: every Cap'n Proto message, the token gate and BASP
# frame guard, data-plane frames (plain and sealed, and through the shared-memory
# channel's pieces), checkpoint records, TOML configs,
# .npy and IDX files (harnesses in tests/fuzz). Builds build-fuzz with clang-14 (ASan,
# UBSan), replays every kept input in tests/fuzz/regressions (crashes once fixed, and seeds:
# a well-formed frame of a kind worth starting from), then fuzzes each harness, its corpus
# starting from those inputs.
#   bash ops/fuzz.sh            # 10 s per harness (what CI runs)
#   bash ops/fuzz.sh 600        # a machine with time: 10 minutes per harness
# Prints executions per harness; exits 1 on any crash (kept in build-fuzz/crashes: add it
# to tests/fuzz/regressions as HARNESS-what once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
command -v clang++-14 >/dev/null || { echo "SKIPPED: clang-14 missing (apt-get install clang-14 libfuzzer-14-dev)"; exit 77; }
build=build-fuzz
if [[ ! -f "$build/build.ninja" ]]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -G Ninja -DASHLAR_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DASHLAR_ENABLE_CUDA=OFF >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" >"$build/build.log" 2>&1 || { echo "the fuzz build failed:"; grep -E "error|undefined" "$build/build.log" | head -20; exit 1; }
mkdir -p "$build/crashes"
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
printf '%-8s %12s %8s %s\n' harness executions exec/s result
for h in wire gate frames files shm; do
  exe="$build/tests/fuzz/fuzz_$h"
  corpus="$build/corpus/$h"
  mkdir -p "$corpus"
  # Every kept input first: it must run clean now.
  for r in tests/fuzz/regressions/"$h"-*; do
    [[ -e "$r" ]] || continue
    cp -n "$r" "$corpus/"
    if ! "$exe" "$r" >"$build/crashes/replay-$h.log" 2>&1; then
      echo "$h: regression input $r crashes again:"; tail -20 "$build/crashes/replay-$h.log"; status=1
    fi
  done
  log="$build/crashes/$h.log"
  if "$exe" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$build/crashes/$h-" \
      "$corpus" >"$log" 2>&1; then
    result=ok
  else
    result="CRASH (see $log)"
    status=1
    grep -E "SUMMARY|ERROR" "$log" | head -3
  fi
  runs=$(grep -oE "Done [0-9]+ runs" "$log" | grep -oE "[0-9]+" || echo 0)
  printf '%-8s %12s %8s %s\n' "$h" "$runs" "$((runs / seconds))" "$result"
done
exit $status
