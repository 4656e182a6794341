#!/usr/bin/env bash
# A worker node whose cgroup allows less memory than the host has: a submitted model the
# scheduler's host holds but the worker's cgroup does not is refused by the worker before
# it allocates the model, naming the node and the estimate; the worker node stays up and
# the cluster trains the next job. Needs root to make a memory cgroup (v1 or v2): exit 77
# (skipped) where it cannot.
# Usage: cgroup_memory_test.sh ASHLAR_BINARY CONFIG
set -u
exe="$1"
config="$2"
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "making a memory cgroup needs root"
dir=$(mktemp -d)
export ASHLAR_HOME="$dir/home"
cg=""
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [[ -n $cg ]] && rmdir "$cg" 2>/dev/null
  [[ -n ${KEEP:-} ]] || rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.log; do echo "--- $f"; tail -20 "$f"; done
  exit 1
}
# 600 MB: the node runs (about 30 MB idle), a model of 70 M parameters (4 copies, 1.1 GB)
# does not fit.
limit=$((600 * 1024 * 1024))
if [[ -d /sys/fs/cgroup/memory && -w /sys/fs/cgroup/memory ]]; then
  cg="/sys/fs/cgroup/memory/ashlar-test-$$"
  mkdir "$cg" 2>/dev/null && echo "$limit" > "$cg/memory.limit_in_bytes" || skip "cannot make a v1 memory cgroup"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  cg="/sys/fs/cgroup/ashlar-test-$$"
  mkdir "$cg" 2>/dev/null && echo "$limit" > "$cg/memory.max" || skip "cannot make a v2 memory cgroup"
else
  skip "no writable memory cgroup hierarchy"
fi

"$exe" node --role scheduler --listen 127.0.0.1:0 --port-file "$dir/port" --work-dir "$dir" > "$dir/scheduler.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
[[ -s "$dir/port" ]] || fail "the scheduler did not listen"
join="127.0.0.1:$(cat "$dir/port")"
token=$(ls "$ASHLAR_HOME"/cluster-*.token 2>/dev/null | head -1)
[[ -n $token ]] || fail "the scheduler made no token under $ASHLAR_HOME"
"$exe" node --role server --join "$join" --token-file "$token" --work-dir "$dir" > "$dir/server.log" 2>&1 &
pids+=("$!")
# The worker node starts inside the cgroup (a shell moves itself there, then becomes it).
bash -c "echo \$\$ > '$cg/cgroup.procs' && exec '$exe' node --role worker --name boxed --slots 1 --join '$join' \
  --token-file '$token'" > "$dir/worker.log" 2>&1 &
worker=$!
pids+=("$worker")
for _ in $(seq 1 150); do grep -q "joined the cluster" "$dir/worker.log" && break; sleep 0.1; done
grep -q "joined the cluster" "$dir/worker.log" || fail "the worker node did not join"
grep -qx "$worker" "$cg/cgroup.procs" || fail "the worker node is not in the cgroup"

job=("$exe" train "$config" --join "$join" --token-file "$token" --workers 1 --servers 2 --epochs 1
     --set data.train_limit=3000 --set data.test_limit=500 --set run.progress_interval=0)
"${job[@]}" --set model.hidden=8000,8000 > "$dir/big.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] || fail "the job with a model the worker's cgroup cannot hold ended rc 0"
grep -q "does not fit in this machine's memory" "$dir/big.log" || fail "the refusal does not say the model does not fit"
grep -q "node boxed" "$dir/big.log" || fail "the refusal does not name the worker's node"
kill -0 "$worker" 2>/dev/null || fail "the worker node ended"
peak=$(cat "$cg/memory.max_usage_in_bytes" 2>/dev/null || cat "$cg/memory.peak" 2>/dev/null || echo 0)
[[ $peak -lt $((400 * 1024 * 1024)) ]] || fail "the worker node took $peak bytes: it allocated the model"
"${job[@]}" > "$dir/next.log" 2>&1 || fail "the next job, a model that fits, did not train"
echo "passed: refused on the worker ($(grep -o "it needs [^;]*" "$dir/big.log" | head -1)), peak $((peak / 1048576)) MB in the cgroup; the next job trained"
