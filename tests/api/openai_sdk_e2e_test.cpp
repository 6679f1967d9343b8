// The official `openai` Python SDK (PyPI, pinned in tests/requirements.txt)
// against a node's Batch API (tests/api/openai_batch.py): files.create,
// batches.create, polling batches.retrieve with request_counts that never go
// back, files.content, batches.list. The output equals `shardline run` on the
// same file byte for byte after the job-id fields; bad lines land in the
// error file; batches.cancel mid-batch ends `cancelled` with the finished
// lines. A missing SDK fails the test (deploy/python-env.sh installs it).
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>

#include "tests/api/api_harness.hpp"
#include "tests/support/python.hpp"

namespace shardline::api {
namespace api_openai_sdk_e2e_test {

using json = nlohmann::json;
using testing::ApiNode;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using OpenAiSdkE2e = testing_support::TempDirTest;

const std::string kSdkScript = std::string(SHARDLINE_SOURCE_DIR) + "/tests/api/openai_batch.py";

TEST_F(OpenAiSdkE2e, TheSdksBatchEqualsRunAndBadLinesGoToTheErrorFile) {
  const std::string problem = testing_support::python_env_problem("openai");
  ASSERT_TRUE(problem.empty()) << problem;

  const std::string input = testing::demo_prompts(40);
  std::ofstream(path("prompts.jsonl")) << input;
  ApiNode node(dir_.string());
  ASSERT_GT(node.port(), 0) << node.log();
  auto sdk_run = [&](const std::string& in, const std::string& tag) {
    return run_command("timeout 300 " + testing_support::kPython + " " + kSdkScript + " " + node.url() + "/v1 " +
                       testing::kApiKey +
                       " " + in + " /v1/completions " + path(tag + ".out.jsonl") + " " + path(tag + ".err.jsonl"));
  };
  const auto r = sdk_run(path("prompts.jsonl"), "demo");
  ASSERT_EQ(r.exit_code, 0) << r.out << node.log();
  const json summary = json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << r.out;
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["counts"], (json{{"total", 40}, {"completed", 40}, {"failed", 0}}));
  EXPECT_EQ(summary["metadata"]["test"], "openai-sdk");
  EXPECT_NE(std::find(summary["listed"].begin(), summary["listed"].end(), summary["id"]), summary["listed"].end());

  const auto run = run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                               " --input " + path("prompts.jsonl") + " --output " + path("run.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(testing::normalize_job_ids(read_file(path("demo.out.jsonl"))),
            testing::normalize_job_ids(read_file(path("run.jsonl"))));
  EXPECT_TRUE(read_file(path("demo.err.jsonl")).empty());

  // Bad lines: their errors in the error file, the others in the output.
  std::ofstream(path("mixed.jsonl"))
      << R"({"custom_id":"ok-1","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon a time","max_tokens":5}})" "\n"
      << R"({"custom_id":"bad-1","method":"POST","url":"/v1/completions","body":{"prompt":"x","suffix":"y"}})" "\n"
      << R"({"custom_id":"bad-2","method":"POST","url":"/v1/completions","body":{"prompt":"Once","max_tokens":600}})" "\n";
  const auto m = sdk_run(path("mixed.jsonl"), "mixed");
  ASSERT_EQ(m.exit_code, 0) << m.out;
  const std::string out = read_file(path("mixed.out.jsonl")), err = read_file(path("mixed.err.jsonl"));
  EXPECT_NE(out.find("\"custom_id\":\"ok-1\""), std::string::npos) << out;
  EXPECT_EQ(out.find("bad-"), std::string::npos) << out;
  EXPECT_NE(err.find("\"custom_id\":\"bad-1\""), std::string::npos) << err;
  EXPECT_NE(err.find("unsupported_parameter"), std::string::npos) << err;
  EXPECT_NE(err.find("context_length_exceeded"), std::string::npos) << err;

  // batches.cancel mid-batch (a node running 4 sequences at a time, so the
  // batch is still running when the script cancels it).
  std::filesystem::create_directories(path("slow"));
  ApiNode slow(path("slow"), {"--max-batch", "4"});
  std::ofstream(path("long.jsonl")) << testing::demo_prompts(120);
  const auto c = run_command("timeout 300 " + testing_support::kPython + " " + kSdkScript + " " + slow.url() + "/v1 " +
                             testing::kApiKey + " " + path("long.jsonl") + " /v1/completions " +
                             path("long.out.jsonl") + " " + path("long.err.jsonl") + " 3");
  ASSERT_EQ(c.exit_code, 0) << c.out << slow.log();
  const json cancelled = json::parse(c.out.substr(c.out.find('{')), nullptr, false);
  EXPECT_EQ(cancelled["status"], "cancelled") << c.out;
  EXPECT_FALSE(cancelled["cancelled_at"].is_null()) << c.out;
  const int done = cancelled["counts"]["completed"].get<int>();
  EXPECT_GE(done, 3);
  EXPECT_LT(done, 120);
  const std::string kept = read_file(path("long.out.jsonl"));
  EXPECT_EQ(std::count(kept.begin(), kept.end(), '\n'), done);
}

}  // namespace
}  // namespace shardline::api
