// SiDP failures through the whole system (seed 002; docs/sidp.md):
//  - `actor kill node0/cpu:1/owner` mid-job, in WaS and in CaS: the owner's
//    layers are withdrawn, ranks needing them wait, the supervisor respawns
//    the owner, which reloads them from the host copy of the model; the job
//    finishes byte-identical to plain DP;
//  - `actor kill node0/cpu:1` (a worker) mid-job in CaS: its peer's lockstep
//    fails at once (its compute generation dies), the group is rebuilt when
//    the worker restarts, the lines are requeued, the output is identical.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/actors/node_harness.hpp"
#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_sidp_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;
using testing_support::read_file;
using testing_support::run_command;

constexpr int kLines = 400;
constexpr int kMaxTokens = 200;
constexpr int kMaxBatch = 16;

class SidpFault : public testing_support::ClusterJobTest {
 protected:
  void SetUp() override {
    ClusterJobTest::SetUp();
    write_input(kLines, kMaxTokens);
    const auto r = run_command(kShardline + " run --quiet --model " + kStoriesDir + " --input " + path("in.jsonl") +
                               " --output " + path("plain.jsonl") + " --parallel dp=2 --max-batch " +
                               std::to_string(kMaxBatch));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    expected_ = read_file(path("plain.jsonl"));
    testing_support::expect_each_custom_id_once(expected_, kLines);
  }

  /// Starts the SiDP node in `mode`, submits the job, kills `victim` after
  /// kMaxBatch lines are done, waits for the job, checks the output and
  /// returns the node's log.
  std::string run_with_kill(const std::string& mode, const std::string& victim) {
    Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data-" + mode), "--model",
                kStoriesDir, "--key-file", path("cluster.key"), "--parallel", "dp=2", "--max-batch",
                std::to_string(kMaxBatch), "--weight-sharing", "sidp", "--sidp-mode", mode, "--heartbeat-ms", "200",
                "--failure-timeout-ms", "20000"},
               path("node-" + mode + ".log"));
    const auto addr = testing_support::wait_for_node(node, false);
    EXPECT_FALSE(addr.addr.empty()) << node.log();
    if (addr.addr.empty()) return node.log();
    const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
    const auto r = run_command(kShardline + " job submit" + client + " --model " + kStoriesDir + " --input " +
                               path("in.jsonl") + " --output " + path("out-" + mode + ".jsonl"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    int done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline && done < kMaxBatch) {
      done = testing_support::job_done(client, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GE(done, kMaxBatch) << "no progress before the kill: " << node.log();
    EXPECT_LT(done, kLines) << "the job finished before the kill";
    const auto kill = run_command(kShardline + " actor kill " + victim + client);
    EXPECT_EQ(kill.exit_code, 0) << kill.out;
    const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(300));
    EXPECT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
    const std::string list = run_command(kShardline + " actor list" + client).out;
    const std::string got = read_file(path("out-" + mode + ".jsonl"));
    testing_support::expect_each_custom_id_once(got, kLines);
    EXPECT_TRUE(testing_support::same_output(got, expected_)) << mode << ": the output after killing " << victim << " differs from plain DP";
    node.kill(SIGTERM);
    EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(30)), 0) << "node did not stop on SIGTERM: " << node.log();
    if (const char* dump = std::getenv("SHARDLINE_TEST_DUMP_LOG")) {
      std::ofstream(std::string(dump) + "." + mode + "." + std::to_string(++dumps_)) << node.log() << list;
    }
    return node.log() + "\n--- actor list after the job ---\n" + list;
  }

  std::string expected_;
  int dumps_ = 0;
};

TEST_F(SidpFault, KillingALayerOwnerMidJobInWasAndCasGivesIdenticalOutput) {
  for (const std::string mode : {"was", "cas"}) {
    SCOPED_TRACE(mode);
    const std::string log = run_with_kill(mode, "node0/cpu:1/owner");
    EXPECT_NE(log.find("supervisor: layer owner node0/cpu:1/owner died (exit_reason(kill)); respawning it"),
              std::string::npos)
        << log;
    // Loaded twice: at the start and by the respawn (from the host copy).
    EXPECT_NE(log.find("layer owner node0/cpu:1/owner: 2 FFN layers loaded and exposed"), std::string::npos) << log;
    EXPECT_NE(log.find("load #2"), std::string::npos) << log;
  }
}

TEST_F(SidpFault, KillingAWorkerMidCasRebuildsTheGroupAndGivesIdenticalOutput) {
  const std::string log = run_with_kill("cas", "node0/cpu:1");
  EXPECT_NE(log.find("worker node0/cpu:1 died (exit_reason(kill)); restarting it"), std::string::npos) << log;
  // The restarted rank made a new compute generation and its peer followed.
  EXPECT_NE(log.find("sidp: compute generation 2"), std::string::npos) << log;
}

}  // namespace
}  // namespace shardline
