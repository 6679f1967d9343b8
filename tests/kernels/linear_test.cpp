#include "kernels/cpu/linear.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace shardline::kernels::cpu {
namespace kernels_linear_test {

struct Case {
  int n, k;
};

/// Random weights [n, k] as F32 and BF16 (the F32 copy holds the BF16 values
/// widened, so both dtypes can share one double reference).
struct Weights {
  std::vector<float> f32;        // [n, k]
  std::vector<std::uint16_t> bf16;  // [n, k]
  std::vector<float> bf16_wide;  // [n, k]
};

Weights make_weights(int n, int k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Weights w;
  w.f32.resize(static_cast<std::size_t>(n) * k);
  for (auto& v : w.f32) v = dist(rng);
  for (float v : w.f32) {
    w.bf16.push_back(f32_to_bf16(v));
    w.bf16_wide.push_back(bf16_to_f32(w.bf16.back()));
  }
  return w;
}

std::vector<float> make_x(int m, int stride, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m) * stride);
  for (auto& v : x) v = dist(rng);
  return x;
}

const void* wptr(const Weights& w, DType dt) {
  return dt == DType::f32 ? static_cast<const void*>(w.f32.data()) : w.bf16.data();
}

bool bit_equal(const float* a, const float* b, int n) {
  return std::memcmp(a, b, sizeof(float) * n) == 0;
}

/// Every instruction path this CPU runs (the portable one everywhere).
std::vector<LinearKernel> kernels() {
  std::vector<LinearKernel> out;
  for (const LinearKernel k :
       {LinearKernel::portable, LinearKernel::avx2, LinearKernel::avx512, LinearKernel::avx512_bf16})
    if (linear_kernel_supported(k)) out.push_back(k);
  return out;
}

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesDoubleReferenceAndNaiveBitExact) {
  for (const LinearKernel kernel : kernels()) {
    SCOPED_TRACE(linear_kernel_name(kernel));
    const DType dt = GetParam();
    std::mt19937 rng(7);
    for (const Case c : {Case{173, 70}, Case{512, 64}, Case{64, 1}, Case{1, 33}, Case{300, 257}}) {
      SCOPED_TRACE(testing::Message() << "n=" << c.n << " k=" << c.k);
      const Weights w = make_weights(c.n, c.k, rng);
      const std::vector<float>& wf = dt == DType::f32 ? w.f32 : w.bf16_wide;
      const int m = 13, xs = c.k + 5, ys = c.n + 3;
      const auto x = make_x(m, xs, rng);
      std::vector<float> bias(c.n);
      for (auto& b : bias) b = static_cast<float>(rng() % 100) / 50.0f - 1.0f;
      const auto packed = PackedLinear::pack(wptr(w, dt), dt, c.n, c.k);
      EXPECT_EQ(packed.out_features(), c.n);
      EXPECT_EQ(packed.in_features(), c.k);
      EXPECT_EQ(packed.dtype(), dt);

      std::vector<float> y(static_cast<std::size_t>(m) * ys, -7.0f), yr(y.size(), -7.0f);
      linear(x.data(), m, xs, packed, bias.data(), y.data(), ys, nullptr, kernel);
      linear_reference(x.data(), m, xs, wptr(w, dt), dt, c.n, c.k, bias.data(), yr.data(), ys);
      EXPECT_TRUE(bit_equal(y.data(), yr.data(), static_cast<int>(y.size())));
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double ref = bias[j], mag = std::fabs(bias[j]);
          for (int kk = 0; kk < c.k; ++kk) {
            // The BF16 path multiplies x rounded to BF16 (round to nearest even).
            const float xv = dt == DType::f32 ? x[i * xs + kk] : bf16_to_f32(f32_to_bf16(x[i * xs + kk]));
            const double p = static_cast<double>(xv) * wf[static_cast<std::size_t>(j) * c.k + kk];
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(y[i * ys + j], ref, 1e-6 * mag * c.k / 8 + 1e-6) << i << "," << j;
        }
        for (int j = c.n; j < ys; ++j) ASSERT_EQ(y[i * ys + j], -7.0f) << "padding written";
      }
    }
  }
}

