#!/usr/bin/env bash
# Installs every Debian package Shardline needs to build and test. Idempotent:
# packages already present are skipped by apt. Runs `apt-get update` itself.
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
  libssl-dev
  libcpp-httplib-dev
  libutf8proc-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  python3 python3-jinja2
  curl
)
# The openai-SDK test runs the official client under Node.js with npm. A
# machine that has them from elsewhere (e.g. NodeSource's nodejs, which
# bundles npm) keeps them; otherwise Debian's packages.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
