#pragma once
/// \file
/// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
/// "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11; Random123).
/// A request's sample at token position p draws from exactly (seed, p), so
/// the value never depends on which other requests share the batch, on
/// chunking, or on preemption.

#include <array>
#include <cstdint>

#include "common/host_device.hpp"

namespace shardline::sampling {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

/// Philox4x32 with 10 rounds (the Random123 default `philox4x32`) on a
/// counter (c0..c3) and key (k0, k1) held in scalars, in place: the one
/// definition the host sampler and the CUDA sampling kernel both run.
SHARDLINE_HOST_DEVICE constexpr void philox4x32_10_inplace(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2,
                                                           std::uint32_t& c3, std::uint32_t k0,
                                                           std::uint32_t k1) noexcept {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c2;
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
}

/// Philox4x32 with 10 rounds (the Random123 default `philox4x32`). Host only.
[[nodiscard]] constexpr PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) noexcept {
  philox4x32_10_inplace(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1]);
  return ctr;
}

/// Maps 32 random bits to a float in [0, 1) using the top 24 bits (exact).
[[nodiscard]] SHARDLINE_HOST_DEVICE constexpr float u32_to_unit_float(std::uint32_t x) noexcept {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Uniform float in [0, 1) for (seed, position, stream): key = seed,
/// counter = {position lo, position hi, stream, 0}; word 0 of the block.
[[nodiscard]] SHARDLINE_HOST_DEVICE constexpr float philox_uniform(std::uint64_t seed, std::uint64_t position,
                                                                   std::uint32_t stream = 0) noexcept {
  std::uint32_t c0 = static_cast<std::uint32_t>(position), c1 = static_cast<std::uint32_t>(position >> 32);
  std::uint32_t c2 = stream, c3 = 0u;
  philox4x32_10_inplace(c0, c1, c2, c3, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return u32_to_unit_float(c0);
}

/// SplitMix64 finalizer: derives a per-request seed (engine seed, request id)
/// for requests that bring no seed of their own.
[[nodiscard]] SHARDLINE_HOST_DEVICE constexpr std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace shardline::sampling
