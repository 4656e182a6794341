#!/bin/bash
# A host application builds against an installed Ashlar: `cmake --install` into a fresh
# prefix, then apps/embed configured on its own with find_package(Ashlar) from that prefix
# (nothing from the source or build tree on its include path), built, and its own-backend
# example run: it must train (test accuracy >= 0.7 on 6000 samples, 3 epochs; chance 0.10).
# Usage: installed_embed_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in lib/cmake/Ashlar/AshlarConfig.cmake include/ashlar/actors/cluster/embed.hpp lib/libashlar_actors.a; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$src/apps/embed" -B "$work/embed" "${gen[@]}" "${launcher[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/embed" -j 2 > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
# The compile lines name the installed headers, not the source tree's.
if [ -n "${gen[*]}" ]; then
  src_abs=$(cd "$src" && pwd)
  work_abs=$(cd "$work" && pwd)
  for dir in $(grep -h "INCLUDES = " "$work/embed/build.ninja" | grep -oE "(-I|-isystem )[^ ]+" | sed -E 's/^(-I|-isystem )//'); do
    case "$dir" in
      "$work_abs/prefix"*) ;;                   # the installed tree (which may lie inside the build)
      "$src_abs" | "$src_abs/"*) echo "the example was compiled against the source tree: $dir"; exit 1 ;;
    esac
  done
  grep -q "INCLUDES = .*$work/prefix/include/ashlar" "$work/embed/build.ninja" \
    || { echo "the example's compile lines do not name the installed headers"; exit 1; }
fi
out=$("$work/embed/ashlar-embed-backend-example" 3 6000)
echo "$out"
acc=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | tail -1 | awk '{print $3}')
python3 -c "import sys; a=float('${acc:-0}'); sys.exit(0 if a >= 0.7 else 1)" \
  || { echo "accuracy '$acc' below 0.7: the installed libraries did not train"; exit 1; }
usage=$("$work/embed/ashlar-embed-example" 2>&1 || true)
grep -q usage <<< "$usage" || { echo "ashlar-embed-example does not start: $usage"; exit 1; }
echo "installed Ashlar: apps/embed built with find_package(Ashlar) and trained (accuracy $acc)"
