#pragma once
/// \file
/// Elapsed wall time on the steady clock, in milliseconds: what the step,
/// phase and benchmark timers record (`step_ms`, `transition_ms`, ...).

#include <chrono>

namespace shardline {

/// Milliseconds since `t0` (steady clock), with sub-millisecond precision.
[[nodiscard]] inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace shardline
