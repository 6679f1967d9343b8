#include "engine/gpu_memory_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>

#include "engine/kv_budget.hpp"

namespace shardline::engine {
namespace {

using u64 = std::uint64_t;

u64 nonneg(int v) { return v > 0 ? static_cast<u64>(v) : 0; }

/// "15.02 GiB".
std::string gib(u64 bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1ull << 30));
  return buf;
}

/// "0.99 MiB", "217.00 KiB", "15.02 GiB", "512 bytes": the largest binary
/// unit the size reaches (CPU budgets of small models read better).
std::string human_size(u64 bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

}  // namespace

u64 weight_bytes_for(const model::ModelConfig& c, DType weight_dtype) noexcept {
  const u64 elem = dtype_size(weight_dtype);
  const u64 hidden = nonneg(c.hidden_size);
  const u64 inter = nonneg(c.intermediate_size);
  const u64 head_dim = nonneg(c.head_dim);
  const u64 attn_out = nonneg(c.num_attention_heads) * head_dim;
  const u64 qkv_rows = (nonneg(c.num_attention_heads) + 2 * nonneg(c.num_key_value_heads)) * head_dim;
  const u64 vocab = nonneg(c.vocab_size);

  const u64 layer_matrix_elems = qkv_rows * hidden + hidden * attn_out + 3 * hidden * inter;
  u64 layer_vector_elems = 2 * hidden;  // input_layernorm, post_attention_layernorm
  if (c.qkv_bias) layer_vector_elems += qkv_rows;
  if (c.qk_norm) layer_vector_elems += 2 * head_dim;
  const u64 layer_bytes = layer_matrix_elems * elem + layer_vector_elems * sizeof(float);

  u64 total = nonneg(c.num_hidden_layers) * layer_bytes;
  total += vocab * hidden * elem;                              // embed_tokens
  if (!c.tie_word_embeddings) total += vocab * hidden * elem;  // lm_head
  total += hidden * sizeof(float);                             // final norm
  return total;
}

u64 activation_bytes_for(const model::ModelConfig& c, int max_num_batched_tokens, int max_num_seqs) noexcept {
  const u64 tokens = nonneg(max_num_batched_tokens);
  const u64 seqs = nonneg(max_num_seqs);
  const u64 hidden = nonneg(c.hidden_size);
  const u64 inter = nonneg(c.intermediate_size);
  const u64 head_dim = nonneg(c.head_dim);
  const u64 attn_out = nonneg(c.num_attention_heads) * head_dim;
  const u64 qkv_rows = (nonneg(c.num_attention_heads) + 2 * nonneg(c.num_key_value_heads)) * head_dim;
  const u64 per_token = hidden        // residual
                        + hidden      // normed
                        + qkv_rows    // qkv
                        + attn_out    // attention out
                        + 2 * inter   // gate_up
                        + inter;      // act
  const u64 logits = seqs * nonneg(c.vocab_size);
  return sizeof(float) * (tokens * per_token + logits);
}

