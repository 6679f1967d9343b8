#include "kernels/cpu/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "tests/kernels/simd_order_reference.hpp"

namespace shardline::kernels::cpu {
namespace kernels_ops_test {

std::vector<float> randn(std::size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(Embedding, F32AndBf16Rows) {
  std::mt19937 rng(1);
  const int vocab = 11, hidden = 37;
  const auto table = randn(static_cast<std::size_t>(vocab) * hidden, rng);
  std::vector<std::uint16_t> table_bf16;
  for (float v : table) table_bf16.push_back(f32_to_bf16(v));
  const std::int32_t ids[] = {3, 0, 10, 3};
  std::vector<float> out(4 * hidden), out_bf16(4 * hidden);
  embedding(ids, 4, table.data(), DType::f32, hidden, out.data());
  embedding(ids, 4, table_bf16.data(), DType::bf16, hidden, out_bf16.data());
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < hidden; ++i) {
      const std::size_t src = static_cast<std::size_t>(ids[t]) * hidden + i;
      ASSERT_EQ(out[t * hidden + i], table[src]);
      ASSERT_EQ(out_bf16[t * hidden + i], bf16_to_f32(table_bf16[src]));
    }
}

/// Every path of the row ops this CPU can run (the SIMD ones are compiled
/// whatever the build machine and chosen at run time).
std::vector<OpsKernel> runnable_ops_kernels() {
  std::vector<OpsKernel> out;
  for (OpsKernel k : {OpsKernel::portable, OpsKernel::avx2, OpsKernel::avx512})
    if (ops_kernel_supported(k)) out.push_back(k);
  return out;
}

double rms_ref(const float* x, int dim, double eps) {
  double ss = 0;
  for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  return 1.0 / std::sqrt(ss / dim + eps);
}

TEST(RmsNorm, MatchesDoubleWithStridesAndInPlace) {
  std::mt19937 rng(2);
  for (const OpsKernel kernel : runnable_ops_kernels()) {
    for (int dim : {8, 64, 77, 768}) {
      SCOPED_TRACE(ops_kernel_name(kernel));
      const int rows = 5, xs = dim + 3, ys = dim + 1;
      const auto x = randn(static_cast<std::size_t>(rows) * xs, rng, 3.0f);
      const auto w = randn(dim, rng);
      std::vector<float> y(static_cast<std::size_t>(rows) * ys, 0.0f);
      rms_norm(x.data(), xs, w.data(), y.data(), ys, rows, dim, 1e-5f, kernel);
      auto inplace = x;
      rms_norm(inplace.data(), xs, w.data(), inplace.data(), xs, rows, dim, 1e-5f, kernel);
      for (int r = 0; r < rows; ++r) {
        const double s = rms_ref(&x[r * xs], dim, 1e-5);
        for (int i = 0; i < dim; ++i) {
          const double ref = x[r * xs + i] * s * w[i];
          ASSERT_NEAR(y[r * ys + i], ref, 1e-5 * std::fabs(ref) + 1e-6) << dim << " " << r << " " << i;
          ASSERT_EQ(inplace[r * xs + i], y[r * ys + i]);
        }
      }
    }
  }
}

TEST(RmsNorm, RowResultIndependentOfBatch) {
  std::mt19937 rng(3);
  const int dim = 771, rows = 33;
  const auto x = randn(static_cast<std::size_t>(rows) * dim, rng);
  const auto w = randn(dim, rng);
  std::vector<float> all(x.size()), alone(dim);
  rms_norm(x.data(), dim, w.data(), all.data(), dim, rows, dim, 1e-6f);
  for (int r = 0; r < rows; ++r) {
    rms_norm(&x[r * dim], dim, w.data(), alone.data(), dim, 1, dim, 1e-6f);
    ASSERT_EQ(std::memcmp(alone.data(), &all[r * dim], sizeof(float) * dim), 0) << r;
  }
}

TEST(AddRmsNorm, UpdatesResidualAndNormalises) {
  std::mt19937 rng(4);
  const int rows = 3, dim = 100;
  auto residual = randn(rows * dim, rng);
  const auto x = randn(rows * dim, rng);
  const auto w = randn(dim, rng);
  const auto res0 = residual;
  for (const OpsKernel kernel : runnable_ops_kernels()) {
    SCOPED_TRACE(ops_kernel_name(kernel));
    residual = res0;
    std::vector<float> y(rows * dim);
    add_rms_norm(residual.data(), x.data(), w.data(), y.data(), rows, dim, 1e-5f, kernel);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> sum(dim);
      for (int i = 0; i < dim; ++i) {
        sum[i] = res0[r * dim + i] + x[r * dim + i];
        ASSERT_EQ(residual[r * dim + i], sum[i]);
      }
      const double s = rms_ref(sum.data(), dim, 1e-5);
      for (int i = 0; i < dim; ++i)
        ASSERT_NEAR(y[r * dim + i], sum[i] * s * w[i], 1e-5 * std::fabs(sum[i] * s * w[i]) + 1e-6);
    }
  }
}

TEST(AddInplace, Adds) {
  std::vector<float> a{1, 2, 3}, b{0.5f, -2, 4};
  add_inplace(a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{1.5f, 0, 7}));
}

