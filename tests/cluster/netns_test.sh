#!/usr/bin/env bash
# A scheduler and a server+worker node in two network namespaces joined by a veth pair, so
# the join and every message cross a real interface; one more worker node beside each. The
# worker node beside the server reaches it through shared memory; the one in the other
# namespace (another host, as far as sockets go) over TCP, and says why. Exits 77 (ctest: skipped) where
# network namespaces cannot be made (not root, no iproute2, no permission).
#   netns_test.sh ASHLAR_BINARY CONFIG
set -u
exe="$1"
config="$2"
skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip command (iproute2)"
id=$$
a="ashlar-a-$id"
b="ashlar-b-$id"
va="asha$((id % 100000))"
vb="ashb$((id % 100000))"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$a" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$b" || skip "cannot create a second network namespace"
ip link add "$va" type veth peer name "$vb" || skip "cannot create a veth pair"
ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" || exit 1
ip -n "$a" addr add 10.231.7.1/24 dev "$va" && ip -n "$a" link set "$va" up && ip -n "$a" link set lo up || exit 1
ip -n "$b" addr add 10.231.7.2/24 dev "$vb" && ip -n "$b" link set "$vb" up && ip -n "$b" link set lo up || exit 1

# Beyond loopback, so mutual TLS: a CA and one certificate per node.
"$exe" cert --ca "$dir/ca" --out "$dir/tls-a" --name sched >/dev/null || { echo "FAILED: ashlar cert"; exit 1; }
"$exe" cert --ca "$dir/ca" --out "$dir/tls-b" --name across-veth >/dev/null || exit 1
"$exe" cert --ca "$dir/ca" --out "$dir/tls-c" --name beside-server >/dev/null || exit 1
"$exe" cert --ca "$dir/ca" --out "$dir/tls-d" --name beside-sched >/dev/null || exit 1
ip netns exec "$a" "$exe" node --role scheduler --listen 10.231.7.1:0 --port-file "$dir/port" --tls "$dir/tls-a" \
  "$config" --exit-after-job --workers 3 --servers 1 --epochs 1 --set data.train_limit=3000 \
  --set data.test_limit=500 --set run.progress_interval=0 --report "$dir/r.json" >"$dir/sched.log" 2>&1 &
sched=$!
pids+=("$sched")
for _ in $(seq 1 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
[[ -s "$dir/port" ]] || { cat "$dir/sched.log"; echo "FAILED: the scheduler did not listen"; exit 1; }
port=$(cat "$dir/port")
ip netns exec "$b" "$exe" node --role server,worker --name across-veth --join "10.231.7.1:$port" \
  --tls "$dir/tls-b" >"$dir/node.log" 2>&1 &
pids+=("$!")
ip netns exec "$b" "$exe" node --role worker --name beside-server --join "10.231.7.1:$port" \
  --tls "$dir/tls-c" >"$dir/near.log" 2>&1 &
pids+=("$!")
ip netns exec "$a" "$exe" node --role worker --name beside-sched --join "10.231.7.1:$port" \
  --tls "$dir/tls-d" >"$dir/far.log" 2>&1 &
pids+=("$!")
code=1
for _ in $(seq 1 600); do
  if ! kill -0 "$sched" 2>/dev/null; then wait "$sched"; code=$?; break; fi
  sleep 0.1
done
cat "$dir/sched.log"
if [[ $code -ne 0 ]]; then echo "FAILED: scheduler exit code $code"; cat "$dir/node.log"; exit 1; fi
grep -q "across-veth" "$dir/sched.log" || { echo "FAILED: the node did not join across the veth pair"; exit 1; }
grep -q '"test_accuracy"' "$dir/r.json" || { echo "FAILED: no report"; exit 1; }
grep -q "mutual TLS" "$dir/sched.log" || { echo "FAILED: the scheduler did not use TLS"; exit 1; }
grep -q "over shared memory (same host)" "$dir/near.log" \
  || { cat "$dir/near.log"; echo "FAILED: the worker node beside the server did not use shared memory"; exit 1; }
grep -qE "over TCP \(the shard node: .*offer is not reachable from here" "$dir/far.log" \
  || { cat "$dir/far.log"; echo "FAILED: the worker node in the other namespace did not say it took TCP, and why"; exit 1; }
if grep -q "over shared memory" "$dir/far.log"; then echo "FAILED: shared memory across namespaces"; exit 1; fi
echo "passed: nodes in two network namespaces trained over mutual TLS, 10.231.7.1 <-> 10.231.7.2; the worker"
echo "beside the server used shared memory, the one across the veth pair TCP"
