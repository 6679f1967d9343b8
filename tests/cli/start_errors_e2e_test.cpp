// Engine start errors (issue 46, item 14). A wrong model path or a tp that
// does not divide the model's heads used to end in "no worker could start
// its engine (see the log above)" and leave an empty output file and a data
// dir behind. Now they are found before anything is created, the cause is
// the final error line, a bad value is a usage error (exit 2), and a client
// that finds no node says how to start one.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/process.hpp"

namespace shardline {
namespace cli_start_errors_e2e_test {

using testing_support::kShardline;
using testing_support::run_command;

const std::string kModel = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";

class StartErrorsE2e : public testing_support::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    std::ofstream(path("in.jsonl")) << R"({"custom_id":"a","body":{"prompt":"Once","max_tokens":4}})" << "\n";
  }
  std::string io() const { return " --input " + path("in.jsonl") + " --output " + path("out.jsonl"); }
  /// The last non-empty line of `out`: the final error.
  static std::string last_line(const std::string& out) {
    const auto end = out.find_last_not_of('\n');
    if (end == std::string::npos) return "";
    const auto begin = out.rfind('\n', end);
    return out.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
  }
  void expect_nothing_created() const {
    EXPECT_FALSE(std::filesystem::exists(path("out.jsonl"))) << "an output file was created";
    EXPECT_FALSE(std::filesystem::exists(path("out.jsonl.shardline"))) << "a data dir was created";
    EXPECT_FALSE(std::filesystem::exists(path("out.jsonl.lock"))) << "an output lock was left";
  }
};

TEST_F(StartErrorsE2e, AMissingModelFolderIsTheFinalErrorAndNothingIsCreated) {
  const auto r = run_command(kShardline + " run --model " + path("no-such-model") + io());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(last_line(r.out), "error: not_found: --model " + path("no-such-model") + ": no such folder") << r.out;
  EXPECT_EQ(r.out.find("no worker could start"), std::string::npos) << r.out;
  expect_nothing_created();
}

TEST_F(StartErrorsE2e, ATpThatDoesNotDivideTheHeadsIsAUsageErrorAndNothingIsCreated) {
  // stories260K has 8 attention heads.
  const auto r = run_command(kShardline + " run --model " + kModel + io() + " --parallel tp=3");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  const std::string last = last_line(r.out);
  EXPECT_NE(last.find("error: invalid_argument: worker 0 cannot start its engine"), std::string::npos) << r.out;
  EXPECT_NE(last.find("tp*sp = 3 must divide num_attention_heads = 8"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no worker could start"), std::string::npos) << r.out;
  expect_nothing_created();

  // `node start` checks the same before its data dir exists (a node that
  // started would run until `timeout` stops it: exit 124).
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("k.key")).exit_code, 0);
  const auto n = run_command("timeout 60 " + kShardline + " node start --model " + kModel +
                             " --parallel tp=3 --listen 127.0.0.1:0 --data-dir " + path("data") + " --key-file " +
                             path("k.key"));
  EXPECT_EQ(n.exit_code, 2) << n.out;
  EXPECT_NE(last_line(n.out).find("tp*sp = 3 must divide num_attention_heads = 8"), std::string::npos) << n.out;
  EXPECT_FALSE(std::filesystem::exists(path("data"))) << n.out;
}

TEST_F(StartErrorsE2e, AClientThatFindsNoNodeSaysHowToStartOne) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("k.key")).exit_code, 0);
  const std::string addr = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  const auto r = run_command(kShardline + " job status --node " + addr + " --key-file " + path("k.key"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const std::string last = last_line(r.out);
  EXPECT_NE(last.find("cannot reach a node at " + addr), std::string::npos) << r.out;
  EXPECT_NE(last.find("start one with `shardline node start`, or pass --node HOST:PORT"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardline
