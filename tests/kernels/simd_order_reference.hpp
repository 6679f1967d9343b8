#pragma once
/// \file
/// Scalar emulations of the CPU kernels' SIMD arithmetic (kernels/cpu/
/// vec_math.hpp), op for op, for bit-exact tests: the AVX-512 and the AVX2
/// paths must each match them, so they match each other.

#include <cmath>

namespace shardline::kernels::cpu::testing_order {

/// x, opaque to the optimizer: a product stays rounded on its own instead
/// of being contracted into an FMA with a later sum (-ffp-contract=fast).
inline float opaque(float x) {
  asm("" : "+x"(x));
  return x;
}

/// exp16 / exp8 of one lane.
inline float exp_lane(float x) {
  x = x > -103.0f ? x : -103.0f;  // max_ps(x, c), min_ps(x, c): NaN gives c
  x = x < 88.7f ? x : 88.7f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                  5.0000001201e-1f})
    p = std::fma(p, r, c);
  const float pr = opaque(p * r);
  p = std::fma(pr, r, r + 1.0f);
  return std::ldexp(p, static_cast<int>(n));  // one rounding, like scalef
}

/// max_ps of one lane: a > b ? a : b.
inline float max_lane(float a, float b) { return a > b ? a : b; }

/// 16 lanes reduced in the order of GCC's _mm512_reduce_{add,max}_ps
/// (hi half op lo half, then quarters, then pairs).
template <typename Op>
float reduce16(const float* lane, Op op) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = op(lane[8 + i], lane[i]);
  for (int i = 0; i < 4; ++i) t6[i] = op(t3[4 + i], t3[i]);
  return op(op(t6[0], t6[2]), op(t6[1], t6[3]));
}

}  // namespace shardline::kernels::cpu::testing_order
