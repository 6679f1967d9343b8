#!/usr/bin/env bash
# The layering rule (docs/architecture.md): layers are one-way. A folder may
# include its own headers and those of folders of a LOWER rank, never of a
# folder of the same rank (peers) or a higher one. Exits 1 and names every
# include against the rule. Run by .ci/run and by ctest (test `layering`).
#
#   rank  folders
#   10    cli
#    9    bench, api
#    8    actors
#    7    messages, sim
#    6    orchestrator
#    5    worker
#    4    engine
#    3    model
#    2    kernels, kvstore
#    1    sampling, comm
#    0    common
# tests/, deploy/ and docs/ may include anything.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A rank=(
  [cli]=10 [bench]=9 [api]=9 [actors]=8 [messages]=7 [sim]=7 [orchestrator]=6 [worker]=5
  [engine]=4 [model]=3 [kernels]=2 [kvstore]=2 [sampling]=1 [comm]=1 [common]=0
)

violations=0
checked=0
for folder in "${!rank[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r hit; do
    file="${hit%%:*}"
    rest="${hit#*:}"
    line="${rest%%:*}"
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$rest")
    checked=$((checked + 1))
    [ "$target" = "$folder" ] && continue
    if [ -z "${rank[$target]+x}" ]; then
      continue  # not a layer folder (e.g. a generated header path)
    fi
    if [ "${rank[$target]}" -ge "${rank[$folder]}" ]; then
      echo "layering: $file:$line: $folder (rank ${rank[$folder]}) includes $target (rank ${rank[$target]}): ${rest#*:}" >&2
      violations=$((violations + 1))
    fi
  done < <(grep -rnE '^\s*#\s*include\s+"[a-z_]+/' "$folder" \
             --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' --include='*.h' || true)
done

if [ "$violations" -ne 0 ]; then
  echo "layering: $violations include(s) against the rule (see .ci/check-layers.sh)" >&2
  exit 1
fi
echo "layering: ok ($checked project includes checked)"
