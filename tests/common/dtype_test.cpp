#include "common/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace shardline {
namespace common_dtype_test {

// Every half value converts back to itself, and every float between two
// adjacent halves rounds to the nearer one (ties to the even one).
TEST(Dtype, F32ToF16RoundTripsEveryHalf) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), bits) << "half 0x" << std::hex << h;
  }
}

TEST(Dtype, F32ToF16RoundsToNearestEven) {
  // Between each pair of adjacent positive finite halves: just below, at and
  // just above the midpoint.
  for (std::uint32_t h = 0; h < 0x7bffu; ++h) {
    const double lo = f16_to_f32(static_cast<std::uint16_t>(h));
    const double hi = f16_to_f32(static_cast<std::uint16_t>(h + 1));
    const double mid = (lo + hi) / 2;
    const float below = std::nextafter(static_cast<float>(mid), 0.0f);
    const float above = std::nextafter(static_cast<float>(mid), 1e9f);
    ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid) << h;  // the midpoint is a float
    EXPECT_EQ(f32_to_f16(below), h) << h;
    EXPECT_EQ(f32_to_f16(above), h + 1) << h;
    EXPECT_EQ(f32_to_f16(static_cast<float>(mid)), (h & 1u) ? h + 1 : h) << h;
    EXPECT_EQ(f32_to_f16(-below), 0x8000u | h) << h;
  }
}

TEST(Dtype, F32ToF16Specials) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bffu);                 // largest half
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bffu);                // below the midpoint to "65536"
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00u);                 // ties to even: inf
  EXPECT_EQ(f32_to_f16(1e30f), 0x7c00u);
  EXPECT_EQ(f32_to_f16(-1e30f), 0xfc00u);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001u);    // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000u);    // half of it: ties to even 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001u);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000u);
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000u);
  const std::uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00u, 0x7c00u);
  EXPECT_NE(nan & 0x3ffu, 0u);
}

}  // namespace
}  // namespace shardline
