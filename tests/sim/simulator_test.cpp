// sim/simulator: the real engine over the simulated executor. Every token of
// the workload is accounted for; a pure-decode step takes what the cost
// model says (plus the overhead); DP replicas scale throughput; the
// scheduler's limits (max batch, KV capacity) show in the results; bad
// strategies and models that do not fit are clear errors.
#include "sim/simulator.hpp"

#include <gtest/gtest.h>

#include "tests/support/process.hpp"

namespace shardline::sim {
namespace {

const std::string kShapes = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/";

model::ModelConfig shape(const std::string& name) {
  auto c = model::load_model_config(kShapes + name);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

ClusterSpec cluster(const std::string& name) {
  auto c = load_cluster(name);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

Strategy strategy(const std::string& parallel, const std::string& budget = "fixed") {
  Strategy s;
  s.parallel = *engine::parse_parallel_config(parallel);
  s.token_budget = budget;
  return s;
}

TEST(Simulator, EveryTokenIsAccountedForAndDecodeStepsCostWhatTheModelSays) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("h100x1");
  SimOptions o;
  o.max_batch = 32;
  const auto workload = fixed_workload(64, 128, 64);
  auto r = simulate(config, c, strategy("single"), workload, o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->num_requests, 64);
  EXPECT_EQ(r->prompt_tokens, 64 * 128);
  EXPECT_EQ(r->generated_tokens, 64 * 64);
  EXPECT_EQ(r->decode_batch, 32) << "max_batch caps the running sequences";
  EXPECT_GT(r->elapsed_s, r->prefill_elapsed_s);
  EXPECT_NEAR(r->total_tok_s, (64 * 128 + 64 * 64) / r->elapsed_s, 1e-6 * r->total_tok_s);
  EXPECT_GT(r->decode_tok_s, 0);
  EXPECT_GT(r->prefill_tok_s, r->decode_tok_s);
  EXPECT_EQ(r->bubble_fraction, 0.0);
  EXPECT_GT(r->kv_peak_fraction, 0.0);
  EXPECT_LE(r->kv_peak_fraction, 1.0);
  EXPECT_GT(r->tpot_ms.p50, 0);
  EXPECT_LE(r->ttft_ms.p50, r->ttft_ms.p99);

  // A full-batch decode step: the engine's own time (per step and per
  // sequence) + the model's step at a context
  // between the shortest and the longest the decodes saw.
  const int active = 1;
  auto model = orchestrator::CostModel::create(orchestrator::ModelShape::from_config(config),
                                               element_sizes(c.device), group_hardware(c, 1, active));
  ASSERT_TRUE(model.ok());
  auto step_at = [&](int ctx) {
    orchestrator::StepShape s;
    for (int i = 0; i < 32; ++i) s.add_sequence(ctx, 1);
    return c.device.step_overhead_ms.value + 32 * c.device.seq_overhead_ms.value + model->estimate({}, s)->total_ms;
  };
  EXPECT_GE(r->decode_step_ms, step_at(128) - 1e-9);
  EXPECT_LE(r->decode_step_ms, step_at(128 + 64) + 1e-9);

  // Deterministic: the same run gives the same numbers.
  auto again = simulate(config, c, strategy("single"), workload, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->elapsed_s, r->elapsed_s);
  EXPECT_EQ(again->ttft_ms.p99, r->ttft_ms.p99);
}

TEST(Simulator, DataParallelReplicasScaleThroughput) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("h100x8");
  SimOptions o;
  o.max_batch = 64;
  o.prefill_run = false;
  const auto workload = fixed_workload(512, 256, 128);
  auto one = simulate(config, c, strategy("single"), workload, o);
  auto four = simulate(config, c, strategy("dp=4"), workload, o);
  ASSERT_TRUE(one.ok()) << one.error().to_string();
  ASSERT_TRUE(four.ok()) << four.error().to_string();
  const double ratio = four->total_tok_s / one->total_tok_s;
  EXPECT_GT(ratio, 3.5);
  EXPECT_LE(ratio, 4.05);
  EXPECT_EQ(four->num_devices, 4);
}

// The orchestrator deals a job over the workers' queues one line per worker
// per round (WorkerPool::dispatch), so a job smaller than the queues still
// spreads over every replica, as in-process DP's round-robin does.
TEST(Simulator, ASmallJobSpreadsOverEveryReplica) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("h100x2");
  SimOptions o;
  o.max_batch = 32;
  o.prefill_run = false;
  // Prefill-heavy, so that splitting the requests halves the work of each
  // replica (a decode step costs about the same at batch 16 as at 32).
  const auto workload = fixed_workload(32, 1024, 8);
  auto one = simulate(config, c, strategy("single"), workload, o);
  auto pulled = simulate(config, c, strategy("dp=2"), workload, o);
  o.dispatch = SimOptions::Dispatch::round_robin;
  auto dealt = simulate(config, c, strategy("dp=2"), workload, o);
  ASSERT_TRUE(one.ok() && pulled.ok() && dealt.ok());
  EXPECT_LT(pulled->elapsed_s, 0.65 * one->elapsed_s);
  EXPECT_DOUBLE_EQ(pulled->elapsed_s, dealt->elapsed_s);
}

TEST(Simulator, PipelineBubblesAndTokenThrottlingComeFromTheSchedule) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("l20x4");
  SimOptions o;
  o.max_batch = 64;
  o.prefill_run = false;
  const auto workload = fixed_workload(128, 512, 64);
  auto fixed = simulate(config, c, strategy("pp=4", "fixed"), workload, o);
  auto throttle = simulate(config, c, strategy("pp=4", "throttle"), workload, o);
  ASSERT_TRUE(fixed.ok()) << fixed.error().to_string();
  ASSERT_TRUE(throttle.ok()) << throttle.error().to_string();
  for (const auto* r : {&*fixed, &*throttle}) {
    EXPECT_GT(r->bubble_fraction, 0.0) << r->strategy;
    EXPECT_LT(r->bubble_fraction, 0.75) << r->strategy;
    EXPECT_EQ(r->generated_tokens, 128 * 64);
  }
  EXPECT_NE(fixed->elapsed_s, throttle->elapsed_s) << "the policies schedule differently";
}

