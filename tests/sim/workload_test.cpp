// sim/workload: length distributions parse or give clear errors; generated
// workloads are seeded and stay in their bounds; a JSONL job file gives one
// request per choice with its prompt's token count and max_tokens.
#include "sim/workload.hpp"
#include "model/tokenizer_loader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "text/tokenizer.hpp"
#include "tests/support/process.hpp"

namespace shardline::sim {
namespace sim_workload_test {

using SimWorkload = testing_support::TempDirTest;

TEST_F(SimWorkload, DistributionsParseOrSayWhatIsExpected) {
  EXPECT_EQ(parse_length_dist("128")->kind, LengthDist::Kind::fixed);
  EXPECT_EQ(parse_length_dist("uniform:1:10")->b, 10);
  EXPECT_EQ(parse_length_dist("loguniform:16:512")->kind, LengthDist::Kind::loguniform);
  auto ln = parse_length_dist("lognormal:200:1.0:2048");
  ASSERT_TRUE(ln.ok());
  EXPECT_EQ(ln->max, 2048);
  for (const char* bad : {"", "x", "0", "uniform:5:1", "uniform:1", "lognormal:10:-1", "poisson:3", "uniform:a:4"}) {
    auto r = parse_length_dist(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("loguniform:A:B"), std::string::npos) << r.error().message;
  }
}

TEST_F(SimWorkload, GeneratedWorkloadsAreSeededAndBounded) {
  const auto in = *parse_length_dist("uniform:8:64");
  const auto out = *parse_length_dist("loguniform:16:512");
  const auto a = generate_workload(2000, in, out, 7);
  const auto b = generate_workload(2000, in, out, 7);
  const auto c = generate_workload(2000, in, out, 8);
  ASSERT_EQ(a.size(), 2000u);
  bool same = true, differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same = same && a[i].prompt_len == b[i].prompt_len && a[i].output_len == b[i].output_len;
    differs = differs || a[i].output_len != c[i].output_len;
    EXPECT_GE(a[i].prompt_len, 8);
    EXPECT_LE(a[i].prompt_len, 64);
    EXPECT_GE(a[i].output_len, 16);
    EXPECT_LE(a[i].output_len, 512);
  }
  EXPECT_TRUE(same);
  EXPECT_TRUE(differs);
  // Long-tailed: the median output is well below the mean.
  std::vector<int> lens;
  for (const auto& r : a) lens.push_back(r.output_len);
  std::sort(lens.begin(), lens.end());
  const double mean = std::accumulate(lens.begin(), lens.end(), 0.0) / lens.size();
  EXPECT_LT(lens[lens.size() / 2], 0.8 * mean);
  // lognormal clamps at MAX.
  for (const auto& r : generate_workload(500, *parse_length_dist("lognormal:100:2:300"), in, 1))
    EXPECT_LE(r.prompt_len, 300);
}

TEST_F(SimWorkload, JsonlJobFilesGiveTheirLengths) {
  std::ofstream(path("job.jsonl"))
      << R"({"custom_id":"a","body":{"prompt":[5,6,7,8],"max_tokens":12}})" "\n"
      << R"({"custom_id":"b","body":{"prompt":[5,6],"max_tokens":3,"n":2}})" "\n"
      << "not json\n\n"
      << R"({"custom_id":"c","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Once upon a time"}]}})" "\n"
      << R"({"custom_id":"d","body":{"prompt":"Once upon a time","max_tokens":5}})" "\n";
  auto tokenizer = model::load_tokenizer(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().to_string();
  auto w = workload_from_jsonl(path("job.jsonl"), tokenizer->get(), 99);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  EXPECT_EQ(w->skipped_lines, 1);
  ASSERT_EQ(w->requests.size(), 5u);
  EXPECT_EQ(w->requests[0].prompt_len, 4);
  EXPECT_EQ(w->requests[0].output_len, 12);
  EXPECT_EQ(w->requests[1].prompt_len, 2);
  EXPECT_EQ(w->requests[2].output_len, 3) << "n = 2: two requests";
  const int text_len = static_cast<int>((*tokenizer)->encode("Once upon a time", true).size());
  EXPECT_EQ(w->requests[4].prompt_len, text_len);
  EXPECT_EQ(w->requests[4].output_len, 5);
  EXPECT_EQ(w->requests[3].output_len, 99) << "a chat line without max_tokens gets the default";
  EXPECT_GE(w->requests[3].prompt_len, text_len);

  auto no_tokenizer = workload_from_jsonl(path("job.jsonl"), nullptr, 16);
  ASSERT_FALSE(no_tokenizer.ok());
  EXPECT_NE(no_tokenizer.error().message.find("needs a tokenizer"), std::string::npos);
  EXPECT_EQ(workload_from_jsonl(path("missing.jsonl"), nullptr, 16).error().code, ErrorCode::not_found);
}

}  // namespace
}  // namespace shardline::sim
