#!/bin/bash
# The body of ops/slurm/ashlar.sbatch and ops/slurm/hetero.sbatch: one Ashlar job on the
# Slurm allocation it runs in, every process a job step (srun), so that Slurm's accounting,
# signals and limits apply.
#
#   one allocation: the scheduler and the server nodes on the first host (sharing it with
#     its workers), one worker node per task;
#   a heterogeneous job: component 0 runs the scheduler (its first task) and the server
#     nodes (its other tasks, at least one), each further component is a worker class: one
#     worker node per task, with that component's slots, devices and memory (speeds are
#     measured by the job, never given).
#
# Every node finds the scheduler with `--join auto` (Slurm's node lists: the first host of
# the first component, on port 20000 + job id mod 10000 unless ASHLAR_PORT says). The
# cluster token is made per job, mode 0600, in the job's directory (ASHLAR_JOB_DIR, default
# SUBMIT_DIR/.ashlar/JOB_ID, which every host must see), unless ASHLAR_TOKEN_FILE names one.
# The job checkpoints into the job's directory; a requeued job (SLURM_RESTART_COUNT > 0)
# resumes from it. scancel stops the job as Ctrl-C does: the workers finish their step, the
# report is written, every process exits. A worker task lost mid-job is survived while
# train.min_workers workers remain (the scheduler's rule); the exit code is the scheduler's.
#
# Variables: ASHLAR (the executable, default `ashlar` on PATH), ASHLAR_JOB_DIR,
# ASHLAR_TOKEN_FILE, ASHLAR_PORT, ASHLAR_TLS_DIR, ASHLAR_SERVERS (one allocation: server nodes, default 1).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: sbatch ops/slurm/ashlar.sbatch CONFIG [train options]   (or hetero.sbatch)" >&2
  exit 2
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
  echo "ashlar-job.sh: not inside a Slurm job (SLURM_JOB_ID is unset): submit it with sbatch" >&2
  exit 2
fi
ASHLAR=${ASHLAR:-ashlar}
config=$1
shift
job_dir=${ASHLAR_JOB_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/.ashlar/$SLURM_JOB_ID}
mkdir -p "$job_dir" && chmod 700 "$job_dir" || { echo "ashlar-job.sh: cannot make $job_dir" >&2; exit 1; }
token=${ASHLAR_TOKEN_FILE:-$job_dir/token}
if [ ! -s "$token" ]; then
  (umask 077 && head -c 32 /dev/urandom | base64 > "$token") || { echo "ashlar-job.sh: cannot write $token" >&2; exit 1; }
fi
# Mutual TLS on the cluster's network: a CA and one certificate of this job's own (made
# once, kept in the job's directory with it), unless ASHLAR_TLS_DIR names the user's.
tls=${ASHLAR_TLS_DIR:-$job_dir/tls}
if [ ! -s "$tls/node.key" ]; then
  "$ASHLAR" cert --ca "$job_dir/ca" --out "$tls" --name "ashlar-job-$SLURM_JOB_ID" >/dev/null \
    || { echo "ashlar-job.sh: cannot make the job's certificate in $tls" >&2; exit 1; }
fi
creds=(--token-file "$token" --tls "$tls")
here=${SLURMD_NODENAME:-$(hostname)}
steps=(--kill-on-bad-exit=0 --wait=0 --overlap)

# The shape: how many server nodes and worker nodes, and where each step runs.
workers=0
if [ -n "${SLURM_HET_SIZE:-}" ]; then
  servers=$(( ${SLURM_NTASKS_HET_GROUP_0:-1} - 1 ))
  [ "$servers" -ge 1 ] || servers=1
  control=(--het-group=0)
  for ((k = 1; k < SLURM_HET_SIZE; k++)); do
    var=SLURM_NTASKS_HET_GROUP_$k
    workers=$(( workers + ${!var:-0} ))
  done
else
  servers=${ASHLAR_SERVERS:-1}
  control=()
  workers=${SLURM_NTASKS:-1}
fi
if [ "$workers" -lt 1 ]; then
  echo "ashlar-job.sh: the job has no worker tasks (a heterogeneous job needs a component after the first)" >&2
  exit 2
fi
# The file, then these, then the command line: what the user passes wins.
export ASHLAR_TRAIN_WORKERS=${ASHLAR_TRAIN_WORKERS:-$workers}
export ASHLAR_TRAIN_SERVERS=${ASHLAR_TRAIN_SERVERS:-$servers}
rm -f "$job_dir/job-state"
resume=()
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -d "$job_dir/checkpoints" ]; then
  resume=(--resume)
  echo "[ashlar-job] requeued (restart ${SLURM_RESTART_COUNT}): resuming from $job_dir/checkpoints"
