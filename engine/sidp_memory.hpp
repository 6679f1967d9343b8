#pragma once
/// \file
/// Memory accounting of SiDP weight sharing (paper §4.1): in a data-parallel
/// group of `dp` ranks, every rank keeps the attention side of the model
/// (qkv, o_proj, RMSNorm weights, qkv bias, q/k norms), the embedding, the
/// lm_head and the final norm, but the FFN weights (fused gate_up + down_proj)
/// only of the layers it owns, plus a ring of cache slots each holding one
/// layer's FFN weights (WaS fetches non-owned layers into them). The bytes
/// freed become KV blocks; `kv_capacity_plain_vs_sidp` compares the KV
/// capacity of plain DP and SiDP at one `--device-memory` budget (the
/// benchmark's capacity table, which needs no compute).
///
/// Pure arithmetic over `model::ModelConfig`, consistent with
/// `weight_bytes_for` (engine/gpu_memory_plan.hpp), and for loaded weights
/// over their matrices' bytes (sidp_weight_bytes_of). All sizes in bytes.

#include <cstdint>
#include <optional>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace shardline::engine {

/// Bytes of one layer's FFN weights: fused gate_up [2 * intermediate, hidden]
/// plus down_proj [hidden, intermediate] at `dtype_size(weight_dtype)` bytes
/// per element, i.e. 3 * hidden * intermediate * elem. This is also the size
/// of one WaS cache slot. The post-attention RMSNorm weight stays with the
/// replicated part (it is a norm, as in §4.1).
[[nodiscard]] std::uint64_t ffn_weight_bytes_per_layer(const model::ModelConfig& config,
                                                       DType weight_dtype) noexcept;

/// FFN layers rank `rank` owns under the balanced plan of `dp` ranks over
/// `num_layers` layers: the layers l with l % dp == rank, so
/// num_layers / dp, plus 1 when rank < num_layers % dp. 0 when num_layers
/// <= 0, dp <= 0 or rank is outside [0, dp).
[[nodiscard]] int sidp_owned_ffn_layer_count(int num_layers, int dp, int rank) noexcept;

/// Bytes of the weights one SiDP rank holds:
///   weight_bytes_for(config, dtype)
///     - (num_hidden_layers - owned) * ffn_weight_bytes_per_layer    (placeholders hold nothing)
///     + cache_slots * ffn_weight_bytes_per_layer                    (WaS ring)
/// `num_owned_ffn_layers` < 0 means all layers (plain DP) and is capped at
/// num_hidden_layers; `cache_slots` < 0 counts as 0. With every layer owned
/// and 0 slots this equals `weight_bytes_for`.
[[nodiscard]] std::uint64_t sidp_weight_bytes_for(const model::ModelConfig& config, DType weight_dtype,
                                                  int num_owned_ffn_layers, int cache_slots) noexcept;

/// sidp_weight_bytes_for on loaded weights in their own formats (a quantized
/// file kept quantized, `--dtype auto`): the bytes of every matrix and
/// vector as stored (ModelWeights::total_bytes) less the FFN layers this
/// rank does not own, counted as `num_owned_ffn_layers` layers of the mean
/// FFN layer's bytes (rounded up) plus `cache_slots` of the largest (a WaS
/// slot holds any layer). Arguments as sidp_weight_bytes_for.
[[nodiscard]] std::uint64_t sidp_weight_bytes_of(const model::ModelWeights& weights, int num_owned_ffn_layers,
                                                 int cache_slots) noexcept;

/// A SiDP group's FFN weights as WaS moves them between CPU ranks: what the
/// cost model (sim::CostModel::for_sidp_rank) prices a layer's fetch and
/// GEMM at.
struct SidpFfnFormat {
  /// Mean bytes of a layer's FFN region (model::sidp::ffn_layout: the
  /// matrices' packed parts, 64-byte aligned) per FFN weight (3 x hidden x
  /// intermediate): F32 about 4, BF16 about 2, Q8_0 1.125, Q4_1 0.75.
  double region_bytes_per_weight = 0;
  /// The quantized type holding most FFN weights (its kernel's GEMM rate is
  /// the one to measure); nullopt when most are dense.
  std::optional<kernels::GgmlType> quant_type;
};

/// SidpFfnFormat of loaded weights. Errors: invalid_argument (no layers, or
/// a layer without gate_up / down_proj), and what model::sidp::ffn_layout
/// returns for a matrix the CPU kernels cannot hold.
[[nodiscard]] Result<SidpFfnFormat> sidp_ffn_format(const model::ModelWeights& weights);

/// What the capacity comparison is computed from: one model on `dp` CPU
/// devices of `device_memory_bytes` each.
struct KvCapacityInput {
  model::ModelConfig config;
  DType weight_dtype = DType::f32;
  DType kv_dtype = DType::f32;
  int block_size = 16;                    ///< tokens per KV block
  std::uint64_t device_memory_bytes = 0;  ///< `--device-memory`, per device
  std::uint64_t activation_bytes = 0;     ///< from `activation_bytes_for` (same on every rank)
  std::uint64_t reserved_bytes = 0;       ///< as CpuMemoryPlanInput::reserved_bytes
  int dp = 1;                             ///< ranks of the DP group
  int cache_slots = 2;                    ///< SiDP WaS ring slots per rank (plain DP has none)
};

/// One rank's share of the budget.
struct RankKvCapacity {
  int rank = 0;
  int owned_ffn_layers = 0;  ///< all layers under plain DP
  int cache_slots = 0;       ///< 0 under plain DP
  std::uint64_t weight_bytes = 0;
  /// KV blocks `plan_cpu_memory` gives this rank; 0 when the weights,
  /// activations and reserve do not fit (or leave less than one block).
  int num_kv_blocks = 0;
  std::uint64_t kv_tokens = 0;  ///< num_kv_blocks * block_size
};

/// Plain DP against SiDP (balanced ownership) on the same devices.
struct KvCapacity {
  std::vector<RankKvCapacity> plain;  ///< dp entries, rank order
  std::vector<RankKvCapacity> sidp;   ///< dp entries, rank order
  [[nodiscard]] std::uint64_t plain_kv_tokens() const noexcept;  ///< sum over ranks
  [[nodiscard]] std::uint64_t sidp_kv_tokens() const noexcept;   ///< sum over ranks
};

/// Per-rank KV capacity of plain DP and of SiDP at one budget. Each rank's
/// blocks are `plan_cpu_memory`'s for its weight bytes (with max_model_len
/// of one block, so any leftover of at least one block counts).
/// Errors: invalid_argument for dp < 1, cache_slots < 0, block_size <= 0,
/// device_memory_bytes 0, or a config without layers, KV heads or head_dim.
[[nodiscard]] Result<KvCapacity> kv_capacity_plain_vs_sidp(const KvCapacityInput& input);

}  // namespace shardline::engine
