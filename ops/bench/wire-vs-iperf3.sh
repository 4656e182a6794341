#!/usr/bin/env bash
# Pull+push bytes/s between two processes of this host for a ~6M-parameter shard, over
# Ashlar's data plane (direct TCP, what workers on other hosts use; shared memory, what
# workers on the shard's host use) and over CAF's middleman, in the chunks a worker
# uses (train.chunk_floats) and whole, against raw loopback TCP measured by iperf3 in the
# same run. Three ways of protecting the bytes after the handshake: none (--unsealed, a
# bench-only switch), sealed records under keys from the token handshake (what nodes do
# without TLS), and mutual TLS (the data plane's frames sealed under keys from the TLS
# session; CAF's connections in TLS). The machine is noisy, so the four are measured
# alternately, `rounds` times, and each ratio reported is the median of per-round ratios.
# Then one push and one pull of 1, 16 and 100 MB tensors per path (shared memory, TCP)
# beside memcpy of the same size (`ashlar bench transport`), and iperf3's stream.
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
  results+=("$("$ashlar" bench wire --tcp --params "$params" --seconds "$seconds" --json --unsealed 2>/dev/null)")
  results+=("$("$ashlar" bench wire --tcp --params "$params" --seconds "$seconds" --json 2>/dev/null)")
  results+=("$("$ashlar" bench wire --tcp --params "$params" --seconds "$seconds" --json --tls "$tls/node" 2>/dev/null)")
  results+=("$(iperf | tr -d '\n')")
done
w=$("$ashlar" bench wire --tcp --params "$params" --seconds "$seconds" --chunk 0 --json 2>/dev/null)
shm=$("$ashlar" bench wire --params "$params" --seconds "$seconds" --json 2>/dev/null)
transport=$("$ashlar" bench transport --json 2>/dev/null | tr '\n' ' ')
/usr/bin/python3 - "$w" "$shm" "$transport" "${results[@]}" <<'PY'
import json, statistics, sys
w = json.loads(sys.argv[1])
shm = json.loads(sys.argv[2])
transport = [json.loads(x) for x in sys.argv[3].replace("} {", "}\n{").split("\n") if x.strip()]
runs = [tuple(json.loads(sys.argv[i + k]) for k in range(4)) for i in range(4, len(sys.argv), 4)]
tcp = [i["end"]["sum_received"]["bits_per_second"] / 8 for *_, i in runs]
plain = [u["bytes_per_second"] for u, *_ in runs]
caf_plain = [u["caf_bytes_per_second"] for u, *_ in runs]
sealed = [s["bytes_per_second"] for _, s, _, _ in runs]
caf_sealed = [s["caf_bytes_per_second"] for _, s, _, _ in runs]
tls = [t["bytes_per_second"] for _, _, t, _ in runs]
caf_tls = [t["caf_bytes_per_second"] for _, _, t, _ in runs]
med = statistics.median
n = runs[0][0]["params"]
print(f"pull+push of a {n}-parameter shard in another process, {len(runs)} alternating rounds")
print(f"{'round':<6} {'unsealed MB/s':>14} {'sealed MB/s':>12} {'TLS MB/s':>9} {'iperf3 MB/s':>12} "
      f"{'sealed/unsealed':>16} {'CAF sealed/unsealed':>20}")
for k in range(len(runs)):
    print(f"{k + 1:<6} {plain[k] / 1e6:>14.1f} {sealed[k] / 1e6:>12.1f} {tls[k] / 1e6:>9.1f} {tcp[k] / 1e6:>12.1f} "
          f"{sealed[k] / plain[k]:>16.3f} {caf_sealed[k] / caf_plain[k]:>20.3f}")
med_tcp = med(tcp)
print()
print(f"{'path (median over rounds), 1 MiB chunks x4':<48} {'MB/s':>9} {'/ loopback':>11}")
rows = [
    ("data plane, unsealed (plain bytes after the gate)", med(plain)),
    ("data plane, sealed records (the default)", med(sealed)),
    ("data plane, TLS (sealed under TLS keys)", med(tls)),
    ("data plane, sealed, whole shard per message", w["bytes_per_second"]),
    ("data plane, shared memory (same host, default)", shm["bytes_per_second"]),
    ("CAF middleman, unsealed", med(caf_plain)),
    ("CAF middleman, sealed records (the default)", med(caf_sealed)),
    ("CAF middleman, TLS", med(caf_tls)),
    ("CAF middleman, sealed, whole shard per message", w["caf_bytes_per_second"]),
    ("iperf3 loopback TCP, one stream", med_tcp),
]
for name, rate in rows:
    print(f"{name:<48} {rate/1e6:>9.1f} {rate/med_tcp:>11.3f}")
def ratio(a, b):
    return med([x / y for x, y in zip(a, b)])
print()
print(f"median of per-round ratios, data plane unsealed / iperf3: {ratio(plain, tcp):.3f}")
print(f"median of per-round ratios, data plane sealed / unsealed: {ratio(sealed, plain):.3f}")
print(f"median of per-round ratios, CAF sealed / unsealed:        {ratio(caf_sealed, caf_plain):.3f}")
print(f"median of per-round ratios, data plane TLS / unsealed:    {ratio(tls, plain):.3f}")
print(f"median of per-round ratios, CAF TLS / unsealed:           {ratio(caf_tls, caf_plain):.3f}")
print()
print("one push and one pull of a tensor, no shard work (GB/s); shm/memcpy and shm/TCP on push+pull")
print(f"{'MB':>4} {'memcpy':>7} {'shm push':>9} {'shm pull':>9} {'TCP push':>9} {'TCP pull':>9} {'iperf3':>7} "
      f"{'shm/memcpy':>11} {'shm/TCP':>8}")
for t in transport:
    print(f"{t['mb']:>4} {t['memcpy_gbs']:>7.2f} {t['shm_push_gbs']:>9.2f} {t['shm_pull_gbs']:>9.2f} "
          f"{t['tcp_push_gbs']:>9.2f} {t['tcp_pull_gbs']:>9.2f} {med_tcp / 1e9:>7.2f} "
          f"{t['shm_gbs'] / t['memcpy_gbs']:>11.2f} {t['shm_gbs'] / t['tcp_gbs']:>8.2f}")
PY
