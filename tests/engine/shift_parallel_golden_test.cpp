// Shift Parallelism (seed 001 §3.3, Alg. 3) on in-process engine groups:
// a base config SP×TP and a shift config TP' = SP×TP over the same devices
// and one KV cache, the config chosen per step by the batched token count.
//  - The §3.3.1 head order: device (s, t) is TP' rank t·sp + s, so each
//    shift runner sees the very KV memory and heads of its base runner
//    (sp2: no reorder; sp2×tp2: devices 1 and 2 swap).
//  - stories260K through every threshold: the reference greedy ids, logits
//    within the TP tolerance (1e-4) of one device; T = 0 is bit-identical
//    to the static base config and a threshold above every step to static
//    TP'; a mixed threshold runs steps in both configs and switches.
//  - dummy Qwen3 (5 layers) sp2×tp2 with a mixed threshold: ids equal and
//    logits within 1e-4 of one device.
//  - A KV budget so small that sequences are preempted across shifts: every
//    request finishes once with the reference ids.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "tests/support/dummy_qwen3.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_shift_parallel_golden_test {

using testing_support::kStoriesDir;

EngineOptions stories_options() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 7;  // chunked prefill: 7-token steps, then decode steps of the running count
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

struct ShiftRun {
  std::vector<RequestOutput> outputs;
  ShiftStats stats;
};

/// Runs `prompts` on one group under `pc`, with Shift at `threshold` (-1: no shift config).
Result<ShiftRun> run(EngineOptions o, const ParallelConfig& pc, long long threshold,
                     const std::vector<std::vector<std::int32_t>>& prompts, const sampling::SamplingParams& params) {
  o.parallel = pc;
  if (threshold >= 0) o.shift = ShiftOptions{ShiftPolicyOptions{threshold, 0.25}};
  Result<EngineInstance> e = build_engine(o);
  if (!e.ok()) return std::move(e).error();
  std::vector<LlmEngine*> engines = {e->engine.get()};
  auto out = generate_data_parallel(engines, prompts, params);
  if (!out.ok()) return std::move(out).error();
  ShiftRun r;
  r.outputs = std::move(out).value();
  if (auto* g = e->executor_as<InProcEngineGroup>()) r.stats = g->executor().shift_stats();
  return r;
}

using testing_support::bit_identical;
using testing_support::max_logit_diff;

TEST(ShiftParallel, ShiftRanksFollowTheSpTpHeadOrder) {
  const ParallelConfig sp2tp2{2, 1, 2, 1};
  // rank = sp_rank * tp + tp_rank; TP' rank = tp_rank * sp + sp_rank.
  EXPECT_EQ(shift_spec_of(sp2tp2, 0).tp_rank, 0);
  EXPECT_EQ(shift_spec_of(sp2tp2, 1).tp_rank, 2);
  EXPECT_EQ(shift_spec_of(sp2tp2, 2).tp_rank, 1);
  EXPECT_EQ(shift_spec_of(sp2tp2, 3).tp_rank, 3);
  EXPECT_EQ(shift_spec_of(sp2tp2, 3).tp, 4);
  EXPECT_EQ(shift_group_ranks(sp2tp2), (std::vector<int>{0, 2, 1, 3}));
  const ParallelConfig sp3tp2{2, 1, 3, 1};  // the paper's SP_TP group [[0, 2, 4, 1, 3, 5]]
  EXPECT_EQ(shift_group_ranks(sp3tp2), (std::vector<int>{0, 2, 4, 1, 3, 5}));
  const ParallelConfig sp2{1, 1, 2, 1};
  EXPECT_EQ(shift_group_ranks(sp2), (std::vector<int>{0, 1}));
}

TEST(ShiftParallel, EveryShiftRunnerSeesItsBaseRunnersKvMemoryAndHeads) {
  auto weights = load_weights(stories_options());
  ASSERT_TRUE(weights.ok());
  for (const ParallelConfig& pc : {ParallelConfig{1, 1, 2, 1}, ParallelConfig{1, 1, 4, 1}, ParallelConfig{2, 1, 2, 1},
                                   ParallelConfig{2, 1, 1, 1}}) {
    SCOPED_TRACE(pc.to_string());
    model::CpuRunnerOptions ro{64, 16, 1, DType::f32};
    auto g = InProcEngineGroup::create(*weights, pc, ro, ShiftOptions{});
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    const auto base = (*g)->kv_cache_views();
    const auto shift = (*g)->shift_kv_cache_views();
    ASSERT_EQ(shift.size(), base.size());
    for (std::size_t r = 0; r < base.size(); ++r) {
      EXPECT_EQ(shift[r].data, base[r].data) << "rank " << r;
      EXPECT_EQ(shift[r].layout.kv_heads, base[r].layout.kv_heads) << "rank " << r;
      EXPECT_EQ(shift[r].layout.layer_begin, base[r].layout.layer_begin);
      EXPECT_EQ(shift[r].layout.layer_end, base[r].layout.layer_end);
    }
  }
}