TEST_P(LinearTest, BatchInvariantAcrossMAndThreads) {
  for (const LinearKernel kernel : kernels()) {
    SCOPED_TRACE(linear_kernel_name(kernel));
    const DType dt = GetParam();
    std::mt19937 rng(11);
    const int saved_threads = omp_get_max_threads();
    for (const Case c : {Case{173, 70}, Case{512, 64}, Case{2304, 768}}) {
      SCOPED_TRACE(testing::Message() << "n=" << c.n << " k=" << c.k);
      const Weights w = make_weights(c.n, c.k, rng);
      const auto packed = PackedLinear::pack(wptr(w, dt), dt, c.n, c.k);
      const int m = 64;
      const auto x = make_x(m, c.k, rng);
      std::vector<float> bias(c.n, 0.25f);
      const std::size_t sz = static_cast<std::size_t>(m) * c.n;

      omp_set_num_threads(2);
      std::vector<float> full(sz);
      linear(x.data(), m, c.k, packed, bias.data(), full.data(), c.n, nullptr, kernel);

      std::vector<float> single(sz), by7(sz), one_thread(sz);
      for (int i = 0; i < m; ++i)  // each row alone (m = 1)
        linear(x.data() + i * c.k, 1, c.k, packed, bias.data(), single.data() + i * c.n, c.n, nullptr, kernel);
      for (int i = 0; i < m; i += 7)  // chunks of 7 rows (last chunk 1)
        linear(x.data() + i * c.k, std::min(7, m - i), c.k, packed, bias.data(), by7.data() + i * c.n,
               c.n, nullptr, kernel);
      omp_set_num_threads(1);
      linear(x.data(), m, c.k, packed, bias.data(), one_thread.data(), c.n, nullptr, kernel);
      omp_set_num_threads(saved_threads);

      for (int i = 0; i < m; ++i) {
        ASSERT_TRUE(bit_equal(full.data() + i * c.n, single.data() + i * c.n, c.n)) << "m=1 row " << i;
        ASSERT_TRUE(bit_equal(full.data() + i * c.n, by7.data() + i * c.n, c.n)) << "m=7 row " << i;
        ASSERT_TRUE(bit_equal(full.data() + i * c.n, one_thread.data() + i * c.n, c.n))
            << "1 thread row " << i;
      }
    }
  }
}

// Every register-tile height (m = 1..13 covers each row count of a tile,
// alone and after full tiles) and every partial last panel shape (columns
// ending inside each 8- or 16-column group, in either half of a BF16 word),
// bit-exact against the naive reference; columns past n are never written.
TEST_P(LinearTest, EveryTileHeightAndColumnTailBitExact) {
  for (const LinearKernel kernel : kernels()) {
    SCOPED_TRACE(linear_kernel_name(kernel));
    const DType dt = GetParam();
    std::mt19937 rng(5);
    const int k = 37;
    for (const int n : {1, 8, 9, 20, 33, 45, 57, 64, 64 + 24, 128}) {
      const Weights w = make_weights(n, k, rng);
      const auto packed = PackedLinear::pack(wptr(w, dt), dt, n, k);
      std::vector<float> bias(n);
      for (auto& b : bias) b = static_cast<float>(rng() % 100) / 50.0f - 1.0f;
      for (int m = 1; m <= 13; ++m) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " m=" << m);
        const int xs = k + 3, ys = n + 2;
        const auto x = make_x(m, xs, rng);
        std::vector<float> y(static_cast<std::size_t>(m) * ys, -7.0f), yr(y.size(), -7.0f);
        linear(x.data(), m, xs, packed, m % 2 ? bias.data() : nullptr, y.data(), ys, nullptr, kernel);
        linear_reference(x.data(), m, xs, wptr(w, dt), dt, n, k, m % 2 ? bias.data() : nullptr,
                         yr.data(), ys);
        ASSERT_TRUE(bit_equal(y.data(), yr.data(), static_cast<int>(y.size())));
      }
    }
  }
}

TEST_P(LinearTest, NoBiasAndEmptyBatch) {
  for (const LinearKernel kernel : kernels()) {
    SCOPED_TRACE(linear_kernel_name(kernel));
    const DType dt = GetParam();
    std::mt19937 rng(3);
    const int n = 40, k = 19;
    const Weights w = make_weights(n, k, rng);
    const auto packed = PackedLinear::pack(wptr(w, dt), dt, n, k);
    const auto x = make_x(3, k, rng);
    std::vector<float> y(3 * n, 1.0f), yr(3 * n, 2.0f);
    linear(x.data(), 3, k, packed, nullptr, y.data(), n, nullptr, kernel);
    linear_reference(x.data(), 3, k, wptr(w, dt), dt, n, k, nullptr, yr.data(), n);
    EXPECT_TRUE(bit_equal(y.data(), yr.data(), 3 * n));

    std::vector<float> untouched(3 * n, 5.0f);
    linear(x.data(), 0, k, packed, nullptr, untouched.data(), n, nullptr, kernel);
    for (float v : untouched) EXPECT_EQ(v, 5.0f);
  }
}

