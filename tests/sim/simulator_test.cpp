// sim/simulator: the real engine over the simulated executor. Every token of
// the workload is accounted for; a pure-decode step takes what the cost
// model says (plus the overhead); DP replicas scale throughput; the
// scheduler's limits (max batch, KV capacity) show in the results; bad
// strategies and models that do not fit are clear errors.
#include "sim/simulator.hpp"

#include <gtest/gtest.h>

#include "engine/gpu_memory_plan.hpp"
#include "engine/sidp_memory.hpp"
#include "sim/workload.hpp"
#include <cmath>
#include "tests/support/process.hpp"

namespace shardline::sim {
namespace sim_simulator_test {

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

/// Options of a run without the prefill-only second run, at `max_batch`.
SimOptions full_run_only(int max_batch) {
  SimOptions o;
  o.max_batch = max_batch;
  o.prefill_run = false;
  return o;
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
  auto model = sim::CostModel::create(sim::ModelShape::from_config(config),
                                               element_sizes(c.device), group_hardware(c, 1, active));
  ASSERT_TRUE(model.ok());
  auto step_at = [&](int ctx) {
    sim::StepShape s;
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
  const SimOptions o = full_run_only(64);
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
  SimOptions o = full_run_only(32);
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
  const SimOptions o = full_run_only(64);
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
  const SimOptions o = full_run_only(16);
  Strategy s = strategy("sp=8");
  s.shift = engine::ShiftPolicyOptions{256, 0.25};
  auto r = simulate(config, c, s, fixed_workload(64, 1024, 64), o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_GT(r->shift_step_fraction, 0.5) << "decode steps of 16 tokens are small";
  EXPECT_LT(r->shift_step_fraction, 1.0) << "prefill steps of 2048 tokens run in SP";
  EXPECT_GT(r->shift_switches, 0u);
}

// A device with a Shift curve (a calibrated CPU device) prices Shift's
// small shifted steps on it, and plain tp groups on the TP curve; without
// one, shifted steps are tp steps.
TEST(Simulator, ShiftStepsArePricedOnTheDevicesShiftCurveWhereItHasOne) {
  const auto config = shape("llama-3.1-8b");
  ClusterSpec c = cluster("h200x2");
  c.device.tp_gemm_efficiency_by_rows = {{4, 0.01}, {64, 0.02}};  // low: decode steps compute-bound
  c.device.tp_gemm_efficiency_by_rows_source = "test";
  const SimOptions o = full_run_only(16);
  const auto workload = fixed_workload(16, 64, 32);
  Strategy shift = strategy("sp=2");
  shift.shift = engine::ShiftPolicyOptions{256, 0.25};
  auto decode_ms = [&](const ClusterSpec& k, const Strategy& s) {
    auto r = simulate(config, k, s, workload, o);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->decode_batch, 16);
    return r->decode_step_ms;
  };
  const double tp2 = decode_ms(c, strategy("tp=2"));
  EXPECT_DOUBLE_EQ(decode_ms(c, shift), tp2) << "no Shift curve: a shifted decode step is a tp=2 step";
  ClusterSpec with_shift = c;
  with_shift.device.shift_gemm_efficiency_by_rows = {{4, 0.015}, {64, 0.03}};
  with_shift.device.shift_gemm_efficiency_by_rows_source = "test";
  const double shifted = decode_ms(with_shift, shift);
  EXPECT_LT(shifted, tp2) << "the faster Shift curve";
  EXPECT_DOUBLE_EQ(decode_ms(with_shift, strategy("tp=2")), tp2) << "a plain tp=2 group keeps the TP curve";
  ClusterSpec as_tp = c;  // the TP curve set to the Shift curve: tp=2 prices as Shift did
  as_tp.device.tp_gemm_efficiency_by_rows = with_shift.device.shift_gemm_efficiency_by_rows;
  EXPECT_DOUBLE_EQ(decode_ms(as_tp, strategy("tp=2")), shifted);
}

// Seesaw (seed 000): the real engine's phases over the simulated executor.
// Each prompt's KV goes to the host buffer after its prefill and comes back
// for its decode, and every transition reloads each device's weight shard
// over its host link.
TEST(Simulator, SeesawRunsPhasesAndPricesKvCopiesAndWeightReloadsOnTheHostLink) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("a10x4");
  const SimOptions o = full_run_only(64);
  Strategy s = strategy("pp=4");
  s.seesaw = SeesawStrategy{*engine::parse_parallel_config("tp=4"), {}, 1.0 * double(1ull << 30)};
  const auto workload = fixed_workload(256, 512, 64);
  auto r = simulate(config, c, s, workload, o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->strategy, "seesaw pp=4:tp=4 fixed");
  // A 1 GiB buffer per device (4 GiB, 32 Ki tokens of 128 KiB) cannot hold
  // 256 prompts of 512 tokens (128 Ki tokens): several rounds of phases.
  const double kv_per_token = 2.0 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2;
  EXPECT_GE(r->seesaw_transitions, 4u);
  EXPECT_LE(r->seesaw_host_peak_bytes, 4.0 * double(1ull << 30));
  EXPECT_GT(r->seesaw_host_peak_bytes, 2.0 * double(1ull << 30));
  // Every prompt's KV went out after its prefill and came back once.
  EXPECT_GE(r->seesaw_offload_bytes, 256 * 512 * kv_per_token);
  EXPECT_DOUBLE_EQ(r->seesaw_offload_bytes, r->seesaw_onboard_bytes);
  // A transition reloads a quarter of the weights on each device's link.
  const double reload_s =
      1e-5 + double(engine::weight_bytes_for(config, c.device.weight_dtype)) / 4 / c.device.host_link_bw_bytes_per_s.value;
  EXPECT_NEAR(r->seesaw_reload_s, r->seesaw_transitions * reload_s, 1e-9 * r->seesaw_reload_s);
  EXPECT_GE(r->seesaw_transition_s, r->seesaw_reload_s);
  EXPECT_EQ(r->bubble_fraction, 0.0);

  // The same on a host link 100 times slower: the copies and reloads cost
  // more, and the run is slower.
  ClusterSpec slow = c;
  slow.device.host_link_bw_bytes_per_s.value /= 100;
  auto r_slow = simulate(config, slow, s, workload, o);
  ASSERT_TRUE(r_slow.ok()) << r_slow.error().to_string();
  EXPECT_NEAR(r_slow->seesaw_reload_s / r_slow->seesaw_transitions, 1e-5 + (reload_s - 1e-5) * 100, 1e-6);
  EXPECT_GT(r_slow->seesaw_onboard_wait_s, r->seesaw_onboard_wait_s);
  EXPECT_LT(r_slow->total_tok_s, 0.8 * r->total_tok_s);
}

// The shape of the paper's result (seed 000 §6.3, CodeLlama-34B on 4 A10
// with long prompts): prefill in PP and decode in TP beats every static
// config of vLLM's kind (a fixed token budget, the paper's baseline).
TEST(Simulator, SeesawBeatsEveryStaticConfigOnPcie) {
  auto config = model::load_model_config(std::string(SHARDLINE_SOURCE_DIR) + "/bench/shapes/codellama-34b");
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  const auto c = cluster("a10x4");
  const SimOptions o = full_run_only(128);
  const auto workload = fixed_workload(200, 2048, 128);
  Strategy seesaw = strategy("pp=4");
  seesaw.seesaw = SeesawStrategy{*engine::parse_parallel_config("tp=4"), {}};
  auto s = simulate(*config, c, seesaw, workload, o);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  for (const char* p : {"tp=4", "pp=4", "tp=2,pp=2"}) {
    auto r = simulate(*config, c, strategy(p), workload, o);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_GT(s->total_tok_s, 1.15 * r->total_tok_s) << p;
  }
}

TEST(Simulator, SeesawConfigsMustShareTheDevices) {
  const auto config = shape("llama-3.1-8b");
  Strategy s = strategy("pp=4");
  s.seesaw = SeesawStrategy{*engine::parse_parallel_config("tp=2"), {}};
  auto r = simulate(config, cluster("a10x4"), s, fixed_workload(4, 64, 4));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("same devices"), std::string::npos) << r.error().message;
  s.seesaw->decode = *engine::parse_parallel_config("tp=4");
  s.shift = engine::ShiftPolicyOptions{256, 0.25};
  r = simulate(config, cluster("a10x4"), s, fixed_workload(4, 64, 4));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("Shift"), std::string::npos) << r.error().message;
}

