"""Parses PromQL expressions with promql-parser (PyPI; Python bindings of the
promql-parser crate, which follows Prometheus' own grammar) and reports those
that do not parse.

Usage: python check_promql.py EXPRS.json   (a JSON array of strings)
Prints one line per expression: "ok" or "error: MESSAGE: EXPR".
"""
import json
import sys

import promql_parser

for expr in json.load(open(sys.argv[1], encoding="utf-8")):
    try:
        promql_parser.parse(expr)
        print("ok")
    except Exception as e:  # the parser raises ValueError with its message
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}: {expr}")
