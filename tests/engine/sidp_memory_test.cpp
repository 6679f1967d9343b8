// Tests for the CPU device memory plan (plan_cpu_memory in
// engine/gpu_memory_plan.cpp) and SiDP weight accounting / KV capacity
// (engine/sidp_memory.cpp), with hand-computed numbers.

#include "engine/sidp_memory.hpp"

#include <gtest/gtest.h>

#include <string>

#include "engine/gpu_memory_plan.hpp"
#include "engine/kv_budget.hpp"
#include "model/weights.hpp"

namespace shardline::engine {
namespace engine_sidp_memory_test {

// hidden 8, intermediate 16, 2 heads / 1 KV head of head_dim 4, vocab 32,
// untied lm_head; `layers` layers.
model::ModelConfig tiny_config(int layers) {
  const std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": )" + std::to_string(layers) +
                           R"(, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 4, "vocab_size": 32, "max_position_embeddings": 64, "tie_word_embeddings": false})";
  auto r = model::parse_model_config(json, "", "tiny/config.json");
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.value();
}

// By hand for tiny_config, bf16 weights (2 bytes per element):
//   FFN per layer: gate_up 32x8 + down 8x16 = 384 elements = 768 B.
//   Attention per layer: qkv 16x8 + o_proj 8x8 = 192 elements = 384 B,
//     + 2 RMSNorm weights of 8 F32 = 64 B -> 448 B.
//   Replicated once: embed + lm_head 2 x 32x8 = 512 elements = 1024 B,
//     + final norm 8 F32 = 32 B -> 1056 B.
constexpr std::uint64_t kFfnBf16 = 768;
constexpr std::uint64_t kAttnLayerBf16 = 448;
constexpr std::uint64_t kOnceBf16 = 1056;

TEST(SidpMemory, FfnBytesPerLayer) {
  EXPECT_EQ(ffn_weight_bytes_per_layer(tiny_config(2), DType::bf16), kFfnBf16);
  EXPECT_EQ(ffn_weight_bytes_per_layer(tiny_config(2), DType::f32), 2 * kFfnBf16);
}

TEST(SidpMemory, BalancedOwnershipCounts) {
  // 5 layers over dp=2: rank 0 owns 0, 2, 4; rank 1 owns 1, 3.
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 2, 0), 3);
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 2, 1), 2);
  // dp=4: rank 0 owns 0, 4; ranks 1..3 one each.
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 4, 0), 2);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(sidp_owned_ffn_layer_count(5, 4, r), 1) << r;
  // dp=8 over 5 layers: ranks 5..7 own none.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(sidp_owned_ffn_layer_count(5, 8, r), r < 5 ? 1 : 0) << r;
  // 28 layers (Qwen3-0.6B) over dp=8: 4 ranks own 4, 4 ranks own 3.
  int total = 0;
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(sidp_owned_ffn_layer_count(28, 8, r), r < 4 ? 4 : 3) << r;
    total += sidp_owned_ffn_layer_count(28, 8, r);
  }
  EXPECT_EQ(total, 28);
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 1, 0), 5);  // plain DP
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 0, 0), 0);
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 2, 2), 0);
  EXPECT_EQ(sidp_owned_ffn_layer_count(5, 2, -1), 0);
}

TEST(SidpMemory, WeightBytesByHand) {
  const model::ModelConfig c = tiny_config(5);
  // Plain: 5 x (448 + 768) + 1056 = 7136.
  EXPECT_EQ(weight_bytes_for(c, DType::bf16), 7136u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, -1, 0), 7136u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 5, 0), 7136u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 9, 0), 7136u);  // capped at the layer count
  // dp=2 rank 1: attention of 5 layers (2240) + 1056 + 2 owned FFN (1536) + 2 slots (1536) = 6368.
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 2, 2), 6368u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 2, 2), 5 * kAttnLayerBf16 + kOnceBf16 + 4 * kFfnBf16);
  // dp=4 rank 1: 1 owned, 2 slots: 2240 + 1056 + 3 x 768 = 5600.
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 1, 2), 5600u);
  // dp=8 rank 7: nothing owned, 1 slot: 2240 + 1056 + 768 = 4064.
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 0, 1), 4064u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::bf16, 0, -3), 3296u);  // negative slots count as 0
  // F32: matrices double, F32 vectors stay. 5 x (768 + 64 + 1536) + 2048 + 32 = 13920 plain;
  // 1 owned, 2 slots: 5 x 832 + 2080 + 3 x 1536 = 10848.
  EXPECT_EQ(weight_bytes_for(c, DType::f32), 13920u);
  EXPECT_EQ(sidp_weight_bytes_for(c, DType::f32, 1, 2), 10848u);
}