// DéjàVu (seed 003 §4.2.3): a failure at a given token. With replicated KV
// every request resumes from its last token with its KV restored over the
// network (nothing is computed again); without, each starts from scratch.
TEST(Simulator, AFailureResumesFromTheLastTokenWithReplicatedKvAndFromScratchWithout) {
  const auto config = shape("llama-3.1-8b");
  const auto c = cluster("h100x2");
  const SimOptions o = full_run_only(8);
  const auto workload = fixed_workload(8, 128, 100);
  Strategy s = strategy("pp=2");
  s.failures = FailureInjection{true, {}, 50, 0, 3.0};
  auto with = simulate(config, c, s, workload, o);
  ASSERT_TRUE(with.ok()) << with.error().to_string();
  s.failures->replicate_kv = false;
  auto without = simulate(config, c, s, workload, o);
  ASSERT_TRUE(without.ok()) << without.error().to_string();
  EXPECT_EQ(with->strategy, "tp=1,pp=2,sp=1,dp=1 fixed failures+replicated-kv");
  EXPECT_EQ(without->strategy, "tp=1,pp=2,sp=1,dp=1 fixed failures");

  // All 8 run in one batch and reach token 50 together.
  const double kv_per_token = 2.0 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2;
  const double weights = double(engine::weight_bytes_for(config, c.device.weight_dtype));
  for (const SimResult* r : {&*with, &*without}) {
    EXPECT_EQ(r->num_failures, 1);
    EXPECT_EQ(r->num_failure_hit_requests, 8);
    // Noticed after 3 s, then each stage reloads its half of the weights.
    EXPECT_NEAR(r->failure_downtime_s, 3.0 + weights / 2 / c.device.host_link_bw_bytes_per_s.value, 1e-9);
    EXPECT_GT(r->elapsed_s, r->failure_free_elapsed_s + r->failure_downtime_s);
    EXPECT_GT(r->failure_latency_ratio, 1.0);
  }
  EXPECT_EQ(with->failure_recomputed_tokens, 0);
  EXPECT_DOUBLE_EQ(with->restored_bytes, 8 * (128 + 50 - 1) * kv_per_token);
  // Every position of every request streamed to the replica once (the
  // last sampled token's KV is computed but never needed: it still streams).
  EXPECT_GE(with->replicated_bytes, 8 * (128 + 99) * kv_per_token);
  EXPECT_EQ(without->failure_recomputed_tokens, 8 * (128 + 49));
  EXPECT_EQ(without->replicated_bytes, 0.0);
  EXPECT_EQ(without->restored_bytes, 0.0);
  EXPECT_GT(without->failure_latency_ratio, with->failure_latency_ratio);
  EXPECT_LT(without->total_tok_s, with->total_tok_s);
}

