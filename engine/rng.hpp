#pragma once
/// \file
/// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
/// "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11; Random123).
/// A request's sample at token position p draws from exactly (seed, p), so
/// the value never depends on which other requests share the batch, on
/// chunking, or on preemption.

#include <array>
#include <cstdint>

namespace shardline::engine {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

/// Philox4x32 with 10 rounds (the Random123 default `philox4x32`).
[[nodiscard]] constexpr PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) noexcept {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

/// Maps 32 random bits to a float in [0, 1) using the top 24 bits (exact).
[[nodiscard]] constexpr float u32_to_unit_float(std::uint32_t x) noexcept {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Uniform float in [0, 1) for (seed, position, stream): key = seed,
/// counter = {position lo, position hi, stream, 0}; word 0 of the block.
[[nodiscard]] constexpr float philox_uniform(std::uint64_t seed, std::uint64_t position,
                                             std::uint32_t stream = 0) noexcept {
  const PhiloxKey key{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  const PhiloxCounter ctr{static_cast<std::uint32_t>(position),
                          static_cast<std::uint32_t>(position >> 32), stream, 0u};
  return u32_to_unit_float(philox4x32_10(ctr, key)[0]);
}

/// SplitMix64 finalizer: derives a per-request seed (engine seed, request id)
/// for requests that bring no seed of their own.
[[nodiscard]] constexpr std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace shardline::engine
