#!/usr/bin/env bash
# Pull+push bytes/s between two processes through Ashlar's wire (CAF + Cap'n Proto) for a
# ~6M-parameter shard, against raw loopback TCP measured by iperf3 in the same run.
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
port=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
sleep 0.5
i=$(iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" -J)
wait || true
/usr/bin/python3 - "$a" "$i" <<'PY'
import json, sys
a = json.loads(sys.argv[1])
i = json.loads(sys.argv[2])
tcp = i["end"]["sum_received"]["bits_per_second"] / 8
print(f"{'path':<40} {'MB/s':>10}")
print(f"{'ashlar pull+push, ' + str(a['params']) + ' params':<40} {a['bytes_per_second']/1e6:>10.1f}")
print(f"{'iperf3 loopback TCP, one stream':<40} {tcp/1e6:>10.1f}")
print(f"ratio ashlar / loopback: {a['bytes_per_second']/tcp:.3f}")
PY
