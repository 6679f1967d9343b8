#pragma once
/// \file
/// Roofline cost of one forward step (Williams et al., CACM 2009): the step
/// cannot be faster than max(bytes moved / memory bandwidth, FLOPs / GEMM
/// peak). Bytes: every packed weight matrix once per step (+ lm_head when any
/// logits are computed), the KV cache read by attention and written for the
/// new tokens. FLOPs: 2 per weight per token for the GEMMs, 2 per logits row
/// per lm_head weight, and 4 * head_dim per (query head, attended key) for
/// QK^T and PV.

#include <cstddef>

#include "model/executor.hpp"
#include "model/config.hpp"

namespace shardline::sim::calibration {

struct StepCost {
  double weight_bytes = 0;  ///< weights streamed (the layers' + lm_head's)
  double kv_bytes = 0;      ///< KV read + written
  double flops = 0;         ///< every FLOP of the step (the three phases below)
  // The step's phases (bench/throughput.hpp reports each against its own limit):
  double gemm_weight_bytes = 0;     ///< the layers' QKV, o_proj, gate_up, down
  double gemm_flops = 0;            ///< 2 per layer weight per token
  double lm_head_weight_bytes = 0;  ///< 0 when no row needs logits
  double lm_head_flops = 0;         ///< 2 per lm_head weight per logits row
  double attention_flops = 0;       ///< 4 * head_dim per (query head, attended key)
  [[nodiscard]] double bytes() const { return weight_bytes + kv_bytes; }
  /// max(bytes / bw, flops / peak) in ms; bandwidth in GB/s, peak in GFLOP/s.
  [[nodiscard]] double roofline_ms(double membw_gbs, double gemm_gflops) const;
  /// The layers' GEMMs alone: max(gemm_weight_bytes / bw, gemm_flops / peak), ms.
  [[nodiscard]] double gemm_limit_ms(double membw_gbs, double gemm_gflops) const;
  /// Attention alone: kv_bytes / bw, ms (its FLOPs are far below the peak).
  [[nodiscard]] double attention_limit_ms(double membw_gbs) const;
  /// lm_head alone: max(lm_head_weight_bytes / bw, lm_head_flops / peak), ms.
  [[nodiscard]] double lm_head_limit_ms(double membw_gbs, double gemm_gflops) const;
};

/// Cost of `step` for a model with `config`, weights of `weight_elem_bytes`
/// and KV cache of `kv_elem_bytes` bytes per element (4 for F32, 2 for BF16).
[[nodiscard]] StepCost step_cost(const model::ModelConfig& config, double weight_elem_bytes,
                                 double kv_elem_bytes, const model::StepInput& step);

}  // namespace shardline::sim::calibration
