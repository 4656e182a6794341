#!/usr/bin/env bash
# Installs the built `ashlar` command (and ops/plot as `ashlar-plot`) under PREFIX/bin
# (default /usr/local; ~/.local needs ~/.local/bin on PATH). Build first: bash ops/build.sh.
#   bash ops/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
if [ ! -x build/apps/ashlar ]; then
  echo "ops/install.sh: build/apps/ashlar is missing: run bash ops/build.sh first" >&2
  exit 1
fi
cmake --install build --prefix "$prefix"
echo "installed: $prefix/bin/ashlar ($("$prefix/bin/ashlar" --version)); for a host application: find_package(Ashlar) with CMAKE_PREFIX_PATH=$prefix"