TEST(Simulator, FailuresAtGivenTimesEachRestartTheGroup) {
  const auto config = shape("llama-3.1-8b");
  const SimOptions o = full_run_only(16);
  Strategy s = strategy("tp=2,dp=2");
  s.failures = FailureInjection{true, {1.0, 2.5, 1e6}, 0, 1, 0.5};
  auto r = simulate(config, cluster("h100x4"), s, fixed_workload(64, 256, 400), o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->num_failures, 2) << "the third comes after the job; elapsed " << r->elapsed_s;
  EXPECT_NEAR(r->first_failure_s, 1.0, 0.1);

  // Bad injections are clear errors.
  s.failures->group = 2;
  auto bad = simulate(config, cluster("h100x4"), s, fixed_workload(4, 16, 4), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not one of the 2 DP groups"), std::string::npos) << bad.error().message;
  s.failures = FailureInjection{true, {3.0, 1.0}, 0, 0, 0.5};
  bad = simulate(config, cluster("h100x4"), s, fixed_workload(4, 16, 4), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("ascending"), std::string::npos) << bad.error().message;
  s.failures = FailureInjection{};
  bad = simulate(config, cluster("h100x4"), s, fixed_workload(4, 16, 4), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("needs times, a token or a mean time between failures"), std::string::npos)
      << bad.error().message;
  s.failures = FailureInjection{true, {}, 0, 0, 0.5, -1.0};
  bad = simulate(config, cluster("h100x4"), s, fixed_workload(4, 16, 4), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("must be >= 0"), std::string::npos) << bad.error().message;
}

// DéjàVu's failures at a given frequency (§5.2.3): a Poisson process of
// mean time between failures mtbf_s, drawn from a seed. The same seed
// gives the same run; more frequent failures cost more; with replicated KV
// each costs less than without.
TEST(Simulator, FailuresAtARateFollowTheirMeanTimeBetweenFailures) {
  const auto config = shape("llama-3.1-8b");
  const SimOptions o = full_run_only(16);
  const auto workload = fixed_workload(64, 256, 400);
  auto run = [&](double mtbf_s, std::uint64_t seed, bool replicate) {
    Strategy s = strategy("tp=2,dp=2");
    s.failures = FailureInjection{replicate, {}, 0, 0, 0.2, mtbf_s, seed};
    auto r = simulate(config, cluster("h100x4"), s, workload, o);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : SimResult{};
  };
  const SimResult a = run(1.0, 7, true);
  const SimResult again = run(1.0, 7, true);
  EXPECT_EQ(a.num_failures, again.num_failures);
  EXPECT_DOUBLE_EQ(a.elapsed_s, again.elapsed_s);
  // The failing group's time divided by the mean gap: about that many
  // failures (a Poisson count; the bounds hold for this seed and are wide
  // for any other).
  ASSERT_GT(a.elapsed_s, 2.0) << "too short a job to see failures at this rate";
  EXPECT_GE(a.num_failures, 1);
  EXPECT_LE(a.num_failures, static_cast<int>(4 * a.elapsed_s / 1.0) + 2);
  const SimResult rare = run(1e6, 7, true);
  EXPECT_EQ(rare.num_failures, 0);
  const SimResult frequent = run(0.25, 7, true);
  EXPECT_GT(frequent.num_failures, a.num_failures);
  EXPECT_GT(frequent.elapsed_s, rare.elapsed_s);
  const SimResult without = run(1.0, 7, false);
  EXPECT_GE(without.num_failures, a.num_failures) << "a job that starts over runs longer, and meets more";
  EXPECT_GT(without.failure_recomputed_tokens, a.failure_recomputed_tokens);
  EXPECT_GT(without.elapsed_s, a.elapsed_s);
}

// SiDP (seed 002): the ranks share the FFN weights, so each holds about
// 1/dp of them and the KV cache gets the rest (§4.1).
TEST(Simulator, SidpRanksHoldTheirShareOfTheFfnAndTheKvGetsTheRest) {
  const auto config = shape("qwen3-32b");
  const auto c = cluster("h200x8");
  const SimOptions o = full_run_only(64);
  const auto workload = fixed_workload(64, 256, 8);
  auto plain = simulate(config, c, strategy("dp=8"), workload, o);
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  Strategy s = strategy("dp=8");
  s.sidp = SidpStrategy{engine::SidpModeSetting::was, 0, 0.25, 3.0, 2};
  auto sidp = simulate(config, c, s, workload, o);
  ASSERT_TRUE(sidp.ok()) << sidp.error().to_string();
  EXPECT_EQ(sidp->strategy, "tp=1,pp=1,sp=1,dp=8 fixed sidp(was)");
  // Rank by rank, as engine/sidp_memory.hpp counts the weights.
  const double usable = double(usable_memory_bytes(c.device));
  const double activation = double(engine::activation_bytes_for(config, o.max_num_batched_tokens, o.max_batch));
  const double per_block = 2.0 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 16 * 2;
  long long tokens = 0;
  for (int r = 0; r < 8; ++r) {
    const int owned = engine::sidp_owned_ffn_layer_count(config.num_hidden_layers, 8, r);
    const double weights = double(engine::sidp_weight_bytes_for(config, c.device.weight_dtype, owned, 2));
    tokens += static_cast<long long>(std::floor((usable - weights - activation) / per_block)) * 16;
  }
  EXPECT_EQ(sidp->kv_capacity_tokens, tokens);
  EXPECT_EQ(plain->kv_capacity_tokens, static_cast<long long>(plain->num_kv_blocks) * 16 * 8);
  EXPECT_GT(sidp->kv_capacity_tokens, 1.6 * plain->kv_capacity_tokens) << "the paper: up to 1.8x";

  // SiDP needs single-device ranks.
  Strategy bad = strategy("tp=2,dp=4");
  bad.sidp = SidpStrategy{};
  auto r = simulate(config, c, bad, workload, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("single-device ranks"), std::string::npos) << r.error().message;
}

// WaS: a rank fetches its (L - owned) FFN layers every step while it
// computes; at a small batch the fetch is the whole step. CaS: the ranks
// step in lockstep and each layer's FFN runs at its owner for the group.
TEST(Simulator, SidpWasStepsAreBoundByTheWeightFetchesAndCasStepsByTheOwners) {
  const auto config = shape("qwen3-32b");
  const auto c = cluster("h200x8");
  const SimOptions o = full_run_only(64);
  const auto workload = fixed_workload(512, 64, 32);
  Strategy was = strategy("dp=8");
  was.sidp = SidpStrategy{engine::SidpModeSetting::was, 0, 0.25, 3.0, 2};
  auto w = simulate(config, c, was, workload, o);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  auto cm = sim::CostModel::create(sim::ModelShape::from_config(config), element_sizes(c.device),
                                            group_hardware(c, 1, 8));
  ASSERT_TRUE(cm.ok());
  const sim::LinkSpec link{c.device.intra_node_bw_bytes_per_s.value, c.device.intra_node_latency_s.value};
  const double fetch_ms = (64 - 8) * cm->sidp_weight_fetch_ms(link);
  EXPECT_EQ(w->decode_batch, 64);
  EXPECT_NEAR(w->decode_step_ms,
              c.device.step_overhead_ms.value + 64 * c.device.seq_overhead_ms.value + fetch_ms, 1e-6 * fetch_ms);
  EXPECT_EQ(w->sidp_switches, 0);
  EXPECT_EQ(w->sidp_cas_step_fraction, 0.0);

  Strategy cas = was;
  cas.sidp->mode = engine::SidpModeSetting::cas;
  auto k = simulate(config, c, cas, workload, o);
  ASSERT_TRUE(k.ok()) << k.error().to_string();
  EXPECT_EQ(k->sidp_cas_step_fraction, 1.0);
  // At 64 sequences per rank the owners' FFN for the group's 512 rows still
  // costs less than fetching the weights; each owner computes all 512.
  EXPECT_LT(k->decode_step_ms, 0.7 * w->decode_step_ms);
  EXPECT_GT(k->decode_step_ms, 64 * cm->sidp_ffn_gemm_ms(512)) << "every layer's FFN at its owner, for the group";
}

// WaS on devices that share one memory bus (CPU devices): a fetch is a
// memcpy by a core, and the calibrated fraction of the group's copy time
// (was_copy_exposed_by_rows) lengthens every WaS step; a GPU's copy engine
// hides it (the test above: fetch-bound steps, no copy term).
TEST(Simulator, SidpWasStepsOnASharedBusAddTheExposedPartOfTheFetchCopy) {
  const auto config = shape("qwen3-32b");
  ClusterSpec c = cluster("h200x2");
  c.device.shared_memory_bus = true;
  c.device.intra_node_bw_bytes_per_s.value = 1e15;  // the link never holds the step: the copy term shows alone
  const SimOptions o = full_run_only(16);
  const auto workload = fixed_workload(32, 64, 16);
  Strategy was = strategy("dp=2");
  was.sidp = SidpStrategy{engine::SidpModeSetting::was, 0, 0.25, 3.0, 2};
  auto cm = sim::CostModel::create(sim::ModelShape::from_config(config), element_sizes(c.device),
                                            group_hardware(c, 1, 2));
  ASSERT_TRUE(cm.ok());
  const double copy_ms = sidp_was_copy_ms(c.device, *cm, 2, 32);
  EXPECT_DOUBLE_EQ(copy_ms, 2 * 32 * cm->ffn_layer_bytes() / c.device.host_link_bw_bytes_per_s.value * 1e3)
      << "both ranks copy their 32 fetched layers at the shared copy rate";
  EXPECT_EQ(sidp_was_copy_ms(cluster("h200x2").device, *cm, 2, 32), 0.0) << "a GPU's copy engine overlaps it";

  auto step_ms = [&](std::vector<std::pair<double, double>> exposed) {
    ClusterSpec k = c;
    k.device.was_copy_exposed_by_rows = std::move(exposed);
    k.device.was_copy_exposed_by_rows_source = "test";
    auto r = simulate(config, k, was, workload, o);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->decode_batch, 16);
    return r->decode_step_ms;
  };
  const double whole = step_ms({});
  const double hidden = step_ms({{1, 0.0}});
  const double quarter = step_ms({{8, 0.0}, {24, 0.5}});  // 0.25 at the 16 rows of a decode step
  EXPECT_NEAR(whole - hidden, copy_ms, 1e-9 * whole);
  EXPECT_NEAR(quarter - hidden, 0.25 * copy_ms, 1e-9 * whole);
}

