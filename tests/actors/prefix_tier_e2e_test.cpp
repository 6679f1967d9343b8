// The host prefix tier through a node (issue 42, step 5 in part;
// engine/prefix_tier.hpp, `--prefix-tier-mib`): a node with a 16-block KV
// cache runs a job behind one head, then a job of unrelated long prompts
// that evicts every cached block, then a job behind the same head again.
// The evicted head was spilled to the tier and comes back from it (the
// node's metrics count restored positions and spilled blocks; the last
// job's status counts cached prompt tokens), and that job's output is
// byte-identical to a run without prefix caching.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/actors/node_harness.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline {
namespace actors_prefix_tier_e2e_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;
using testing_support::read_file;
using testing_support::run_command;

class PrefixTierE2e : public testing_support::ClusterJobTest {
 protected:
  /// Submits NAME.jsonl (output NAME_out.jsonl) as job `job` and waits until it is done.
  void run_job(const std::string& client, const std::string& name, int job, Child& node) {
    const auto submit = run_command(kShardline + " job submit" + client + " --model " + kStoriesDir + " --input " +
                                    path(name + ".jsonl") + " --output " + path(name + "_out.jsonl"));
    ASSERT_EQ(submit.exit_code, 0) << submit.out;
    const nlohmann::json status = testing_support::wait_job_done(client, job, std::chrono::seconds(120));
    ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  }
};

constexpr const char* kHead = "Once upon a time, there was a little girl named Lily. She loved to play in the park "
                              "with her friends. One day, ";

void write_job(const std::string& path, const std::string& tag, int lines, bool behind_head) {
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    const std::string prompt = behind_head ? std::string(kHead) + tag + " number " + std::to_string(i)
                                           : "A " + tag + " story " + std::to_string(i) + " about a big red ball and a "
                                             "small blue car that went up the hill and down again to the sea.";
    out << nlohmann::json{{"custom_id", tag + std::to_string(i)}, {"body", {{"prompt", prompt}, {"max_tokens", 12},
                                                                           {"temperature", 0}}}}
               .dump()
        << "\n";
  }
}

