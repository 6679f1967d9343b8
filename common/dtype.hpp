#pragma once
/// \file
/// Storage element types and scalar conversions (BF16 and IEEE F16 <-> F32).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace shardline {

/// Element type of stored tensors.
enum class DType { f32, f16, bf16 };

[[nodiscard]] constexpr const char* dtype_name(DType d) noexcept {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
  }
  return "?";
}

[[nodiscard]] constexpr std::size_t dtype_size(DType d) noexcept {
  return d == DType::f32 ? 4 : 2;
}

/// BF16 bits -> F32 (exact).
[[nodiscard]] inline float bf16_to_f32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// F32 -> BF16 bits, round-to-nearest-even; NaN stays NaN.
[[nodiscard]] inline std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// IEEE half bits -> F32 (exact, incl. subnormals, inf, NaN).
[[nodiscard]] inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace shardline
