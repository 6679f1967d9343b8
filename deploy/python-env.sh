#!/usr/bin/env bash
# Creates (or refreshes) the Python virtual environment the tests use for the
# field's references: transformers + torch (CPU), tokenizers, gguf, jinja2,
# the official openai SDK, jsonschema, a PromQL parser. Every version is
# pinned in tests/requirements.txt (a full lock, installed with --no-deps).
# Idempotent: a venv built from the same requirements is kept as it is.
#
#   SHARDLINE_CACHE   cache folder (default ~/.cache/shardline): the venv is
#                     $SHARDLINE_CACHE/venv; every wheel is kept in
#                     $SHARDLINE_CACHE/wheels (pip's own HTTP cache stores
#                     nothing from this registry), so a rebuild downloads nothing
#   SHARDLINE_PYTHON_FOR_VENV   interpreter the venv is made from (default
#                     Debian's /usr/bin/python3, python3-venv installed)
#
# Prints the venv's python. Exits non-zero if any package fails to install
# or import: a test bed that is not whole is an error, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${SHARDLINE_CACHE:-$HOME/.cache/shardline}"
venv="$cache/venv"
req="tests/requirements.txt"
base_python="${SHARDLINE_PYTHON_FOR_VENV:-/usr/bin/python3}"
stamp="$venv/.shardline-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"

check_imports() {
  "$venv/bin/python" - <<'PY'
import torch, transformers, tokenizers, gguf, jinja2, openai, jsonschema, promql_parser, numpy, accelerate
x = torch.ones(4, 4) @ torch.ones(4, 4)
assert float(x.sum()) == 64.0
print(f"python-env: torch {torch.__version__} (CPU), transformers {transformers.__version__}, "
      f"gguf, tokenizers {tokenizers.__version__}, openai {openai.__version__}")
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && check_imports >/dev/null 2>&1; then
  echo "python-env: $venv is up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

start=$(date +%s)
rm -rf "$venv"
mkdir -p "$cache"
"$base_python" -m venv "$venv"
wheels="$cache/wheels"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
# Downloads only the wheels the wheelhouse lacks, then installs from it alone.
"${pip[@]}" download -q --no-deps --only-binary=:all: -d "$wheels" -r "$req" >&2
"${pip[@]}" install -q --no-index --find-links "$wheels" --no-deps -r "$req" >&2
if ! check_imports >&2; then
  # torch's import loads CUDA libraries this machine's toolkit lacks: take
  # torch's own full dependency set from PyPI instead (about 3 GB more).
  echo "python-env: torch does not import with the machine's CUDA libraries; installing its full dependencies" >&2
  "${pip[@]}" download -q --only-binary=:all: -d "$wheels" "$(grep -E '^torch==' "$req")" >&2
  "${pip[@]}" install -q --no-index --find-links "$wheels" "$(grep -E '^torch==' "$req")" >&2
  check_imports >&2
fi
echo "$want" >"$stamp"
echo "python-env: built $venv in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1) on disk" >&2
echo "$venv/bin/python"