TEST_F(PrefixTierE2e, AHeadEvictedByAnotherJobComesBackFromTheTierForTheNextJob) {
  write_job(path("a.jsonl"), "she found", 3, true);
  write_job(path("fill.jsonl"), "filler", 8, false);
  write_job(path("b.jsonl"), "she saw", 3, true);
  constexpr int kBlocks = 16;
  const std::string kv_bytes = std::to_string(kBlocks * 16 * 5 * 4 * 8 * 2 * 4);  // stories260K, F32 KV
  const auto plain = run_command(kShardline + " run --quiet --no-prefix-caching --model " + kStoriesDir +
                                 " --input " + path("b.jsonl") + " --output " + path("b_plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;

  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--data-dir",
              path("data"), "--model", kStoriesDir, "--key-file", path("cluster.key"), "--max-batch", "2",
              "--max-model-len", "128", "--kv-cache-bytes", kv_bytes, "--prefix-tier-mib", "16"},
             path("node.log"));
  const testing_support::NodeAddress at = testing_support::wait_for_node(node, true);
  ASSERT_FALSE(at.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(at.addr, path("cluster.key"));
  int job = 0;
  for (const char* name : {"a", "fill", "b"}) {
    ASSERT_NO_FATAL_FAILURE(run_job(client, name, ++job, node));
  }
  const std::string metrics = testing_support::scrape_eventually(at.metrics_port, std::chrono::seconds(10));
  const std::string worker = "{worker=\"node0/cpu:0\"}";
  EXPECT_GT(testing_support::metric_in(metrics, "shardline_prefix_tier_spilled_blocks_total" + worker), 0) << metrics;
  EXPECT_GT(testing_support::metric_in(metrics, "shardline_prefix_tier_restored_tokens_total" + worker), 0)
      << "the head came back from the tier\n"
      << metrics;
  const auto b = testing_support::job_status(client, 3);
  ASSERT_TRUE(b.has_value());
  EXPECT_GT((*b)["jobs"][0]["cached_tokens"].get<long long>(), 0) << b->dump();
  EXPECT_TRUE(testing_support::same_output(read_file(path("b_out.jsonl")), read_file(path("b_plain.jsonl"))))
      << "the restored head changed the output";
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
}

// The persistent tier (worker/store_prefix_tier.hpp): a node runs a job
// behind one head and is killed (-9) once it is done; a node started again
// over the same data dir runs another job behind the same head, and its
// worker fetches the head's blocks from the KV store (RocksDB under
// DATA/kv) instead of computing them: the metrics count fetched and
// restored positions, and the output is byte-identical to a run without
// prefix caching.
TEST_F(PrefixTierE2e, ANodeStartedAgainFetchesTheHeadFromItsKvStore) {
  write_job(path("a.jsonl"), "she found", 3, true);
  write_job(path("b.jsonl"), "she saw", 3, true);
  const auto plain = run_command(kShardline + " run --quiet --no-prefix-caching --model " + kStoriesDir +
                                 " --input " + path("b.jsonl") + " --output " + path("b_plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const std::vector<std::string> start = {kShardline, "node", "start", "--listen", "127.0.0.1:0", "--metrics",
                                          "127.0.0.1:0", "--data-dir", path("data"), "--model", kStoriesDir,
                                          "--key-file", path("cluster.key"), "--max-batch", "2"};
  int job = 0;
  for (const char* name : {"a", "b"}) {
    Child node(start, path(std::string("node_") + name + ".log"));
    const testing_support::NodeAddress at = testing_support::wait_for_node(node, true);
    ASSERT_FALSE(at.addr.empty()) << node.log();
    const std::string client = testing_support::client_flags(at.addr, path("cluster.key"));
    ASSERT_NO_FATAL_FAILURE(run_job(client, name, ++job, node));
    const std::string metrics = testing_support::scrape_eventually(at.metrics_port, std::chrono::seconds(10));
    const std::string worker = "{worker=\"node0/cpu:0\"}";
    const double fetched = testing_support::metric_in(metrics, "shardline_prefix_store_fetched_tokens_total" + worker);
    if (job == 1) {
      EXPECT_EQ(fetched, 0) << "a new store holds nothing\n" << metrics;
      // The head's blocks reach the store when first shared; wait for them
      // (the heartbeat's gauge) before the kill.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      double kept = 0;
      while (kept == 0 && std::chrono::steady_clock::now() < deadline) {
        kept = testing_support::metric_in(testing_support::scrape_eventually(at.metrics_port, std::chrono::seconds(5)),
                                          "shardline_kv_store_prefix_bytes{store=\"node0/kvstore\"}");
        if (kept == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      EXPECT_GT(kept, 0) << node.log();
      node.kill(SIGKILL);
      (void)node.wait_or_kill(std::chrono::seconds(10));
    } else {
      EXPECT_GT(fetched, 0) << "the head came from the KV store\n" << metrics << node.log();
      // Every request's head went to the store as a link to those blocks,
      // not as its KV (the store's heartbeat reports it).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      double linked = 0;
      while (linked == 0 && std::chrono::steady_clock::now() < deadline) {
        linked = testing_support::metric_in(
            testing_support::scrape_eventually(at.metrics_port, std::chrono::seconds(5)),
            "shardline_kv_linked_tokens_total{store=\"node0/kvstore\"}");
        if (linked == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      EXPECT_GT(linked, 0) << node.log();
      EXPECT_GT(testing_support::metric_in(metrics, "shardline_prefix_tier_restored_tokens_total" + worker), 0)
          << metrics;
      const auto b = testing_support::job_status(client, job);
      ASSERT_TRUE(b.has_value());
      EXPECT_GT((*b)["jobs"][0]["cached_tokens"].get<long long>(), 0) << b->dump();
      node.kill(SIGTERM);
      EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
    }
  }
  EXPECT_TRUE(testing_support::same_output(read_file(path("b_out.jsonl")), read_file(path("b_plain.jsonl"))))
      << "the fetched head changed the output";
}

}  // namespace actors_prefix_tier_e2e_test
}  // namespace shardline
