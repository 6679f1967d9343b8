#!/usr/bin/env bash
# Issue 42's restart target (docs/prefix-caching.md#a-restarted-node): job
# (a) (one 1,000-token head + 64-token questions, 256 lines, 64 out) run by
# `shardline run` over a fresh data dir (its KV store empty: the head is
# computed), then again by a new process over the same data dir (a restarted
# node: the head's blocks come from the KV store's prefix tier), REPS times.
# Each run's final metrics go to OUT/<cold|warm>_<rep>.prom; one line per run
# on stdout: wall seconds, prompt positions fetched from the store, restored
# from the tier, computed. Run from the repository root after a build, on an
# otherwise idle machine (about 3 minutes per rep on 2 cores).
#
#   bash bench/prefix_store_restart.sh OUT [REPS]
set -euo pipefail
out=${1:?usage: prefix_store_restart.sh OUT [REPS]}
reps=${2:-3}
source "$(dirname "$0")/prefix_workload_a.sh"  # bin, shape, write_workload_a, metric
mkdir -p "$out"
write_workload_a "$out/a.jsonl"
for rep in $(seq "$reps"); do
  data="$out/data_$rep"
  rm -rf "$data" "$out/cold_$rep.jsonl" "$out/warm_$rep.jsonl"
  for phase in cold warm; do
    t0=$(date +%s.%N)
    "$bin" run --quiet --model "$shape" --load-format dummy --threads 2 --max-batch 64 --max-model-len 2048 --kv-cache-bytes 4294967296 \
      --failure-timeout-ms 60000 --input "$out/a.jsonl" \
      --output "$out/${phase}_$rep.jsonl" --data-dir "$data" --metrics-file "$out/${phase}_$rep.prom"
    t1=$(date +%s.%N)
    p="$out/${phase}_$rep.prom"
    printf '%s rep %d: %.1f s, fetched from the KV store %s, restored from the tier %s, computed %s positions\n' \
      "$phase" "$rep" "$(echo "$t1 - $t0" | bc)" "$(metric "$p" shardline_prefix_store_fetched_tokens_total)" \
      "$(metric "$p" shardline_prefix_tier_restored_tokens_total)" "$(metric "$p" shardline_computed_tokens_total)"
  done
  rm -rf "$data"
done
