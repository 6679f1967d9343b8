// Automatic prefix caching through `shardline run` (issue 42): a job full of
// shared prefixes — completions behind one long head, chat lines behind one
// system message, `n = 3` lines (sampled, seeded) and a few lines with
// logprobs — gives a byte-identical output file with caching on (the
// default), with `--enable-prefix-caching` said, and with
// `--no-prefix-caching`; at another batch size and step budget too. The
// run's metrics count the shared tokens as hits with caching on
// (shardline_prefix_cache_hits_total) and none without; the run's last
// lines give the job's hit rate beside its prefix tree's ideal.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace cli_prefix_cache_e2e_test {

using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;
using json = nlohmann::json;

using PrefixCacheE2e = testing_support::TempDirTest;

/// The sum of a counter's samples (every label set) in Prometheus text; 0 when absent.
double metric_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(name, 0) == 0 && (line[name.size()] == '{' || line[name.size()] == ' '))
      sum += std::stod(line.substr(line.rfind(' ') + 1));
  return sum;
}

constexpr const char* kTemplate =
    "{%- for m in messages -%}\n"
    "  {{ m['role'] | upper }}: {{ m['content'] | trim }}\n"
    "{% endfor -%}\n"
    "{%- if add_generation_prompt %}ASSISTANT:{% endif -%}\n";

TEST_F(PrefixCacheE2e, ASharedPrefixJobIsByteIdenticalWithAndWithoutCaching) {
  std::ofstream(path("chat.jinja")) << kTemplate;
  const std::string head =
      "Once upon a time, in a small town by the sea, there lived a little girl named Lily who loved to play "
      "in the garden with her dog. Every morning she woke up early, ate her breakfast and ran outside. ";
  const std::string system = "You tell short, happy stories for small children, with a moral at the end of each.";
  {
    std::ofstream in(path("in.jsonl"));
    auto line = [&](const std::string& id, const std::string& url, json body) {
      in << json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}}.dump() << "\n";
    };
    const char* questions[] = {"One day she found", "Then her dog", "The sun was", "Her mom said", "A bird"};
    for (int i = 0; i < 20; ++i) {
      json body = {{"prompt", head + questions[i % 5] + (i >= 5 ? " " + std::to_string(i) : "")},
                   {"max_tokens", 16}};
      if (i % 2 == 0) body["temperature"] = 0;
      else body["seed"] = 100 + i;
      if (i % 7 == 0) body["logprobs"] = 2;
      line("c" + std::to_string(i), "/v1/completions", body);
    }
    for (int i = 0; i < 10; ++i) {
      const json messages = json::array({{{"role", "system"}, {"content", system}},
                                         {{"role", "user"}, {"content", std::string("Tell me about ") + questions[i % 5]}}});
      line("chat" + std::to_string(i), "/v1/chat/completions",
           {{"messages", messages}, {"max_completion_tokens", 12}, {"seed", 300 + i}, {"temperature", 0.9}});
    }
    for (int i = 0; i < 4; ++i)
      line("n3-" + std::to_string(i), "/v1/completions",
           {{"prompt", head + "The end of the day came and"}, {"max_tokens", 12}, {"n", 3}, {"seed", 500 + i}});
  }
  const std::string base = kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --chat-template " +
                           path("chat.jinja") + " --input " + path("in.jsonl");
  const auto off = run_command(base + " --no-prefix-caching --output " + path("off.jsonl") + " --metrics-file " +
                               path("off.prom"));
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_EQ(metric_sum(read_file(path("off.prom")), "shardline_prefix_cache_hits_total"), 0.0);
  const std::string want = read_file(path("off.jsonl"));
  ASSERT_FALSE(want.empty());
  for (const std::string flags : {"", "--enable-prefix-caching", "--max-batch 3 --max-num-batched-tokens 24"}) {
    const std::string out = path("on" + std::to_string(flags.size()) + ".jsonl");
    const std::string prom = path("on" + std::to_string(flags.size()) + ".prom");
    const auto on = run_command(base + " " + flags + " --output " + out + " --metrics-file " + prom);
    ASSERT_EQ(on.exit_code, 0) << flags << ": " << on.out;
    EXPECT_TRUE(testing_support::same_output(read_file(out), want)) << "flags '" << flags << "' differ from no caching";
    const std::string metrics = read_file(prom);
    const double hits = metric_sum(metrics, "shardline_prefix_cache_hits_total");
    const double queries = metric_sum(metrics, "shardline_prefix_cache_queries_total");
    // The head is 3 full 16-token blocks at least; most of the 40 requests
    // after the first few find it.
    EXPECT_GT(hits, 20 * 48) << flags << ":\n" << metrics;
    EXPECT_LT(hits, queries) << flags;
  }
  // Not quiet: the run ends with the job's hit rate beside its prompts'
  // prefix tree's ideal, its lines handed out in prefix order.
  const std::string loud_cmd = kShardline + " run --model " + testing_support::kStoriesDir + " --chat-template " +
                               path("chat.jinja") + " --input " + path("in.jsonl") + " --output " + path("loud.jsonl");
  const auto loud = run_command(loud_cmd);
  ASSERT_EQ(loud.exit_code, 0) << loud.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(loud.out, m, std::regex(R"(prefix cache: ([0-9.]+)% of prompt tokens cached \(ideal ([0-9.]+)%, the prompts' prefix tree; lines in prefix order\))")))
      << loud.out;
  EXPECT_GT(std::stod(m[1]), 30.0) << "most lines are behind the long head";
  EXPECT_GT(std::stod(m[2]), 30.0);
  EXPECT_LE(std::stod(m[2]), 100.0);
  EXPECT_TRUE(testing_support::same_output(read_file(path("loud.jsonl")), want)) << "prefix order changed the output";
}

}  // namespace cli_prefix_cache_e2e_test
}  // namespace shardline
