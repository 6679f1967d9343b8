#pragma once
/// \file
/// The Llama / Qwen2 / Qwen3 forward pass on CPU over a paged KV cache: the
/// `engine::ModelExecutor` a CPU device runs.
///
/// One step takes a flattened batch of tokens from many sequences (prefill
/// chunks and decode tokens mixed) and returns logits for the rows the
/// scheduler asked for. Per layer: RMSNorm -> fused QKV GEMM (+bias) ->
/// [Qwen3 per-head q/k RMSNorm] -> RoPE -> KV scatter into blocks -> paged GQA
/// attention -> o_proj -> residual + RMSNorm -> fused gate_up GEMM -> SwiGLU ->
/// down_proj -> residual. Every kernel is batch-invariant (see
/// kernels/cpu/linear.hpp and attention.hpp), so a request's logits are
/// bit-identical alone or in any batch, at any prefill chunking.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/memory.hpp"
#include "common/result.hpp"
#include "engine/step.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "model/weights.hpp"

namespace shardline::model {

/// Where a step's time went (ms), accumulated while profiling is on.
struct StepProfile {
  double gemm_ms = 0;       ///< QKV, o_proj, gate_up, down_proj
  double attention_ms = 0;  ///< KV scatter + paged attention
  double logits_ms = 0;     ///< final norm + lm_head
  double other_ms = 0;      ///< embedding, norms, RoPE, SwiGLU, residual adds
  [[nodiscard]] double total_ms() const { return gemm_ms + attention_ms + logits_ms + other_ms; }
};

struct CpuRunnerOptions {
  int num_kv_blocks = 0;  ///< blocks in the paged KV cache (> 0)
  int block_size = 16;    ///< tokens per KV block
  int num_threads = 0;    ///< OpenMP threads for kernels; 0 = leave as is
  DType kv_cache_dtype = DType::f32;  ///< f32 (exact) or bf16 (half the KV bytes)
};

class CpuModelRunner final : public engine::ModelExecutor {
 public:
  /// Packs the weights for the GEMM kernels and allocates the KV cache
  /// (2 * layers * num_kv_blocks * kv_heads * block_size * head_dim elements
  /// of kv_cache_dtype, zeroed up front so no page faults land in steps).
  /// Errors: invalid_argument (num_kv_blocks or block_size <= 0, KV dtype not
  /// f32/bf16), out_of_memory (KV cache allocation failed).
  [[nodiscard]] static Result<std::unique_ptr<CpuModelRunner>> create(
      std::shared_ptr<const ModelWeights> weights, const CpuRunnerOptions& options);

  /// Runs one step. Errors: invalid_argument when a token id, position, slot
  /// or block id is out of range, or the step is inconsistent (sizes).
  [[nodiscard]] Result<engine::StepOutput> execute(const engine::StepInput& input) override;

  [[nodiscard]] int vocab_size() const override { return config().vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return options_.num_kv_blocks; }
  [[nodiscard]] int block_size() const override { return options_.block_size; }

  [[nodiscard]] const ModelConfig& config() const { return weights_->config; }
  /// Times each op family of every step (a few clock reads per layer).
  void set_profiling(bool on) { profiling_ = on; }
  /// The last step's profile (zeros unless profiling).
  [[nodiscard]] const StepProfile& last_profile() const { return profile_; }
  /// Bytes of packed weights the GEMMs stream per step (for rooflines).
  [[nodiscard]] std::size_t packed_weight_bytes() const;
  /// Bytes of the KV cache (K and V, all layers).
  [[nodiscard]] std::size_t kv_cache_bytes() const { return kv_cache_bytes_; }

 private:
  struct PackedLayer {
    kernels::cpu::PackedLinear qkv;      // [qkv_rows, hidden]
    kernels::cpu::PackedLinear o_proj;   // [hidden, heads * head_dim]
    kernels::cpu::PackedLinear gate_up;  // [2 * intermediate, hidden]
    kernels::cpu::PackedLinear down;     // [hidden, intermediate]
  };

  CpuModelRunner(std::shared_ptr<const ModelWeights> weights, const CpuRunnerOptions& options);
  [[nodiscard]] Status validate(const engine::StepInput& input) const;
  [[nodiscard]] kernels::cpu::KvCacheLayer kv_layer(int layer);
  void ensure_scratch(int num_tokens);

  std::shared_ptr<const ModelWeights> weights_;
  CpuRunnerOptions options_;
  std::vector<PackedLayer> layers_;
  kernels::cpu::PackedLinear lm_head_;  // [vocab, hidden]
  std::vector<float> inv_freq_;         // [head_dim / 2]
  AlignedBuffer kv_cache_;  // [layers, 2, num_kv_blocks, kv_heads, block_size, head_dim]
  std::size_t kv_cache_bytes_ = 0;
  std::size_t kv_layer_bytes_ = 0;  ///< bytes of one layer's K (or V)

  bool profiling_ = false;
  StepProfile profile_;

  // Scratch, grown to the largest step seen.
  int scratch_tokens_ = 0;
  std::vector<float> residual_;  // [num_tokens, hidden]
  std::vector<float> normed_;    // [num_tokens, hidden]
  std::vector<float> qkv_;       // [num_tokens, qkv_rows]
  std::vector<float> attn_;      // [num_tokens, heads * head_dim]
  std::vector<float> proj_;      // [num_tokens, hidden]
  std::vector<float> gate_up_;   // [num_tokens, 2 * intermediate]
  std::vector<float> act_;       // [num_tokens, intermediate]
};

}  // namespace shardline::model