// The orchestrator's switching (§4.3) on the virtual clock: WaS for the
// bulk of a long-tailed job, CaS for its tail, faster than either mode alone.
TEST(Simulator, SidpAutoSwitchesToCasInTheTailAndBeatsEitherModeAlone) {
  const auto config = shape("qwen3-32b");
  const auto c = cluster("h200x8");
  const SimOptions o = full_run_only(256);
  auto in = parse_length_dist("1024");
  auto out = parse_length_dist("loguniform:16:2048");
  ASSERT_TRUE(in.ok() && out.ok());
  const auto workload = generate_workload(1000, *in, *out, 1);
  double best_single = 0;
  SimResult automatic;
  for (const auto mode : {engine::SidpModeSetting::was, engine::SidpModeSetting::cas, engine::SidpModeSetting::automatic}) {
    Strategy s = strategy("dp=8");
    s.sidp = SidpStrategy{mode, 512, 0.25, 0.5, 2};
    auto r = simulate(config, c, s, workload, o);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    if (mode == engine::SidpModeSetting::automatic) automatic = *r;
    else best_single = std::max(best_single, r->total_tok_s);
  }
  EXPECT_EQ(automatic.sidp_switch_batch, 512);
  EXPECT_GE(automatic.sidp_switches, 1);
  EXPECT_GT(automatic.sidp_cas_step_fraction, 0.0);
  EXPECT_LT(automatic.sidp_cas_step_fraction, 1.0);
  EXPECT_GT(automatic.total_tok_s, 1.1 * best_single);
}

}  // namespace
}  // namespace shardline::sim
