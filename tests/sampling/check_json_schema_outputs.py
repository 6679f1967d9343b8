#!/usr/bin/env python3
"""The oracle of the structured-output schema suite: validates outputs
against their JSON schemas with the `jsonschema` package (Draft 2020-12,
with its format checker: date, email, ipv4, uuid, ...; `date-time`, which
jsonschema checks only with an extra package, is checked here as RFC 3339
with Python's datetime).

Input: a JSONL file, one {"name", "schema", "output"} per line ("output" is
the generated text). Prints one line per failure and a summary; exits 1 if
any output is not JSON or does not validate, 2 on bad input.

Usage: check_json_schema_outputs.py OUTPUTS.jsonl
"""
import datetime
import json
import re
import sys

import jsonschema

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def date_time_ok(value):
    if not isinstance(value, str):
        return True  # formats apply to strings only
    if not RFC3339.match(value):
        return False
    try:
        datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    checker.checks("date-time")(date_time_ok)
    failures = 0
    total = 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                case = json.loads(line)
                name, schema, output = case["name"], case["schema"], case["output"]
            except (ValueError, KeyError) as e:
                print(f"line {line_no}: bad input: {e}", file=sys.stderr)
                return 2
            total += 1
            try:
                value = json.loads(output)
            except ValueError as e:
                failures += 1
                print(f"FAIL {name}: not JSON ({e}): {output!r}")
                continue
            errors = sorted(jsonschema.Draft202012Validator(schema, format_checker=checker).iter_errors(value),
                            key=str)
            if errors:
                failures += 1
                print(f"FAIL {name}: {errors[0].message}: {output!r}")
    print(f"{total - failures} of {total} outputs valid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
