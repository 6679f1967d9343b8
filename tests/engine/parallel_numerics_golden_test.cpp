// Numerics of every parallel config against one device, through the whole
// engine (scheduler, pipelined micro-batches, sampler) with in-process
// engine groups:
//  - stories260K (8 heads, 4 KV heads, 5 layers): TP in {1,2,4}, PP in
//    {1,2,5}, SP in {2,4,8} (SP 8 replicates KV heads), DP in {1,2}, TP2xPP2,
//    SP2xTP2 give the reference greedy ids, and every logit of every step is
//    within 1e-4 of the single-device run. Configs without TP are
//    bit-identical (row-independent, batch-invariant kernels; no partial sums).
//  - a dummy Qwen3 shape (qwen3-0.6b, 5 layers, q/k norm, tied embeddings,
//    16 heads / 8 KV heads): the same configs, greedy ids equal and logits
//    within 1e-4 of one device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/group/engine_builder.hpp"
#include "engine/data_parallel.hpp"
#include "tests/support/dummy_qwen3.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_parallel_numerics_golden_test {

using testing_support::kStoriesDir;

struct Run {
  std::vector<RequestOutput> outputs;
};

EngineOptions stories_options(int max_num_batched_tokens) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.capture_logits = true;
  o.check_integrity = true;
  return o;
}

/// The dummy Qwen3 weights, made once: every config's engine shares them
/// (making 150M dummy values took most of this test's time, once per
/// config and DP replica).
std::shared_ptr<const model::ModelWeights> qwen3_weights() {
  static const std::shared_ptr<const model::ModelWeights> weights = [] {
    auto w = load_weights(testing_support::dummy_qwen3_options());
    EXPECT_TRUE(w.ok()) << w.error().to_string();
    return w.ok() ? *w : nullptr;
  }();
  return weights;
}

EngineOptions qwen3_options() {
  EngineOptions o = testing_support::dummy_qwen3_options();
  o.num_threads = 0;  // cores / group size
  o.weights = qwen3_weights();
  return o;
}

/// Runs `prompts` under `pc` (dp replicas of tp x sp x pp groups).
Result<std::vector<RequestOutput>> run_config(EngineOptions o, const ParallelConfig& pc,
                                              const std::vector<std::vector<std::int32_t>>& prompts,
                                              const sampling::SamplingParams& params) {
  ParallelConfig group = pc;
  group.dp = 1;
  o.parallel = group;
  std::vector<EngineInstance> replicas;
  std::vector<LlmEngine*> engines;
  for (int r = 0; r < pc.dp; ++r) {
    Result<EngineInstance> e = build_engine(o);
    if (!e.ok()) return std::move(e).error();
    replicas.push_back(std::move(e).value());
  }
  for (EngineInstance& e : replicas) engines.push_back(e.engine.get());
  return generate_data_parallel(engines, prompts, params, pc.dp > 1 ? 1 : 0);
}

std::vector<ParallelConfig> all_configs() {
  std::vector<ParallelConfig> out;
  for (int tp : {2, 4}) out.push_back({tp, 1, 1, 1});
  for (int pp : {2, 5}) out.push_back({1, pp, 1, 1});
  for (int sp : {2, 4, 8}) out.push_back({1, 1, sp, 1});
  out.push_back({1, 1, 1, 2});  // dp 2
  out.push_back({2, 2, 1, 1});  // tp2 x pp2
  out.push_back({2, 1, 2, 1});  // sp2 x tp2
  out.push_back({2, 1, 1, 2});  // tp2 x dp2
  return out;
}

/// Every generated token and every logit against the single-device run.
void expect_matches(const std::vector<RequestOutput>& got, const std::vector<RequestOutput>& ref,
                    const ParallelConfig& pc, bool exact) {
  ASSERT_EQ(got.size(), ref.size());
  float max_diff = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].token_ids, ref[i].token_ids) << pc.to_string() << " request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size()) << pc.to_string();
    for (std::size_t s = 0; s < ref[i].logits.size(); ++s) {
      ASSERT_EQ(got[i].logits[s].size(), ref[i].logits[s].size());
      for (std::size_t v = 0; v < ref[i].logits[s].size(); ++v)
        max_diff = std::max(max_diff, std::fabs(got[i].logits[s][v] - ref[i].logits[s][v]));
      if (exact) {
        EXPECT_EQ(0, std::memcmp(got[i].logits[s].data(), ref[i].logits[s].data(), ref[i].logits[s].size() * 4))
            << pc.to_string() << " request " << i << " step " << s << " not bit-identical";
      }
    }
  }
  EXPECT_LE(max_diff, 1e-4f) << pc.to_string();
  std::printf("  %-22s max |logit - single| = %.3g\n", pc.to_string().c_str(), static_cast<double>(max_diff));
}

TEST(ParallelNumerics, Stories260KEveryConfigMatchesReferenceAndSingleDevice) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  // A budget of 7 tokens: prompts are chunked and SP chunks are uneven.
  Result<std::vector<RequestOutput>> single = run_config(stories_options(7), {}, prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (std::size_t i = 0; i < cases.size(); ++i) ASSERT_EQ(single.value()[i].token_ids, cases[i].generated_ids);
  for (const ParallelConfig& pc : all_configs()) {
    for (int budget : {7, 256}) {
      SCOPED_TRACE(pc.to_string() + " budget " + std::to_string(budget));
      Result<std::vector<RequestOutput>> got = run_config(stories_options(budget), pc, prompts, greedy);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      for (std::size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(got.value()[i].token_ids, cases[i].generated_ids) << "reference ids, case " << i;
        for (std::size_t s = 0; s < cases[i].top5.size(); ++s)
          testing_support::expect_top5(got.value()[i].logits[s], cases[i].top5[s],
                                       pc.to_string() + " case " + std::to_string(i) + " step " + std::to_string(s));
      }
      expect_matches(got.value(), single.value(), pc, /*exact=*/pc.tp == 1);
    }
  }
}

TEST(ParallelNumerics, DummyQwen3EveryConfigMatchesSingleDevice) {
  std::vector<std::vector<std::int32_t>> prompts = {
      {151643, 785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 576},
      {9707, 11, 1879},
      {40, 1079, 264, 2083, 1614, 323, 358, 1366, 311, 1492, 498, 449, 2146, 2797, 4755, 30, 21927}};
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 6;
  greedy.ignore_eos = true;
  Result<std::vector<RequestOutput>> single = run_config(qwen3_options(), {}, prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (const ParallelConfig& pc : all_configs()) {
    SCOPED_TRACE(pc.to_string());
    Result<std::vector<RequestOutput>> got = run_config(qwen3_options(), pc, prompts, greedy);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    expect_matches(got.value(), single.value(), pc, /*exact=*/pc.tp == 1);
  }
}

TEST(ParallelNumerics, UnshardableConfigIsAClearError) {
  EngineOptions o = stories_options(64);
  o.parallel = {3, 1, 1, 1};  // 8 heads do not split over 3 ranks
  Result<EngineInstance> e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("num_attention_heads = 8"), std::string::npos) << e.error().message;
  o.parallel = {1, 6, 1, 1};  // 5 layers
  e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("num_hidden_layers = 5"), std::string::npos) << e.error().message;
}

}  // namespace
}  // namespace shardline::engine
