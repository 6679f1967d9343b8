#pragma once
// The Python test bed (deploy/python-env.sh): a pinned virtual environment
// with the field's references (transformers + torch on CPU, tokenizers,
// gguf, jinja2, the official openai SDK, jsonschema, promql-parser). Tests
// that compare against them run scripts with kPython. A missing or broken
// venv fails those tests with the command that builds it: a reference that
// did not install is a failure, never a skip.
#include <string>

#include "tests/support/process.hpp"

namespace shardline::testing_support {

/// The venv's interpreter (CMake's SHARDLINE_PYTHON, by default
/// ~/.cache/shardline/venv/bin/python).
inline const std::string kPython = SHARDLINE_PYTHON;

/// "" when kPython runs and imports every module of `modules` (a
/// comma-separated Python import list, e.g. "openai" or "torch, transformers");
/// otherwise what went wrong and how to fix it, for the test's failure message.
inline std::string python_env_problem(const std::string& modules) {
  const auto r = run_command("'" + kPython + "' -c 'import " + modules + "'");
  if (r.exit_code == 0) return "";
  return kPython + " cannot import " + modules + " (run `bash deploy/install-deps.sh` or `bash deploy/python-env.sh`): " +
         r.out;
}

}  // namespace shardline::testing_support
