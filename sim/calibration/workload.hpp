#pragma once
/// \file
/// Pieces shared by the benchmarks: the seeded random prompts of vLLM's
/// throughput setting, the median of timings (and of an engine's decode
/// steps) and a wall clock.

#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/llm_engine.hpp"

namespace shardline::sim::calibration {

/// `num` prompts of `len` token ids drawn from [3, vocab) by a seeded LCG
/// (ids 0-2 are special in the Llama family); the same for the same seed.
[[nodiscard]] std::vector<std::vector<std::int32_t>> random_prompts(int num, int len, int vocab, std::uint64_t seed);

/// The median of `v` (mean of the middle two for an even count); 0 when empty.
[[nodiscard]] double median(std::vector<double> v);

/// The median step_ms of `engine`'s recorded pure-decode steps of exactly
/// `batch` sequences (its step_stats()); 0 when there are none.
[[nodiscard]] double decode_median_ms(const engine::LlmEngine& engine, int batch);

/// The benchmarks' wall clock (monotonic).
using Clock = std::chrono::steady_clock;

/// Seconds from `t0` to now.
[[nodiscard]] inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace shardline::sim::calibration