fi
echo "[ashlar-job] job $SLURM_JOB_ID: scheduler on $here, $servers server and $workers worker nodes; token $token"

srun "${control[@]}" "${steps[@]}" --nodes=1 --ntasks=1 -w "$here" --job-name=ashlar-scheduler \
  "$ASHLAR" node --role scheduler --listen auto --exit-after-job "${creds[@]}" --job-state-file "$job_dir/job-state" \
  "$config" --checkpoint-dir "$job_dir/checkpoints" "${resume[@]}" "$@" &
scheduler=$!
# Each member step's srun says on its stderr which of its tasks ended and how ("srun: error:
# n2: task 1: Exited with exit code 3"): kept (and passed on) in the job's directory, so that
# one task of a step of several that fails before the job has its members fails the start
# as a whole step's end does.
rm -f "$job_dir"/step-*.err
srun "${control[@]}" "${steps[@]}" --nodes=1 --ntasks="$servers" -w "$here" --job-name=ashlar-servers \
  "$ASHLAR" node --role server --join auto --hold-shards-on-signal "${creds[@]}" \
  2> >(tee -a "$job_dir/step-0.err" >&2) &
members=($!)
member_names=("server nodes'")
if [ -n "${SLURM_HET_SIZE:-}" ]; then
  for ((k = 1; k < SLURM_HET_SIZE; k++)); do
    srun --het-group="$k" "${steps[@]}" --job-name="ashlar-workers-$k" \
      "$ASHLAR" node --role worker --join auto "${creds[@]}" 2> >(tee -a "$job_dir/step-$k.err" >&2) &
    members+=($!)
    member_names+=("worker class $k's")
  done
else
  srun "${steps[@]}" --job-name=ashlar-workers "$ASHLAR" node --role worker --join auto "${creds[@]}" \
    2> >(tee -a "$job_dir/step-1.err" >&2) &
  members+=($!)
  member_names+=("worker nodes'")
fi
# The first task of member step $1 that ended with an error, as its srun said ("" for none).
task_failed() {
  grep -m1 -oE "task [0-9]+: (Exited with exit code [1-9][0-9]*|Killed|Terminated|Segmentation fault|Aborted)" \
    "$job_dir/step-$1.err" 2>/dev/null
}

# scancel (or a signal to this script) reaches every step itself: wait for the scheduler's
# step, which writes the report, however many signals come meanwhile. A member step that
# ends before the job has its members (the scheduler's job-state file) fails the start at
# once, naming it, as `ashlar launch` does; once the job runs, a lost task is the
# scheduler's to survive.
trap 'echo "[ashlar-job] stop requested: the scheduler stops the job after the workers'"'"' step"' TERM INT
failed_start=""
while kill -0 "$scheduler" 2>/dev/null; do
  if [ -z "$failed_start" ] && ! grep -qx running "$job_dir/job-state" 2>/dev/null; then
    for i in "${!members[@]}"; do
      task=$(task_failed "$i")
      if ! kill -0 "${members[$i]}" 2>/dev/null || [ -n "$task" ]; then
        failed_start=${member_names[$i]}
        if [ -n "$task" ]; then
          echo "[ashlar-job] the $failed_start step's $task before the job had its members; stopping the job" >&2
        else
          echo "[ashlar-job] the $failed_start step ended before the job had its members; stopping the job" >&2
        fi
        # The scheduler's task runs on this host: its own SIGTERM ends the wait for the nodes
        # with the report naming what the job lacked (a signal to its srun would kill it).
        pkill -TERM -f "^[^ ]+ node --role scheduler .*$job_dir/job-state" 2>/dev/null \
          || kill -TERM "$scheduler" 2>/dev/null
        break
      fi
    done
  fi
  sleep 0.5
done
wait "$scheduler"
code=$?
[ -n "$failed_start" ] && [ "$code" = 0 ] && code=1
# The scheduler shut the cluster down: the other steps end; those that do not in 30 s are stopped.
for ((i = 0; i < 300 && ${#failed_start} == 0; i++)); do
  alive=0
  for p in "${members[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break
  sleep 0.1
done
for p in "${members[@]}"; do kill -TERM "$p" 2>/dev/null; done
wait 2>/dev/null
echo "[ashlar-job] the scheduler exited with code $code"
exit "$code"
