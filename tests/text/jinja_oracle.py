#!/usr/bin/env python3
"""The oracle of tests/text/jinja_test.cpp: renders each case with Python's
jinja2 exactly as transformers' apply_chat_template does (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension; its tojson filter and raise_exception global).

Usage: jinja_oracle.py CASES.json OUT.json
CASES.json: [{"template": str, "context": {...}}, ...]
OUT.json:   [{"text": str} | {"error": str}, ...]  (same order)
"""
import json
import sys

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' definition: json.dumps, not the HTML-escaping jinja2 filter
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = []
    for case in cases:
        try:
            text = env.from_string(case["template"]).render(**case["context"])
            out.append({"text": text})
        except Exception as e:  # the C++ side must fail too; the message is not compared
            out.append({"error": type(e).__name__ + ": " + str(e)})
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
