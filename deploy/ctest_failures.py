#!/usr/bin/env python3
"""Prints one line per failed ctest test, from ctest's JUnit file: the test,
and where and why gtest says it failed (the first failure's location and
the lines after it, shortened). deploy/test.sh prints it after ctest, so the
last lines of a CI log say why a test failed, not only which.

Usage: ctest_failures.py JUNIT_XML [--max-chars N]
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET

# gtest: "/path/file.cpp:123: Failure" then the expression and the values.
FAILURE = re.compile(r"^(?:.*/)?([^/\s]+:\d+): Failure$")


def why(output: str, lines_after: int = 4) -> str:
    """The first gtest failure of `output`: "file:line: msg | msg ..."."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = FAILURE.match(line.strip())
        if m:
            after = [l.strip() for l in lines[i + 1:i + 1 + lines_after] if l.strip()]
            return m.group(1) + ": " + " | ".join(after)
    # No gtest failure line: a crash, a timeout or a script test; the last
    # lines say most.
    tail = [l.strip() for l in lines if l.strip()][-3:]
    return " | ".join(tail) if tail else "(no output)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("junit")
    ap.add_argument("--max-chars", type=int, default=900)
    args = ap.parse_args()
    try:
        root = ET.parse(args.junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"ctest_failures: cannot read {args.junit}: {e}", file=sys.stderr)
        return 2
    failed = 0
    for case in root.iter("testcase"):
        if case.get("status") not in ("fail", "failed") and case.find("failure") is None:
            continue
        failed += 1
        out = case.findtext("system-out") or ""
        seconds = float(case.get("time") or 0)
        line = f"FAILED {case.get('name')} after {seconds:.1f} s: {why(out)}"
        print(line[: args.max_chars])
    if failed:
        print(f"{failed} test(s) failed; their whole output is above (--output-on-failure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
