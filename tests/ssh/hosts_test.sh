#!/bin/bash
# `ashlar launch --hosts` / `--hostfile` against a real sshd on this host (Debian's
# openssh-server), started by this test on a port of its own with a key made for it, and
# reached as a user's ssh reaches a cluster's hosts (BatchMode, the key, an ssh_config):
#
#   hosts:       --hosts ADDRESS:2,127.0.0.1:1 (ADDRESS: this host's network address)
#                trains the shipped MLP config over ssh (beyond loopback: the launch's own
#                TLS), rc 0, every node started and ended, no credentials left on the hosts;
#   hostfile:    a hostfile naming 127.0.0.1 and localhost (2 slots each) trains 3 workers
#                (--set train.workers=3: the slots filled in host order; loopback only);
#   unreachable: a host without sshd and one that does not resolve are both named, rc 1,
#                before any node starts;
#   kill:        a worker node SIGKILLed on its host mid-job is survived: rc 0, epochs once;
#   stop:        SIGINT to the launcher stops the job over the channel: the report is
#                written, every node on every host exits.
#
# usage: hosts_test.sh ASHLAR_BINARY SOURCE_DIR CASE [EPOCHS] [MIN_ACCURACY]
# Exits 77 (ctest: skipped) where sshd is not installed or cannot start here.
set -uo pipefail
bin=$1 src=$2 case=$3 epochs=${4:-1} min_acc=${5:-0.80}
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; [ -f "${log:-}" ] && tail -60 "$log"; exit 1; }
for c in ssh ssh-keygen python3; do command -v $c >/dev/null || skip "no $c (ops/install-deps.sh installs openssh)"; done
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] || skip "no sshd (ops/install-deps.sh installs openssh-server)"

d=$(mktemp -d /tmp/ashlar-ssh-XXXXXX)
log=$d/launch.out
cleanup() {
  [ -f "$d/sshd.pid" ] && kill "$(cat "$d/sshd.pid")" 2>/dev/null
  for p in $(nodes_left); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$d"
}
trap cleanup EXIT
port=$(( 23000 + ($$ % 900) ))
ssh-keygen -q -t ed25519 -N '' -f "$d/host_key" || fail "ssh-keygen"
ssh-keygen -q -t ed25519 -N '' -f "$d/id" || fail "ssh-keygen"
cp "$d/id.pub" "$d/authorized_keys"
[ "$(id -u)" -ne 0 ] || mkdir -p /run/sshd
cat > "$d/sshd_config" <<CONF
Port $port
ListenAddress 0.0.0.0
HostKey $d/host_key
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
LogLevel ERROR
CONF
"$sshd" -f "$d/sshd_config" -E "$d/sshd.log" || skip "sshd does not start here: $(cat "$d/sshd.log")"
cat > "$d/ssh_config" <<CONF
Host *
  Port $port
  IdentityFile $d/id
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
CONF
for ((i = 0; i < 50; i++)); do ssh -F "$d/ssh_config" -o BatchMode=yes 127.0.0.1 true 2>/dev/null && break; sleep 0.1; done
ssh -F "$d/ssh_config" -o BatchMode=yes 127.0.0.1 true || skip "cannot ssh to this host's sshd: $(tail -3 "$d/sshd.log")"
ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.' | grep -v '^127\.' | head -1)

cd "$d"
touch "$d/started"
config=$src/ops/configs/fmnist-mlp.toml
job=(--report "$d/r.json" --set run.progress_interval=0 --ssh-config "$d/ssh_config")
field() { python3 -c "import json; print(json.load(open('$d/r.json')).get('$1'))"; }
# This test's nodes: every process started over ssh by this launch runs with this sshd's
# key directory in its command line (--ssh-config names it only on the launcher's), so
# nodes are found by the names the launch gave them.
nodes_left() { pgrep -f "^$bin node --role (server|worker) --join .* --launcher-stdin" | while read -r p; do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q "^SSH_CONNECTION=.* $port\$" && echo "$p"; done; }
wait_for() { # wait_for TEXT PID: until the launch's output has TEXT (120 s at most, while PID runs)
  for ((i = 0; i < 1200; i++)); do
    grep -q "$1" "$log" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
check_trained() {
  acc=$(field test_accuracy)
  python3 -c "import sys; sys.exit(0 if $acc >= $min_acc else 1)" || fail "accuracy $acc < $min_acc"
  sleep 1
  left=$(nodes_left)
  [ -z "$left" ] || fail "nodes left running on the hosts: $left"
  no_credentials_left
}
# The nodes' private credential directories made since this test's start, still there.
no_credentials_left() {
  left=$(find /tmp -maxdepth 1 -name 'ashlar-node-*' -newer "$d/started" 2>/dev/null)
  [ -z "$left" ] || fail "credentials left on a host: $left"
}

case $case in
hosts)
  [ -n "$ip" ] || skip "this host has no network address besides loopback"
  "$bin" launch "$config" --hosts "$ip:2,127.0.0.1:1" --servers 2 --epochs "$epochs" "${job[@]}" > "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || fail "launch: rc $rc"
  grep -q "starting 2 server and 2 worker node(s) over ssh: $ip: server-0, 2 workers; 127.0.0.1: server-1, 1 worker" "$log" \
    || fail "the placement"
  grep -q "scheduler at $ip:" "$log" || fail "the scheduler's address is not this host's on the route to $ip"
  grep -q "train.workers 4 (.*fmnist-mlp.toml.*) gives way to the hosts' 3 slots" "$log" || fail "the config's workers"
  [ "$(field workers)" = 3 ] || fail "workers $(field workers)"
  check_trained
  echo "hosts: rc 0 over ssh to $ip and 127.0.0.1 (TLS), test accuracy $acc, no node or credentials left"
  ;;
