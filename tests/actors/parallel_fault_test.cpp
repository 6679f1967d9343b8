// Fault test of engine-group workers: `actor kill` of a tp=2 group worker and
// of a pp=2 group worker (micro-batches in flight) mid-job; the supervisor
// restarts the group like any worker, its lines are requeued, and the output
// is byte-identical to an uninterrupted run of the same config. (Not to the
// single-device run: over these 300 x 120 seeded tokens, TP's all-reduce
// rounding moves one sample across a CDF boundary, demo-0236; PP is
// bit-identical to one device. parallel_e2e_test compares configs with one
// device on a set without such a line.)
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_parallel_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

class ParallelFault : public testing_support::TempDirTest {
 protected:
  static constexpr int kMaxBatch = 8;

  /// The first 300 demo requests (seeded sampling, every 10th line greedy)
  /// with 120 tokens each: long enough to kill the worker mid-job.
  void SetUp() override {
    TempDirTest::SetUp();
    testing_support::write_demo_prompts(path("in.jsonl"), 300,
                                        [](int, nlohmann::json& body) { body["max_tokens"] = 120; });
  }

  void kill_group_worker_mid_job(const std::string& parallel, const std::string& worker) {
    const auto clean = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir +
                                   " --input " + path("in.jsonl") + " --output " + path("clean.jsonl") +
                                   " --parallel " + parallel);
    ASSERT_EQ(clean.exit_code, 0) << clean.out;
    const std::string expected = read_file(path("clean.jsonl"));

    ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
    Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
                testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--max-batch",
                std::to_string(kMaxBatch), "--parallel", parallel},
               path("node.log"));
    const std::string log = node.wait_for_log("listening on", std::chrono::seconds(30));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
    const std::string client = " --node 127.0.0.1:" + m[1].str() + " --key-file " + path("cluster.key");
    ASSERT_EQ(run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                          " --input " + path("in.jsonl") + " --output " + path("out.jsonl") +
                          " --token-budget throttle")
                  .exit_code,
              0);
    int done_at_kill = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
      done_at_kill = s["jobs"][0]["done"].get<int>();
      if (done_at_kill >= 16) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Killed well before the end, so that it holds lines when it dies.
    ASSERT_GE(done_at_kill, 16) << "no progress before the kill: " << node.log();
    ASSERT_LT(done_at_kill, 250) << "the job was nearly done before the kill";
    auto kill = run_command(kShardline + " actor kill " + worker + client);
    ASSERT_EQ(kill.exit_code, 0) << kill.out;

    nlohmann::json status;
    for (int i = 0; i < 600; ++i) {
      status = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
      if (status["jobs"][0]["state"] == "done") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
    EXPECT_NE(node.log().find("worker " + worker + " died (exit_reason(kill)); restarting it"), std::string::npos)
        << node.log();
    // It held lines, and they were requeued: at least one, at most its queue
    // (2 x max batch).
    const std::string node_log = node.log();
    std::smatch requeued;
    const std::regex requeue_line("worker " + worker + " died \\(exit_reason\\(kill\\)\\); (\\d+) lines requeued");
    ASSERT_TRUE(std::regex_search(node_log, requeued, requeue_line)) << node_log;
    const int n = std::stoi(requeued[1].str());
    RecordProperty("requeued", n);
    RecordProperty("done_before_kill", done_at_kill);
    EXPECT_GE(n, 1) << "killed at " << done_at_kill << " lines done: " << node_log;
    EXPECT_LE(n, 2 * kMaxBatch);
    // The restarted group registered again under the same name and shape.
    std::string actors;
    for (int i = 0; i < 100; ++i) {
      actors = run_command(kShardline + " actor list" + client).out;
      if (actors.find(worker) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(actors.find(worker), std::string::npos) << actors;
    EXPECT_TRUE(testing_support::same_output(read_file(path("out.jsonl")), expected)) << "output after the group worker kill differs";
    node.kill(SIGTERM);
    EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << node.log();
  }
};

TEST_F(ParallelFault, KilledTp2GroupWorkerIsRestartedAndTheOutputIsUnchanged) {
  kill_group_worker_mid_job("tp=2", "node0/cpu:0-1");
}

TEST_F(ParallelFault, KilledPp2GroupWorkerIsRestartedAndTheOutputIsUnchanged) {
  kill_group_worker_mid_job("pp=2", "node0/cpu:0-1");
}

}  // namespace
}  // namespace shardline
