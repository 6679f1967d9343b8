#pragma once
// The structured-output JSON schema suite (tests/sampling/data/
// json_schemas.jsonl; issue 43) and its oracle, the `jsonschema` package
// (tests/sampling/check_json_schema_outputs.py), shared by the grammar-layer
// walk and the engine runs on real models.
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/python.hpp"

namespace shardline::testing_support {

/// The suite's cases: {"name", "schema"} (or "schema_text", not JSON), and
/// "refused" (a phrase of the error) for those that must not compile.
inline std::vector<nlohmann::json> load_schema_suite() {
  std::ifstream in(std::string(SHARDLINE_SOURCE_DIR) + "/tests/sampling/data/json_schemas.jsonl");
  std::vector<nlohmann::json> suite;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) suite.push_back(nlohmann::json::parse(line));
  return suite;
}

/// The schema text a case compiles.
inline std::string schema_text(const nlohmann::json& c) {
  return c.contains("schema_text") ? c["schema_text"].get<std::string>() : c["schema"].dump();
}

/// Runs the oracle on a JSONL of {"name", "schema", "output"}: exit code 0
/// and "N of N outputs valid" when every output parses and validates.
inline CommandResult check_schema_outputs(const std::string& jsonl_path) {
  return run_command("'" + kPython + "' '" + SHARDLINE_SOURCE_DIR +
                     "/tests/sampling/check_json_schema_outputs.py' '" + jsonl_path + "'");
}

}  // namespace shardline::testing_support
