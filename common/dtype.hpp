#pragma once
/// \file
/// Storage element types and scalar conversions (BF16 and IEEE F16 <-> F32).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/host_device.hpp"

namespace shardline {

namespace detail {
/// The float whose bits are `u` / the bits of `f`, on host and device.
[[nodiscard]] SHARDLINE_HOST_DEVICE inline float u32_as_f32(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
[[nodiscard]] SHARDLINE_HOST_DEVICE inline std::uint32_t f32_as_u32(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
}  // namespace detail

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
[[nodiscard]] SHARDLINE_HOST_DEVICE inline float bf16_to_f32(std::uint16_t h) noexcept {
  return detail::u32_as_f32(static_cast<std::uint32_t>(h) << 16);
}

/// F32 -> BF16 bits, round-to-nearest-even; NaN stays NaN.
[[nodiscard]] SHARDLINE_HOST_DEVICE inline std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t u = detail::f32_as_u32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// IEEE half bits -> F32 (exact, incl. subnormals, inf, NaN).
[[nodiscard]] SHARDLINE_HOST_DEVICE inline float f16_to_f32(std::uint16_t h) noexcept {
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
  return detail::u32_as_f32(bits);
}

/// F32 -> IEEE half bits, round-to-nearest-even (as CUDA's __float2half_rn):
/// overflow -> +-inf, results below the half range -> subnormals or +-0,
/// NaN stays NaN (quiet, sign kept).
[[nodiscard]] SHARDLINE_HOST_DEVICE inline std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t u = detail::f32_as_u32(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: rounds to inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 itself ties to even 0)
    const std::uint32_t exp = abs >> 23;              // 102 .. 112
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand
    const std::uint32_t shift = 126 - exp;            // value = mant * 2^(exp-150); half ulp = 2^-24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped mantissa bits.
  std::uint32_t h = ((abs >> 13) - ((127u - 15u) << 10));
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent (to inf at most)
  return static_cast<std::uint16_t>(sign | h);
}

}  // namespace shardline
