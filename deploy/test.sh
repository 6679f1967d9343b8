#!/usr/bin/env bash
# Builds Shardline and runs the ctest suites (unit, golden, e2e, fault; gpu
# tests skip themselves without a device). Extra arguments go to ctest
# instead of the default selection, e.g. `bash deploy/test.sh -L golden`.
# The default leaves out the label `validation`: the simulator against this
# machine's timings (about 15 minutes, run alone), a measurement that a
# noisy machine fails, so it is no CI test; `bash deploy/test.sh -L
# validation` runs it on a quiet machine (docs/simulator.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
if [[ $# -eq 0 ]]; then
  set -- -LE validation
fi
# The JUnit file lets the last lines of the log say why each failed test
# failed (deploy/ctest_failures.py), not only which.
junit=build/Testing/ctest-junit.xml
rm -f "$junit"
rc=0
ctest --test-dir build --output-on-failure --output-junit "$PWD/$junit" -j "$(nproc)" "$@" || rc=$?
if [[ $rc -ne 0 && -f $junit ]]; then
  python3 deploy/ctest_failures.py "$junit" || true
fi
exit "$rc"
