#include "kernels/cpu/linear.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace shardline::kernels::cpu {
namespace {

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

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesDoubleReferenceAndNaiveBitExact) {
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
    linear(x.data(), m, xs, packed, bias.data(), y.data(), ys);
    linear_reference(x.data(), m, xs, wptr(w, dt), dt, c.n, c.k, bias.data(), yr.data(), ys);
    EXPECT_TRUE(bit_equal(y.data(), yr.data(), static_cast<int>(y.size())));
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        double ref = bias[j], mag = std::fabs(bias[j]);
        for (int kk = 0; kk < c.k; ++kk) {
          const double p = static_cast<double>(x[i * xs + kk]) * wf[static_cast<std::size_t>(j) * c.k + kk];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[i * ys + j], ref, 1e-6 * mag * c.k / 8 + 1e-6) << i << "," << j;
      }
      for (int j = c.n; j < ys; ++j) ASSERT_EQ(y[i * ys + j], -7.0f) << "padding written";
    }
  }
}

TEST_P(LinearTest, BatchInvariantAcrossMAndThreads) {
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
    linear(x.data(), m, c.k, packed, bias.data(), full.data(), c.n);

    std::vector<float> single(sz), by7(sz), one_thread(sz);
    for (int i = 0; i < m; ++i)  // each row alone (m = 1)
      linear(x.data() + i * c.k, 1, c.k, packed, bias.data(), single.data() + i * c.n, c.n);
    for (int i = 0; i < m; i += 7)  // chunks of 7 rows (last chunk 1)
      linear(x.data() + i * c.k, std::min(7, m - i), c.k, packed, bias.data(), by7.data() + i * c.n,
             c.n);
    omp_set_num_threads(1);
    linear(x.data(), m, c.k, packed, bias.data(), one_thread.data(), c.n);
    omp_set_num_threads(saved_threads);

    for (int i = 0; i < m; ++i) {
      ASSERT_TRUE(bit_equal(full.data() + i * c.n, single.data() + i * c.n, c.n)) << "m=1 row " << i;
      ASSERT_TRUE(bit_equal(full.data() + i * c.n, by7.data() + i * c.n, c.n)) << "m=7 row " << i;
      ASSERT_TRUE(bit_equal(full.data() + i * c.n, one_thread.data() + i * c.n, c.n))
          << "1 thread row " << i;
    }
  }
}

// Every register-tile height (m = 1..13 covers each row count of a tile,
// alone and after full tiles) and every partial last panel shape (columns
// ending inside each 8- or 16-column group, in either half of a BF16 word),
// bit-exact against the naive reference; columns past n are never written.
TEST_P(LinearTest, EveryTileHeightAndColumnTailBitExact) {
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
      linear(x.data(), m, xs, packed, m % 2 ? bias.data() : nullptr, y.data(), ys);
      linear_reference(x.data(), m, xs, wptr(w, dt), dt, n, k, m % 2 ? bias.data() : nullptr,
                       yr.data(), ys);
      ASSERT_TRUE(bit_equal(y.data(), yr.data(), static_cast<int>(y.size())));
    }
  }
}

TEST_P(LinearTest, NoBiasAndEmptyBatch) {
  const DType dt = GetParam();
  std::mt19937 rng(3);
  const int n = 40, k = 19;
  const Weights w = make_weights(n, k, rng);
  const auto packed = PackedLinear::pack(wptr(w, dt), dt, n, k);
  const auto x = make_x(3, k, rng);
  std::vector<float> y(3 * n, 1.0f), yr(3 * n, 2.0f);
  linear(x.data(), 3, k, packed, nullptr, y.data(), n);
  linear_reference(x.data(), 3, k, wptr(w, dt), dt, n, k, nullptr, yr.data(), n);
  EXPECT_TRUE(bit_equal(y.data(), yr.data(), 3 * n));

  std::vector<float> untouched(3 * n, 5.0f);
  linear(x.data(), 0, k, packed, nullptr, untouched.data(), n);
  for (float v : untouched) EXPECT_EQ(v, 5.0f);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LinearPack, Bf16KeepsTwoBytesPerWeight) {
  std::vector<std::uint16_t> w(64 * 10, f32_to_bf16(1.0f));
  const auto p = PackedLinear::pack(w.data(), DType::bf16, 64, 10);
  EXPECT_EQ(p.bytes(), 64u * 10u * 2u);
  EXPECT_THROW((void)PackedLinear::pack(w.data(), DType::f16, 64, 10), std::invalid_argument);
}

}  // namespace
}  // namespace shardline::kernels::cpu
