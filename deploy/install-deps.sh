#!/usr/bin/env bash
# Installs every Debian package Shardline needs to build and test, then the
# Python test bed (deploy/python-env.sh: a pinned venv with transformers +
# torch for CPU, tokenizers, gguf, jinja2, openai, jsonschema, promql-parser)
# and the real model of the main job (deploy/fetch-models.sh). Idempotent:
# packages already present are skipped by apt, an up-to-date venv and a
# checked model file are kept. Runs `apt-get update` itself.
# Usage: bash deploy/install-deps.sh      (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libcaf-dev
  capnproto libcapnp-dev
  librocksdb-dev
  libopenblas-dev
  libsentencepiece-dev
  nlohmann-json3-dev
  libcli11-dev
  libspdlog-dev libfmt-dev
  libpcre2-dev
  libssl-dev openssl  # openssl: the CLI is the oracle of tests/comm/tls_identity_test.cpp
  libcpp-httplib-dev
  libutf8proc-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  python3 python3-venv
  curl unzip
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/python-env.sh" >/dev/null
bash "$(dirname "$0")/fetch-models.sh"
echo "install-deps: done"
