#pragma once
/// \file
/// Device memory plan of one GPU worker, in the manner of vLLM's
/// `--gpu-memory-utilization`: how much of a device's memory the worker may
/// take, what the model weights, the activation workspace and the fixed
/// runtime reserve need out of that, and how many paged KV-cache blocks fit in
/// what is left. The same plan serves a CPU device given a `--device-memory`
/// budget (`plan_cpu_memory`): the budget is then the whole device.
///
/// Pure host-side arithmetic (no CUDA calls), so it is unit-tested on CPU.
/// The device numbers come from `kernels::cuda::query_devices()`
/// (`DeviceInfo::total_memory_bytes` / `free_memory_bytes`); the model numbers
/// from `model::ModelConfig` via `weight_bytes_for` / `activation_bytes_for`;
/// the KV block size from `engine/kv_budget.hpp` (`kv_bytes_per_block`).
///
/// All sizes are in bytes. GiB below means 2^30 bytes.

#include <cstdint>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "model/config.hpp"

namespace shardline::engine {

/// Bytes of the model weights as `model::load_model` / `make_dummy_weights`
/// hold them (exactly `ModelWeights::total_bytes()` for the same config and
/// dtype): every matrix (embed_tokens, fused qkv, o_proj, fused gate_up,
/// down_proj, and lm_head unless `tie_word_embeddings`, in which case the
/// shared matrix is counted once) at `dtype_size(weight_dtype)` bytes per
/// element, plus every vector (input / post-attention / final RMSNorm weights,
/// the qkv bias of Qwen2 / `attention_bias`, the q/k norms of Qwen3) in F32
/// (4 bytes per element, as the loader stores them). Per layer:
///   matrices = qkv_rows * hidden + hidden * heads * head_dim + 3 * hidden * intermediate
///   vectors  = 2 * hidden [+ qkv_rows if qkv_bias] [+ 2 * head_dim if qk_norm]
/// Whole model: layers * per-layer + vocab * hidden (embed) [+ vocab * hidden
/// (lm_head) unless tied] + hidden (final norm, F32).
[[nodiscard]] std::uint64_t weight_bytes_for(const model::ModelConfig& config, DType weight_dtype) noexcept;

/// Peak activation workspace, in bytes, of one forward step over
/// `max_num_batched_tokens` tokens (T) of at most `max_num_seqs` (S)
/// sequences. Every buffer is F32 (activations are F32) and, to stay an upper
/// bound, all of them are counted as live at once:
///   residual    [T, hidden]
///   normed      [T, hidden]
///   qkv         [T, (heads + 2 * kv_heads) * head_dim]
///   attn_out    [T, heads * head_dim]
///   gate_up     [T, 2 * intermediate]
///   act         [T, intermediate]      (silu(gate) * up)
///   logits      [S, vocab]             (last position of each sequence only)
/// bytes = 4 * (T * (2 * hidden + qkv_rows + heads * head_dim + 3 * intermediate) + S * vocab).
/// Per-layer buffers are reused across layers, so the count does not grow with
/// the layer count. Non-positive T or S count as 0 rows.
[[nodiscard]] std::uint64_t activation_bytes_for(const model::ModelConfig& config, int max_num_batched_tokens,
                                                 int max_num_seqs) noexcept;

/// What the plan is computed from. Sizes in bytes.
struct GpuMemoryPlanInput {
  std::uint64_t total_bytes = 0;  ///< device memory (DeviceInfo::total_memory_bytes)
  std::uint64_t free_bytes = 0;   ///< free now (DeviceInfo::free_memory_bytes); other processes hold the rest
  /// Fraction of TOTAL memory this worker may use, in (0, 1] (`--gpu-memory-utilization`).
  double gpu_memory_utilization = 0.9;
  std::uint64_t weight_bytes = 0;      ///< exact, from `weight_bytes_for`
  std::uint64_t activation_bytes = 0;  ///< peak workspace, from `activation_bytes_for`
  /// CUDA context, cuBLAS workspace, captured graphs: not visible to the
  /// allocator, so set aside up front.
  std::uint64_t reserved_bytes = 512ull << 20;
  int num_layers = 0;    ///< KV cache shape: layers holding a cache on this worker
  int num_kv_heads = 0;  ///< KV heads on this worker
  int head_dim = 0;
  int block_size = 16;  ///< tokens per KV block (`--block-size`)
  DType kv_dtype = DType::bf16;  ///< `--kv-cache-dtype`
  int max_model_len = 0;  ///< longest sequence (prompt + output) one request may reach
};

/// The resulting split of the device memory. Sizes in bytes.
///
///   budget_bytes = floor(total_bytes * gpu_memory_utilization)
///   usable_bytes = min(budget_bytes, free_bytes)      (cannot take what another process holds)
///   kv space     = usable_bytes - weight_bytes - activation_bytes - reserved_bytes
///   num_kv_blocks = floor(kv space / kv_bytes_per_block)
///   kv_bytes      = num_kv_blocks * kv_bytes_per_block   (<= kv space)
///   max_concurrent_seqs_at_max_len = num_kv_blocks / ceil(max_model_len / block_size)
struct GpuMemoryPlan {
  std::uint64_t budget_bytes = 0;  ///< total * utilization
  std::uint64_t usable_bytes = 0;  ///< min(budget, free)
  std::uint64_t weight_bytes = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t kv_bytes = 0;  ///< bytes the KV cache allocates (whole blocks)
  int num_kv_blocks = 0;       ///< capped at INT_MAX
  std::uint64_t kv_bytes_per_block = 0;  ///< K and V over all layers, one block
  int max_concurrent_seqs_at_max_len = 0;  ///< sequences of max_model_len tokens that fit at once
};

/// Computes the plan (formula on `GpuMemoryPlan`).
/// Errors (messages give the sizes in GiB with 2 decimals):
///   invalid_argument: utilization outside (0, 1] or NaN; total_bytes 0;
///     num_layers, num_kv_heads, head_dim, block_size or max_model_len <= 0.
///   out_of_memory: weights + activations + reserved exceed min(budget, free)
///     ("model weights need 15.02 GiB ... but --gpu-memory-utilization 0.90 of
///     79.10 GiB leaves 71.19 GiB (free now: 10.00 GiB)"); or the KV cache left
///     over cannot hold one sequence of max_model_len tokens.
[[nodiscard]] Result<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryPlanInput& input);

