#!/usr/bin/env bash
# Builds Shardline and runs every ctest suite (unit, golden, e2e, fault,
# validation; gpu tests skip themselves without a device). Extra arguments
# go to ctest to select, e.g. `bash deploy/test.sh -L golden`;
# `-LE validation` leaves out the simulator's validation against this
# machine (about 10 minutes, run alone: docs/simulator.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
