// Fault tests: `actor kill orchestrator` mid-job, several times. The node's
// supervisor restarts it from its RocksDB state; the workers (of this node,
// and of a joined node over loopback) say hello again with the lines they
// hold, which stay theirs; the job finishes with every custom_id once and
// the bytes of a run without kills, and no line is computed twice.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
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
namespace actors_orchestrator_restart_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

class OrchestratorRestartFault : public testing_support::ClusterJobTest {
 protected:
  /// Waits until `actor list` shows every name in `workers`.
  static std::string wait_for_workers(const std::string& client, const std::vector<std::string>& workers) {
    std::string list;
    for (int i = 0; i < 300; ++i) {
      list = run_command(kShardline + " actor list" + client).out;
      bool all = true;
      for (const auto& w : workers) all = all && list.find(w) != std::string::npos;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return list;
  }

  /// Kills the orchestrator (by `name`) once the job has `done_at_least`
  /// lines; returns the lines done just before.
  static int kill_orchestrator_at(const std::string& client, int done_at_least, const std::string& name) {
    int done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (std::chrono::steady_clock::now() < deadline) {
      done = testing_support::job_done(client, 1);
      if (done >= done_at_least) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GE(done, done_at_least) << "no progress before the kill";
    const auto r = run_command(kShardline + " actor kill " + name + client);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("killed " + name), std::string::npos) << r.out;
    return done;
  }
};

TEST_F(OrchestratorRestartFault, KilledThreeTimesMidJobTheJobFinishesOnceWithTheCleanBytes) {
  // The job outlasts three kills and restarts with a wide margin: 80k
  // tokens, as 1000 lines of 80 were (with the AVX2 kernels a 300-line job
  // of 80-token lines ended before the third kill in a CI-like run). Each
  // line runs 200 tokens (ignore_eos) so that the workers still hold lines
  // when the new orchestrator asks, after the supervisor's restart delay:
  // with 80 tokens, lines ending at EOS, an AVX-512 machine finished every
  // line it held within that delay (0 held at each hello) in one run of two.
  constexpr int kLines = 400;
  testing_support::write_demo_prompts(path("in.jsonl"), kLines, [](int, nlohmann::json& body) {
    body["max_tokens"] = 200;
    body["ignore_eos"] = true;
  });
  const std::string expected = clean_output();
  testing_support::expect_each_custom_id_once(expected, kLines);

  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--data-dir",
              path("data"), "--model", testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--devices",
              "cpu:2", "--max-batch", "16"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  const std::string before = wait_for_workers(client, {"node0/cpu:0", "node0/cpu:1"});
  ASSERT_NE(before.find("node0/cpu:1"), std::string::npos) << before;
  EXPECT_NE(before.find("running restarts=0"), std::string::npos) << before;
  submit(client);

  // Three kills while the workers are busy, by both names the orchestrator answers to.
  std::vector<int> done_at_kill;
  done_at_kill.push_back(kill_orchestrator_at(client, 10, "orchestrator"));
  done_at_kill.push_back(kill_orchestrator_at(client, 35, "node0/orchestrator"));
  done_at_kill.push_back(kill_orchestrator_at(client, 60, "orchestrator"));
  for (int d : done_at_kill) EXPECT_LT(d, kLines) << "the job finished before a kill";

  const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(300));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after the orchestrator kills differs from the clean run";

  // `actor list` shows the restarts; so does the metric.
  const std::string after = run_command(kShardline + " actor list" + client).out;
  EXPECT_NE(after.find("running restarts=3"), std::string::npos) << after;
  EXPECT_EQ(testing_support::metric(addr.metrics_port, "shardline_orchestrator_restarts_total"), 3.0);