/// What a CPU device's plan is computed from: `--device-memory` emulates a
/// device of that many bytes. Sizes in bytes.
struct CpuMemoryPlanInput {
  std::uint64_t device_memory_bytes = 0;  ///< `--device-memory`: the whole budget of this device
  /// Exact, from `weight_bytes_for` (plain) or `sidp_weight_bytes_for`
  /// (SiDP weight sharing: engine/sidp_memory.hpp).
  std::uint64_t weight_bytes = 0;
  std::uint64_t activation_bytes = 0;  ///< peak workspace, from `activation_bytes_for`
  /// 0 by default: a CPU device has no driver context, library workspace or
  /// graph pool hidden from the allocator (what the GPU reserve covers), and
  /// the process's own memory (code, tokenizer, scheduler tables, thread
  /// stacks, `--swap-space`, which stands for host memory) is outside the
  /// emulated device.
  std::uint64_t reserved_bytes = 0;
  int num_layers = 0;    ///< KV cache shape, as in GpuMemoryPlanInput
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType kv_dtype = DType::f32;
  int max_model_len = 0;
};

/// The CPU device's plan: `plan_gpu_memory`'s split with total = free =
/// budget = usable = `device_memory_bytes` (utilization 1.0: the flag already
/// states what the engine may take), reserved as given.
/// Errors (sizes with 2 decimals in the largest binary unit they reach --
/// KiB, MiB, GiB -- and the budget also in bytes):
///   invalid_argument: device_memory_bytes 0; num_layers, num_kv_heads,
///     head_dim, block_size or max_model_len <= 0.
///   out_of_memory: weights + activations + reserved exceed the budget
///     ("model weights need 0.99 MiB (plus activations 7.03 MiB and reserved
///     0 bytes = 8.02 MiB) but --device-memory is 1.00 MiB (1048576 bytes);
///     ..."), or the KV cache left over cannot hold one sequence of
///     max_model_len tokens.
[[nodiscard]] Result<GpuMemoryPlan> plan_cpu_memory(const CpuMemoryPlanInput& input);

}  // namespace shardline::engine
