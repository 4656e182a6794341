#!/bin/bash
# A real Slurm on this host (Debian's slurm-wlm and munge): munged, slurmctld and three
# slurmd (nodes n1, n2, n3), started by this test in a mount namespace of its own whose
# /etc/hosts maps n1..n3 to this host's network address (as a cluster's DNS would; never
# loopback: a job of several hosts is refused a scheduler there). Then ops/slurm's scripts
# as a user submits them:
#
#   het:      sbatch --wait hetero.sbatch CONFIG trains, rc 0, every component's tasks joined;
#   kill:     a worker task SIGKILLed mid-job is survived (rc 0, epochs once, one lost);
#   scancel:  the report is written (stopped) and no Ashlar process is left;
#   requeue:  a job requeued mid-run resumes from its checkpoint and finishes, rc 0.
#   start:    a member step that fails before the job has its members fails it fast,
#             and so does one task of a step of several;
#   loopback: a node whose scheduler host resolves to loopback in a job of several hosts
#             is refused, naming the variable.
#
# usage: slurm_test.sh ASHLAR_BINARY SOURCE_DIR CASE [EPOCHS] [MIN_ACCURACY]
# Exits 77 (ctest: skipped) where Slurm is not installed or namespaces cannot be made.
set -uo pipefail
bin=$1 src=$2 case=$3 epochs=${4:-2} min_acc=${5:-0.84}
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && tail -60 "$log"; exit 1; }

if [ -z "${SLURMTEST_NS:-}" ]; then
  [ "$(id -u)" -eq 0 ] || skip "the test's Slurm daemons run as root"
  for c in slurmctld slurmd munged sbatch unshare; do command -v $c >/dev/null || skip "no $c (ops/install-deps.sh installs slurm-wlm and munge)"; done
  ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.' | grep -v '^127\.' | head -1)
  [ -n "$ip" ] || skip "this host has no network address besides loopback"
  export SLURMTEST_NS=1 SLURMTEST_IP=$ip
  exec unshare -m --propagation private bash "$0" "$@" || skip "cannot make a mount namespace"
fi

d=$(mktemp -d /tmp/ashlar-slurm-XXXXXX)
log=$d/job.out
cleanup() {
  scancel --full -u root >/dev/null 2>&1
  [ -f "$d/slurmctld.pid" ] && kill "$(cat "$d/slurmctld.pid")" 2>/dev/null
  for n in n1 n2 n3; do [ -f "$d/slurmd-$n.pid" ] && kill "$(cat "$d/slurmd-$n.pid")" 2>/dev/null; done
  [ -f "$d/munged.pid" ] && kill "$(cat "$d/munged.pid")" 2>/dev/null
  pkill -f "$d/" 2>/dev/null
  sleep 0.5
  rm -rf "$d"
}
trap cleanup EXIT
printf '127.0.0.1 localhost\n%s n1 n2 n3 %s\n' "$SLURMTEST_IP" "$(hostname)" > "$d/hosts"
mount --bind "$d/hosts" /etc/hosts || skip "cannot bind /etc/hosts in the namespace"

# Ports of this run's own (several runs on one host do not meet): the daemons' from 24000,
# the jobs' ids (whose scheduler port is 20000 + id mod 10000) from a first id of its own.
base=$(( 24000 + ($$ % 400) * 10 ))
first_job=$(( ($$ % 400) * 10 + 1 ))
mkdir -p "$d/state" "$d/spool/n1" "$d/spool/n2" "$d/spool/n3" "$d/log" "$d/submit"
head -c 1024 /dev/urandom > "$d/munge.key"; chmod 600 "$d/munge.key"
munged -f --socket="$d/munge.sock" --key-file="$d/munge.key" --log-file="$d/log/munged.log" \
  --pid-file="$d/munged.pid" --seed-file="$d/munged.seed" || skip "munged does not start here"
