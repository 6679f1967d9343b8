// Finished lines' KV is dropped once their results are committed (not
// before: a crash in between resumes the line from it).
// `actor kill NODE/kvstore` mid-job: the store really dies, the node's
// supervisor restarts it from its RocksDB (`actor list` shows the restart
// and the store's bytes), the workers keep streaming (buffer and retry), and
// the job finishes with the same bytes as a run without the kill.
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <csignal>
#include <regex>
#include <thread>

#include "tests/actors/node_harness.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_kvstore_e2e_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;
using testing_support::metric;
using testing_support::read_file;
using testing_support::run_command;

class KvStoreE2e : public testing_support::ClusterJobTest {};

TEST_F(KvStoreE2e, ActorKillOfTheKvStoreMidJobRestartsItAndTheJobFinishes) {
  constexpr int kLines = 96;
  write_input(kLines, 120);
  const std::string expected = clean_output();
  Child node({kShardline, "node", "start", "--name", "n0", "--listen", "127.0.0.1:0", "--data-dir", path("data"),
              "--model", kStoriesDir, "--key-file", path("cluster.key"), "--max-batch", "32", "--metrics",
              "127.0.0.1:0"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  submit(client);

  // Mid-job: the store has acknowledged KV and lines are unfinished.
  const std::string replicated = "shardline_kv_replicated_tokens_total{store=\"n0/kvstore\"}";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && metric(addr.metrics_port, replicated) < 1000)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(metric(addr.metrics_port, replicated), 1000) << node.log();
  ASSERT_LT(testing_support::job_done(client, 1), kLines) << "the job finished before the kill";

  const auto kill = run_command(kShardline + " actor kill n0/kvstore" + client);
  ASSERT_EQ(kill.exit_code, 0) << kill.out;
  node.wait_for_log("kv store n0/kvstore died (exit_reason(kill)); restarting it from its RocksDB",
                    std::chrono::seconds(20));
  node.wait_for_log("kv store n0/kvstore is a new instance (restarted)", std::chrono::seconds(20));

  // `actor list` shows the new incarnation with its state.
  std::string list;
  for (int i = 0; i < 100; ++i) {
    list = run_command(kShardline + " actor list" + client).out;
    if (list.find("restarts=1") != std::string::npos && list.find("n0/kvstore") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(list, m, std::regex("n0/kvstore +kvstore +n0 +- +running restarts=1 +mem [0-9.]+ MiB / "
                                                    "256\\.0 MiB, disk [0-9.]+ MiB")))
      << list;

  const auto status = testing_support::wait_job_done(client, 1, std::chrono::seconds(180));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  EXPECT_EQ(metric(addr.metrics_port, "shardline_kv_store_restarts_total"), 1);
  // The workers kept streaming to the new incarnation.
  EXPECT_GT(metric(addr.metrics_port, replicated), 1000);
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after the KV store kill differs";
  // A store that is not there.
  const auto unknown = run_command(kShardline + " actor kill n9/kvstore" + client);
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.out.find("no actor named 'n9/kvstore'"), std::string::npos) << unknown.out;
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
}

TEST_F(KvStoreE2e, FinishedLinesKvIsDroppedOnceTheirResultsAreCommitted) {
  // The orchestrator drops a line's KV after committing its result, so
  // mid-job the store holds about the lines in flight (at most 2 x max
  // batch queued on the worker), not every line finished so far.
  constexpr int kLines = 1000, kCheckAt = 60, kMaxBatch = 4;  // the check comes early in a long job
  write_input(kLines, 60);
  Child node({kShardline, "node", "start", "--name", "n0", "--listen", "127.0.0.1:0", "--data-dir", path("data"),
              "--model", kStoriesDir, "--key-file", path("cluster.key"), "--max-batch", std::to_string(kMaxBatch)},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, false);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  submit(client);
  int done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && done < kCheckAt) {
    done = testing_support::job_done(client, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(done, kCheckAt) << node.log();
  ASSERT_LT(done, kLines) << "the job finished before the check";
  // The store's request count comes with its heartbeat, a snapshot that can
  // catch drops still in flight on a loaded machine: read it a heartbeat
  // apart, up to 4 times, all mid-job. Without the drops every reading
  // holds at least the kCheckAt lines finished so far.
  std::vector<int> counts;
  std::string list;
  for (int reading = 0; reading < 4; ++reading) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    list = run_command(kShardline + " actor list" + client).out;
    const int done_after = testing_support::job_done(client, 1);
    ASSERT_LT(done_after, kLines) << "the job finished before the check";
    std::smatch m;
    ASSERT_TRUE(std::regex_search(list, m, std::regex("n0/kvstore .* ([0-9]+) requests"))) << list;
    counts.push_back(std::stoi(m[1].str()));
    if (counts.back() <= 2 * kMaxBatch + 4) break;
  }
  std::string readings;
  for (int c : counts) readings += " " + std::to_string(c);
  EXPECT_LE(*std::min_element(counts.begin(), counts.end()), 2 * kMaxBatch + 4)
      << "the store holds the KV of finished lines (" << done << " done; readings" << readings << ")\n" << list;
  const auto status = testing_support::wait_job_done(client, 1, std::chrono::seconds(180));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
}

}  // namespace
}  // namespace shardline