TEST(SiluAndMul, MatchesDouble) {
  std::mt19937 rng(5);
  const int rows = 4, inter = 83;
  auto gu = randn(static_cast<std::size_t>(rows) * 2 * inter, rng, 4.0f);
  gu[0] = -100.0f;  // saturated tails
  gu[1] = 100.0f;
  for (const OpsKernel kernel : runnable_ops_kernels()) {
    SCOPED_TRACE(ops_kernel_name(kernel));
    std::vector<float> out(rows * inter);
    silu_and_mul(gu.data(), out.data(), rows, inter, kernel);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < inter; ++j) {
        const double g = gu[r * 2 * inter + j], u = gu[r * 2 * inter + inter + j];
        const double ref = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(out[r * inter + j], ref, 2e-6 * std::fabs(ref) + 1e-30) << r << " " << j;
      }
  }
}

/// The SIMD paths this CPU can run: both follow the order below, bit for bit.
std::vector<OpsKernel> simd_ops_kernels() {
  std::vector<OpsKernel> out;
  for (OpsKernel k : {OpsKernel::avx2, OpsKernel::avx512})
    if (ops_kernel_supported(k)) out.push_back(k);
  return out;
}

// The AVX-512 and AVX2 paths give the same bits: both must match the scalar
// emulation of their order (16 lane chains over the full 16-blocks, the
// lanes reduced like _mm512_reduce_add_ps, the tail in order; SiLU with
// exp16 on the 16-blocks, std::exp on the tail).
TEST(RowOps, RmsNormAndSiluMatchSimdOrderBitExact) {
  if (simd_ops_kernels().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512: no SIMD path to check";
  for (const OpsKernel kernel : simd_ops_kernels()) {
    SCOPED_TRACE(ops_kernel_name(kernel));
    std::mt19937 rng(8);
    const int rows = 64;  // a last-bit change in one sum rarely survives sqrt and 1/x: many rows
    for (int dim : {8, 16, 32, 77, 768}) {
      const auto x = randn(static_cast<std::size_t>(rows) * dim, rng, 3.0f), w = randn(dim, rng);
      std::vector<float> y(x.size());
      rms_norm(x.data(), dim, w.data(), y.data(), dim, rows, dim, 1e-5f, kernel);
      for (int r = 0; r < rows; ++r) {
        const float* xr = &x[static_cast<std::size_t>(r) * dim];
        float lane[16] = {};
        int i = 0;
        for (; i + 16 <= dim; i += 16)
          for (int l = 0; l < 16; ++l) lane[l] = std::fma(xr[i + l], xr[i + l], lane[l]);
        float ss = i ? testing_order::reduce16(lane, [](float a, float b) { return a + b; }) : 0.0f;
        for (; i < dim; ++i) ss = std::fma(xr[i], xr[i], ss);
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + 1e-5f);
        for (int c = 0; c < dim; ++c) {
          const float ref = (xr[c] * inv) * w[c];
          ASSERT_EQ(std::memcmp(&y[static_cast<std::size_t>(r) * dim + c], &ref, sizeof(float)), 0)
              << dim << " " << r << " " << c;
        }
      }
    }
    for (int inter : {8, 32, 40, 83}) {
      const auto gu = randn(static_cast<std::size_t>(rows) * 2 * inter, rng, 4.0f);
      std::vector<float> out(static_cast<std::size_t>(rows) * inter);
      silu_and_mul(gu.data(), out.data(), rows, inter, kernel);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < inter; ++j) {
          const float g = gu[static_cast<std::size_t>(r) * 2 * inter + j];
          const float u = gu[static_cast<std::size_t>(r) * 2 * inter + inter + j];
          const float e = j < inter / 16 * 16 ? testing_order::exp_lane(0.0f - g) : std::exp(-g);
          const float ref = g / (1.0f + e) * u;
          ASSERT_EQ(std::memcmp(&out[static_cast<std::size_t>(r) * inter + j], &ref, sizeof(float)), 0)
              << inter << " " << r << " " << j;
        }
    }
  }
}