  // The workers lived through the kills and kept their lines: none was lost
  // or requeued, and each line was computed once (the workers count what
  // they finish).
  const std::string log = node.log();
  EXPECT_EQ(testing_support::all_matches(log, std::regex("(orchestrator: restarted)")).size(), 3u) << log;
  EXPECT_EQ(log.find("lines requeued"), std::string::npos) << log;
  EXPECT_EQ(log.find("missed its heartbeats"), std::string::npos) << log;
  const auto held = testing_support::all_matches(log, std::regex("joined again holding (\\d+) lines"));
  EXPECT_GE(held.size(), 3u) << log;  // two workers x three restarts, when both held lines
  int most = 0;
  for (const auto& n : held) most = std::max(most, std::stoi(n));
  EXPECT_GT(most, 0) << "no kill landed while a worker held lines: " << log;
  const double done = testing_support::metric(addr.metrics_port, "shardline_requests_total{state=\"done\"}");
  const double failed = testing_support::metric(addr.metrics_port, "shardline_requests_total{state=\"failed\"}");
  EXPECT_EQ(done + std::max(0.0, failed), static_cast<double>(kLines)) << "some line was computed twice";
  RecordProperty("done_at_kills", std::to_string(done_at_kill[0]) + "," + std::to_string(done_at_kill[1]) + "," +
                                      std::to_string(done_at_kill[2]));

  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << node.log();
}

TEST_F(OrchestratorRestartFault, WorkersOfAJoinedNodeReattachAfterKillsOverLoopback) {
  constexpr int kLines = 80;
  write_input(kLines, 64);
  const std::string expected = clean_output();

  Child a({kShardline, "node", "start", "--name", "a", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
           "--data-dir", path("data"), "--model", testing_support::kStoriesDir, "--key-file", path("cluster.key"),
           "--max-batch", "16"},
          path("a.log"));
  const auto addr = testing_support::wait_for_node(a, true);
  ASSERT_FALSE(addr.addr.empty()) << a.log();
  Child b({kShardline, "node", "start", "--name", "b", "--join", addr.addr, "--metrics", "127.0.0.1:0", "--model",
           testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--max-batch", "16"},
          path("b.log"));
  const auto b_addr = testing_support::wait_for_node(b, true);
  ASSERT_GT(b_addr.metrics_port, 0) << b.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  const std::string list = wait_for_workers(client, {"a/cpu:0", "b/cpu:0"});
  ASSERT_NE(list.find("b/cpu:0"), std::string::npos) << list;
  submit(client);

  kill_orchestrator_at(client, 10, "orchestrator");
  kill_orchestrator_at(client, 40, "a/orchestrator");

  const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(300));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << a.log() << b.log();
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after the orchestrator kills differs from the clean run";
  EXPECT_NE(run_command(kShardline + " actor list" + client).out.find("restarts=2"), std::string::npos);

  // The joined node never reconnected: after each kill its worker was asked
  // to say hello again (its heartbeat met an orchestrator that did not know
  // it) and did, with the lines it held, as did the local one (asked by its
  // supervisor, and maybe by the orchestrator too).
  // The joined worker re-attaches through its next heartbeat, which may
  // come after the job finished, and a second kill within a heartbeat
  // interval leaves it only the newest orchestrator to greet. So: wait
  // (bounded) until it joined the orchestrator of the last restart.
  const std::regex asked("worker [ab]/cpu:0: (the orchestrator asks for a hello again)");
  const auto b_back = [](const std::string& log) {
    const std::size_t last = log.find("orchestrator: restarted (restart 2)");
    return last != std::string::npos && log.find("orchestrator: worker b/cpu:0 joined", last) != std::string::npos;
  };
  std::string a_log = a.log();
  for (int i = 0; i < 150 && !b_back(a_log); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a_log = a.log();
  }
  const std::string b_log = b.log();
  EXPECT_TRUE(b_back(a_log)) << a_log;
  EXPECT_GE(testing_support::all_matches(b_log, asked).size(), 1u) << b_log;
  EXPECT_GE(testing_support::all_matches(a_log, asked).size(), 2u) << a_log;
  EXPECT_EQ(a_log.find("lines requeued"), std::string::npos) << a_log;
  double computed = 0;
  for (int port : {addr.metrics_port, b_addr.metrics_port}) {
    computed += std::max(0.0, testing_support::metric(port, "shardline_requests_total{state=\"done\"}"));
    computed += std::max(0.0, testing_support::metric(port, "shardline_requests_total{state=\"failed\"}"));
  }
  EXPECT_EQ(computed, static_cast<double>(kLines)) << "some line was computed twice";

  for (Child* c : {&b, &a}) {
    c->kill(SIGTERM);
    EXPECT_EQ(c->wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << c->log();
  }
}

}  // namespace
}  // namespace shardline
