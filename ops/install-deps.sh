#!/usr/bin/env bash
# Installs Ashlar's build and run dependencies from Debian bookworm's packages.
#   bash ops/install-deps.sh          # build, test and run
#   bash ops/install-deps.sh --bench  # also iperf3 (benchmarks)
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libcaf-dev capnproto libcapnp-dev librocksdb-dev libspdlog-dev libfmt-dev catch2
  libopenblas-dev libdnnl-dev libcli11-dev libtomlplusplus-dev zlib1g-dev libssl-dev
  dataset-fashion-mnist python3 python3-matplotlib python3-numpy curl
  clang-14 libfuzzer-14-dev libclang-rt-14-dev
  python3-dev pybind11-dev python3-pytest python3-torch python3-torchvision python3-pip
  slurmctld slurmd slurm-client munge
  openssh-server openssh-client
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(iperf3)
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
# The Kubernetes manifests' schema check (tests/k8s) takes its validators from npm, where
# node and npm are on the machine.
k8s_test_packages() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/k8s"
  if command -v npm >/dev/null && [[ ! -d "$dir/node_modules/kubernetes-models" ]]; then
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) \
      || echo "install-deps: npm ci in tests/k8s failed: the manifests' schema test will be skipped"
  fi
}
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  k8s_test_packages
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
k8s_test_packages