hostfile)
  printf '# the hosts\n127.0.0.1 slots=2\nlocalhost slots=2  # one of them used\n' > "$d/hosts"
  "$bin" launch "$config" --hostfile "$d/hosts" --servers 1 --epochs "$epochs" "${job[@]}" --set train.workers=3 \
    > "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || fail "launch: rc $rc"
  grep -q "127.0.0.1: server-0, 2 workers; localhost: 1 worker" "$log" || fail "the placement"
  [ "$(field workers)" = 3 ] || fail "workers $(field workers)"
  check_trained
  echo "hostfile: rc 0 over ssh to 127.0.0.1 and localhost, test accuracy $acc"
  ;;
unreachable)
  start=$(date +%s)
  "$bin" launch "$config" --hosts 127.0.0.1:1,nohost.invalid:1,127.0.0.2:1 "${job[@]}" --ssh-port 1 \
    --ssh-connect-timeout 3 > "$log" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "launch: rc $rc, not 1"
  cat "$log"
  grep -q "cannot reach these hosts over ssh" "$log" || fail "no refusal"
  for h in nohost.invalid 127.0.0.1 127.0.0.2; do grep -q "^  $h: " "$log" || fail "$h is not named"; done
  grep -q "starting" "$log" && fail "nodes were started"
  [ $(( $(date +%s) - start )) -lt 30 ] || fail "the refusal took $(( $(date +%s) - start )) s"
  echo "unreachable: rc 1, each host named with what ssh said, no node started"
  ;;
kill)
  "$bin" launch "$config" --hosts 127.0.0.1:1,localhost:1 --servers 1 "${job[@]}" --epochs 3 \
    --set train.sample_ms=0.4 --set train.speeds=1 > "$log" 2>&1 &
  launch=$!
  wait_for "training starts" $launch || fail "training did not start"
  sleep 3
  victim=$(nodes_left | while read -r p; do tr '\0' ' ' < /proc/$p/cmdline | grep -q "worker@localhost" && echo "$p"; done)
  [ -n "$victim" ] || fail "no worker node to kill"
  kill -9 $victim
  wait $launch
  rc=$?
  [ $rc -eq 0 ] || fail "launch: rc $rc after a worker node was killed"
  [ "$(field lost_workers)" = 1 ] || fail "lost_workers $(field lost_workers)"
  applied=$(field applied_samples)
  python3 -c "import sys; e=$applied/60000; print('epochs applied', e); sys.exit(0 if 2.99 <= e <= 3.05 else 1)" \
    || fail "epochs not trained once"
  epochs=3 check_trained
  echo "kill: a worker node SIGKILLed on its host, rc 0, test accuracy $acc"
  ;;
stop)
  "$bin" launch "$config" --hosts 127.0.0.1:1,localhost:1 --servers 1 "${job[@]}" --epochs 50 > "$log" 2>&1 &
  launch=$!
  wait_for "training starts" $launch || fail "training did not start"
  sleep 2
  kill -INT $launch
  wait $launch
  rc=$?
  [ $rc -eq 130 ] || fail "launch: rc $rc after SIGINT, not 130"
  [ "$(field stopped_early)" = True ] || fail "the report does not say stopped"
  sleep 1
  left=$(nodes_left)
  [ -z "$left" ] || fail "nodes left running after the stop: $left"
  no_credentials_left
  echo "stop: SIGINT stopped the job over ssh, report written, no node or credentials left"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
