#!/usr/bin/env bash
# The layering rule (docs/architecture.md): layers are one-way. A layer may
# include its own headers and those of layers of a LOWER rank, never of a
# layer of the same rank (peers) or a higher one. A layer is a top-level
# folder, or one of the sub-layers below (a folder inside one, e.g.
# engine/policies/, belongs to its layer). Exits 1 and names every include
# against the rule. Run by .ci/run and by ctest (test `layering`).
#
#   rank  layers
#   100   cli
#    90   bench, api
#    80   actors
#    72   sim/calibration  the simulator's calibration and validation
#    70   messages, sim
#    60   orchestrator
#    50   worker
#    44   engine/sidp     SiDP's drivers (in-process, node actors, processes)
#    42   engine/group    executors over a device group, engine builder
#    41   engine/seesaw   Seesaw's phases and KV mover (the step loop's phase hook)
#    40   engine          the core: engine loop, scheduler, KV, policies/
#    30   model
#    20   kernels, kvstore
#    10   sampling, comm
#     5   text            tokenizers, Jinja, chat templates
#     0   common
# tests/, deploy/ and docs/ may include anything.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A rank=(
  [cli]=100 [bench]=90 [api]=90 [actors]=80 [messages]=70 [sim/calibration]=72 [sim]=70 [orchestrator]=60 [worker]=50
  [engine/sidp]=44 [engine/group]=42 [engine/seesaw]=41 [engine]=40 [model]=30 [kernels]=20 [kvstore]=20
  [sampling]=10 [comm]=10 [text]=5 [common]=0
)

# The layer of a path relative to the root ("engine/group/tcp_group.hpp" ->
# engine/group, "engine/policies/x.hpp" -> engine); empty when none.
layer_of() {
  local path=$1 top=${1%%/*} rest sub
  rest=${path#*/}
  if [[ $rest == */* ]]; then
    sub="$top/${rest%%/*}"
    if [[ -n ${rank[$sub]+x} ]]; then
      echo "$sub"
      return
    fi
  fi
  [[ -n ${rank[$top]+x} ]] && echo "$top"
  return 0
}

violations=0
checked=0
for folder in "${!rank[@]}"; do
  [[ $folder == */* ]] && continue  # sub-layers are walked with their folder
  [ -d "$folder" ] || continue
  while IFS= read -r hit; do
    file="${hit%%:*}"
    rest="${hit#*:}"
    line="${rest%%:*}"
    target_path=$(sed -E 's/.*#include "([a-z_/]+\.[a-z]+)".*/\1/' <<<"$rest")
    checked=$((checked + 1))
    from=$(layer_of "$file")
    to=$(layer_of "$target_path")
    [ -z "$to" ] && continue  # not a layer folder (e.g. a generated header path)
    [ "$to" = "$from" ] && continue
    if [ "${rank[$to]}" -ge "${rank[$from]}" ]; then
      echo "layering: $file:$line: $from (rank ${rank[$from]}) includes $to (rank ${rank[$to]}): ${rest#*:}" >&2
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
