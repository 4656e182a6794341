#!/usr/bin/env bash
# Pull+push bytes/s between two processes for a ~6M-parameter shard, over Ashlar's data
# plane (direct TCP, what workers use) and over CAF's middleman, in the chunks a worker
# uses (train.chunk_floats) and whole, against raw loopback TCP measured by iperf3 in the
# same run, and the same paths with mutual TLS (the data plane's frames sealed with
# AES-128-GCM under keys from the TLS session; CAF's connections in TLS). The machine is
# noisy, so plain, TLS and iperf3 are measured alternately, `rounds` times, and each ratio
# reported is the median of the per-round ratios.
#   bash ops/bench/wire-vs-iperf3.sh [build-dir] [params] [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
params="${2:-6000000}"
seconds="${3:-4}"
rounds="${4:-3}"
ashlar="$build/apps/ashlar"
[[ -x "$ashlar" ]] || { echo "no $ashlar: build first (bash ops/build.sh)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 missing: apt-get install iperf3" >&2; exit 1; }
iperf() {
  local port=$((20000 + RANDOM % 20000))
  iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" -J
  wait || true
}
tls=$(mktemp -d)
trap 'rm -rf "$tls"' EXIT
"$ashlar" cert --ca "$tls/ca" --out "$tls/node" --name bench >/dev/null
results=()
for ((r = 0; r < rounds; ++r)); do
  results+=("$("$ashlar" bench wire --params "$params" --seconds "$seconds" --json)")
  results+=("$("$ashlar" bench wire --params "$params" --seconds "$seconds" --json --tls "$tls/node")")
  results+=("$(iperf | tr -d '\n')")
done
w=$("$ashlar" bench wire --params "$params" --seconds "$seconds" --chunk 0 --json)
/usr/bin/python3 - "$w" "${results[@]}" <<'PY'
import json, statistics, sys
w = json.loads(sys.argv[1])
triples = [tuple(json.loads(sys.argv[i + k]) for k in range(3)) for i in range(2, len(sys.argv), 3)]
pairs = [(a, i) for a, _, i in triples]
tcp = [i["end"]["sum_received"]["bits_per_second"] / 8 for _, i in pairs]
ours = [a["bytes_per_second"] for a, _ in pairs]
caf = [a["caf_bytes_per_second"] for a, _ in pairs]
sealed = [t["bytes_per_second"] for _, t, _ in triples]
caf_tls = [t["caf_bytes_per_second"] for _, t, _ in triples]
ratios = [o / t for o, t in zip(ours, tcp)]
n = pairs[0][0]["params"]
print(f"pull+push of a {n}-parameter shard in another process, {len(pairs)} alternating rounds")
print(f"{'round':<6} {'data plane MB/s':>16} {'with TLS MB/s':>14} {'iperf3 MB/s':>12} {'ratio':>7} {'TLS/plain':>10}")
for k, (o, e, t, q) in enumerate(zip(ours, sealed, tcp, ratios)):
    print(f"{k + 1:<6} {o / 1e6:>16.1f} {e / 1e6:>14.1f} {t / 1e6:>12.1f} {q:>7.3f} {e / o:>10.3f}")
med_tcp = statistics.median(tcp)
print()
print(f"{'path (median over rounds)':<44} {'MB/s':>9} {'/ loopback':>11}")
rows = [
    ("data plane, 1 MiB chunks x4 (what workers do)", statistics.median(ours)),
    ("data plane, whole shard per message", w["bytes_per_second"]),
    ("CAF middleman, 1 MiB chunks x4", statistics.median(caf)),
    ("CAF middleman, whole shard per message", w["caf_bytes_per_second"]),
    ("data plane over TLS, 1 MiB chunks x4", statistics.median(sealed)),
    ("CAF middleman over TLS, 1 MiB chunks x4", statistics.median(caf_tls)),
    ("iperf3 loopback TCP, one stream", med_tcp),
]
for name, rate in rows:
    print(f"{name:<44} {rate/1e6:>9.1f} {rate/med_tcp:>11.3f}")
print(f"\nmedian of per-round ratios, data plane / iperf3: {statistics.median(ratios):.3f}")
print(f"median of per-round ratios, data plane with TLS / without: "
      f"{statistics.median([e / o for e, o in zip(sealed, ours)]):.3f}")
print(f"median of per-round ratios, CAF with TLS / without: "
      f"{statistics.median([e / o for e, o in zip(caf_tls, caf)]):.3f}")
PY
