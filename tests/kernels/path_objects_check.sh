#!/usr/bin/env bash
# The CPU kernels' instruction-path objects (*_avx2.cpp.o, *_avx512.cpp.o in
# the kernels library, each compiled for its own instructions) define no weak
# symbol: a weak definition (an out-of-line std::vector<float>::resize, say)
# is compiled with that file's flags, and the linker may keep that copy for
# the whole program, so other code would run AVX-512 instructions on a CPU
# without them (kernels/cpu/local_buffer.hpp). The personality-routine
# reference every C++ object carries is data, not code, and is allowed.
# Usage: path_objects_check.sh LIBRARY.a
set -euo pipefail
lib=$(realpath "$1")
members=$(ar t "$lib" | grep -E '_avx(2|512)[a-z0-9_]*\.cpp\.o$' || true)
[[ -n "$members" ]] || { echo "no instruction-path objects in $lib" >&2; exit 1; }
bad=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && ar x "$lib" $members)
for m in $members; do
  # nm lines: "ADDRESS TYPE NAME", or "TYPE NAME" for an undefined one.
  weak=$(nm "$tmp/$m" | awk '{ t = (NF == 3 ? $2 : $1) } t ~ /^[WVu]$/ { print $NF }' |
         grep -v '^DW.ref.__gxx_personality_v0$' | c++filt || true)
  if [[ -n "$weak" ]]; then
    echo "$m defines weak or unique symbols (compiled for its instructions, shared program-wide):" >&2
    echo "$weak" >&2
    bad=1
  else
    echo "$m: no weak symbols"
  fi
done
exit $bad
