#!/usr/bin/env bash
# Builds Shardline and runs every ctest suite (unit, golden, e2e, fault; gpu
# tests skip themselves without a device). Extra arguments go to ctest,
# e.g. `bash deploy/test.sh -L golden`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