TEST(SidpMemory, PlainEqualsTheLoadersBytes) {
  // All layers owned and no slots is exactly what the loader holds.
  for (const int layers : {1, 2, 5}) {
    for (const DType d : {DType::f32, DType::bf16}) {
      model::LoadOptions o;
      o.format = model::LoadFormat::dummy;
      o.dtype = d;
      auto w = model::make_dummy_weights(tiny_config(layers), o);
      ASSERT_TRUE(w.ok()) << w.error().to_string();
      EXPECT_EQ(sidp_weight_bytes_for(tiny_config(layers), d, -1, 0), w->total_bytes()) << layers;
      EXPECT_EQ(sidp_weight_bytes_for(tiny_config(layers), d, layers, 0), w->total_bytes()) << layers;
    }
  }
}

TEST(SidpMemory, LoadedWeightsCountTheirOwnFormats) {
  // Dense: the loaded bytes give the config's arithmetic exactly.
  for (const DType d : {DType::f32, DType::bf16}) {
    model::LoadOptions o;
    o.format = model::LoadFormat::dummy;
    o.dtype = d;
    auto w = model::make_dummy_weights(tiny_config(5), o);
    ASSERT_TRUE(w.ok()) << w.error().to_string();
    for (const int owned : {-1, 0, 2, 5})
      for (const int slots : {0, 2})
        EXPECT_EQ(sidp_weight_bytes_of(*w, owned, slots), sidp_weight_bytes_for(tiny_config(5), d, owned, slots))
            << "owned " << owned << " slots " << slots;
  }
  // SmolLM2-135M's Q4_1 file kept quantized (4 layers): an FFN layer is
  // 3 x 576 x 1536 weights at 20 bytes per 32 (F16 d and m, 16 bytes of
  // nibbles), 1,658,880 bytes, against 5,308,416 in BF16.
  model::LoadOptions q;
  q.dtype = DType::bf16;
  q.keep_quantized = true;
  q.num_layers_override = 4;
  auto w = model::load_model(std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct", q);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  const std::uint64_t ffn_layer = 3ull * 576 * 1536 / 32 * 20;
  ASSERT_EQ(w->layers[0].gate_up.bytes() + w->layers[0].down_proj.bytes(), ffn_layer);
  EXPECT_EQ(sidp_weight_bytes_of(*w, -1, 0), w->total_bytes());
  EXPECT_EQ(sidp_weight_bytes_of(*w, 1, 2), w->total_bytes() - 3 * ffn_layer + 2 * ffn_layer);
  EXPECT_LT(sidp_weight_bytes_of(*w, 1, 2), sidp_weight_bytes_for(w->config, DType::bf16, 1, 2));
}

// What the SiDP cost model prices a layer's fetch at: the FFN regions'
// bytes per weight, and the quantized type that holds most of them.
TEST(SidpMemory, FfnFormatIsTheRegionsBytesPerWeight) {
  // SmolLM2-135M's Q4_1 file kept quantized (4 layers): a region holds
  // gate_up [3072, 576] and down [576, 1536] packed at 24 bytes per 32
  // weights (16 bytes of nibbles, F32 d and m), both multiples of 64 bytes:
  // exactly 0.75 bytes a weight, against the file's 0.625.
  model::LoadOptions q;
  q.dtype = DType::bf16;
  q.keep_quantized = true;
  q.num_layers_override = 4;
  const std::string dir = std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct";
  auto w = model::load_model(dir, q);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  auto f = sidp_ffn_format(*w);
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  EXPECT_DOUBLE_EQ(f->region_bytes_per_weight, 0.75);
  ASSERT_TRUE(f->quant_type.has_value());
  EXPECT_EQ(*f->quant_type, kernels::GgmlType::q4_1);
  // The same file dequantized to BF16: 2 bytes a weight (576 and 1536 are
  // whole 64-column panels), dense.
  model::LoadOptions d = q;
  d.keep_quantized = false;
  auto wd = model::load_model(dir, d);
  ASSERT_TRUE(wd.ok()) << wd.error().to_string();
  auto fd = sidp_ffn_format(*wd);
  ASSERT_TRUE(fd.ok()) << fd.error().to_string();
  EXPECT_DOUBLE_EQ(fd->region_bytes_per_weight, 2.0);
  EXPECT_FALSE(fd->quant_type.has_value());
  // Bad input: a model without layers is refused by name.
  model::ModelWeights empty = *wd;
  empty.layers.clear();
  auto e = sidp_ffn_format(empty);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("no layers"), std::string::npos) << e.error().message;
}

