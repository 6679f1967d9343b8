// build_engine with EngineOptions::device_memory_bytes (`--device-memory`) on
// a CPU device: the memory plan carves weights, activations and KV blocks
// out of the budget and refuses what does not fit, on the shipped
// stories260K (numbers computed by hand below).
#include <gtest/gtest.h>

#include <string>

#include "engine/group/engine_builder.hpp"
#include "engine/gpu_memory_plan.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_device_memory_test {

using testing_support::kStoriesDir;

// stories260K: hidden 64, intermediate 172, 5 layers, 8 heads / 4 KV heads of
// head_dim 8, vocab 512, tied embeddings. F32 weights, by hand:
//   per layer: qkv 128x64 + o_proj 64x64 + FFN 3x64x172 = 45312 elements
//              = 181248 B, + 2 norms x 64 F32 = 512 B -> 181760 B
//   5 layers 908800 + embed 512x64x4 = 131072 + final norm 256 = 1040128 B
constexpr std::uint64_t kWeights = 1'040'128;
constexpr std::uint64_t kFfnPerLayer = 3 * 64 * 172 * 4;  // 132096 B
// Activations at 64 batched tokens, 8 sequences: per token 64 + 64 + 128 +
// 64 + 344 + 172 = 836 floats; logits 8 x 512. 4 x (64 x 836 + 4096).
constexpr std::uint64_t kActivations = 230'400;
// KV block, F32, 16 tokens: 2 x 5 layers x 4 heads x 8 x 16 x 4 = 20480 B.
constexpr std::uint64_t kBlock = 20'480;
// max_model_len 128 -> 8 blocks per sequence; max_num_seqs 8 -> 64 blocks usable.

EngineOptions options(std::uint64_t device_memory) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.max_model_len = 128;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.device_memory_bytes = device_memory;
  return o;
}

TEST(DeviceMemory, HandNumbersMatchThePlanInputs) {
  auto cfg = model::load_model_config(kStoriesDir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  EXPECT_EQ(weight_bytes_for(*cfg, DType::f32), kWeights);
  EXPECT_EQ(activation_bytes_for(*cfg, 64, 8), kActivations);
}

TEST(DeviceMemory, FittingBudgetGivesThePlannedBlocks) {
  // 20 blocks and 100 spare bytes after weights and activations.
  auto e = build_engine(options(kWeights + kActivations + 20 * kBlock + 100));
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->num_kv_blocks, 20);
  EXPECT_EQ(e->kv_cache_bytes, 20 * kBlock);
  EXPECT_EQ(e->weight_bytes, kWeights);
  EXPECT_EQ(e->weight_bytes, e->weights->total_bytes());

  // It generates with them.
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 4;
  p.ignore_eos = true;
  auto outs = e->engine->generate({{1, 20, 30}}, p);
  ASSERT_TRUE(outs.ok()) << outs.error().to_string();
  EXPECT_EQ((*outs)[0].token_ids.size(), 4u);
}

TEST(DeviceMemory, BlocksAreCappedByWhatTheSequencesCanUse) {
  auto e = build_engine(options(64ull << 20));
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->num_kv_blocks, 64);  // 8 sequences x 8 blocks, not the ~3000 that fit
  // --kv-cache-bytes, when also given, caps the plan's KV space.
  EngineOptions o = options(64ull << 20);
  o.kv_cache_bytes = 10 * kBlock;
  e = build_engine(o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->num_kv_blocks, 10);
}

TEST(DeviceMemory, SidpWeightsLeaveMoreBlocks) {
  // Owning 2 of 5 FFN layers with 1 cache slot frees 2 layers' FFN weights.
  EngineOptions o = options(kWeights + kActivations + 20 * kBlock + 100);
  o.sidp_owned_ffn_layers = 2;
  o.sidp_cache_slots = 1;
  auto e = build_engine(o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->weight_bytes, kWeights - 2 * kFfnPerLayer);  // 775936
  // (20 x 20480 + 100 + 264192) / 20480 = 673892 / 20480 = 32.9
  EXPECT_EQ(e->num_kv_blocks, 32);
}

TEST(DeviceMemory, TooSmallForTheWeightsNamesTheSizes) {
  auto e = build_engine(options(1ull << 20));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::out_of_memory);
  const std::string& m = e.error().message;
  EXPECT_NE(m.find("cpu:0: "), std::string::npos) << m;
  EXPECT_NE(m.find("model weights need 1015.75 KiB"), std::string::npos) << m;  // 1040128 B
  EXPECT_NE(m.find("activations 225.00 KiB"), std::string::npos) << m;          // 230400 B
  EXPECT_NE(m.find("= 1.21 MiB"), std::string::npos) << m;                      // 1270528 B
  EXPECT_NE(m.find("--device-memory is 1.00 MiB (1048576 bytes)"), std::string::npos) << m;
}

TEST(DeviceMemory, NoRoomForOneSequenceIsRefused) {
  // 7 blocks left; a 128-token sequence needs 8.
  auto e = build_engine(options(kWeights + kActivations + 8 * kBlock - 1));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(e.error().message.find("KV cache of 7 blocks holds 112 tokens"), std::string::npos)
      << e.error().message;
  EXPECT_NE(e.error().message.find("needs 8 blocks"), std::string::npos) << e.error().message;
  // One byte more fits exactly one sequence.
  e = build_engine(options(kWeights + kActivations + 8 * kBlock));
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->num_kv_blocks, 8);
}

TEST(DeviceMemory, BadCombinationsAreRefused) {
  EngineOptions o = options(64ull << 20);
  o.device = model::DeviceKind::cuda;
  auto e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("--device-memory is for CPU devices"), std::string::npos) << e.error().message;

  o = options(64ull << 20);
  o.parallel.tp = 2;
  e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::unsupported);

  o = options(64ull << 20);
  o.sidp_owned_ffn_layers = 6;  // the model has 5
  e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  o.sidp_owned_ffn_layers = -2;
  EXPECT_EQ(build_engine(o).error().code, ErrorCode::invalid_argument);
  o.sidp_owned_ffn_layers = -1;
  o.sidp_cache_slots = -1;
  EXPECT_EQ(build_engine(o).error().code, ErrorCode::invalid_argument);
}

TEST(DeviceMemory, OffRecordsTheLoadedWeightBytes) {
  EngineOptions o = options(0);
  o.kv_cache_bytes = 10 * kBlock;
  auto e = build_engine(o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(e->num_kv_blocks, 10);
  EXPECT_EQ(e->weight_bytes, kWeights);
}

}  // namespace
}  // namespace shardline::engine
