#!/usr/bin/env bash
# A scheduler and a server+worker node in two network namespaces joined by a veth pair, so
# the join and every message cross a real interface; one more worker node beside each. The
# worker node beside the server reaches it through shared memory; the one in the other
# namespace (another host, as far as sockets go) over TCP, and says why. Then a ring job on
# the same layout: each worker's chunks to the next go through shared memory within a
# namespace and over TCP across the pair. Exits 77 (ctest: skipped) where
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
# One job on a fresh cluster: a scheduler in namespace a; a server+worker node and a worker
# node in b; a worker node in a. Logs in $dir/POLICY-*.log.
run_job() {
  local policy="$1" pids_before=${#pids[@]}
  rm -f "$dir/port"
  ip netns exec "$a" "$exe" node --role scheduler --listen 10.231.7.1:0 --port-file "$dir/port" --tls "$dir/tls-a" \
    "$config" --exit-after-job --policy "$policy" --workers 3 --servers 1 --epochs 1 --set data.train_limit=3000 \
    --set data.test_limit=500 --set run.progress_interval=0 --report "$dir/$policy-r.json" >"$dir/$policy-sched.log" 2>&1 &
  local sched=$!
  pids+=("$sched")
  for _ in $(seq 1 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
  [[ -s "$dir/port" ]] || { cat "$dir/$policy-sched.log"; echo "FAILED: the scheduler did not listen"; exit 1; }
  local port
  port=$(cat "$dir/port")
  ip netns exec "$b" "$exe" node --role server,worker --name across-veth --join "10.231.7.1:$port" \
    --tls "$dir/tls-b" >"$dir/$policy-node.log" 2>&1 &
  pids+=("$!")
  ip netns exec "$b" "$exe" node --role worker --name beside-server --join "10.231.7.1:$port" \
    --tls "$dir/tls-c" >"$dir/$policy-near.log" 2>&1 &
  pids+=("$!")
  ip netns exec "$a" "$exe" node --role worker --name beside-sched --join "10.231.7.1:$port" \
    --tls "$dir/tls-d" >"$dir/$policy-far.log" 2>&1 &
  pids+=("$!")
  local code=1
  for _ in $(seq 1 600); do
    if ! kill -0 "$sched" 2>/dev/null; then wait "$sched"; code=$?; break; fi
    sleep 0.1
  done
  cat "$dir/$policy-sched.log"
  if [[ $code -ne 0 ]]; then echo "FAILED: $policy: scheduler exit code $code"; cat "$dir/$policy-node.log"; exit 1; fi
  grep -q "across-veth" "$dir/$policy-sched.log" || { echo "FAILED: the node did not join across the veth pair"; exit 1; }
  grep -q '"test_accuracy"' "$dir/$policy-r.json" || { echo "FAILED: $policy: no report"; exit 1; }
  grep -q "mutual TLS" "$dir/$policy-sched.log" || { echo "FAILED: the scheduler did not use TLS"; exit 1; }
  for p in "${pids[@]:$pids_before}"; do kill "$p" 2>/dev/null; done
}

run_job bsp
near="$dir/bsp-near.log" far="$dir/bsp-far.log"
grep -q "shard 0 at .* over shared memory (same host" "$near" \
  || { cat "$near"; echo "FAILED: the worker node beside the server did not use shared memory"; exit 1; }
grep -qE "over TCP \(the shard node: .*offer is not reachable from here" "$far" \
  || { cat "$far"; echo "FAILED: the worker node in the other namespace did not say it took TCP, and why"; exit 1; }
if grep -q "over shared memory" "$far"; then echo "FAILED: shared memory across namespaces"; exit 1; fi

# A ring job: workers 0 (across-veth, b), 1 (beside-sched, a) and 2 (beside-server, b), in
# the order of their nodes' names, each sending its chunks to the next: 2 -> 0 within b
# through shared memory, 0 -> 1 and 1 -> 2 across the veth pair over TCP.
run_job ring
near="$dir/ring-near.log" far="$dir/ring-far.log" node="$dir/ring-node.log"
grep -q "ring of 3 workers formed" "$dir/ring-sched.log" || { echo "FAILED: no ring formed"; exit 1; }
grep -q "the next worker's ring inbox at 10.231.7.2:[0-9]* over shared memory (same host" "$near" \
  || { cat "$near"; echo "FAILED: the ring's chunks within namespace b did not go through shared memory"; exit 1; }
for log in "$far" "$node"; do
  grep -qE "the next worker's ring inbox at 10\.231\.7\.[12]:[0-9]+ over TCP \(" "$log" \
    || { cat "$log"; echo "FAILED: the ring's chunks across the veth pair did not say they took TCP, and why"; exit 1; }
done
if grep -q "ring inbox .* over shared memory" "$far" "$node"; then echo "FAILED: ring chunks through shared memory across namespaces"; exit 1; fi
echo "passed: nodes in two network namespaces trained over mutual TLS, 10.231.7.1 <-> 10.231.7.2; the worker"
echo "beside the server used shared memory, the one across the veth pair TCP; a ring job's chunks likewise"