TEST(Simulator, KvCapacityBoundsTheBatchAndWeightsMustFit) {
  const auto config = shape("llama-3.1-70b");
  // 70B in BF16 is ~141 GB: one A10 cannot hold it, nor can TP over 4.
  auto r = simulate(config, cluster("a10x8"), strategy("tp=4"), fixed_workload(4, 64, 8));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(r.error().message.find("do not fit"), std::string::npos) << r.error().message;
  auto blocks8 = kv_blocks_per_group(config, cluster("h200x8"), *engine::parse_parallel_config("tp=8"), {});
  auto blocks4 = kv_blocks_per_group(config, cluster("h200x8"), *engine::parse_parallel_config("tp=4"), {});
  ASSERT_TRUE(blocks8.ok() && blocks4.ok());
  EXPECT_GT(*blocks8, 2 * *blocks4) << "tp=8 halves the weights and the KV heads per rank";

  auto too_many = simulate(shape("llama-3.1-8b"), cluster("h100x2"), strategy("tp=4"), fixed_workload(2, 8, 2));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message.find("needs 4 devices"), std::string::npos);
  EXPECT_FALSE(simulate(shape("llama-3.1-8b"), cluster("h100"), strategy("single"), {}).ok());
  EXPECT_FALSE(simulate(shape("llama-3.1-8b"), cluster("h100"), strategy("single", "bogus"),
                        fixed_workload(1, 8, 2))
                   .ok());
}

TEST(Simulator, ShiftRunsSmallStepsInFullTensorParallelism) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("h200x8");
  SimOptions o;
  o.max_batch = 16;
  o.prefill_run = false;
  Strategy s = strategy("sp=8");
  s.shift = engine::ShiftPolicyOptions{256, 0.25};
  auto r = simulate(config, c, s, fixed_workload(64, 1024, 64), o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_GT(r->shift_step_fraction, 0.5) << "decode steps of 16 tokens are small";
  EXPECT_LT(r->shift_step_fraction, 1.0) << "prefill steps of 2048 tokens run in SP";
  EXPECT_GT(r->shift_switches, 0u);
}

}  // namespace
}  // namespace shardline::sim