CpuMemoryPlanInput cpu_input(std::uint64_t device_memory, std::uint64_t weights, std::uint64_t activations) {
  CpuMemoryPlanInput in;
  in.device_memory_bytes = device_memory;
  in.weight_bytes = weights;
  in.activation_bytes = activations;
  in.num_layers = 5;
  in.num_kv_heads = 1;
  in.head_dim = 4;
  in.block_size = 16;
  in.kv_dtype = DType::f32;  // block: 2 x 5 x 1 x 4 x 16 x 4 = 2560 B
  in.max_model_len = 64;     // 4 blocks
  return in;
}

TEST(CpuMemoryPlan, WholeBudgetIsTheDevice) {
  // 7136 weights + 1000 activations + 10 blocks (25600) + 100 spare.
  auto p = plan_cpu_memory(cpu_input(7136 + 1000 + 25600 + 100, 7136, 1000));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->budget_bytes, 33836u);
  EXPECT_EQ(p->usable_bytes, 33836u);
  EXPECT_EQ(p->reserved_bytes, 0u);
  EXPECT_EQ(p->kv_bytes_per_block, 2560u);
  EXPECT_EQ(p->num_kv_blocks, 10);
  EXPECT_EQ(p->kv_bytes, 25600u);
  EXPECT_EQ(p->max_concurrent_seqs_at_max_len, 2);  // 10 / 4
  // A reserve, when given, comes out of it: 101 bytes more than the spare loses a block.
  CpuMemoryPlanInput in = cpu_input(33836, 7136, 1000);
  in.reserved_bytes = 101;
  p = plan_cpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->num_kv_blocks, 9);
}

TEST(CpuMemoryPlan, RefusesWhatDoesNotFitWithTheSizes) {
  auto p = plan_cpu_memory(cpu_input(4096, 7136, 1000));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, ErrorCode::out_of_memory);
  const std::string& m = p.error().message;
  EXPECT_NE(m.find("model weights need 6.97 KiB"), std::string::npos) << m;  // 7136 / 1024
  EXPECT_NE(m.find("activations 1000 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("= 7.95 KiB"), std::string::npos) << m;                  // 8136 / 1024
  EXPECT_NE(m.find("--device-memory is 4.00 KiB (4096 bytes)"), std::string::npos) << m;

  // Weights fit, but 3 blocks (7680 B) are left and a 64-token sequence needs 4.
  p = plan_cpu_memory(cpu_input(7136 + 1000 + 7680 + 2559, 7136, 1000));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(p.error().message.find("KV cache of 3 blocks holds 48 tokens"), std::string::npos)
      << p.error().message;
  EXPECT_NE(p.error().message.find("needs 4 blocks"), std::string::npos) << p.error().message;
  EXPECT_NE(p.error().message.find("--device-memory"), std::string::npos) << p.error().message;
  // One byte more gives the fourth block.
  p = plan_cpu_memory(cpu_input(7136 + 1000 + 7680 + 2560, 7136, 1000));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->num_kv_blocks, 4);

  p = plan_cpu_memory(cpu_input(0, 7136, 1000));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, ErrorCode::invalid_argument);
  CpuMemoryPlanInput in = cpu_input(1 << 20, 7136, 1000);
  in.max_model_len = 0;
  EXPECT_EQ(plan_cpu_memory(in).error().code, ErrorCode::invalid_argument);
}

