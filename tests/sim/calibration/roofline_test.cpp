// The roofline cost of a step, checked against hand-computed numbers.
#include "sim/calibration/roofline.hpp"

#include <gtest/gtest.h>

namespace shardline::sim::calibration {
namespace sim_calibration_roofline_test {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  return c;
}

model::StepInput step(std::vector<std::pair<int, int>> computed_and_new, int num_logits) {
  model::StepInput in;
  for (auto [computed, fresh] : computed_and_new) {
    model::StepSeq s;
    s.num_computed_tokens = computed;
    s.num_new_tokens = fresh;
    in.seqs.push_back(s);
    for (int i = 0; i < fresh; ++i) in.token_ids.push_back(0);
  }
  for (int i = 0; i < num_logits; ++i) in.logits_rows.push_back(i);
  return in;
}

TEST(Roofline, DecodeStepBytesAndFlops) {
  // Per layer: qkv 8x(2+2*1)*4=128, o 8*8=64, gate/up/down 3*8*16=384 -> 576 params.
  // Two sequences decoding at contexts 3 and 5 (one new token each), logits for both.
  const StepCost c = step_cost(tiny(), 4.0, 4.0, step({{2, 1}, {4, 1}}, 2));
  EXPECT_DOUBLE_EQ(c.weight_bytes, (2 * 576 + 10 * 8) * 4.0);
  // KV bytes per token per layer: 2 (K,V) * 1 head * 4 dims * 4 B = 32; read 3+5, write 2, 2 layers.
  EXPECT_DOUBLE_EQ(c.kv_bytes, 2 * 32.0 * (8 + 2));
  // GEMMs: 2 tokens * 2 layers * 2*576; lm_head: 2 * 2*80; attention: 4*4 dims*2 heads*(3+5) keys*2 layers.
  EXPECT_DOUBLE_EQ(c.flops, 2 * 2 * 2.0 * 576 + 2 * 2.0 * 80 + 2 * 4.0 * 2 * 4 * 8);
}

TEST(Roofline, PhasesSplitTheStepAndEachHasItsOwnLimit) {
  // The decode step above, phase by phase (the bench's per-phase report).
  const StepCost c = step_cost(tiny(), 4.0, 4.0, step({{2, 1}, {4, 1}}, 2));
  EXPECT_DOUBLE_EQ(c.gemm_weight_bytes, 2 * 576 * 4.0);
  EXPECT_DOUBLE_EQ(c.lm_head_weight_bytes, 10 * 8 * 4.0);
  EXPECT_DOUBLE_EQ(c.gemm_flops, 2 * 2 * 2.0 * 576);
  EXPECT_DOUBLE_EQ(c.lm_head_flops, 2 * 2.0 * 80);
  EXPECT_DOUBLE_EQ(c.attention_flops, 2 * 4.0 * 2 * 4 * 8);
  EXPECT_DOUBLE_EQ(c.flops, c.gemm_flops + c.lm_head_flops + c.attention_flops);
  EXPECT_DOUBLE_EQ(c.weight_bytes, c.gemm_weight_bytes + c.lm_head_weight_bytes);
  // Limits at 1 GB/s and 1 GFLOP/s (bytes and FLOPs read as ns, so ms = x / 1e6):
  // GEMM max(4608 B, 4608 FLOP); attention 640 B; lm_head max(320 B, 320 FLOP).
  EXPECT_DOUBLE_EQ(c.gemm_limit_ms(1.0, 1.0), 4608 / 1e6);
  EXPECT_DOUBLE_EQ(c.gemm_limit_ms(1.0, 0.5), 2 * 4608 / 1e6);  // compute-bound at half the peak
  EXPECT_DOUBLE_EQ(c.attention_limit_ms(2.0), 640 / 2e6);
  EXPECT_DOUBLE_EQ(c.lm_head_limit_ms(0.25, 1.0), 4 * 320 / 1e6);  // memory-bound at a quarter
  // No logits row: no lm_head bytes, FLOPs or limit.
  const StepCost p = step_cost(tiny(), 4.0, 4.0, step({{2, 1}}, 0));
  EXPECT_DOUBLE_EQ(p.lm_head_weight_bytes, 0.0);
  EXPECT_DOUBLE_EQ(p.lm_head_limit_ms(1.0, 1.0), 0.0);
}

TEST(Roofline, PrefillChunkAttendsCausally) {
  // A 4-token chunk after 2 cached tokens attends 3+4+5+6 = 18 keys; no logits -> no lm_head.
  const StepCost c = step_cost(tiny(), 2.0, 2.0, step({{2, 4}}, 0));
  EXPECT_DOUBLE_EQ(c.weight_bytes, 2 * 576 * 2.0);
  EXPECT_DOUBLE_EQ(c.flops, 4 * 2 * 2.0 * 576 + 2 * 4.0 * 2 * 4 * 18);
  EXPECT_DOUBLE_EQ(c.kv_bytes, 2 * 16.0 * (6 + 4));
}

TEST(Roofline, RooflineIsTheSlowerOfMemoryAndCompute) {
  StepCost c;
  c.weight_bytes = 1e9;  // 1 GB at 50 GB/s = 20 ms
  c.flops = 1e10;        // 10 GFLOP at 1000 GFLOP/s = 10 ms
  EXPECT_DOUBLE_EQ(c.roofline_ms(50, 1000), 20.0);
  EXPECT_DOUBLE_EQ(c.roofline_ms(100, 250), 40.0);
}

}  // namespace
}  // namespace shardline::sim::calibration
