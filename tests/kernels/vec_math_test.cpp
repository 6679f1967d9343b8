// The private SIMD helpers of the CPU kernels (kernels/cpu/vec_math.hpp)
// against scalar emulations of their documented arithmetic, bit for bit:
// exp16 (AVX-512) and exp8 (AVX2, scalef done as two products) must each
// match the same emulation, and so give the same bits; likewise the 16-lane
// reductions.
#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/kernels/simd_order_reference.hpp"

namespace shardline::kernels::cpu {
namespace kernels_vec_math_test {

using testing_order::exp_lane;
using testing_order::max_lane;
using testing_order::reduce16;

#if defined(__AVX512F__)
constexpr bool kSimd = true;
void simd_exp(const float* x, float* y) { _mm512_storeu_ps(y, detail::exp16(_mm512_loadu_ps(x))); }
float simd_sum(const float* l) { return detail::hsum16(_mm512_loadu_ps(l)); }
float simd_max(const float* l) { return _mm512_reduce_max_ps(_mm512_loadu_ps(l)); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool kSimd = true;
void simd_exp(const float* x, float* y) {
  _mm256_storeu_ps(y, detail::exp8(_mm256_loadu_ps(x)));
  _mm256_storeu_ps(y + 8, detail::exp8(_mm256_loadu_ps(x + 8)));
}
float simd_sum(const float* l) { return detail::hsum16(_mm256_loadu_ps(l), _mm256_loadu_ps(l + 8)); }
float simd_max(const float* l) { return detail::hmax16(_mm256_loadu_ps(l), _mm256_loadu_ps(l + 8)); }
#else
constexpr bool kSimd = false;
void simd_exp(const float*, float*) {}
float simd_sum(const float*) { return 0; }
float simd_max(const float*) { return 0; }
#endif

TEST(VecMath, ExpMatchesScalarEmulationBitExact) {
  if (!kSimd) GTEST_SKIP() << "no SIMD path compiled";
  std::vector<float> x;
  for (float v = -112.0f; v <= 96.0f; v += 1.0f / 128) x.push_back(v);  // clamps, denormals, 0
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-104.0f, 89.0f);
  for (int i = 0; i < 20000; ++i) x.push_back(u(rng));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, std::nanf(""), 88.7f, -103.0f, 1e-40f, -1e-40f})
    x.push_back(v);
  while (x.size() % 16) x.push_back(0.5f);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); i += 16) simd_exp(&x[i], &y[i]);
  int subnormal = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float ref = exp_lane(x[i]);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(y[i]), std::bit_cast<std::uint32_t>(ref))
        << "x = " << x[i] << ": " << y[i] << " vs " << ref;
    subnormal += std::fpclassify(y[i]) == FP_SUBNORMAL;
  }
  EXPECT_GT(subnormal, 100);  // the gradual-underflow range is covered
  // and it is e^x: within a few ulp on the normal range
  for (float v : {-80.0f, -10.0f, -1.0f, 0.0f, 0.5f, 3.0f, 80.0f})
    EXPECT_NEAR(exp_lane(v), std::exp(v), 4e-7 * std::exp(v)) << v;
}

TEST(VecMath, ReductionsMatchScalarEmulationBitExact) {
  if (!kSimd) GTEST_SKIP() << "no SIMD path compiled";
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 30);
  auto add = [](float a, float b) { return a + b; };
  int order_matters = 0;
  for (int c = 0; c < 5000; ++c) {
    float l[16];
    for (float& v : l) v = std::ldexp(nd(rng), ex(rng));  // mixed magnitudes: order shows
    const float sum = reduce16(l, add);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(simd_sum(l)), std::bit_cast<std::uint32_t>(sum)) << c;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(simd_max(l)),
              std::bit_cast<std::uint32_t>(reduce16(l, max_lane))) << c;
    float seq = 0.0f;
    for (float v : l) seq += v;
    order_matters += seq != sum;
  }
  EXPECT_GT(order_matters, 100);  // a sequential sum would fail the check above
}

}  // namespace
}  // namespace shardline::kernels::cpu
