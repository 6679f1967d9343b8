// Tests for engine/gpu_memory_plan.cpp: weight / activation byte counts and
// the --gpu-memory-utilization device memory plan (host-side, no GPU needed).

#include "engine/gpu_memory_plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "engine/kv_budget.hpp"
#include "model/weights.hpp"

namespace shardline::engine {
namespace engine_gpu_memory_plan_test {

namespace fs = std::filesystem;

const fs::path kShapes = fs::path(SHARDLINE_SHARED_DIR) / "models" / "shapes";

// H100 80 GB as cudaMemGetInfo reports it: 79.10 GiB.
constexpr std::uint64_t kH100Total = 84'934'656'000ull;
constexpr std::uint64_t kGiB = 1ull << 30;

model::ModelConfig tiny_config(bool tied) {
  const std::string json = std::string(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 4, "vocab_size": 32, "max_position_embeddings": 64, "tie_word_embeddings": )") +
                           (tied ? "true" : "false") + "}";
  auto r = model::parse_model_config(json, "", "tiny/config.json");
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.value();
}

model::ModelConfig load_shape(const char* name) {
  auto r = model::load_model_config(kShapes / name);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.value();
}

GpuMemoryPlanInput input_for(const model::ModelConfig& c, DType weight_dtype, DType kv_dtype,
                             int max_model_len) {
  GpuMemoryPlanInput in;
  in.total_bytes = kH100Total;
  in.free_bytes = kH100Total - (500ull << 20);  // driver / other contexts hold ~500 MiB
  in.gpu_memory_utilization = 0.9;
  in.weight_bytes = weight_bytes_for(c, weight_dtype);
  in.activation_bytes = activation_bytes_for(c, 8192, 256);
  in.num_layers = c.num_hidden_layers;
  in.num_kv_heads = c.num_key_value_heads;
  in.head_dim = c.head_dim;
  in.block_size = 16;
  in.kv_dtype = kv_dtype;
  in.max_model_len = max_model_len;
  return in;
}

TEST(GpuMemoryPlan, TinyConfigWeightBytesAreExact) {
  // Per layer, matrices: qkv (2+2*1)*4=16 rows x 8 = 128, o_proj 8x8 = 64,
  // gate_up 32x8 = 256, down 8x16 = 128 -> 576 elements; vectors 2 x 8 F32 = 64 B.
  // Embedding / lm_head 32x8 = 256 elements each; final norm 8 F32 = 32 B.
  const model::ModelConfig untied = tiny_config(false);
  const model::ModelConfig tied = tiny_config(true);
  EXPECT_EQ(weight_bytes_for(untied, DType::bf16), 2u * (576 * 2 + 64) + 2 * 256 * 2 + 32);  // 3488
  EXPECT_EQ(weight_bytes_for(untied, DType::bf16), 3488u);
  EXPECT_EQ(weight_bytes_for(tied, DType::bf16), 3488u - 512u);  // lm_head counted once
  EXPECT_EQ(weight_bytes_for(untied, DType::f32), 2u * (576 * 4 + 64) + 2 * 256 * 4 + 32);  // 6816
  EXPECT_EQ(weight_bytes_for(untied, DType::f32), 6816u);

  // Same count as the loader's in-memory weights.
  for (const bool t : {false, true}) {
    for (const DType d : {DType::f32, DType::bf16}) {
      model::LoadOptions o;
      o.format = model::LoadFormat::dummy;
      o.dtype = d;
      auto w = model::make_dummy_weights(tiny_config(t), o);
      ASSERT_TRUE(w.ok()) << w.error().to_string();
      EXPECT_EQ(weight_bytes_for(tiny_config(t), d), w->total_bytes()) << "tied=" << t << " " << dtype_name(d);
    }
  }
}

TEST(GpuMemoryPlan, TinyConfigActivationBytesAreExact) {
  // T=4 tokens, S=2 seqs: residual 4x8 + normed 4x8 + qkv 4x16 + attn 4x8 +
  // gate_up 4x32 + act 4x16 + logits 2x32 = 416 floats.
  const model::ModelConfig c = tiny_config(false);
  EXPECT_EQ(activation_bytes_for(c, 4, 2), 416u * 4);
  EXPECT_EQ(activation_bytes_for(c, 0, 0), 0u);
  EXPECT_EQ(activation_bytes_for(c, 1, 0), (8 + 8 + 16 + 8 + 32 + 16) * 4u);
}

TEST(GpuMemoryPlan, TinyConfigPlanIsExact) {
  const model::ModelConfig c = tiny_config(false);
  GpuMemoryPlanInput in;
  in.total_bytes = 1'000'000;
  in.free_bytes = 1'000'000;
  in.gpu_memory_utilization = 0.5;
  in.weight_bytes = weight_bytes_for(c, DType::bf16);    // 3488
  in.activation_bytes = activation_bytes_for(c, 4, 2);  // 1664
  in.reserved_bytes = 10'000;
  in.num_layers = 2;
  in.num_kv_heads = 1;
  in.head_dim = 4;
  in.block_size = 16;
  in.kv_dtype = DType::bf16;
  in.max_model_len = 64;
  auto r = plan_gpu_memory(in);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const GpuMemoryPlan& p = r.value();
  EXPECT_EQ(p.budget_bytes, 500'000u);
  EXPECT_EQ(p.usable_bytes, 500'000u);
  EXPECT_EQ(p.weight_bytes, 3488u);
  EXPECT_EQ(p.activation_bytes, 1664u);
  EXPECT_EQ(p.reserved_bytes, 10'000u);
  // 2 (K,V) x 2 layers x 1 head x 4 dim x 16 tokens x 2 bytes.
  EXPECT_EQ(p.kv_bytes_per_block, 512u);
  EXPECT_EQ(p.kv_bytes_per_block, kv_bytes_per_block(2, 1, 4, 16, 2));
  // (500000 - 3488 - 1664 - 10000) / 512 = 484848 / 512 = 946 (floor).
  EXPECT_EQ(p.num_kv_blocks, 946);
  EXPECT_EQ(p.kv_bytes, 946u * 512u);
  // 64 tokens = 4 blocks per sequence -> 946 / 4 = 236.
  EXPECT_EQ(p.max_concurrent_seqs_at_max_len, 236);
  EXPECT_LE(p.weight_bytes + p.activation_bytes + p.reserved_bytes + p.kv_bytes, p.budget_bytes);
}

TEST(GpuMemoryPlan, Llama31_8bBf16OnH100IsPlausible) {
  const model::ModelConfig c = load_shape("llama-3.1-8b");
  // Exact formula: matrices in BF16, norm vectors in F32.
  const std::uint64_t h = 4096, inter = 14336, layers = 32, vocab = 128256;
  const std::uint64_t qkv_rows = (32 + 2 * 8) * 128;
  const std::uint64_t matrices = layers * (qkv_rows * h + h * 4096 + 3 * h * inter) + 2 * vocab * h;
  const std::uint64_t vectors = layers * 2 * h + h;
  const std::uint64_t expected = matrices * 2 + vectors * 4;
  EXPECT_EQ(matrices + vectors, static_cast<std::uint64_t>(c.num_parameters()));
  EXPECT_EQ(weight_bytes_for(c, DType::bf16), expected);
  EXPECT_EQ(weight_bytes_for(c, DType::bf16), 16'061'054'976ull);
  EXPECT_NEAR(static_cast<double>(weight_bytes_for(c, DType::bf16)), 16.06e9, 0.01e9);

  auto r = plan_gpu_memory(input_for(c, DType::bf16, DType::bf16, 8192));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const GpuMemoryPlan& p = r.value();
  EXPECT_EQ(p.budget_bytes, static_cast<std::uint64_t>(std::floor(kH100Total * 0.9)));
  EXPECT_EQ(p.usable_bytes, p.budget_bytes);  // 500 MiB taken elsewhere is still within the 10% left
  EXPECT_EQ(p.kv_bytes_per_block, 2ull << 20);  // 2 MiB per 16-token block
  EXPECT_GT(p.num_kv_blocks, 0);
  // ~71.2 GiB budget - ~15 GiB weights - ~0.5 GiB reserved - activations -> ~54 GiB of KV.
  EXPECT_GT(p.kv_bytes, 50 * kGiB);
  EXPECT_LT(p.kv_bytes, 56 * kGiB);
  EXPECT_EQ(static_cast<std::uint64_t>(p.num_kv_blocks),
            (p.usable_bytes - p.weight_bytes - p.activation_bytes - p.reserved_bytes) / p.kv_bytes_per_block);
  EXPECT_EQ(p.max_concurrent_seqs_at_max_len, p.num_kv_blocks / (8192 / 16));
  EXPECT_GE(p.max_concurrent_seqs_at_max_len, 50);
  EXPECT_LE(p.weight_bytes + p.activation_bytes + p.reserved_bytes + p.kv_bytes, p.budget_bytes);
}

TEST(GpuMemoryPlan, Llama31_70bDoesNotFitOn80GB) {
  const model::ModelConfig c = load_shape("llama-3.1-70b");
  GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 8192);
  in.free_bytes = 10 * kGiB;
  auto r = plan_gpu_memory(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  const std::string& m = r.error().message;
  EXPECT_NE(m.find("model weights need 131.42 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("but --gpu-memory-utilization 0.90 of 79.10 GiB leaves 71.19 GiB (free now: 10.00 GiB)"),
            std::string::npos)
      << m;
}

TEST(GpuMemoryPlan, WeightsThatFitTheBudgetButNotFreeMemoryAreOutOfMemory) {
  const model::ModelConfig c = load_shape("llama-3.1-8b");
  GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 8192);
  in.free_bytes = 10 * kGiB;  // another process holds the rest
  auto r = plan_gpu_memory(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(r.error().message.find("model weights need 14.96 GiB"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("(free now: 10.00 GiB)"), std::string::npos) << r.error().message;
}

TEST(GpuMemoryPlan, UtilizationOutsideZeroOneIsRejected) {
  const model::ModelConfig c = tiny_config(false);
  for (const double u : {0.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
    GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 64);
    in.gpu_memory_utilization = u;
    auto r = plan_gpu_memory(in);
    ASSERT_FALSE(r.ok()) << u;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("--gpu-memory-utilization must be in (0, 1]"), std::string::npos)
        << r.error().message;
  }
  GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 64);
  in.gpu_memory_utilization = 1.0;
  in.free_bytes = in.total_bytes;
  auto r = plan_gpu_memory(in);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->budget_bytes, kH100Total);
}

TEST(GpuMemoryPlan, NonPositiveShapesAreRejected) {
  const model::ModelConfig c = tiny_config(false);
  const GpuMemoryPlanInput good = input_for(c, DType::bf16, DType::bf16, 64);
  ASSERT_TRUE(plan_gpu_memory(good).ok());
  struct Case {
    const char* field;
    void (*mutate)(GpuMemoryPlanInput&);
  };
  const Case cases[] = {
      {"num_layers", [](GpuMemoryPlanInput& i) { i.num_layers = 0; }},
      {"num_kv_heads", [](GpuMemoryPlanInput& i) { i.num_kv_heads = -1; }},
      {"head_dim", [](GpuMemoryPlanInput& i) { i.head_dim = 0; }},
      {"block_size", [](GpuMemoryPlanInput& i) { i.block_size = 0; }},
      {"block_size", [](GpuMemoryPlanInput& i) { i.block_size = -16; }},
      {"max_model_len", [](GpuMemoryPlanInput& i) { i.max_model_len = 0; }},
      {"total memory", [](GpuMemoryPlanInput& i) { i.total_bytes = 0; }},
  };
  for (const Case& k : cases) {
    GpuMemoryPlanInput in = good;
    k.mutate(in);
    auto r = plan_gpu_memory(in);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << k.field;
    EXPECT_NE(r.error().message.find(k.field), std::string::npos) << r.error().message;
  }
}

TEST(GpuMemoryPlan, FreeMemorySmallerThanBudgetLimitsKvCache) {
  const model::ModelConfig c = load_shape("llama-3.1-8b");
  GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 8192);
  auto full = plan_gpu_memory(in);
  ASSERT_TRUE(full.ok()) << full.error().to_string();

  in.free_bytes = 40 * kGiB;  // below the 71.19 GiB budget
  auto limited = plan_gpu_memory(in);
  ASSERT_TRUE(limited.ok()) << limited.error().to_string();
  EXPECT_EQ(limited->budget_bytes, full->budget_bytes);  // budget is still total x utilization
  EXPECT_EQ(limited->usable_bytes, 40 * kGiB);
  const std::uint64_t kv_space = 40 * kGiB - in.weight_bytes - in.activation_bytes - in.reserved_bytes;
  EXPECT_EQ(static_cast<std::uint64_t>(limited->num_kv_blocks), kv_space / (2ull << 20));
  EXPECT_LT(limited->num_kv_blocks, full->num_kv_blocks);
  EXPECT_LE(limited->weight_bytes + limited->activation_bytes + limited->reserved_bytes + limited->kv_bytes,
            in.free_bytes);
}

TEST(GpuMemoryPlan, Bf16KvHalvesBytesPerBlockOfF32) {
  const model::ModelConfig c = load_shape("llama-3.1-8b");
  auto bf16 = plan_gpu_memory(input_for(c, DType::bf16, DType::bf16, 8192));
  auto f32 = plan_gpu_memory(input_for(c, DType::bf16, DType::f32, 8192));
  ASSERT_TRUE(bf16.ok()) << bf16.error().to_string();
  ASSERT_TRUE(f32.ok()) << f32.error().to_string();
  EXPECT_EQ(f32->kv_bytes_per_block, 4ull << 20);
  EXPECT_EQ(bf16->kv_bytes_per_block * 2, f32->kv_bytes_per_block);
  // Same KV space, so twice the blocks (up to the floor).
  EXPECT_EQ(bf16->num_kv_blocks / 2, f32->num_kv_blocks);
}

TEST(GpuMemoryPlan, KvCacheTooSmallForOneMaxLenSequenceIsOutOfMemory) {
  const model::ModelConfig c = load_shape("llama-3.1-8b");
  // 128K tokens need 8192 blocks of 2 MiB = 16 GiB; leave ~2 GiB for the cache.
  GpuMemoryPlanInput in = input_for(c, DType::bf16, DType::bf16, 131072);
  in.free_bytes = in.weight_bytes + in.activation_bytes + in.reserved_bytes + 2 * kGiB;
  auto r = plan_gpu_memory(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  const std::string& m = r.error().message;
  EXPECT_NE(m.find("KV cache of 1024 blocks holds 16384 tokens; one sequence of max_model_len 131072 needs "
                   "8192 blocks (16.00 GiB)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("lower --max-model-len or raise --gpu-memory-utilization"), std::string::npos) << m;

  // Exactly one sequence fits: 8192 blocks.
  in.free_bytes = in.weight_bytes + in.activation_bytes + in.reserved_bytes + 16 * kGiB;
  auto ok = plan_gpu_memory(in);
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ(ok->num_kv_blocks, 8192);
  EXPECT_EQ(ok->max_concurrent_seqs_at_max_len, 1);

  // Nothing left at all after weights: still the KV message, not a crash.
  in.free_bytes = in.weight_bytes + in.activation_bytes + in.reserved_bytes;
  auto none = plan_gpu_memory(in);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(none.error().message.find("KV cache of 0 blocks"), std::string::npos) << none.error().message;
}

}  // namespace
}  // namespace shardline::engine
