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

namespace shardline::bench {

struct StepCost {
  double weight_bytes = 0;  ///< weights streamed
  double kv_bytes = 0;      ///< KV read + written
  double flops = 0;
  [[nodiscard]] double bytes() const { return weight_bytes + kv_bytes; }
  /// max(bytes / bw, flops / peak) in ms; bandwidth in GB/s, peak in GFLOP/s.
  [[nodiscard]] double roofline_ms(double membw_gbs, double gemm_gflops) const;
};

/// Cost of `step` for a model with `config`, weights of `weight_elem_bytes`
/// and KV cache of `kv_elem_bytes` bytes per element (4 for F32, 2 for BF16).
[[nodiscard]] StepCost step_cost(const model::ModelConfig& config, double weight_elem_bytes,
                                 double kv_elem_bytes, const model::StepInput& step);

}  // namespace shardline::bench
