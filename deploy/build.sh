#!/usr/bin/env bash
# Configures and builds Shardline into ./build (Release, Ninja). Idempotent.
# Extra CMake arguments are passed through, e.g. -DSHARDLINE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${SHARDLINE_BUILD_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
