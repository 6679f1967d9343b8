// Recovery from replicated KV (DéjàVu §4.2.3) at the node level:
//  - kill -9 of a single-node `run` mid-job, then the rerun resumes every
//    unfinished request from the KV its store kept (shardline_recovered_tokens
//    > 0, nothing recomputed), and the output is byte-identical;
//  - with `--kv-sync none` a kill -9 drops the store's unsynced writes
//    (RocksDB's memtable) while the orchestrator's resume points survive:
//    the rerun never uses KV the store no longer has (it recomputes it, and
//    counts it), and the output is still byte-identical.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <regex>
#include <thread>

#include "tests/actors/node_harness.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_kv_recovery_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;
using testing_support::metric;
using testing_support::metric_in;
using testing_support::read_file;

class KvRecoveryFault : public testing_support::ClusterJobTest {
 protected:
  static constexpr int kLines = 96;
  static constexpr int kMaxBatch = 32;

  std::vector<std::string> run_args(const std::string& kv_sync) const {
    return {kShardline, "run", "--log-level", "info", "--quiet",        "--model",   kStoriesDir,     "--input",
            path("in.jsonl"), "--output", path("out.jsonl"), "--data-dir", path("data"), "--max-batch",
            std::to_string(kMaxBatch), "--metrics", "127.0.0.1:0", "--kv-sync", kv_sync};
  }

