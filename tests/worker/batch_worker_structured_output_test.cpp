// Structured outputs through the batch worker (issue 43): a line's grammar
// fields compile once per distinct spec, constrain its choices (n > 1
// included), and survive a resume; a grammar the engine cannot compile or
// enforce is the line's invalid_response_format, and the other lines of the
// job run on.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <utility>

#include "tests/support/stories_reference.hpp"
#include "worker/batch_worker.hpp"

namespace shardline::worker {
namespace worker_batch_worker_structured_output_test {

using testing_support::kStoriesDir;
using Key = std::pair<std::uint64_t, std::uint64_t>;

BatchWorker make_worker() {
  engine::EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 4u << 20;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.num_threads = 1;
  auto e = engine::build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  auto w = BatchWorker::create(std::move(e).value(), "so");
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().to_string());
  return std::move(w).value();
}

BatchRequest line(std::uint64_t index, std::string kind, std::string text, std::vector<std::string> choices = {}) {
  BatchRequest r;
  r.job_id = 3;
  r.line_index = index;
  r.custom_id = "line" + std::to_string(index);
  r.prompt = "Once upon a time, Lily";
  r.params.temperature = 0.0f;
  r.params.max_tokens = 80;
  r.return_token_ids = true;
  r.grammar_kind = std::move(kind);
  r.grammar_text = std::move(text);
  r.grammar_choices = std::move(choices);
  r.grammar_any_whitespace = false;
  return r;
}

std::map<Key, BatchResult> run_all(BatchWorker& w) {
  std::map<Key, BatchResult> out;
  for (int i = 0; i < 100000 && w.has_work(); ++i) {
    auto r = w.step();
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (!r.ok()) break;
    for (BatchResult& res : r.value()) out[{res.job_id, res.line_index}] = std::move(res);
  }
  return out;
}

const std::string kSchema =
    R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "n": {"type": "integer",)"
    R"( "minimum": 1, "maximum": 3}}, "required": ["mood", "n"], "additionalProperties": false})";

TEST(BatchWorkerStructuredOutput, LinesMatchTheirGrammarsAndBadOnesFailAlone) {
  BatchWorker w = make_worker();
  w.submit(line(0, "json_schema", kSchema));
  BatchRequest two = line(1, "choice", "", {"yes", "no", "maybe"});
  two.n = 2;
  two.params.temperature = 1.0f;
  two.params.seed = 9;
  two.params.has_seed = true;
  w.submit(two);
  w.submit(line(2, "regex", "[0-9]{3}-[a-z]{2}"));
  w.submit(line(3, "json_schema", R"({"type": "object", "properties": )"));  // not JSON
  w.submit(line(4, "json_schema", R"({"type": "array", "uniqueItems": true})"));  // not enforceable
  w.submit(line(5, "regex", "(ab"));
  BatchRequest ignores_eos = line(6, "json_object", "");
  ignores_eos.params.ignore_eos = true;
  w.submit(ignores_eos);
  w.submit(line(7, "json_schema", kSchema));  // the same schema as line 0
  w.submit(line(8, "", ""));                    // unconstrained
  auto out = run_all(w);
  ASSERT_EQ(out.size(), 9u);

  for (const std::uint64_t i : {0ull, 7ull}) {
    const BatchResult& r = out.at({3, i});
    ASSERT_TRUE(r.ok) << r.error_message;
    const auto j = nlohmann::json::parse(r.choices[0].text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.choices[0].text;
    EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad") << r.choices[0].text;
    EXPECT_TRUE(j["n"].is_number_integer() && j["n"] >= 1 && j["n"] <= 3) << r.choices[0].text;
    EXPECT_EQ(j.size(), 2u) << r.choices[0].text;
    EXPECT_EQ(r.choices[0].finish_reason, "stop");
  }
  const BatchResult& c = out.at({3, 1});
  ASSERT_TRUE(c.ok) << c.error_message;
  ASSERT_EQ(c.choices.size(), 2u);
  for (const BatchChoice& ch : c.choices)
    EXPECT_TRUE(ch.text == "yes" || ch.text == "no" || ch.text == "maybe") << ch.text;
  ASSERT_TRUE(out.at({3, 2}).ok);
  EXPECT_TRUE(std::regex_match(out.at({3, 2}).choices[0].text, std::regex("[0-9]{3}-[a-z]{2}")))
      << out.at({3, 2}).choices[0].text;

  for (const std::uint64_t i : {3ull, 4ull, 5ull}) {
    const BatchResult& r = out.at({3, i});
    EXPECT_FALSE(r.ok) << i;
    EXPECT_EQ(r.error_code, "invalid_response_format") << i << ": " << r.error_message;
    EXPECT_TRUE(r.choices.empty());
  }
  EXPECT_NE(out.at({3, 4}).error_message.find("uniqueItems"), std::string::npos) << out.at({3, 4}).error_message;
  EXPECT_NE(out.at({3, 5}).error_message.find("regex"), std::string::npos) << out.at({3, 5}).error_message;
  EXPECT_EQ(out.at({3, 6}).error_code, "invalid_parameter");
  EXPECT_NE(out.at({3, 6}).error_message.find("ignore_eos"), std::string::npos);
  EXPECT_TRUE(out.at({3, 8}).ok);
  EXPECT_EQ(w.status().lines_failed, 4u);
}

// A line that resumes after a failure replays its generated tokens into its
// grammar and finishes with the output it would have had.
TEST(BatchWorkerStructuredOutput, ResumedLineGivesTheSameOutput) {
  BatchResult full;
  {
    BatchWorker w = make_worker();
    w.submit(line(0, "json_schema", kSchema));
    auto out = run_all(w);
    full = out.at({3, 0});
    ASSERT_TRUE(full.ok) << full.error_message;
  }
  const std::vector<std::int32_t>& ids = full.choices[0].token_ids;
  ASSERT_GE(ids.size(), 4u);
  BatchWorker w = make_worker();
  BatchRequest again = line(0, "json_schema", kSchema);
  again.resume.push_back({std::vector<std::int32_t>(ids.begin(), ids.begin() + ids.size() / 2), 0, {}});
  w.submit(again);
  auto out = run_all(w);
  const BatchResult& resumed = out.at({3, 0});
  ASSERT_TRUE(resumed.ok) << resumed.error_message;
  EXPECT_EQ(resumed.choices[0].token_ids, ids);
  EXPECT_EQ(resumed.choices[0].text, full.choices[0].text);
}

}  // namespace worker_batch_worker_structured_output_test
}  // namespace shardline::worker
