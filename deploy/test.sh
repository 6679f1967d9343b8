#!/usr/bin/env bash
# Builds Shardline and runs the ctest suites (unit, golden, e2e, fault; gpu
# tests skip themselves without a device). Extra arguments go to ctest
# instead of the default selection, e.g. `bash deploy/test.sh -L golden`.
# The default leaves out the label `validation`: the simulator against this
# machine's timings (about 15 minutes, run alone), a measurement that a
# noisy machine fails, so it is no CI test; `bash deploy/test.sh -L
# validation` runs it on a quiet machine (docs/simulator.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
if [[ $# -eq 0 ]]; then
  set -- -LE validation
fi
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