namespace {

/// How the errors of one kind of device name its budget and what to change.
struct PlanWording {
  std::string device_label;  ///< "GPU memory plan" / "CPU memory plan"
  std::string budget;        ///< "--gpu-memory-utilization 0.90 of 79.10 GiB leaves 71.19 GiB (free now: ...)"
  std::string fit_advice;    ///< weights do not fit: what to change
  std::string kv_advice;     ///< no max_model_len sequence fits: what to change
  std::string (*size)(u64) = gib;  ///< how sizes are written
};

/// The plan of GpuMemoryPlan's formula, for any device (`in` already
/// validated for its kind). Errors: invalid_argument, out_of_memory.
Result<GpuMemoryPlan> plan_device_memory(const GpuMemoryPlanInput& in, const PlanWording& w) {
  auto positive = [&w](int v, const char* name) -> Status {
    if (v > 0) return Status::ok_status();
    return make_error(ErrorCode::invalid_argument,
                      w.device_label + ": " + name + " must be positive, got " + std::to_string(v));
  };
  for (const Status& s : {positive(in.num_layers, "num_layers"), positive(in.num_kv_heads, "num_kv_heads"),
                          positive(in.head_dim, "head_dim"), positive(in.block_size, "block_size"),
                          positive(in.max_model_len, "max_model_len")})
    if (!s.ok()) return s.error();

  GpuMemoryPlan p;
  p.budget_bytes = static_cast<u64>(std::floor(static_cast<double>(in.total_bytes) * in.gpu_memory_utilization));
  p.budget_bytes = std::min(p.budget_bytes, in.total_bytes);
  p.usable_bytes = std::min(p.budget_bytes, in.free_bytes);
  p.weight_bytes = in.weight_bytes;
  p.activation_bytes = in.activation_bytes;
  p.reserved_bytes = in.reserved_bytes;

  // Saturating sum (inputs are sizes of real devices, but stay safe).
  const u64 max = std::numeric_limits<u64>::max();
  u64 fixed = in.weight_bytes;
  fixed = in.activation_bytes > max - fixed ? max : fixed + in.activation_bytes;
  fixed = in.reserved_bytes > max - fixed ? max : fixed + in.reserved_bytes;
  if (fixed > p.usable_bytes)
    return make_error(ErrorCode::out_of_memory,
                      "model weights need " + w.size(in.weight_bytes) + " (plus activations " +
                          w.size(in.activation_bytes) + " and reserved " + w.size(in.reserved_bytes) + " = " +
                          w.size(fixed) + ") but " + w.budget + "; " + w.fit_advice);

  const u64 kv_space = p.usable_bytes - fixed;
  const int elem = static_cast<int>(dtype_size(in.kv_dtype));
  p.kv_bytes_per_block = kv_bytes_per_block(in.num_layers, in.num_kv_heads, in.head_dim, in.block_size, elem);
  const std::int64_t blocks =
      num_kv_blocks_for_budget(kv_space, in.num_layers, in.num_kv_heads, in.head_dim, in.block_size, elem);
  p.num_kv_blocks = static_cast<int>(std::min<std::int64_t>(blocks, std::numeric_limits<int>::max()));
  p.kv_bytes = static_cast<u64>(p.num_kv_blocks) * p.kv_bytes_per_block;

  const u64 blocks_per_seq =
      (static_cast<u64>(in.max_model_len) + static_cast<u64>(in.block_size) - 1) / static_cast<u64>(in.block_size);
  if (static_cast<u64>(p.num_kv_blocks) < blocks_per_seq)
    return make_error(ErrorCode::out_of_memory,
                      "KV cache of " + std::to_string(p.num_kv_blocks) + " blocks holds " +
                          std::to_string(static_cast<u64>(p.num_kv_blocks) * static_cast<u64>(in.block_size)) +
                          " tokens; one sequence of max_model_len " + std::to_string(in.max_model_len) +
                          " needs " + std::to_string(blocks_per_seq) + " blocks (" +
                          w.size(blocks_per_seq * p.kv_bytes_per_block) + "), but only " + w.size(kv_space) +
                          " is left of " + w.size(p.usable_bytes) + " after weights " + w.size(in.weight_bytes) +
                          ", activations " + w.size(in.activation_bytes) + " and reserved " +
                          w.size(in.reserved_bytes) + "; " + w.kv_advice);
  p.max_concurrent_seqs_at_max_len = static_cast<int>(static_cast<u64>(p.num_kv_blocks) / blocks_per_seq);
  return p;
}

}  // namespace

Result<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryPlanInput& in) {
  const double util = in.gpu_memory_utilization;
  if (!(util > 0.0 && util <= 1.0))  // also rejects NaN
    return make_error(ErrorCode::invalid_argument,
                      "--gpu-memory-utilization must be in (0, 1], got " + std::to_string(util));
  if (in.total_bytes == 0)
    return make_error(ErrorCode::invalid_argument, "device total memory is 0 bytes");
  const u64 budget = std::min(
      static_cast<u64>(std::floor(static_cast<double>(in.total_bytes) * util)), in.total_bytes);
  PlanWording w;
  w.device_label = "GPU memory plan";
  w.budget = "--gpu-memory-utilization " + fixed2(util) + " of " + gib(in.total_bytes) + " leaves " + gib(budget) +
             " (free now: " + gib(in.free_bytes) + ")";
  w.fit_advice =
      "use a smaller --dtype, split the model over more devices (--parallel), "
      "lower --max-num-batched-tokens, or raise --gpu-memory-utilization";
  w.kv_advice = "lower --max-model-len or raise --gpu-memory-utilization";
  return plan_device_memory(in, w);
}

Result<GpuMemoryPlan> plan_cpu_memory(const CpuMemoryPlanInput& in) {
  if (in.device_memory_bytes == 0)
    return make_error(ErrorCode::invalid_argument, "--device-memory must be > 0 bytes");
  GpuMemoryPlanInput g;
  g.total_bytes = in.device_memory_bytes;
  g.free_bytes = in.device_memory_bytes;
  g.gpu_memory_utilization = 1.0;
  g.weight_bytes = in.weight_bytes;
  g.activation_bytes = in.activation_bytes;
  g.reserved_bytes = in.reserved_bytes;
  g.num_layers = in.num_layers;
  g.num_kv_heads = in.num_kv_heads;
  g.head_dim = in.head_dim;
  g.block_size = in.block_size;
  g.kv_dtype = in.kv_dtype;
  g.max_model_len = in.max_model_len;
  PlanWording w;
  w.device_label = "CPU memory plan";
  w.size = human_size;
  w.budget = "--device-memory is " + human_size(in.device_memory_bytes) + " (" +
             std::to_string(in.device_memory_bytes) + " bytes)";
  w.fit_advice =
      "use a smaller --dtype, lower --max-num-batched-tokens, or raise --device-memory";
  w.kv_advice = "lower --max-model-len or raise --device-memory";
  return plan_device_memory(g, w);
}

}  // namespace shardline::engine
