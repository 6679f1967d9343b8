// Fault tests of failure detection by heartbeats (--heartbeat-ms,
// --failure-timeout-ms): a worker whose thread hangs (the test hook
// SHARDLINE_TEST_STALL_WORKER) or whose engine group waits on a `shard
// serve` rank stopped with SIGSTOP sends no heartbeat; the orchestrator
// declares it dead within the timeout, requeues its lines to another worker,
// and the supervisor replaces it once its thread comes back. The job's output
// is complete, once per custom_id, and the clean run's bytes. Also the
// flags' checks.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/actors/node_harness.hpp"
#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_heartbeat_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;
using Clock = std::chrono::steady_clock;

/// Milliseconds since midnight of a spdlog line's "[YYYY-MM-DD HH:MM:SS.mmm]"
/// stamp before the first occurrence of `needle` in `log`; -1 if absent.
long long stamp_ms(const std::string& log, const std::string& needle) {
  const auto at = log.find(needle);
  if (at == std::string::npos) return -1;
  const auto line = log.rfind('\n', at) == std::string::npos ? 0 : log.rfind('\n', at) + 1;
  std::smatch m;
  const std::string head = log.substr(line, at - line);
  if (!std::regex_search(head, m, std::regex("\\[\\d{4}-\\d\\d-\\d\\d (\\d\\d):(\\d\\d):(\\d\\d)\\.(\\d{3})\\]")))
    return -1;
  return ((std::stoll(m[1]) * 60 + std::stoll(m[2])) * 60 + std::stoll(m[3])) * 1000 + std::stoll(m[4]);
}

class HeartbeatFault : public testing_support::ClusterJobTest {};

constexpr int kHeartbeatMs = 200;
constexpr int kTimeoutMs = 1500;
/// Scheduling slack on a loaded CI machine (2 shared cores).
constexpr int kSlackMs = 2000;

TEST_F(HeartbeatFault, AStuckWorkerThreadIsDeclaredDeadWithinTheTimeoutAndReplaced) {
  constexpr int kLines = 60;
  constexpr int kStallMs = 20'000;  // several times what the job takes on the other worker
  write_input(kLines, 64);
  const std::string expected = clean_output(8);

  // node0/cpu:1 sticks in its 10th step (mid-job: it holds lines).
  ::setenv("SHARDLINE_TEST_STALL_WORKER", ("node0/cpu:1,10," + std::to_string(kStallMs)).c_str(), 1);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--devices", "cpu:2", "--max-batch",
              "8", "--heartbeat-ms", std::to_string(kHeartbeatMs), "--failure-timeout-ms",
              std::to_string(kTimeoutMs)},
             path("node.log"));
  ::unsetenv("SHARDLINE_TEST_STALL_WORKER");
  const auto addr = testing_support::wait_for_node(node, false);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  node.wait_for_log("worker node0/cpu:1 joined", std::chrono::seconds(60));
  node.wait_for_log("worker node0/cpu:0 joined", std::chrono::seconds(60));
  submit(client);

  // The other worker finishes the job, the stuck one's lines included,
  // while the stuck thread still sleeps.
  const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(120));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  std::string log = node.log();
  ASSERT_NE(log.find("test hook: stalling"), std::string::npos) << log;
  EXPECT_EQ(log.find("test hook: stall over"), std::string::npos)
      << "the job waited for the stuck worker instead of finishing without it: " << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("worker node0/cpu:1 missed its heartbeats; (\\d+) lines requeued")))
      << log;
  EXPECT_GE(std::stoi(m[1].str()), 1) << "the stuck worker held no lines";
  // Declared dead within the timeout of its last heartbeat: at most the
  // timeout (plus a tick and scheduling slack) after the stall began, and no
  // sooner than the timeout less one heartbeat interval.
  const long long stalled = stamp_ms(log, "test hook: stalling");
  const long long declared = stamp_ms(log, "worker node0/cpu:1 missed its heartbeats");
  ASSERT_GE(stalled, 0);
  ASSERT_GE(declared, 0);
  RecordProperty("declared_dead_after_ms", static_cast<int>(declared - stalled));
  EXPECT_GE(declared - stalled, kTimeoutMs - kHeartbeatMs - 50) << log;
  EXPECT_LE(declared - stalled, kTimeoutMs + kSlackMs) << log;
  EXPECT_EQ(log.find("worker node0/cpu:0 missed"), std::string::npos) << "a busy worker was declared dead: " << log;

  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output differs from the clean run";

  // When the stuck thread comes back, the kill waiting in its mailbox ends
  // it, and the supervisor replaces it; the new instance joins.
  const auto deadline = Clock::now() + std::chrono::milliseconds(kStallMs) + std::chrono::seconds(60);
  while (Clock::now() < deadline &&
         testing_support::all_matches(node.log(), std::regex("orchestrator: worker node0/cpu:1 (joined) \\(device"))
                 .size() < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  log = node.log();
  EXPECT_NE(log.find("test hook: stall over"), std::string::npos) << log;
  EXPECT_NE(log.find("supervisor: worker node0/cpu:1 died (exit_reason(kill)); restarting it"), std::string::npos)
      << log;
  EXPECT_EQ(testing_support::all_matches(log, std::regex("orchestrator: worker node0/cpu:1 (joined) \\(device")).size(),
            2u)
      << log;
  const std::string list = run_command(kShardline + " actor list" + client).out;
  EXPECT_NE(list.find("node0/cpu:1"), std::string::npos) << list;
  EXPECT_TRUE(testing_support::same_output(read_file(path("out.jsonl")), expected)) << "the stuck worker's late results changed the output";

  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << node.log();
}

