#!/usr/bin/env bash
# Pull+push bytes/s between two processes for a ~6M-parameter shard, over Ashlar's data
# plane (direct TCP, what workers use) and over CAF's middleman, in the chunks a worker
# uses (train.chunk_floats) and whole, against raw loopback TCP measured by iperf3 in the
# same run.
#   bash ops/bench/wire-vs-iperf3.sh [build-dir] [params] [seconds]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
params="${2:-6000000}"
seconds="${3:-5}"
ashlar="$build/apps/ashlar"
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 missing: apt-get install iperf3" >&2; exit 1; }
a=$("$ashlar" bench wire --params "$params" --seconds "$seconds" --json)
w=$("$ashlar" bench wire --params "$params" --seconds "$seconds" --chunk 0 --json)
port=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
sleep 0.5
i=$(iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" -J)
wait || true
/usr/bin/python3 - "$a" "$w" "$i" <<'PY'
import json, sys
a = json.loads(sys.argv[1])
w = json.loads(sys.argv[2])
i = json.loads(sys.argv[3])
tcp = i["end"]["sum_received"]["bits_per_second"] / 8
n = a["params"]
rows = [
    (f"data plane, 4 MiB chunks x2 in flight", a["bytes_per_second"]),
    (f"data plane, whole shard per message", w["bytes_per_second"]),
    (f"CAF middleman, 4 MiB chunks x2", a["caf_bytes_per_second"]),
    (f"CAF middleman, whole shard per message", w["caf_bytes_per_second"]),
    ("iperf3 loopback TCP, one stream", tcp),
]
print(f"pull+push of a {n}-parameter shard in another process")
print(f"{'path':<44} {'MB/s':>9} {'/ loopback':>11}")
for name, rate in rows:
    print(f"{name:<44} {rate/1e6:>9.1f} {rate/tcp:>11.3f}")
PY