cat > "$d/slurm.conf" <<CONF
ClusterName=ashlartest
SlurmctldHost=$(hostname)($SLURMTEST_IP)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
FirstJobId=$first_job
NodeName=n1 NodeAddr=$SLURMTEST_IP Port=$((base + 2)) CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeAddr=$SLURMTEST_IP Port=$((base + 3)) CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n3 NodeAddr=$SLURMTEST_IP Port=$((base + 4)) CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$d/slurm.conf
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start: $(tail -5 "$d/log/slurmctld.log")"
for n in n1 n2 n3; do slurmd -f "$SLURM_CONF" -N $n || fail "slurmd $n did not start"; done
for ((i = 0; i < 100; i++)); do
  [ "$(sinfo -h -o '%t' 2>/dev/null | sort -u)" = "idle" ] && break
  sleep 0.2
done
[ "$(sinfo -h -o '%D %t')" = "3 idle" ] || fail "the nodes are not idle: $(sinfo)"
echo "slurm: 3 nodes idle ($(sinfo -h -o '%N'))"

# The user's side: the repository's scripts, the built ashlar, a submit directory.
export ASHLAR=$bin ASHLAR_SLURM_DIR=$src/ops/slurm
cd "$d/submit"
config=$src/ops/configs/fmnist-mlp.toml
job=(--epochs "$epochs" --report "$d/submit/r.json" --set run.progress_interval=0)
field() { python3 -c "import json,sys; print(json.load(open('$d/submit/r.json')).get('$1'))"; }
submit() { sbatch --parsable -o "$log" "$@"; }
# This cluster's Ashlar processes matching PATTERN (their environment names this SLURM_CONF:
# other tests' processes of the same binary are not ours).
ours() {
  for p in $(pgrep -f "$1"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "SLURM_CONF=$SLURM_CONF" && echo "$p"
  done
}
wait_for() { # wait_for PATTERN SECONDS: until the job's output has it
  for ((i = 0; i < $2 * 10; i++)); do grep -q "$1" "$log" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# failed_start CASE_ARM: submits the het job with an ashlar that fails as the shell case arm
# says (for some of its tasks) before joining; the job must end non-zero within 30 s. Sets
# rc and took.
failed_start() {
  printf '#!/bin/bash\ncase " $* " in %s esac\nexec %s "$@"\n' "$1" "$bin" > "$d/ashlar-wrap"
  chmod +x "$d/ashlar-wrap"
  ASHLAR=$d/ashlar-wrap submit "$src/ops/slurm/hetero.sbatch" "$config" "${job[@]}" >/dev/null
  wait_for "^\[ashlar-job\] job" 120 || fail "the job did not start"
  local t0=$SECONDS
  wait_for "the scheduler exited with code" 120 || fail "the job did not end"
  took=$((SECONDS - t0))
  rc=$(grep -o "the scheduler exited with code [0-9]*" "$log" | grep -o "[0-9]*$")
  [ "$rc" != 0 ] || fail "the job did not fail"
  [ "$took" -lt 30 ] || fail "it took $took s, not fast"
}

case $case in
het)
  sbatch --wait -o "$log" "$src/ops/slurm/hetero.sbatch" "$config" "${job[@]}"
  rc=$?
  [ $rc -eq 0 ] || fail "sbatch --wait: rc $rc"
  grep -q "scheduler on n1, 1 server and 3 worker nodes" "$log" || fail "the shape"
  grep -q "joining the scheduler at n1:" "$log" || fail "the nodes did not find the scheduler from Slurm's node list"
  acc=$(field test_accuracy)
  python3 -c "import sys; sys.exit(0 if $acc >= $min_acc else 1)" || fail "accuracy $acc < $min_acc"
  [ "$(field workers)" = 3 ] || fail "workers $(field workers)"
  echo "het: rc 0, test accuracy $acc, 3 workers on n2 (2) and n3 (1)"
  ;;
kill)
  id=$(submit "$src/ops/slurm/hetero.sbatch" "$config" "${job[@]}" --set train.sample_ms=0.4 --set train.speeds=1)
  wait_for "training starts" 120 || fail "training did not start"
  sleep 3
  victim=$(ours "^$bin node --role worker" | head -1)  # (the task itself, not its srun)
  [ -n "$victim" ] || fail "no worker task to kill"
  kill -9 "$victim"
  for ((i = 0; i < 3000; i++)); do squeue -h -j "$id" 2>/dev/null | grep -q . || break; sleep 0.2; done
  grep -q "the scheduler exited with code 0" "$log" || fail "the job did not end with code 0"
  [ "$(field lost_workers)" = 1 ] || fail "lost_workers $(field lost_workers)"
  applied=$(field applied_samples)
  python3 -c "import sys; e=$applied/60000; print('epochs applied', e); sys.exit(0 if $epochs - 0.01 <= e <= $epochs + 0.05 else 1)" \
    || fail "epochs not trained once"
  acc=$(field test_accuracy)
  python3 -c "import sys; sys.exit(0 if $acc >= $min_acc else 1)" || fail "accuracy $acc < $min_acc"
  echo "kill: a worker task SIGKILLed mid-job, rc 0, test accuracy $acc"
  ;;