TEST(SidpMemory, KvCapacityPlainVsSidpByHand) {
  KvCapacityInput in;
  in.config = tiny_config(5);
  in.weight_dtype = DType::bf16;
  in.kv_dtype = DType::f32;  // 2560 B per block of 16 tokens
  in.block_size = 16;
  in.activation_bytes = 1000;
  in.device_memory_bytes = 7136 + 1000 + 10 * 2560;  // plain DP: exactly 10 blocks
  in.cache_slots = 2;
  for (const int dp : {2, 4, 8}) {
    in.dp = dp;
    auto cap = kv_capacity_plain_vs_sidp(in);
    ASSERT_TRUE(cap.ok()) << cap.error().to_string();
    ASSERT_EQ(cap->plain.size(), static_cast<std::size_t>(dp));
    ASSERT_EQ(cap->sidp.size(), static_cast<std::size_t>(dp));
    for (int r = 0; r < dp; ++r) {
      EXPECT_EQ(cap->plain[r].owned_ffn_layers, 5);
      EXPECT_EQ(cap->plain[r].cache_slots, 0);
      EXPECT_EQ(cap->plain[r].weight_bytes, 7136u);
      EXPECT_EQ(cap->plain[r].num_kv_blocks, 10);
      EXPECT_EQ(cap->plain[r].kv_tokens, 160u);
    }
    EXPECT_EQ(cap->plain_kv_tokens(), 160u * dp);
  }
  // dp=2: rank 0 owns 3 + 2 slots = all 5 FFNs' worth: no gain; rank 1 owns
  // 2 + 2 slots: one FFN (768 B) freed, less than a block: still 10.
  in.dp = 2;
  auto cap = kv_capacity_plain_vs_sidp(in);
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(cap->sidp[0].weight_bytes, 7136u);
  EXPECT_EQ(cap->sidp[1].weight_bytes, 6368u);
  EXPECT_EQ(cap->sidp[0].num_kv_blocks, 10);
  EXPECT_EQ(cap->sidp[1].num_kv_blocks, 10);  // 25600 + 768 = 26368 -> 10 blocks
  // dp=8: ranks 0..4 own 1 layer: 7136 - 2 x 768 = 5600 -> (25600 + 1536) / 2560 = 10;
  // ranks 5..7 own none: 4832 -> 25600 + 2304 = 27904 -> 10 blocks.
  in.dp = 8;
  cap = kv_capacity_plain_vs_sidp(in);
  ASSERT_TRUE(cap.ok());
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(cap->sidp[r].owned_ffn_layers, r < 5 ? 1 : 0) << r;
    EXPECT_EQ(cap->sidp[r].weight_bytes, r < 5 ? 5600u : 4832u) << r;
    EXPECT_EQ(cap->sidp[r].num_kv_blocks, 10) << r;
  }
  // Bigger FFNs make the difference: use F32 weights and bf16 KV (1280 B per block).
  in.weight_dtype = DType::f32;
  in.kv_dtype = DType::bf16;
  in.device_memory_bytes = 13920 + 1000 + 10 * 1280;  // plain: 10 blocks
  in.dp = 4;
  cap = kv_capacity_plain_vs_sidp(in);
  ASSERT_TRUE(cap.ok()) << cap.error().to_string();
  EXPECT_EQ(cap->plain[0].num_kv_blocks, 10);
  // rank 0: 2 owned + 2 slots: frees 1 FFN of 1536 B -> 12800 + 1536 = 14336 -> 11 blocks.
  EXPECT_EQ(cap->sidp[0].owned_ffn_layers, 2);
  EXPECT_EQ(cap->sidp[0].weight_bytes, 13920u - 1536u);
  EXPECT_EQ(cap->sidp[0].num_kv_blocks, 11);
  // ranks 1..3: 1 owned + 2 slots: frees 2 FFNs -> 12800 + 3072 = 15872 -> 12 blocks.
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(cap->sidp[r].owned_ffn_layers, 1);
    EXPECT_EQ(cap->sidp[r].weight_bytes, 13920u - 2 * 1536u);
    EXPECT_EQ(cap->sidp[r].num_kv_blocks, 12);
    EXPECT_EQ(cap->sidp[r].kv_tokens, 192u);
  }
  EXPECT_EQ(cap->plain_kv_tokens(), 4u * 160u);
  EXPECT_EQ(cap->sidp_kv_tokens(), 176u + 3u * 192u);

  // A budget plain DP cannot fit but SiDP can: plain 0 blocks, not an error.
  in.device_memory_bytes = 13920 + 1000 - 1;
  cap = kv_capacity_plain_vs_sidp(in);
  ASSERT_TRUE(cap.ok()) << cap.error().to_string();
  EXPECT_EQ(cap->plain[0].num_kv_blocks, 0);
  EXPECT_EQ(cap->sidp[0].num_kv_blocks, 1);  // 1535 B left
  EXPECT_EQ(cap->sidp[1].num_kv_blocks, 2);  // 3071 B left

  // Each rank's count is plan_cpu_memory's for its weights.
  CpuMemoryPlanInput pi;
  pi.device_memory_bytes = in.device_memory_bytes;
  pi.weight_bytes = cap->sidp[1].weight_bytes;
  pi.activation_bytes = 1000;
  pi.num_layers = 5;
  pi.num_kv_heads = 1;
  pi.head_dim = 4;
  pi.block_size = 16;
  pi.kv_dtype = DType::bf16;
  pi.max_model_len = 16;
  auto plan = plan_cpu_memory(pi);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->num_kv_blocks, cap->sidp[1].num_kv_blocks);
}

TEST(SidpMemory, KvCapacityRejectsBadInput) {
  KvCapacityInput in;
  in.config = tiny_config(5);
  in.device_memory_bytes = 1 << 20;
  in.dp = 0;
  EXPECT_EQ(kv_capacity_plain_vs_sidp(in).error().code, ErrorCode::invalid_argument);
  in.dp = 2;
  in.cache_slots = -1;
  EXPECT_EQ(kv_capacity_plain_vs_sidp(in).error().code, ErrorCode::invalid_argument);
  in.cache_slots = 2;
  in.block_size = 0;
  EXPECT_EQ(kv_capacity_plain_vs_sidp(in).error().code, ErrorCode::invalid_argument);
  in.block_size = 16;
  in.device_memory_bytes = 0;
  EXPECT_EQ(kv_capacity_plain_vs_sidp(in).error().code, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace shardline::engine
