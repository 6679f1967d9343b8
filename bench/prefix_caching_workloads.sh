#!/usr/bin/env bash
# Issue 42's prefix-caching workloads (docs/prefix-caching.md#benchmark),
# caching off and on, alternated, each configuration REPS times; one JSON
# line per run into OUT/<workload>_<config>.jsonl. Run from the repository
# root after a build, on an otherwise idle machine (about 25 minutes on 2
# cores at REPS=2).
#
#   bash bench/prefix_caching_workloads.sh OUT [REPS]
set -euo pipefail
out=${1:?usage: prefix_caching_workloads.sh OUT [REPS]}
reps=${2:-2}
bin=./build/cli/shardline
shape=${SHAPE:-../shared/models/shapes/stories110m}
mkdir -p "$out"
run() {
  local name=$1
  shift
  echo "== $name $(date +%T)" >&2
  "$bin" bench --shape "$shape" --threads 2 --max-batch 64 "$@" 2>/dev/null | tail -1 >>"$out/$name.jsonl"
}
few=(--num-prompts 64 --input-len 864 --few-shot 8 --few-shot-pool 32 --few-shot-len 100 --output-len 64)
for _ in $(seq "$reps"); do
  run d_off --num-prompts 64 --input-len 256 --output-len 64
  run d_on --num-prompts 64 --input-len 256 --output-len 64 --enable-prefix-caching
  run b_off "${few[@]}"
  run b_on "${few[@]}" --enable-prefix-caching
  run b_sorted "${few[@]}" --enable-prefix-caching --prefix-order sorted
  run c_off --num-prompts 64 --n 8 --input-len 256 --output-len 64
  run c_on --num-prompts 64 --n 8 --input-len 256 --output-len 64 --enable-prefix-caching
done
for _ in $(seq "$reps"); do
  run a_off --num-prompts 256 --input-len 1064 --shared-prefix-len 1000 --output-len 64
  run a_on --num-prompts 256 --input-len 1064 --shared-prefix-len 1000 --output-len 64 --enable-prefix-caching
done
echo done >&2
