#pragma once
/// \file
/// Shift Parallelism's per-step switch (seed 001, §3 and Alg. 3): an engine
/// group built with a base config SP×TP also holds a shift config TP' =
/// SP×TP over the same devices and the same KV cache (§3.3); each step runs
/// in the config its batched token count calls for:
///
///   base -> shift  when num_tokens <= T                 (small decode steps:
///                                                        full TP has the lowest latency)
///   shift -> base  when num_tokens >  floor(T·(1+h))    (large, prefill-heavy
///                                                        steps: SP has the higher throughput)
///
/// Between T and floor(T·(1+h)) (both excluded / included as written) the
/// current config stays: that band is the hysteresis, so steps alternating
/// around T do not flap. With h = 0 this is exactly Alg. 3 (ArcticInference:
/// shift when the batch has at most T tokens, T = 512 by default, no
/// hysteresis). Leaving shift is immediate because a large step under TP'
/// would pay P-wide all-reduces of [num_tokens, hidden] (§3.1).
///
///  - A step with no tokens changes nothing (it runs nothing).
///  - T = 0 never shifts (the static base config); T >= the step budget
///    always shifts (the static shift config).
///  - A plain class: no threads. The group's rank 0 (its ParallelExecutor)
///    owns one and asks it once per step; the other ranks follow the kind of
///    step rank 0 sends them.

#include <cstdint>

#include "common/result.hpp"

namespace shardline::engine {

/// Which of the group's two configs a step runs in.
enum class ShiftMode { base, shift };

[[nodiscard]] constexpr const char* shift_mode_name(ShiftMode m) noexcept {
  return m == ShiftMode::base ? "base" : "shift";
}

struct ShiftPolicyOptions {
  long long threshold = 512;  ///< T, batched tokens per step (>= 0)
  double hysteresis = 0.25;   ///< h (>= 0): back to base above floor(T·(1+h))
  /// Errors: invalid_argument naming the field.
  [[nodiscard]] Status validate() const;
};

class ShiftPolicy {
 public:
  /// Errors: what options.validate() returns.
  [[nodiscard]] static Result<ShiftPolicy> create(const ShiftPolicyOptions& options);

  /// The config of a step with `num_tokens` batched tokens (and records it).
  ShiftMode decide(long long num_tokens);

  [[nodiscard]] ShiftMode mode() const { return mode_; }
  [[nodiscard]] const ShiftPolicyOptions& options() const { return options_; }
  /// floor(T·(1+h)): the largest step that stays in shift.
  [[nodiscard]] long long upper_threshold() const { return upper_; }
  [[nodiscard]] std::uint64_t switches() const { return switches_; }
  [[nodiscard]] std::uint64_t base_steps() const { return base_steps_; }
  [[nodiscard]] std::uint64_t shift_steps() const { return shift_steps_; }

 private:
  explicit ShiftPolicy(const ShiftPolicyOptions& o);
  ShiftPolicyOptions options_;
  long long upper_ = 0;
  ShiftMode mode_ = ShiftMode::base;
  std::uint64_t switches_ = 0;
  std::uint64_t base_steps_ = 0;
  std::uint64_t shift_steps_ = 0;
};

}  // namespace shardline::engine
