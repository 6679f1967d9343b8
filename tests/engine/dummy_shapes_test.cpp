// Smoke tests of the dummy load format on the public shapes the benchmarks
// use (reduced layer counts): Qwen3 (GQA, q/k RMSNorm, tied embeddings) and
// Llama 3.1 (GQA, llama3 rope scaling, untied lm_head) run a few steps.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/group/engine_builder.hpp"

namespace shardline::engine {
namespace engine_dummy_shapes_test {

void run_shape(const std::string& shape, DType dtype, int num_layers) {
  EngineOptions o;
  o.model_dir = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/" + shape;
  o.load_format = model::LoadFormat::dummy;
  o.dtype = dtype;
  o.seed = 3;
  o.num_layers_override = num_layers;
  o.max_model_len = 64;
  o.kv_cache_bytes = 64ull << 20;
  o.max_num_batched_tokens = 16;  // chunk the 20-token prompt
  o.capture_logits = true;
  auto e = build_engine(o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ(static_cast<int>(e->weights->layers.size()), num_layers);
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 4;
  p.ignore_eos = true;
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(100 + 37 * i);
  auto outs = e->engine->generate({prompt, {5, 6, 7}}, p);
  ASSERT_TRUE(outs.ok()) << outs.error().to_string();
  ASSERT_EQ(outs->size(), 2u);
  const int vocab = e->weights->config.vocab_size;
  for (const RequestOutput& out : *outs) {
    ASSERT_EQ(out.token_ids.size(), 4u);
    for (std::int32_t t : out.token_ids) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, vocab);
    }
    for (const auto& row : out.logits) {
      ASSERT_EQ(static_cast<int>(row.size()), vocab);
      for (float v : row) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST(DummyShapes, Qwen3_0_6bTwoLayersF32) { run_shape("qwen3-0.6b", DType::f32, 2); }
TEST(DummyShapes, Llama31_8bOneLayerBf16) { run_shape("llama-3.1-8b", DType::bf16, 1); }

}  // namespace
}  // namespace shardline::engine