  /// Runs until the store acknowledged at least `min_tokens` positions and
  /// some lines are still unfinished, then kill -9.
  void run_and_kill(const std::string& kv_sync, double min_tokens) {
    Child run(run_args(kv_sync), path("run1.log"));
    const auto addr = testing_support::wait_for_node(run, true);
    ASSERT_GT(addr.metrics_port, 0) << run.log();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    double replicated = 0;
    while (std::chrono::steady_clock::now() < deadline && !run.exited()) {
      replicated = metric(addr.metrics_port, "shardline_kv_replicated_tokens_total{store=\"local/kvstore\"}");
      if (replicated >= min_tokens) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_FALSE(run.exited()) << "the job finished before the kill: " << run.log();
    ASSERT_GE(replicated, min_tokens) << run.log();
    run.kill(SIGKILL);
    run.wait();
  }

  struct Rerun {
    double recovered = 0;
    double recomputed = 0;
    std::string log;
  };

  /// Runs the job again on the same data dir to the end; the counters of
  /// that process, as `run --metrics-file` wrote them at its exit (a scrape
  /// of /metrics can miss the last ones: the run ends with its job).
  Rerun rerun(const std::string& kv_sync) {
    std::vector<std::string> args = run_args(kv_sync);
    args.insert(args.end(), {"--metrics-file", path("run2.prom")});
    Child run(args, path("run2.log"));
    Rerun out;
    EXPECT_EQ(run.wait(), 0) << run.log();
    out.log = run.log();
    const std::string prom = read_file(path("run2.prom"));
    const std::string w = "worker=\"local/cpu:0\"";
    out.recovered = metric_in(prom, "shardline_recovered_tokens_total{" + w + "}");
    out.recomputed = metric_in(prom, "shardline_recomputed_tokens_total{cause=\"failure\"," + w + "}");
    // Both are exported from the start (at 0): absent means a broken file.
    EXPECT_GE(out.recovered, 0) << prom;
    EXPECT_GE(out.recomputed, 0) << prom;
    return out;
  }
};

TEST_F(KvRecoveryFault, KillNineOfARunResumesFromTheStoresKv) {
  write_input(kLines, 120);
  const std::string expected = clean_output();
  run_and_kill("wal", 2000);
  const Rerun r = rerun("wal");
  RecordProperty("recovered_tokens", std::to_string(r.recovered));
  RecordProperty("recomputed_tokens", std::to_string(r.recomputed));
  // Every request in flight at the kill resumed from replicated KV: the
  // positions came from the store, none was recomputed (wal survives kill -9).
  EXPECT_GT(r.recovered, 0) << r.log;
  EXPECT_EQ(r.recomputed, 0) << r.log;
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after kill -9 and resume differs from the clean run";
}

TEST_F(KvRecoveryFault, UnsyncedKvLostAtACrashIsRecomputedNeverUsed) {
  write_input(kLines, 120);
  const std::string expected = clean_output();
  // --kv-sync none: the store acknowledges what is in RocksDB's memtable; a
  // kill -9 loses it, while jobs.db keeps the resume points.
  run_and_kill("none", 2000);
  const Rerun r = rerun("none");
  RecordProperty("recovered_tokens", std::to_string(r.recovered));
  RecordProperty("recomputed_tokens", std::to_string(r.recomputed));
  // The rerun asked for KV the store lost: it recomputed those positions
  // instead of restoring anything it did not have.
  EXPECT_GT(r.recomputed, 0) << r.log;
  EXPECT_NE(r.log.find("replicated positions"), std::string::npos) << "no fetch fell short: " << r.log;
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after losing unsynced KV differs from the clean run";
}

TEST_F(KvRecoveryFault, KillNineOfAJoinedNodeResumesItsLinesFromItsReplica) {
  write_input(kLines, 120);
  const std::string expected = clean_output();
  const std::vector<std::string> common{"--model", kStoriesDir, "--key-file", path("cluster.key"), "--max-batch",
                                        std::to_string(kMaxBatch), "--metrics", "127.0.0.1:0"};
  auto args = [&common](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  Child a(args({kShardline, "node", "start", "--name", "a", "--listen", "127.0.0.1:0", "--data-dir", path("da")}),
          path("a.log"));
  const auto addr = testing_support::wait_for_node(a, true);
  ASSERT_FALSE(addr.addr.empty()) << a.log();
  Child b(args({kShardline, "node", "start", "--name", "b", "--join", addr.addr, "--data-dir", path("db")}),
          path("b.log"));
  const auto b_addr = testing_support::wait_for_node(b, true);
  ASSERT_GT(b_addr.metrics_port, 0) << b.log();
  a.wait_for_log("orchestrator: worker b/cpu:0 joined", std::chrono::seconds(60));
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  submit(client);
  // b's store has acknowledged KV (held by a's store too: a replicates b).
  const std::string b_replicated = "shardline_kv_replicated_tokens_total{store=\"b/kvstore\"}";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && metric(b_addr.metrics_port, b_replicated) < 1000)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(metric(b_addr.metrics_port, b_replicated), 1000) << b.log();
  b.kill(SIGKILL);
  b.wait();
  const auto status = testing_support::wait_job_done(client, 1, std::chrono::seconds(180));
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << a.log();
  // a's counters: read over HTTP, retried while its /metrics does not
  // answer (a loaded machine), never taken as 0.
  const std::string prom = testing_support::scrape_eventually(addr.metrics_port, std::chrono::seconds(30));
  const std::string w = "worker=\"a/cpu:0\"";
  const double recovered = metric_in(prom, "shardline_recovered_tokens_total{" + w + "}");
  const double recomputed = metric_in(prom, "shardline_recomputed_tokens_total{cause=\"failure\"," + w + "}");
  ASSERT_GE(recomputed, 0) << "no counter in a's /metrics: " << prom;
  RecordProperty("recovered_tokens", std::to_string(recovered));
  RecordProperty("recomputed_tokens", std::to_string(recomputed));
  EXPECT_GT(status["jobs"][0]["resumed"].get<int>(), 0) << status.dump();
  EXPECT_GT(recovered, 0) << a.log();
  EXPECT_EQ(recomputed, 0) << a.log();
  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after kill -9 of the joined node differs";
  a.kill(SIGTERM);
  EXPECT_EQ(a.wait_or_kill(std::chrono::seconds(20)), 0) << a.log();
}

}  // namespace
}  // namespace shardline
