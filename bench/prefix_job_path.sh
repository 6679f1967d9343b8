#!/usr/bin/env bash
# Issue 42's job path on workload (a) (one 1,000-token head + 64-token
# questions, 256 lines, 64 out; stories110m shape, dummy weights) through
# `shardline run`, in four configurations alternated within each rep
# (docs/prefix-caching.md#the-job-path):
#   off       --no-prefix-caching (KV streaming to the node's store, DéjàVu)
#   on        prefix caching, streaming from the end of each cached head
#             (the head goes to the store as a prefix link)
#   on-full   prefix caching, every position streamed (--kv-prefix-mib 0:
#             no prefix blocks in the store, so nothing to link to)
#   on-local  prefix caching, no KV store (--kv-replication 0: no streaming)
# One line per run on stdout: wall seconds, KV bytes streamed, positions the
# store counted from links, positions computed. Each run's final metrics go
# to OUT/<config>_<rep>.prom. Run from the repository root after a build, on
# an otherwise idle machine (about 10 minutes per rep on 2 cores).
#
#   bash bench/prefix_job_path.sh OUT [REPS] [CONFIGS...]
set -euo pipefail
out=${1:?usage: prefix_job_path.sh OUT [REPS] [CONFIGS...]}
reps=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(off on on-full on-local)
source "$(dirname "$0")/prefix_workload_a.sh"  # bin, shape, write_workload_a, metric
mkdir -p "$out"
write_workload_a "$out/a.jsonl"
for rep in $(seq "$reps"); do
  for config in "${configs[@]}"; do
    case "$config" in
      off) flags=(--no-prefix-caching) ;;
      on) flags=() ;;
      on-full) flags=(--kv-prefix-mib 0) ;;
      on-local) flags=(--kv-replication 0) ;;
      *) echo "unknown config $config" >&2; exit 2 ;;
    esac
    data="$out/data_${config}_$rep"
    rm -rf "$data"
    t0=$(date +%s.%N)
    "$bin" run --quiet --model "$shape" --load-format dummy --threads 2 --max-batch 64 --max-model-len 2048 \
      --kv-cache-bytes 4294967296 --failure-timeout-ms 60000 "${flags[@]}" --input "$out/a.jsonl" \
      --output "$out/${config}_$rep.jsonl" --data-dir "$data" --metrics-file "$out/${config}_$rep.prom"
    t1=$(date +%s.%N)
    p="$out/${config}_$rep.prom"
    printf '%-8s rep %d: %6.1f s, streamed %6.2f GB, linked %s positions, computed %s positions\n' "$config" "$rep" \
      "$(echo "$t1 - $t0" | bc)" "$(echo "$(metric "$p" shardline_kv_streamed_bytes_total) / 1000000000" | bc -l)" \
      "$(metric "$p" shardline_kv_linked_tokens_total)" "$(metric "$p" shardline_computed_tokens_total)"
    rm -rf "$data"
  done
done
