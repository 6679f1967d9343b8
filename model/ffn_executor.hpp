#pragma once
/// \file
/// The FFN of a decoder layer as a pluggable module: the CPU runner
/// (model/shard_runner.hpp) computes `down(silu(gate(x)) * up(x))` itself from
/// its own packed weights, unless it is given an FfnExecutor, which then owns
/// every layer's FFN. SiDP (seed 002 §4.1: "treats each Transformer FFN as a
/// pluggable module: intercepting FFN forward passes") plugs in here:
/// model/sidp/sidp_ffn.hpp runs the FFN of layers this rank does not own by
/// fetching their weights (WaS) or by sending its rows to the owner (CaS).

#include "common/result.hpp"

namespace shardline::model {

class FfnExecutor {
 public:
  virtual ~FfnExecutor() = default;

  /// Called once before a step's first layer with the step's token rows on
  /// this rank (> 0). Errors: io (a peer of a synchronised group is gone).
  [[nodiscard]] virtual Status begin_step(int num_rows) = 0;

  /// out[num_rows, hidden] = down_proj(silu(x W_gate^T) * (x W_up^T)) of
  /// decoder layer `layer`, x = [num_rows, hidden] (the post-attention
  /// RMSNorm output). Row-wise batch-invariant: a row's output does not
  /// depend on the other rows. Errors: io (a weight owner or a peer is gone
  /// past its timeout), internal.
  [[nodiscard]] virtual Status forward(int layer, const float* x, int num_rows, float* out) = 0;

  /// After a step's last layer (begin_step succeeded and every forward too).
  virtual void end_step() = 0;

  /// After a step failed part-way: drop whatever the step left in flight so
  /// the next step starts clean.
  virtual void abort_step() = 0;
};

}  // namespace shardline::model
