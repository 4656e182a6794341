#!/usr/bin/env bash
# Configures and builds Ashlar (Release, Ninja, ccache when present) into ./build,
# or into the directory given as the first argument; extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
shift || true
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$(nproc)"