scancel)
  id=$(submit "$src/ops/slurm/hetero.sbatch" "$config" --epochs 50 --report "$d/submit/r.json")
  wait_for "training starts" 120 || fail "training did not start"
  sleep 2
  scancel "$id"
  for ((i = 0; i < 600; i++)); do squeue -h -j "$id" 2>/dev/null | grep -q . || break; sleep 0.2; done
  sleep 1
  [ -s "$d/submit/r.json" ] || fail "no report after scancel"
  [ "$(field stopped_early)" = True ] || fail "the report does not say stopped: $(field stopped_early)"
  left=$(ours "^$bin node")
  [ -z "$left" ] || fail "Ashlar processes left after scancel: $left"
  echo "scancel: report written (stopped after $(field epochs_trained) epochs), no process left"
  ;;
requeue)
  id=$(submit "$src/ops/slurm/hetero.sbatch" "$config" "${job[@]}" --set train.sample_ms=0.4 --set train.speeds=1 \
       --checkpoint-every 20)
  wait_for "training starts" 120 || fail "training did not start"
  sleep 4
  scontrol requeue "$id" || fail "scontrol requeue"
  wait_for "requeued (restart 1): resuming" 180 || fail "the requeued job did not resume"
  for ((i = 0; i < 3000; i++)); do squeue -h -j "$id" 2>/dev/null | grep -q . || break; sleep 0.2; done
  grep -q "restored version" "$log" || fail "nothing restored"
  tail -1 "$log" | grep -q "the scheduler exited with code 0" || fail "the resumed job did not end with code 0"
  echo "requeue: resumed from the checkpoint, test accuracy $(field test_accuracy)"
  ;;
start)
  # A member that never joins (its step fails at once) fails the start fast, naming it.
  failed_start '*" --role server "*) echo "no store here" >&2; exit 3;;'
  grep -q "the server nodes' step.* before the job had its members; stopping the job" "$log" || fail "not named"
  grep -q "the job's nodes did not come\|stopped while waiting for\|lacked\|has none" "$log" || fail "the scheduler did not say what the job lacked"
  echo "start: a server step that never joined failed the start in $took s, rc $rc"
  grep -E "ended before|lacked|has none|exited with code" "$log" | tail -4
  : > "$log"
  # One task of a step of several (worker class 1's second task) fails before it joins: the
  # start fails as fast as for a whole step, naming the step and the task.
  failed_start '*" --role worker "*) [ "${SLURM_PROCID:-0}" = 1 ] && { echo "no device here" >&2; exit 3; };;'
  grep -q "the worker class 1's step's task 1: Exited with exit code 3 before the job had its members; stopping the job" "$log" \
    || fail "the task is not named"
  echo "task: one task of a step of two failed the start in $took s, rc $rc"
  ;;
loopback)
  out=$(SLURM_JOB_ID=5 SLURM_JOB_NODELIST="localhost,n2" "$bin" node --role worker --join auto 2>&1)
  [ $? -eq 2 ] || fail "not refused: $out"
  echo "$out" | grep -q "localhost (from SLURM_JOB_NODELIST) resolves to 127.0.0.1, this host's loopback, while the job spans 2 hosts" \
    || fail "the refusal does not name it: $out"
  echo "loopback: refused, naming SLURM_JOB_NODELIST"
  ;;
*) fail "unknown case $case" ;;
esac
