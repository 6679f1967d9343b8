// SiDP failures through the whole system (seed 002; docs/sidp.md):
//  - `actor kill node0/cpu:1/owner` mid-job, in WaS and in CaS: the owner's
//    layers are withdrawn, ranks needing them wait, the supervisor respawns
//    the owner, which reloads them from the host copy of the model; the job
//    finishes byte-identical to plain DP;
//  - `actor kill node0/cpu:1` (a worker) mid-job in CaS: its peer's lockstep
//    fails at once (its compute generation dies), the group is rebuilt when
//    the worker restarts, the lines are requeued, the output is identical.
// The same on two CUDA workers sharing a fake GPU (`shardline_fake_cuda`,
// `--devices cuda:0x2`: the owners' layers in GPU memory, CaS rows as device
// copies), against plain DP on the same fake GPU (deterministic GEMMs).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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
  /// The node's command and its device flags (CPU devices here).
  virtual std::string binary() const { return kShardline; }
  virtual std::vector<std::string> device_flags() const { return {}; }
  /// The actor names of worker 1 and its owner.
  virtual std::string worker1() const { return "node0/cpu:1"; }

  static std::string joined(const std::vector<std::string>& flags) {
    std::string out;
    for (const std::string& f : flags) out += " " + f;
    return out;
  }

  void SetUp() override {
    ClusterJobTest::SetUp();
    write_input(kLines, kMaxTokens);
    const auto r = run_command(binary() + " run --quiet --model " + kStoriesDir + " --input " + path("in.jsonl") +
                               " --output " + path("plain.jsonl") + " --parallel dp=2 --max-batch " +
                               std::to_string(kMaxBatch) + joined(device_flags()));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    expected_ = read_file(path("plain.jsonl"));
    testing_support::expect_each_custom_id_once(expected_, kLines);
  }

  /// Starts the SiDP node in `mode`, submits the job, kills `victim` after
  /// kMaxBatch lines are done, waits for the job, checks the output and
  /// returns the node's log.
  std::string run_with_kill(const std::string& mode, const std::string& victim) {
    std::vector<std::string> args = {binary(), "node", "start", "--listen", "127.0.0.1:0", "--data-dir",
                                     path("data-" + mode), "--model", kStoriesDir, "--key-file", path("cluster.key"),
                                     "--parallel", "dp=2", "--max-batch", std::to_string(kMaxBatch),
                                     "--weight-sharing", "sidp", "--sidp-mode", mode, "--heartbeat-ms", "200",
                                     "--failure-timeout-ms", "20000"};
    for (const std::string& f : device_flags()) args.push_back(f);
    Child node(args, path("node-" + mode + ".log"));
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

  void expect_owner_kill_recovers() {
    for (const std::string mode : {"was", "cas"}) {
      SCOPED_TRACE(mode);
      const std::string owner = worker1() + "/owner";
      const std::string log = run_with_kill(mode, owner);
      EXPECT_NE(log.find("supervisor: layer owner " + owner + " died (exit_reason(kill)); respawning it"),
                std::string::npos)
          << log;
      // Loaded twice: at the start and by the respawn (from the host copy).
      EXPECT_NE(log.find("layer owner " + owner + ": 2 FFN layers loaded and exposed"), std::string::npos) << log;
      EXPECT_NE(log.find("load #2"), std::string::npos) << log;
    }
  }

  void expect_worker_kill_rebuilds_the_group() {
    const std::string log = run_with_kill("cas", worker1());
    EXPECT_NE(log.find("worker " + worker1() + " died (exit_reason(kill)); restarting it"), std::string::npos) << log;
    // The restarted rank made a new compute generation and its peer followed.
    EXPECT_NE(log.find("sidp: compute generation 2"), std::string::npos) << log;
  }
};

TEST_F(SidpFault, KillingALayerOwnerMidJobInWasAndCasGivesIdenticalOutput) { expect_owner_kill_recovers(); }

TEST_F(SidpFault, KillingAWorkerMidCasRebuildsTheGroupAndGivesIdenticalOutput) {
  expect_worker_kill_rebuilds_the_group();
}

#if SHARDLINE_HAVE_CUDA
class SidpFaultOnCuda : public SidpFault {
 protected:
  std::string binary() const override { return testing_support::kShardlineFakeCuda; }  // 2 fake GPUs
  std::vector<std::string> device_flags() const override {
    return {"--devices", "cuda:0x2", "--gpu-memory-utilization", "0.3", "--deterministic"};
  }
  std::string worker1() const override { return "node0/cuda:0.1"; }
};

TEST_F(SidpFaultOnCuda, KillingALayerOwnerMidJobInWasAndCasGivesIdenticalOutput) { expect_owner_kill_recovers(); }

TEST_F(SidpFaultOnCuda, KillingAWorkerMidCasRebuildsTheGroupAndGivesIdenticalOutput) {
  expect_worker_kill_rebuilds_the_group();
}
#endif

}  // namespace
}  // namespace shardline