TEST(LinearKernels, AutomaticIsTheBestPathThisCpuRuns) {
  const std::vector<LinearKernel> here = kernels();
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(here.front(), LinearKernel::portable) << "every CPU runs the portable path";
  EXPECT_TRUE(linear_kernel_supported(LinearKernel::automatic));
  // Without SHARDLINE_LINEAR_KERNEL in the environment, automatic is the
  // widest path here (kernels() lists them narrowest first).
  if (std::getenv("SHARDLINE_LINEAR_KERNEL") == nullptr)
    EXPECT_STREQ(linear_kernel_name(LinearKernel::automatic), linear_kernel_name(here.back()));
  std::printf("  linear() paths here:");
  for (const LinearKernel k : here) std::printf(" %s", linear_kernel_name(k));
  std::printf(" (automatic: %s)\n", linear_kernel_name(LinearKernel::automatic));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LinearPack, Bf16KeepsTwoBytesPerWeight) {
  std::vector<std::uint16_t> w(64 * 11, f32_to_bf16(1.0f));
  const auto p = PackedLinear::pack(w.data(), DType::bf16, 64, 10);
  EXPECT_EQ(p.bytes(), 64u * 10u * 2u);
  // An odd k is padded to whole pairs (VDPBF16PS reads k two at a time).
  EXPECT_EQ(PackedLinear::pack(w.data(), DType::bf16, 64, 11).bytes(), 64u * 12u * 2u);
  EXPECT_EQ(PackedLinear::packed_bytes(DType::bf16, 64, 11), 64u * 12u * 2u);
  EXPECT_THROW((void)PackedLinear::pack(w.data(), DType::f16, 64, 10), std::invalid_argument);
}

// The BF16 path's chain, written out by hand for one element: x rounded to
// BF16, pairs in order, the odd element's product added before the even
// one's, each sum rounded to F32; denormal inputs read as zero and denormal
// sums flush to zero (VDPBF16PS). Each expected value is computed here in
// double from the rule, independent of linear_reference.
TEST(LinearBf16, PairOrderRoundingAndDenormalsFollowVdpbf16ps) {
  auto bits = [](float v) { return f32_to_bf16(v); };
  auto run = [&](const std::vector<float>& x, const std::vector<std::uint16_t>& w) {
    const int k = static_cast<int>(x.size());
    const auto p = PackedLinear::pack(w.data(), DType::bf16, 1, k);
    float yr = -7.0f;
    linear_reference(x.data(), 1, k, w.data(), DType::bf16, 1, k, nullptr, &yr, 1);
    for (const LinearKernel kernel : kernels()) {  // VDPBF16PS itself where the CPU has it
      float y = -7.0f;
      linear(x.data(), 1, k, p, nullptr, &y, 1, nullptr, kernel);
      EXPECT_EQ(std::memcmp(&y, &yr, 4), 0) << linear_kernel_name(kernel) << ": " << y << " vs reference " << yr;
    }
    return yr;
  };
  const std::uint16_t one = bits(1.0f);
  // Order: odd element first. With x = (1, 1, 1.5 * 2^-23, 2^-23): pair 0
  // gives 2; pair 1 adds 2^-23 (a tie at 2: stays 2), then 1.5 * 2^-23
  // (rounds up to 2 + 2^-22). Left to right, 2 + 1.5 * 2^-23 -> 2 + 2^-22,
  // then + 2^-23 ties up to 2 + 2^-21.
  const float x_order[] = {1.0f, 1.0f, 1.5f * std::ldexp(1.0f, -23), std::ldexp(1.0f, -23)};
  EXPECT_EQ(run({x_order, x_order + 4}, {one, one, one, one}), 2.0f + std::ldexp(1.0f, -22));
  // x is rounded to BF16 (8 significant bits), to nearest even: 1 + 2^-8 is
  // a tie that stays 1; 1 + 3 * 2^-8 is a tie that goes up to 1 + 2^-6.
  EXPECT_EQ(run({1.0f + std::ldexp(1.0f, -8), 0.0f}, {one, bits(0.0f)}), 1.0f);
  EXPECT_EQ(run({1.0f + 3 * std::ldexp(1.0f, -8), 0.0f}, {one, bits(0.0f)}),
            1.0f + std::ldexp(1.0f, -6));
  // An odd k: the last pair's odd element is zero padding.
  EXPECT_EQ(run({1.0f, 2.0f, 4.0f}, {one, one, one}), 7.0f);
  // Denormals. A denormal BF16 weight reads as zero (else 1e30 * 2^-133 ~ 1e-10).
  EXPECT_EQ(run({1e30f, 0.0f}, {std::uint16_t{0x0001}, bits(0.0f)}), 0.0f);
  // A denormal x rounds to zero.
  EXPECT_EQ(run({std::ldexp(1.0f, -130), 0.0f}, {one, bits(0.0f)}), 0.0f);
  // A denormal sum flushes to zero: pair 0 leaves a = 1.5 * 2^-126; pair 1's
  // odd product -b (b = 2^-126) gives a - b = 2^-127, denormal: 0; then + b
  // gives b (without the flush: 2^-127 + b = a).
  const float a = 1.5f * std::ldexp(1.0f, -126), b = std::ldexp(1.0f, -126);
  EXPECT_EQ(run({1.0f, 0.0f, 1.0f, -1.0f}, {bits(a), bits(0.0f), bits(b), bits(b)}), b);
}

}  // namespace
}  // namespace shardline::kernels::cpu