TEST(RopeInvFreq, PlainMatchesFormula) {
  RopeParams p;
  p.head_dim = 64;
  p.theta = 10000.0f;
  const auto inv = rope_inv_freq(p);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double ref = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    EXPECT_NEAR(inv[i], ref, 1e-6 * ref) << i;
  }
}

TEST(RopeInvFreq, Llama31Scaling) {
  RopeParams p;
  p.head_dim = 128;
  p.theta = 500000.0f;
  p.llama3_scaling = true;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_max_position_embeddings = 8192;
  const auto inv = rope_inv_freq(p);
  ASSERT_EQ(inv.size(), 64u);
  // Hand-computed (double) from HF _compute_llama3_parameters:
  // high-frequency band (wavelen < 2048) unchanged, low band (> 8192) / 8,
  // medium band (i = 30, wavelen 2948) smoothly interpolated.
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {20, 0.016560440080994446},
                                             {25, 0.005940730375674967},
                                             {30, 0.0013718935677611381},
                                             {35, 9.556212353964683e-05},
                                             {40, 3.428102195952591e-05},
                                             {63, 3.068925988914511e-07}};
  for (auto [i, ref] : expected) EXPECT_NEAR(inv[i], ref, 2e-6 * ref) << i;
  // Every index against the closed form.
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128), wl = 2 * std::numbers::pi / f;
    double ref = f;
    if (wl > 8192) ref = f / 8;
    else if (wl >= 2048) {
      const double s = (8192 / wl - 1) / 3;
      ref = (1 - s) * f / 8 + s * f;
    }
    EXPECT_NEAR(inv[i], ref, 2e-6 * ref) << i;
  }
}

TEST(Rope, RotateHalfMatchesDirectFormula) {
  std::mt19937 rng(6);
  const int tokens = 5, heads = 3, d = 64, stride = heads * d + 10;
  RopeParams p;
  p.head_dim = d;
  const auto inv = rope_inv_freq(p);
  const std::int32_t pos[] = {0, 1, 17, 1000, 8191};
  auto x = randn(static_cast<std::size_t>(tokens) * stride, rng);
  const auto x0 = x;
  rope(x.data(), tokens, stride, heads, d, pos, inv.data());
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv[i];
        const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
        const double a = x0[t * stride + h * d + i], b = x0[t * stride + h * d + i + d / 2];
        ASSERT_NEAR(x[t * stride + h * d + i], a * c - b * s, 1e-5) << t << " " << h << " " << i;
        ASSERT_NEAR(x[t * stride + h * d + i + d / 2], b * c + a * s, 1e-5);
      }
    for (int i = heads * d; i < stride; ++i) ASSERT_EQ(x[t * stride + i], x0[t * stride + i]);
  }
}

// RoPE's bits do not depend on the build machine: each product is rounded
// before the sum, as Hugging Face's x * cos + rotate_half(x) * sin (two
// torch multiplies, then an add), never fused into an FMA (ops.cpp is
// compiled with -ffp-contract=off, kernels/CMakeLists.txt). The reference
// rounds each product through a volatile float, which no compiler may fuse;
// cos and sin are the same libm calls on the same float angle. The
// products are chosen so that fusing them would show: with one rounding
// fewer, a * c - b * s differs in its last bits for many of these inputs.
TEST(Rope, EachProductIsRoundedBeforeTheSumBitForBit) {
  std::mt19937 rng(7);
  const int tokens = 6, heads = 2, d = 128, stride = heads * d;
  RopeParams p;
  p.head_dim = d;
  p.theta = 500000.0f;
  const auto inv = rope_inv_freq(p);
  const std::int32_t pos[] = {0, 3, 255, 4097, 30000, 131071};
  auto x = randn(static_cast<std::size_t>(tokens) * stride, rng);
  const auto x0 = x;
  rope(x.data(), tokens, stride, heads, d, pos, inv.data());
  int fused_would_differ = 0;
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv[i];
        const float c = std::cos(angle), s = std::sin(angle);
        const float a = x0[t * stride + h * d + i], b = x0[t * stride + h * d + i + d / 2];
        volatile float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        const float want1 = ac - bs, want2 = bc + as;
        ASSERT_EQ(x[t * stride + h * d + i], want1) << t << " " << h << " " << i;
        ASSERT_EQ(x[t * stride + h * d + i + d / 2], want2) << t << " " << h << " " << i;
        if (std::fma(a, c, -static_cast<float>(bs)) != want1) ++fused_would_differ;
      }
  // The check can fail: a fused product changes about a fifth of these
  // (166 of 768 measured).
  EXPECT_GT(fused_would_differ, tokens * heads * d / 16);
}

}  // namespace
}  // namespace shardline::kernels::cpu
