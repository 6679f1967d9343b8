#!/usr/bin/env bash
# Builds Shardline and runs every ctest suite (unit, golden, e2e, fault; gpu
# tests skip themselves without a device). Extra arguments go to ctest
# instead of the default selection, e.g. `bash deploy/test.sh -L golden`.
# The default leaves out the `validation` label (the simulator against this
# machine's measurements, docs/simulator.md): `bash deploy/test.sh -L
# validation` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
if [ "$#" -eq 0 ]; then set -- -LE validation; fi
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
