#!/usr/bin/env bash
# A checkpointed job whose disk fills up, and then has room again (a small tmpfs, made
# larger while the job runs):
#   1. while the disk is full, each cut that does not fit fails with an error naming the
#      checkpoint store and "No space left on device"; training goes on, and the last
#      committed cut stands (`checkpoint show` reads it, checksums intact, while the job
#      runs);
#   2. a store that cannot reopen on the full disk stays readable and tries again; once
#      there is room, the stores reopen and cuts are committed again: the process
#      neither aborts (RocksDB 7's LOG and WAL writers assert after a failed write, so the
#      stores keep no LOG file and reopen before writing again) nor loses a shard;
#   3. the job ends well, and a resume starts from a cut taken after the disk had room.
# Needs root to mount a tmpfs: exit 77 (skipped) where it cannot.
# Usage: full_disk_test.sh ASHLAR_BINARY SOURCE_DIR
set -uo pipefail
ashlar="$1"
src="$2"
work=$(mktemp -d)
fs="$work/fs"
mkdir -p "$fs"
pid=""
cleanup() {
  if [[ -n $pid ]]; then
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  umount "$fs" 2>/dev/null || umount -l "$fs" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; [[ -f $work/train.log ]] && grep -v "epoch .* samples/s" "$work/train.log" | tail -40; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "mounting a small tmpfs needs root"
# 3 MB: the first cut of two shards of the MLP (about 1 MB each with the optimizer's
# velocity) fits, the second does not.
mount -t tmpfs -o size=3m tmpfs "$fs" 2>/dev/null || skip "cannot mount a tmpfs here"

args=("$src/ops/configs/fmnist-mlp.toml" --policy bsp --workers 2 --servers 2 --epochs 100 --gpus none
      --set run.time_limit=30 --set train.speeds=1,1 --set train.sample_ms=0.3 --set run.progress_interval=0
      --checkpoint-dir "$fs/ck" --checkpoint-every 100)
"$ashlar" train "${args[@]}" --report "$work/report.json" > "$work/train.log" 2>&1 &
pid=$!
# Cuts fail on the full disk before it gets room: the stores of each later cut are reopened
# while the disk is still full (which fails: they stay readable, and try again later).
# After each failed cut a filler file takes what room is left, so that the next reopen meets
# a disk with no room at all; a reopen can still find a few pages that closing the store
# freed, succeed and fail at the write, so the wait goes on (up to 30 s) until a reopen
# has failed.
abandoned() { grep -c "job: checkpoint cut [0-9]* abandoned" "$work/train.log"; }
reopen_failed() {
  grep -q "reopening the checkpoint store $fs/ck/shard-[01]\.[0-9]* after a failed write: .*No space left on device" \
    "$work/train.log"
}
filled=0
for _ in $(seq 300); do
  n=$(abandoned)
  [[ $n -ge 2 ]] && reopen_failed && break
  if [[ $n -gt $filled ]]; then
    filled=$n
    dd if=/dev/zero of="$fs/filler.$filled" bs=4k 2>/dev/null
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[[ $(abandoned) -ge 2 ]] || fail "no two cuts abandoned on the full disk"
grep -q "failed: io_error: writing to the checkpoint store $fs/ck/shard-[01]\.[0-9]*: .*No space left on device" "$work/train.log" \
  || fail "the failed cut's error does not name the checkpoint store and the full disk"
failed=$(grep -o "checkpoint cut [0-9]* (version [0-9]*) failed" "$work/train.log" | head -1 | grep -o "cut [0-9]*" | grep -o "[0-9]*")
[[ -n $failed ]] || fail "no shard's cut failed"
reopen_failed || fail "no store tried to reopen on the full disk"
# The last committed cut stands while the disk is full.
"$ashlar" checkpoint show "$fs/ck" > "$work/show-full.txt" 2>&1 || { cat "$work/show-full.txt"; fail "checkpoint show failed on a full disk"; }
before=$(grep -o "shard 0, cut [0-9]*" "$work/show-full.txt" | grep -o "[0-9]*$")
[[ -n $before && $before -lt $failed ]] && grep -q "shard 0, cut $before, .*checksum ok" "$work/show-full.txt" \
  && grep -q "shard 1, cut $before, .*checksum ok" "$work/show-full.txt" \
  || { cat "$work/show-full.txt"; fail "no committed cut before the failed cut $failed is intact on the full disk"; }
kill -0 "$pid" 2>/dev/null || fail "the job ended while the disk was full"
rm -f "$fs"/filler.*
mount -o remount,size=64m "$fs" || fail "cannot make the tmpfs larger"
wait "$pid"
code=$?
pid=""
[[ $code -eq 0 ]] || fail "the job exited with $code"
grep -q "Assertion" "$work/train.log" && fail "RocksDB asserted"
grep -q "reopened after a failed write; writing again" "$work/train.log" || fail "no store reopened once the disk had room"
grep -q '"test_accuracy"' "$work/report.json" || fail "no report"
"$ashlar" checkpoint show "$fs/ck" > "$work/show.txt" 2>&1 || { cat "$work/show.txt"; fail "checkpoint show failed"; }
cut=$(grep -o "shard 0, cut [0-9]*" "$work/show.txt" | grep -o "[0-9]*$")
[[ -n $cut && -n $failed && $cut -gt $failed ]] || { cat "$work/show.txt"; fail "no cut committed after the failed cut $failed (newest: $cut)"; }
grep -q "shard 1, cut $cut, .*checksum ok" "$work/show.txt" || { cat "$work/show.txt"; fail "shard 1 lacks cut $cut"; }
echo "cut $before committed; cut $failed failed on the full disk; cut $cut committed once it had room"

# The resume starts from that cut.
"$ashlar" train "${args[@]}" --resume --set run.time_limit=2 > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; fail "the resume failed"; }
grep -q "resuming from $fs/ck, checkpoint cut $cut " "$work/resume.log" \
  || { grep -v "epoch .* samples/s" "$work/resume.log"; fail "the resume did not start from cut $cut"; }
echo "resumed from cut $cut"
