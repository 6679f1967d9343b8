#!/usr/bin/env bash
# Configures and builds Shardline into ./build (Release, Ninja). Idempotent.
#   bash deploy/build.sh [--target T]... [CMake arguments]
# --target builds only T and what it needs (README's first command builds
# `shardline`, the binary, without the test programs); without it everything
# is built. Further arguments go to CMake's configure step, e.g.
# -DSHARDLINE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${SHARDLINE_BUILD_JOBS:-$(nproc)}"
targets=()
while [[ $# -ge 2 && $1 == --target ]]; do
  targets+=(--target "$2")
  shift 2
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs" "${targets[@]}"