TEST_F(HeartbeatFault, ASigstoppedShardServeRankIsDetectedAndItsGroupReplaced) {
  // Enough lines that the job cannot finish between two status polls (each
  // a CLI process): with 40, a run beside other tests saw 4 and then 40
  // done, and the stop came after the job (2026-11-29).
  constexpr int kLines = 120;
  constexpr int kGroupTimeoutMs = 10'000;  // the group's own failure detection, slower
  write_input(kLines, 64);
  const std::string expected = clean_output(8);
  std::ofstream(path("group.key")) << "group secret";
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  auto shard = [&](const std::string& log) {
    return std::make_unique<Child>(std::vector<std::string>{kShardline, "shard", "serve", "--model",
                                                            testing_support::kStoriesDir, "--parallel", "tp=2",
                                                            "--rank", "1", "--group-master", master,
                                                            "--group-key-file", path("group.key"), "--threads", "1"},
                                   path(log));
  };
  auto rank1 = shard("shard1.log");
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--parallel", "tp=2", "--max-batch",
              "8", "--group-master", master, "--group-key-file", path("group.key"), "--group-timeout-ms",
              std::to_string(kGroupTimeoutMs), "--threads", "1", "--heartbeat-ms", std::to_string(kHeartbeatMs),
              "--failure-timeout-ms", std::to_string(kTimeoutMs)},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, false);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  ASSERT_NE(node.wait_for_log("worker node0/cpu:0-1 joined", std::chrono::seconds(60)).find("joined"),
            std::string::npos)
      << node.log() << rank1->log();
  submit(client);

  // Stop rank 1 mid-job: rank 0's step waits on it, the worker's thread
  // does not come back to its mailbox, its heartbeats stop.
  int done = 0;
  for (int i = 0; i < 3000 && done < 4; ++i) {
    done = testing_support::job_done(client, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(done, 4) << node.log();
  ASSERT_LT(done, kLines) << "the job finished before the stop";
  rank1->kill(SIGSTOP);
  const auto stopped = Clock::now();
  std::string log;
  while (Clock::now() - stopped < std::chrono::seconds(30)) {
    log = node.log();
    if (log.find("missed its heartbeats") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto detected_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped).count();
  RecordProperty("declared_dead_after_ms", static_cast<int>(detected_ms));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("worker node0/cpu:0-1 missed its heartbeats; (\\d+) lines requeued")))
      << log;
  EXPECT_GE(std::stoi(m[1].str()), 1);
  EXPECT_LE(detected_ms, kTimeoutMs + kSlackMs) << log;
  // Detected before the group's own timeout would have failed the step.
  EXPECT_LT(detected_ms, kGroupTimeoutMs) << log;

  // A fresh rank 1 for the replacement group; the stopped one is gone for good.
  auto rank1b = shard("shard1b.log");
  rank1->kill(SIGKILL);
  rank1->wait();
  const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(180));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log() << rank1b->log();
  log = node.log();
  EXPECT_NE(log.find("supervisor: worker node0/cpu:0-1 died"), std::string::npos) << log;
  EXPECT_EQ(testing_support::all_matches(log, std::regex("orchestrator: worker node0/cpu:0-1 (joined)")).size(), 2u)
      << log;
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output differs from the clean run";

  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(30)), 0) << "node did not stop on SIGTERM: " << node.log();
  EXPECT_NE(rank1b->wait_or_kill(std::chrono::seconds(30)), -1) << rank1b->log();
}

TEST_F(HeartbeatFault, FlagsAreCheckedAsUsageErrors) {
  write_input(2, 4);
  const std::string base = kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                           path("in.jsonl") + " --output " + path("out.jsonl");
  auto r = run_command(base + " --heartbeat-ms 0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--heartbeat-ms must be positive"), std::string::npos) << r.out;
  r = run_command(base + " --heartbeat-ms 1000 --failure-timeout-ms 1000");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--failure-timeout-ms (1000) must be greater than --heartbeat-ms (1000)"), std::string::npos)
      << r.out;
  r = run_command(kShardline + " node start --data-dir " + path("data") + " --model " + testing_support::kStoriesDir +
                  " --key-file " + path("cluster.key") + " --failure-timeout-ms -5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--failure-timeout-ms (-5) must be greater than --heartbeat-ms (1000)"), std::string::npos)
      << r.out;
  // The defaults are the paper's, and a valid pair runs.
  const auto help = run_command(kShardline + " node start --help").out;
  EXPECT_NE(help.find("--heartbeat-ms INT=1000"), std::string::npos) << help;
  EXPECT_NE(help.find("--failure-timeout-ms INT=3000"), std::string::npos) << help;
  r = run_command(base + " --heartbeat-ms 100 --failure-timeout-ms 2000");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace shardline
