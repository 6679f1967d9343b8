#pragma once
/// \file
/// The Llama / Qwen2 / Qwen3 forward pass on CPU over a paged KV cache: the
/// `model::ModelExecutor` a CPU device runs.
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
#include "model/executor.hpp"
#include "model/shard_runner.hpp"
#include "model/weights.hpp"

namespace shardline::model {

class CpuModelRunner final : public model::ModelExecutor {
 public:
  /// Packs the weights for the GEMM kernels and allocates the KV cache
  /// (2 * layers * num_kv_blocks * kv_heads * block_size * head_dim elements
  /// of kv_cache_dtype, zeroed up front so no page faults land in steps).
  /// Errors: invalid_argument (num_kv_blocks or block_size <= 0, KV dtype not
  /// f32/bf16), out_of_memory (KV cache allocation failed).
  /// With `ffn`, every layer's FFN runs through it (SiDP weight sharing,
  /// model/sidp/sidp_ffn.hpp) and no FFN weights are packed here.
  [[nodiscard]] static Result<std::unique_ptr<CpuModelRunner>> create(
      std::shared_ptr<const ModelWeights> weights, const CpuRunnerOptions& options,
      std::shared_ptr<FfnExecutor> ffn = nullptr);

  /// Runs one step. Errors: invalid_argument when a token id, position, slot
  /// or block id is out of range, or the step is inconsistent (sizes).
  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override;

  [[nodiscard]] int vocab_size() const override { return config().vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return shard_->num_kv_blocks(); }
  [[nodiscard]] int block_size() const override { return shard_->block_size(); }
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override { return shard_->kv_model_shape(); }
  [[nodiscard]] std::vector<kvstore::KvCacheView> kv_cache_views() override { return {shard_->kv_cache_view()}; }
  [[nodiscard]] bool supports_layer_kv_hook() const override { return true; }
  void set_layer_kv_hook(LayerKvHook hook) override { shard_->set_layer_kv_hook(std::move(hook)); }

  [[nodiscard]] const ModelConfig& config() const { return shard_->config(); }
  /// Times each op family of every step (a few clock reads per layer).
  void set_profiling(bool on) { shard_->set_profiling(on); }
  /// The last step's profile (zeros unless profiling).
  [[nodiscard]] const StepProfile& last_profile() const { return shard_->last_profile(); }
  /// Bytes of packed weights the GEMMs stream per step (for rooflines).
  [[nodiscard]] std::size_t packed_weight_bytes() const { return shard_->packed_weight_bytes(); }
  /// Bytes of the KV cache (K and V, all layers).
  [[nodiscard]] std::size_t kv_cache_bytes() const { return shard_->kv_cache_bytes(); }

 private:
  explicit CpuModelRunner(std::unique_ptr<ShardRunner> shard) : shard_(std::move(shard)) {}
  std::unique_ptr<ShardRunner> shard_;  ///< the whole model (tp = sp = pp = 1)
};

}  // namespace shardline::model
