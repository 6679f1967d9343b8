#!/usr/bin/env bash
# `shardline run` on a real full disk (issue 46, items 7 and 8), driven by
# tests/cli/disk_full_e2e_test.cpp. Run inside a private mount namespace
# (`unshare --mount --propagation private`), so the small tmpfs it mounts
# vanishes with it.
#
#   disk_full_e2e.sh data|kv|output WORK SHARDLINE MODEL FREE_KIB
#
# Mounts an 8 MiB tmpfs at WORK/disk and puts the data dir (`data`), the KV
# store's part of it (`kv`: the data dir's `kv` is a link to the tmpfs) or
# the output file (`output`) on it, fills it up to FREE_KIB KiB free, and
# starts `run` on WORK/in.jsonl. `kv` also lets the KV store take the disk's
# last bytes (--kv-disk-reserve-mib 0), so its RocksDB hits ENOSPC; the job
# store stays on the real disk, so it never races the KV store for the
# tmpfs's last bytes.
# `data`, `output`: once the run logs that its job paused for a full disk,
# it checks the run is still alive, frees the space and waits for the run to
# finish, and prints "paused", "resumed" and the run's exit code. `kv`: the
# job store has room, so the job runs on while the KV store cannot write; it
# waits for the run and prints its exit code. The caller checks the output
# (WORK/out.jsonl, copied off the tmpfs).
set -euo pipefail
case_name=$1 work=$2 bin=$3 model=$4 free_kib=$5

mkdir -p "$work/disk"
mount -t tmpfs -o size=8m tmpfs "$work/disk"
trap 'umount -l "$work/disk" 2>/dev/null || true' EXIT
extra=()
if [ "$case_name" = data ]; then
  data="$work/disk/data" out="$work/out.jsonl"
elif [ "$case_name" = kv ]; then
  data="$work/data" out="$work/out.jsonl"
  extra=(--kv-disk-reserve-mib 0)
  mkdir -p "$data" "$work/disk/kv"
  ln -s "$work/disk/kv" "$data/kv"
else
  data="$work/data" out="$work/disk/out.jsonl"
fi
total_kib=$(df -k --output=avail "$work/disk" | tail -1)
dd if=/dev/zero of="$work/disk/filler" bs=1k count=$((total_kib - free_kib)) status=none

"$bin" run --model "$model" --input "$work/in.jsonl" --output "$out" --data-dir "$data" "${extra[@]}" \
  >"$work/run.log" 2>&1 &
run_pid=$!
if [ "$case_name" = kv ]; then
  # The job store has room: the job runs on while the KV store cannot write.
  rc=0
  timeout 120 tail --pid="$run_pid" -f /dev/null || { echo "the run did not finish"; kill "$run_pid"; }
  wait "$run_pid" || rc=$?
  echo "run exit $rc"
  tr '\r' '\n' <"$work/run.log" | grep -v '^\[ *#* *\] ' || true
  exit 0
fi
for _ in $(seq 600); do  # 120 s
  grep -q "job paused: disk_full" "$work/run.log" && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.2
done
if ! grep -q "job paused: disk_full" "$work/run.log"; then
  echo "the job never paused for a full disk"
  kill "$run_pid" 2>/dev/null || true
  cat "$work/run.log"
  exit 1
fi
echo paused
sleep 2  # it stays paused, alive, while the disk is full
if ! kill -0 "$run_pid" 2>/dev/null; then
  echo "the run exited on a full disk"
  cat "$work/run.log"
  exit 1
fi
rm "$work/disk/filler"
rc=0
wait "$run_pid" || rc=$?
grep -q "resumed" "$work/run.log" && echo resumed
echo "run exit $rc"
[ "$case_name" = output ] && cp "$out" "$work/out.jsonl"
tr '\r' '\n' <"$work/run.log" | grep -v '^\[ *#* *\] ' || true  # the log without the progress bar
