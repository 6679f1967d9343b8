// SiDP through the whole system (seed 002; docs/sidp.md): `node start
// --parallel dp=2 --weight-sharing sidp --sidp-mode auto` runs a long-tailed
// job (output lengths 16 to 460); the orchestrator sees the group's
// effective batch fall below b* in the tail and broadcasts the switch to CaS,
// which the metrics and `job status` show; the output is byte-identical to
// plain data parallelism. `actor list` shows the layer owners and each
// worker's weight bytes and KV blocks.
#include <gtest/gtest.h>

#include <chrono>
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
namespace actors_sidp_e2e_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;
using testing_support::read_file;
using testing_support::run_command;

constexpr int kLines = 120;
constexpr int kLongLines = 6;  // the tail: the last lines generate 460 tokens

class SidpE2e : public testing_support::ClusterJobTest {
 protected:
  /// Short lines (16 to 79 tokens, ignoring EOS), then kLongLines of 460.
  void write_long_tailed_input() {
    testing_support::write_demo_prompts(path("in.jsonl"), kLines, [](int i, nlohmann::json& body) {
      body["max_tokens"] = i >= kLines - kLongLines ? 460 : 16 + (i * 37) % 64;
      body["ignore_eos"] = true;
    });
  }

  /// The job under plain DP (`run --parallel dp=2`).
  std::string plain_dp_output() {
    const auto r = run_command(kShardline + " run --quiet --model " + kStoriesDir + " --input " + path("in.jsonl") +
                               " --output " + path("plain.jsonl") + " --parallel dp=2 --max-batch 16");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return read_file(path("plain.jsonl"));
  }
};

TEST_F(SidpE2e, AutoSwitchesToCasInTheTailThroughTheOrchestratorAndMatchesPlainDp) {
  // The tail (fewer than b* = 8 running, none waiting) lasts about 0.1 s on
  // an AVX-512 machine (~380 decode steps of 3 sequences per rank): the
  // dwell (20 ms) and the heartbeats that report it (every 10 ms) fit in it
  // several times. With a 0.1 s dwell and 50 ms heartbeats the job ended
  // before the switch in two full-suite runs of several.
  write_long_tailed_input();
  const std::string expected = plain_dp_output();
  testing_support::expect_each_custom_id_once(expected, kLines);

  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              kStoriesDir, "--key-file", path("cluster.key"), "--metrics", "127.0.0.1:0", "--parallel", "dp=2",
              "--max-batch", "16", "--weight-sharing", "sidp", "--sidp-mode", "auto", "--sidp-switch-batch", "8",
              "--sidp-min-dwell", "0.02", "--heartbeat-ms", "10", "--failure-timeout-ms", "20000"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));

  // The owners register (each with its layers) and the workers report
  // their weight bytes, KV blocks and mode.
  std::string list;
  for (int i = 0; i < 100; ++i) {
    list = run_command(kShardline + " actor list" + client).out;
    // Both workers' rows too: cpu:0's may report before cpu:1's.
    if (list.find("node0/cpu:1/owner") != std::string::npos && list.find("sidp was") != std::string::npos &&
        std::regex_search(list, std::regex("node0/cpu:1 .*weights [0-9.]+ MiB")))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(list.find("node0/cpu:0/owner"), std::string::npos) << list;
  EXPECT_NE(list.find("node0/cpu:1/owner"), std::string::npos) << list;
  EXPECT_NE(list.find("layers 1,3"), std::string::npos) << "stories260K has 5 layers: rank 1 owns 1 and 3\n" << list;
  EXPECT_NE(list.find("sidp was"), std::string::npos) << list;
  // Each device holds its share: the whole stories260K is 1.0 MiB in F32;
  // attention, embeddings, its FFN layers and 2 slots are less.
  std::smatch weights;
  ASSERT_TRUE(std::regex_search(list, weights, std::regex("node0/cpu:1 .*weights ([0-9.]+) MiB"))) << list;
  EXPECT_LT(std::stod(weights[1].str()), 0.95) << list;

  // A job that expects plain DP is refused with the reason; nothing is
  // created (the real job below is job 1).
  const auto refused = run_command(kShardline + " job submit" + client + " --model " + kStoriesDir + " --input " +
                                   path("in.jsonl") + " --output " + path("wrong.jsonl") + " --weight-sharing none");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.out.find("this cluster runs --weight-sharing sidp; the job asks for --weight-sharing none"),
            std::string::npos)
      << refused.out;
  const auto r = run_command(kShardline + " job submit" + client + " --model " + kStoriesDir + " --input " +
                             path("in.jsonl") + " --output " + path("out.jsonl") + " --weight-sharing sidp");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "1\n");
  const nlohmann::json status = testing_support::wait_job_done(client, 1, std::chrono::seconds(300));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "SiDP auto differs from plain DP";

  // The switch to CaS came from the orchestrator's broadcast, in the tail.
  const double to_cas =
      testing_support::metric(addr.metrics_port, "shardline_sidp_switches_total{group=\"node0/sidp\",to=\"cas\"}");
  EXPECT_GE(to_cas, 1) << node.log();
  ASSERT_TRUE(status.contains("sidp_groups")) << status.dump();
  const nlohmann::json& group = status["sidp_groups"][0];
  EXPECT_EQ(group["group"], "node0/sidp");
  EXPECT_EQ(group["switch_batch"], 8);
  ASSERT_GE(group["switches"].size(), 1u) << status.dump();
  EXPECT_EQ(group["switches"][0]["to"], "cas") << status.dump();
  const std::string log = node.log();
  EXPECT_NE(log.find("worker node0/cpu:0: SiDP directive cas"), std::string::npos) << log;
  EXPECT_NE(log.find("worker node0/cpu:1: SiDP directive cas"), std::string::npos) << log;
  // Every rank runs the mode the group was told last (they report it in
  // their heartbeats).
  std::string after;
  for (int i = 0; i < 50; ++i) {
    after = run_command(kShardline + " actor list" + client).out;
    if (after.find("sidp was") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(after.find("sidp was"), std::string::npos) << after << log;
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(30)), 0) << "node did not stop on SIGTERM: " << node.log();
}

}  // namespace
}  // namespace shardline