TEST(ShiftParallel, BadConfigsAreRefusedClearly) {
  auto weights = load_weights(stories_options());
  ASSERT_TRUE(weights.ok());
  model::CpuRunnerOptions ro{64, 16, 1, DType::f32};
  auto pp = InProcEngineGroup::create(*weights, ParallelConfig{1, 2, 2, 1}, ro, ShiftOptions{});
  ASSERT_FALSE(pp.ok());
  EXPECT_NE(pp.error().message.find("pp = 1"), std::string::npos) << pp.error().message;
  // sp=8 shards stories260K (8 heads) but the shift config tp=8 cannot split its 172-wide FFN.
  auto sp8 = InProcEngineGroup::create(*weights, ParallelConfig{1, 1, 8, 1}, ro, ShiftOptions{});
  ASSERT_FALSE(sp8.ok());
  EXPECT_NE(sp8.error().message.find("shift config tp=8"), std::string::npos) << sp8.error().message;
  auto bad = InProcEngineGroup::create(*weights, ParallelConfig{1, 1, 2, 1}, ro,
                                       ShiftOptions{ShiftPolicyOptions{-3, 0.25}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--shift-threshold"), std::string::npos);
  EngineOptions single = stories_options();
  single.shift = ShiftOptions{};
  auto one = build_engine(single);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.error().code, ErrorCode::unsupported) << one.error().to_string();
}

TEST(ShiftParallel, Stories260KThroughEveryThresholdMatchesReference) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  auto single = run(stories_options(), {}, -1, prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (const ParallelConfig& pc : {ParallelConfig{1, 1, 2, 1}, ParallelConfig{2, 1, 2, 1}, ParallelConfig{1, 1, 4, 1}}) {
    const ParallelConfig tp_all{pc.group_size(), 1, 1, 1};
    auto static_base = run(stories_options(), pc, -1, prompts, greedy);
    auto static_shift = run(stories_options(), tp_all, -1, prompts, greedy);
    ASSERT_TRUE(static_base.ok() && static_shift.ok());
    for (long long threshold : {0LL, 3LL, 1LL << 20}) {
      const std::string what = pc.to_string() + " T=" + std::to_string(threshold);
      SCOPED_TRACE(what);
      auto got = run(stories_options(), pc, threshold, prompts, greedy);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      for (std::size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(got->outputs[i].token_ids, cases[i].generated_ids) << "reference ids, case " << i;
      }
      const float d = max_logit_diff(got->outputs, single->outputs);
      EXPECT_LE(d, 1e-4f);
      std::printf("  %-24s max |logit - single| = %.3g, base/shift steps %llu/%llu, %llu switches\n", what.c_str(),
                  static_cast<double>(d), static_cast<unsigned long long>(got->stats.base_steps),
                  static_cast<unsigned long long>(got->stats.shift_steps),
                  static_cast<unsigned long long>(got->stats.switches));
      if (threshold == 0) {
        EXPECT_EQ(got->stats.shift_steps, 0u);
        EXPECT_TRUE(bit_identical(got->outputs, static_base->outputs)) << "T=0 differs from the static base config";
      } else if (threshold == 3) {
        EXPECT_GT(got->stats.base_steps, 0u);
        EXPECT_GT(got->stats.shift_steps, 0u);
        EXPECT_GE(got->stats.switches, 1u);
      } else {
        EXPECT_EQ(got->stats.base_steps, 0u);
        EXPECT_TRUE(bit_identical(got->outputs, static_shift->outputs))
            << "always-shift differs from static " << tp_all.to_string();
      }
    }
  }
}

TEST(ShiftParallel, DummyQwen3MixedThresholdMatchesOneDevice) {
  EngineOptions o = testing_support::dummy_qwen3_options();
  auto weights = load_weights(o);
  ASSERT_TRUE(weights.ok());
  o.weights = *weights;
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::dummy_qwen3_prompts();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  auto single = run(o, {}, -1, prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  auto got = run(o, ParallelConfig{2, 1, 2, 1}, 3, prompts, greedy);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  for (std::size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got->outputs[i].token_ids, single->outputs[i].token_ids);
  EXPECT_LE(max_logit_diff(got->outputs, single->outputs), 1e-4f);
  EXPECT_GT(got->stats.base_steps, 0u);
  EXPECT_GT(got->stats.shift_steps, 0u);
}

// Preemptions (recompute and swap) across shifts lose and duplicate nothing.
TEST(ShiftParallel, TinyKvBudgetPreemptsAcrossShiftsAndKeepsEveryRequestOnce) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  for (PreemptionMode mode : {PreemptionMode::recompute, PreemptionMode::swap}) {
    EngineOptions o = stories_options();
    o.kv_cache_bytes = 0;
    o.block_size = 4;
    o.preemption_mode = mode;
    // 16 blocks of 4 tokens: about one and a half sequences' worth.
    o.max_model_len = 64;
    o.kv_cache_bytes = 16ull * 4 * 5 * 2 * 4 * 8 * 4;  // blocks * tokens * layers * K,V * heads * hd * f32
    auto got = run(o, ParallelConfig{2, 1, 2, 1}, 3, prompts, greedy);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    ASSERT_EQ(got->outputs.size(), cases.size());
    int preempted = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(got->outputs[i].request_id, i);
      EXPECT_EQ(got->outputs[i].token_ids, cases[i].generated_ids) << "case " << i;
      preempted += got->outputs[i].num_preemptions;
    }
    EXPECT_GT(preempted, 0) << "the budget preempted nothing";
    EXPECT_GT(got->stats.shift_steps, 0u);
    EXPECT_GT(got->stats.base_steps, 0u);
  }
}

}  // namespace
}  // namespace shardline::engine
