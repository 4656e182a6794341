#!/usr/bin/env bash
# Chaos benchmark of a launched-by-hand cluster (scheduler, 2 server nodes, 4 worker nodes,
# checkpoints on) under a seeded schedule of SIGKILL/SIGSTOP faults; --soak: the same
# cluster without faults, its processes' memory over a long run. See ops/bench/chaos.py.
#   bash ops/bench/chaos.sh --minutes 10 --seed 1 --out /tmp/chaos
#   bash ops/bench/chaos.sh --soak --minutes 30 --out /tmp/soak
set -euo pipefail
exec python3 "$(dirname "$0")/chaos.py" "$@"
