#pragma once
/// \file
/// Pieces shared by the benchmarks: the seeded random prompts of vLLM's
/// throughput setting and the median of timings.

#include <cstdint>
#include <vector>

namespace shardline::bench {

/// `num` prompts of `len` token ids drawn from [3, vocab) by a seeded LCG
/// (ids 0-2 are special in the Llama family); the same for the same seed.
[[nodiscard]] std::vector<std::vector<std::int32_t>> random_prompts(int num, int len, int vocab, std::uint64_t seed);

/// The median of `v` (mean of the middle two for an even count); 0 when empty.
[[nodiscard]] double median(std::vector<double> v);

}  // namespace shardline::bench
