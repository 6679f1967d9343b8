// DéjàVu on CUDA workers (issue 41 item 7), end to end on fake GPUs: a node
// of `shardline_fake_cuda` (the real command over the fake CUDA device and
// fake NCCL) runs a job on a CUDA worker, which streams every sequence's KV
// to the node's KV store through its KvCopier; `actor kill` of the worker
// mid-job, and its restart resumes the lines it held from their KV in the
// store instead of recomputing them (shardline_recovered_tokens_total > 0).
// The job finishes with every line once and the same bytes as a `run` on
// the same devices without the kill; the node stops cleanly with no device
// anomaly. A single GPU, and a pipeline group with a GPU per rank (NCCL).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/actors/node_harness.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_cuda_worker_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::kShardlineFakeCuda;
using testing_support::kStoriesDir;
using testing_support::read_file;
using testing_support::run_command;

#if SHARDLINE_HAVE_CUDA

/// Sum of every sample of `name` in a /metrics text.
double sum_samples(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

class CudaWorkerFault : public testing_support::ClusterJobTest {
 protected:
  void SetUp() override {
    // Inherited by the fake processes this test starts.
    ASSERT_EQ(setenv("SHARDLINE_FAKE_CUDA_DEVICES", "2", 1), 0);
    ClusterJobTest::SetUp();
  }

  /// The job through a node on `devices` (fake GPUs), its worker `worker`
  /// killed once it has finished kMaxBatch lines; checked against `run` on
  /// the same devices.
  void kill_worker_mid_job(const std::vector<std::string>& devices, const std::string& worker) {
    constexpr int kLines = 96, kMaxBatch = 16;
    std::string flags;
    for (const std::string& d : devices) flags += " " + d;
    const auto clean = run_command(kShardlineFakeCuda + " run --quiet --model " + kStoriesDir + " --input " +
                                   path("in.jsonl") + " --output " + path("clean.jsonl") + " --max-batch " +
                                   std::to_string(kMaxBatch) + flags);
    ASSERT_EQ(clean.exit_code, 0) << clean.out;
    const std::string expected = read_file(path("clean.jsonl"));
    testing_support::expect_each_custom_id_once(expected, kLines);

    std::vector<std::string> argv = {kShardlineFakeCuda, "node", "start", "--name", "n0", "--listen", "127.0.0.1:0",
                                     "--data-dir", path("data"), "--model", kStoriesDir, "--key-file",
                                     path("cluster.key"), "--max-batch", std::to_string(kMaxBatch), "--metrics",
                                     "127.0.0.1:0"};
    argv.insert(argv.end(), devices.begin(), devices.end());
    Child node(argv, path("node.log"));
    const testing_support::NodeAddress at = testing_support::wait_for_node(node, true);
    ASSERT_FALSE(at.addr.empty()) << node.log();
    const std::string client = testing_support::client_flags(at.addr, path("cluster.key"));
    submit(client);

    int done_before_kill = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      done_before_kill = testing_support::job_done(client, 1);
      if (done_before_kill >= kMaxBatch) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(done_before_kill, kMaxBatch) << "no progress before the kill: " << node.log();
    ASSERT_LT(done_before_kill, kLines) << "the job finished before the kill";
    const auto kill = run_command(kShardline + " actor kill " + worker + client);
    ASSERT_EQ(kill.exit_code, 0) << kill.out;

    nlohmann::json status;
    for (int i = 0; i < 1200; ++i) {
      if (auto s = testing_support::job_status(client, 1)) status = *s;
      if (!status.is_null() && status["jobs"][0]["state"] == "done") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
    EXPECT_NE(node.log().find("worker " + worker + " died (exit_reason(kill)); restarting it"), std::string::npos)
        << node.log();
    const std::string got = read_file(path("out.jsonl"));
    testing_support::expect_each_custom_id_once(got, kLines);
    EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after the worker kill differs";
    const std::string metrics = testing_support::scrape_eventually(at.metrics_port, std::chrono::seconds(10));
    const double recovered = sum_samples(metrics, "shardline_recovered_tokens_total");
    RecordProperty("recovered_tokens", std::to_string(recovered));
    EXPECT_GT(recovered, 0) << "the restarted worker recomputed every resumed line: no KV restored from the store\n"
                            << metrics;
    EXPECT_GT(sum_samples(metrics, "shardline_kv_streamed_bytes_total"), 0) << metrics;
    node.kill(SIGTERM);
    EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0)
        << "the node did not stop cleanly (86: a fake device anomaly): " << node.log();
  }
};

TEST_F(CudaWorkerFault, ActorKillOfASingleGpuWorkerResumesItsLinesFromTheirStreamedKv) {
  write_input(96, 120);
  kill_worker_mid_job({"--devices", "cuda:0"}, "n0/cuda:0");
}

TEST_F(CudaWorkerFault, ActorKillOfAPipelineGroupOnTwoGpusResumesItsLinesFromTheirStreamedKv) {
  write_input(96, 120);
  kill_worker_mid_job({"--devices", "cuda:0,1", "--parallel", "pp=2"}, "n0/cuda:0,1");
}

#endif

}  // namespace actors_cuda_worker_fault_test
}  // namespace shardline
