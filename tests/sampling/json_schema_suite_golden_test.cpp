// The structured-output schema suite (issue 43) at the grammar layer: 48
// JSON schemas (tests/sampling/data/json_schemas.jsonl: scalars with
// bounds, strings with lengths, patterns (with optional and non-capturing
// groups) and formats, enums and consts,
// nested and deep objects, required / optional fields, additionalProperties
// false and as a schema, arrays with min/max items, prefixItems, anyOf /
// oneOf / allOf, type lists, $ref to $defs and definitions, a recursive
// $ref, extraction-style records). Each is compiled against stories260K's
// and SmolLM2's vocabularies and walked with two seeds
// (tests/sampling/grammar_walk.hpp); every output must end (a stop token)
// and validate against its schema, with the `jsonschema` package from PyPI
// as the oracle (tests/sampling/check_json_schema_outputs.py). Six more
// must be refused: keywords xgrammar would ignore (allOf of several
// schemas, uniqueItems, multipleOf on a number, contains), a format with a
// pattern, and a schema that is not JSON.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sampling/grammar_walk.hpp"
#include "tests/sampling/schema_suite.hpp"

namespace shardline::sampling {
namespace sampling_json_schema_suite_golden_test {

using grammar_walk::generate;
using grammar_walk::Generated;
using grammar_walk::Vocab;

using testing_support::check_schema_outputs;
using testing_support::load_schema_suite;

TEST(JsonSchemaSuite, EveryOutputValidatesAgainstItsSchema) {
  const std::string problem = testing_support::python_env_problem("jsonschema");
  ASSERT_EQ(problem, "");
  const std::vector<nlohmann::json> suite = load_schema_suite();
  ASSERT_GE(suite.size(), 40u);
  const std::filesystem::path out_path =
      std::filesystem::temp_directory_path() / ("shardline_schema_suite_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream out(out_path);
  std::vector<double> compile_ms;
  int num_outputs = 0, num_refused = 0;
  for (const Vocab& v : {grammar_walk::stories260k(), grammar_walk::smollm2()}) {
    for (const nlohmann::json& c : suite) {
      const std::string name = c["name"].get<std::string>();
      const std::string text = testing_support::schema_text(c);
      const GrammarSpec spec{GrammarKind::json_schema, text, {}, false};
      const auto t0 = std::chrono::steady_clock::now();
      auto compiled = v.compiler->compile(spec);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (c.contains("refused")) {
        // What the grammar engine cannot enforce (it would ignore it) and a
        // schema that is not JSON: refused by name, nothing compiled.
        ASSERT_FALSE(compiled.ok()) << name << " compiled";
        EXPECT_EQ(compiled.error().code, ErrorCode::invalid_argument) << name;
        EXPECT_NE(compiled.error().message.find(c["refused"].get<std::string>()), std::string::npos)
            << name << ": " << compiled.error().message;
        ++num_refused;
        continue;
      }
      compile_ms.push_back(ms);
      ASSERT_TRUE(compiled.ok()) << name << ": " << compiled.error().to_string();
      for (const unsigned seed : {1u, 2u}) {
        const Generated g = generate(v, spec, seed, 400);
        ASSERT_TRUE(g.terminated) << name << " seed " << seed << " did not end: " << g.text;
        out << nlohmann::json{{"name", name + " seed " + std::to_string(seed)}, {"schema", c["schema"]},
                              {"output", g.text}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::strict)
            << "\n";
        ++num_outputs;
      }
    }
  }
  out.close();
  EXPECT_GE(num_outputs, 2 * 2 * 40);
  EXPECT_GE(num_refused, 2 * 5);
  const auto r = check_schema_outputs(out_path.string());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(std::to_string(num_outputs) + " of " + std::to_string(num_outputs) + " outputs valid"),
            std::string::npos)
      << r.out;
  std::sort(compile_ms.begin(), compile_ms.end());
  const double median = compile_ms[compile_ms.size() / 2];
  RecordProperty("median_compile_ms", std::to_string(median));
  std::printf("schema suite: %zu compiles, median %.2f ms, max %.2f ms; %d outputs\n", compile_ms.size(), median,
              compile_ms.back(), num_outputs);
  std::filesystem::remove(out_path);
}

// The oracle can fail: an output that breaks its schema is reported.
TEST(JsonSchemaSuite, TheOracleRefusesAnOutputOutsideItsSchema) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("shardline_schema_oracle_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(path);
    out << R"({"name": "in", "schema": {"type": "integer", "maximum": 3}, "output": "3"})" << "\n";
    out << R"({"name": "over", "schema": {"type": "integer", "maximum": 3}, "output": "4"})" << "\n";
    out << R"({"name": "format", "schema": {"type": "string", "format": "date"}, "output": "\"2023-02-30\""})"
        << "\n";
  }
  const auto r = check_schema_outputs(path.string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL over"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL format"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 of 3 outputs valid"), std::string::npos) << r.out;
  std::filesystem::remove(path);
}

}  // namespace sampling_json_schema_suite_golden_test
}  // namespace shardline::sampling
