// cuda::GemmContext::linear, cast_f32 and the roofline probes (label gpu) on
// random inputs against a double-accumulation reference. Without a device
// every test that needs one skips; the host-side argument checks (no CUDA
// call) run everywhere.
//
// Tolerances (max |gpu - ref| / max |ref| over the m x n outputs):
//  - F32 weights: 1e-5 in both modes (true FP32, no TF32) against x · w^T in
//    double;
//  - BF16 / F16 weights: 1e-3 in both modes against the double product of
//    the *cast* inputs (x rounded to the weight dtype on the host exactly as
//    cast_f32 does, the weights as stored), so only the FP32 accumulation
//    is measured -- an error from the cast itself would show up far above it.
// batch_invariant mode must give bit-identical rows whatever the batch, and
// every mode the same bits run after run and when replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/roofline.hpp"
#include "tests/kernels/cuda/gpu_test_util.hpp"

namespace shardline::kernels::cuda {
namespace {

using gpu_test::download;
using gpu_test::normalized_error;
using gpu_test::upload;

constexpr double kF32Tol = 1e-5;
constexpr double kLowpTol = 1e-3;
constexpr int kMaxRows = 512;
constexpr int kMaxK = 1024;

#define ASSERT_STATUS_OK(expr)                        \
  do {                                                \
    const Status st_ = (expr);                        \
    ASSERT_TRUE(st_.ok()) << st_.error().to_string(); \
  } while (0)

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

/// F32 -> IEEE half bits, round to nearest even (what __float2half_rn does
/// for every non-NaN input); NaN -> a quiet NaN (compare NaN-ness only).
std::uint16_t host_f32_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65536 (and inf)
  if (a < 0x38800000u) {  // below 2^-14: a half subnormal (or zero)
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25
    const std::uint32_t e = a >> 23;                                 // 102 .. 112
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // h = mant * 2^(e - 126)
    std::uint32_t q = mant >> shift;
    const std::uint32_t r = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (r > half || (r == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t q = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
  const std::uint32_t r = a & 0x1fffu;
  if (r > 0x1000u || (r == 0x1000u && (q & 1u))) ++q;  // may carry up to 0x7c00 (inf)
  return static_cast<std::uint16_t>(sign | q);
}

/// `v` rounded to `dtype` and widened back (the value the GEMM multiplies).
float round_to(float v, DType dtype) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(host_f32_to_f16(v));
    case DType::f32: break;
  }
  return v;
}

/// Weights [n, k] of `dtype`: the device bytes and the values they hold.
struct Weights {
  DeviceBuffer dev;
  std::vector<float> values;  ///< widened, [n, k]
};

Weights make_weights(DType dtype, int n, int k, std::uint32_t seed) {
  Weights w;
  const std::vector<float> f = random_floats(static_cast<std::size_t>(n) * k, seed);
  w.values.resize(f.size());
  if (dtype == DType::f32) {
    w.values = f;
    w.dev = upload(f);
    return w;
  }
  std::vector<std::uint16_t> bits(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    bits[i] = dtype == DType::bf16 ? f32_to_bf16(f[i]) : host_f32_to_f16(f[i]);
    w.values[i] = dtype == DType::bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  }
  w.dev = upload(bits);
  return w;
}

struct Shape {
  int m, n, k;
  int x_stride, y_stride;  // 0: dense (k, n)
  bool accumulate;
};

std::string describe(const Shape& s, DType dtype, GemmMode mode) {
  return std::string(dtype_name(dtype)) + " " + gemm_mode_name(mode) + " m " + std::to_string(s.m) +
         " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " x_stride " +
         std::to_string(s.x_stride) + " y_stride " + std::to_string(s.y_stride) +
         (s.accumulate ? " accumulate" : "");
}

/// The m x n block of a row-major [rows, stride] matrix, compacted.
std::vector<float> block(const std::vector<float>& y, int m, int n, int stride) {
  std::vector<float> out(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    std::copy_n(y.begin() + static_cast<long>(i) * stride, n, out.begin() + static_cast<long>(i) * n);
  return out;
}

/// y = x_eff · w^T (+ y0) in double, x_eff = x rounded to `dtype`; [m, n] dense.
std::vector<float> reference(const std::vector<float>& x, int x_stride, const Weights& w, DType dtype,
                             const Shape& s, const std::vector<float>& y0, int y_stride) {
  std::vector<float> out(static_cast<std::size_t>(s.m) * s.n);
  std::vector<double> xr(static_cast<std::size_t>(s.k));
  for (int i = 0; i < s.m; ++i) {
    for (int q = 0; q < s.k; ++q) xr[q] = round_to(x[static_cast<long>(i) * x_stride + q], dtype);
    for (int j = 0; j < s.n; ++j) {
      double acc = s.accumulate ? y0[static_cast<long>(i) * y_stride + j] : 0.0;
      const float* wr = &w.values[static_cast<long>(j) * s.k];
      for (int q = 0; q < s.k; ++q) acc += xr[q] * wr[q];
      out[static_cast<long>(i) * s.n + j] = static_cast<float>(acc);
    }
  }
  return out;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  std::size_t first = a.size(), count = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first == a.size()) first = i;
      ++count;
    }
  EXPECT_EQ(count, 0u) << what << ": " << count << " elements differ, first at " << first;
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceQuery q = query_devices();
    if (q.devices.empty()) GTEST_SKIP() << "no CUDA device: " << q.error;
    Result<std::unique_ptr<GemmContext>> c = GemmContext::create(kMaxRows, kMaxK);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    ctx_ = std::move(c).value();
  }

  /// Runs one shape in one mode against the reference; also checks that the
  /// y columns past n (stride padding) are untouched.
  void check_shape(DType dtype, GemmMode mode, const Shape& s, double tol) {
    const std::string what = describe(s, dtype, mode);
    const int xs = s.x_stride > 0 ? s.x_stride : s.k;
    const int ys = s.y_stride > 0 ? s.y_stride : s.n;
    const std::vector<float> x = random_floats(static_cast<std::size_t>(std::max(s.m, 1)) * xs, 11);
    const std::vector<float> y0 =
        random_floats(static_cast<std::size_t>(std::max(s.m, 1)) * ys, 12, -4.0f, 4.0f);
    const Weights w = make_weights(dtype, s.n, s.k, 13);
    DeviceBuffer dx = upload(x);
    DeviceBuffer dy = upload(y0);
    ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), xs, s.m, s.k, w.dev.data(), dtype, s.n,
                                  dy.as<float>(), ys, s.accumulate, mode, nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    const std::vector<float> y = download<float>(dy);
    if (s.m == 0) {
      expect_bits_equal(y, y0, what + " (m == 0 writes nothing)");
      return;
    }
    const std::vector<float> ref = reference(x, xs, w, dtype, s, y0, ys);
    const double err = normalized_error(block(y, s.m, s.n, ys), ref);
    EXPECT_LE(err, tol) << what;
    std::vector<float> pad_gpu, pad_ref;
    for (int i = 0; i < s.m; ++i)
      for (int j = s.n; j < ys; ++j) {
        pad_gpu.push_back(y[static_cast<long>(i) * ys + j]);
        pad_ref.push_back(y0[static_cast<long>(i) * ys + j]);
      }
    expect_bits_equal(pad_gpu, pad_ref, what + " (stride padding)");
  }

  void check_all_shapes(DType dtype, double tol) {
    const Shape shapes[] = {
        {0, 64, 64, 0, 0, false},       {1, 1, 1, 0, 0, false},       {1, 64, 64, 0, 0, false},
        {3, 129, 77, 0, 0, false},      {3, 129, 77, 80, 140, true},  {1, 4096, 256, 0, 0, false},
        {70, 200, 264, 300, 211, true}, {65, 64, 128, 0, 0, false},   {130, 65, 8, 9, 70, true},
        {256, 128, 512, 0, 0, false},   {5, 300, 1000, 1001, 0, false},
    };
    for (const GemmMode mode : {GemmMode::fast, GemmMode::batch_invariant})
      for (const Shape& s : shapes) check_shape(dtype, mode, s, tol);
  }

  std::unique_ptr<GemmContext> ctx_;
};

// ---- host-side checks (no device needed) ---------------------------------------

TEST(CudaGemmArgs, RejectedBeforeAnyCudaCall) {
  // None of these paths makes a CUDA call, so they hold with or without a GPU.
  EXPECT_EQ(GemmContext::create(-1, 16).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(GemmContext::create(16, -1).error().code, ErrorCode::invalid_argument);
  float dummy = 0.0f;
  EXPECT_EQ(cast_f32(&dummy, -1, DType::bf16, &dummy, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(cast_f32(nullptr, 4, DType::bf16, &dummy, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(cast_f32(&dummy, 4, static_cast<DType>(9), &dummy, nullptr).error().code,
            ErrorCode::unsupported);
  EXPECT_TRUE(cast_f32(nullptr, 0, DType::f16, nullptr, nullptr).ok());
  EXPECT_EQ(measure_d2d_bandwidth_gbs(0, 3).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(measure_d2d_bandwidth_gbs(1024, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(measure_gemm_tflops(DType::bf16, 0, 8, 8, 3).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(measure_gemm_tflops(static_cast<DType>(9), 8, 8, 8, 3).error().code,
            ErrorCode::unsupported);
}

// ---- numerics ------------------------------------------------------------------

TEST_F(CudaGemm, F32WeightsMatchReferenceInBothModes) { check_all_shapes(DType::f32, kF32Tol); }

TEST_F(CudaGemm, Bf16WeightsMatchCastReferenceInBothModes) {
  check_all_shapes(DType::bf16, kLowpTol);
}

TEST_F(CudaGemm, F16WeightsMatchCastReferenceInBothModes) { check_all_shapes(DType::f16, kLowpTol); }

TEST_F(CudaGemm, UnalignedWeightsUseTheScalarPath) {
  // w at an odd element offset (2-byte aligned): the invariant kernel's
  // 16-byte loads must not be used, and fast mode must get a cuBLASLt
  // algorithm allowing it (or fall back to the invariant kernel).
  const int m = 9, n = 70, k = 136;
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Weights w = make_weights(dtype, n + 1, k, 21);  // one spare row for the offset
    const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * k, 22);
    DeviceBuffer dx = upload(x);
    DeviceBuffer dy = upload(std::vector<float>(static_cast<std::size_t>(m) * n, 0.0f));
    const auto* wp = static_cast<const std::uint16_t*>(w.dev.data()) + 1;
    Weights shifted;
    shifted.values.assign(w.values.begin() + 1, w.values.begin() + 1 + static_cast<long>(n) * k);
    const Shape s{m, n, k, 0, 0, false};
    const std::vector<float> ref = reference(x, k, shifted, dtype, s, {}, n);
    for (const GemmMode mode : {GemmMode::fast, GemmMode::batch_invariant}) {
      ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), k, m, k, wp, dtype, n, dy.as<float>(), n, false,
                                    mode, nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      EXPECT_LE(normalized_error(download<float>(dy), ref), kLowpTol) << describe(s, dtype, mode);
    }
  }
}

TEST_F(CudaGemm, ZeroRowsLaunchNothing) {
  for (const GemmMode mode : {GemmMode::fast, GemmMode::batch_invariant})
    for (const DType dtype : {DType::f32, DType::bf16})
      EXPECT_TRUE(ctx_->linear(nullptr, 0, 0, 0, nullptr, dtype, 0, nullptr, 0, false, mode, nullptr).ok());
}

TEST_F(CudaGemm, FastAndInvariantModesSeeTheSameInputs) {
  // Both modes multiply the same cast x and weights with FP32 accumulation:
  // they differ only by the summation order (far below the cast's 2^-9).
  const int m = 33, n = 160, k = 512;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * k, 31);
  DeviceBuffer dx = upload(x);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Weights w = make_weights(dtype, n, k, 32);
    std::vector<float> out[2];
    for (int i = 0; i < 2; ++i) {
      DeviceBuffer dy = upload(std::vector<float>(static_cast<std::size_t>(m) * n, 0.0f));
      ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), k, m, k, w.dev.data(), dtype, n, dy.as<float>(),
                                    n, false, i == 0 ? GemmMode::fast : GemmMode::batch_invariant,
                                    nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      out[i] = download<float>(dy);
    }
    EXPECT_LE(normalized_error(out[1], out[0]), 1e-5) << dtype_name(dtype);
  }
}

// ---- batch invariance and determinism ---------------------------------------------

TEST_F(CudaGemm, BatchInvariantRowsAreBitIdenticalWhateverTheBatch) {
  const int big = 256, n = 200;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const int k : {77, 264}) {  // the 2-byte and the 16-byte load paths
      const std::string what = std::string(dtype_name(dtype)) + " k " + std::to_string(k);
      const std::vector<float> x = random_floats(static_cast<std::size_t>(big) * k, 41);
      const Weights w = make_weights(dtype, n, k, 42);
      DeviceBuffer dx = upload(x);
      DeviceBuffer dfull = upload(std::vector<float>(static_cast<std::size_t>(big) * n, 0.0f));
      ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), k, big, k, w.dev.data(), dtype, n,
                                    dfull.as<float>(), n, false, GemmMode::batch_invariant, nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      const std::vector<float> full = download<float>(dfull);
      DeviceBuffer dsmall = upload(std::vector<float>(static_cast<std::size_t>(7) * n, 0.0f));
      for (const int row : {0, 1, 6, 63, 64, 100, 200, 255}) {
        const std::vector<float> want(full.begin() + static_cast<long>(row) * n,
                                      full.begin() + static_cast<long>(row + 1) * n);
        // m = 1, then m = 7 with the row at positions 0, 3 and 6 of the batch.
        std::vector<int> starts = {row};
        for (const int pos : {0, 3, 6})
          if (row - pos >= 0 && row - pos + 7 <= big) starts.push_back(row - pos);
        for (std::size_t t = 0; t < starts.size(); ++t) {
          const int m = t == 0 ? 1 : 7, start = starts[t];
          ASSERT_STATUS_OK(ctx_->linear(dx.as<float>() + static_cast<long>(start) * k, k, m, k,
                                        w.dev.data(), dtype, n, dsmall.as<float>(), n, false,
                                        GemmMode::batch_invariant, nullptr));
          ASSERT_STATUS_OK(synchronize(nullptr));
          const std::vector<float> got = download<float>(dsmall);
          const std::vector<float> row_got(got.begin() + static_cast<long>(row - start) * n,
                                           got.begin() + static_cast<long>(row - start + 1) * n);
          expect_bits_equal(row_got, want,
                            what + " row " + std::to_string(row) + " in a batch of " +
                                std::to_string(m) + " at position " + std::to_string(row - start));
        }
      }
    }
}

TEST_F(CudaGemm, RunToRunDeterministicInBothModes) {
  const int m = 256, n = 384, k = 1000;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * k, 51);
  DeviceBuffer dx = upload(x);
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const GemmMode mode : {GemmMode::fast, GemmMode::batch_invariant}) {
      const Weights w = make_weights(dtype, n, k, 52);
      std::vector<float> first;
      for (int run = 0; run < 3; ++run) {
        DeviceBuffer dy = upload(std::vector<float>(static_cast<std::size_t>(m) * n, 0.0f));
        ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), k, m, k, w.dev.data(), dtype, n,
                                      dy.as<float>(), n, false, mode, nullptr));
        ASSERT_STATUS_OK(synchronize(nullptr));
        std::vector<float> y = download<float>(dy);
        if (run == 0)
          first = std::move(y);
        else
          expect_bits_equal(y, first, std::string(dtype_name(dtype)) + " " + gemm_mode_name(mode) +
                                          " run " + std::to_string(run));
      }
    }
}

// ---- errors --------------------------------------------------------------------------

TEST_F(CudaGemm, ErrorsComeBackWithoutLaunching) {
  Result<std::unique_ptr<GemmContext>> small = GemmContext::create(8, 64);
  ASSERT_TRUE(small.ok()) << small.error().to_string();
  GemmContext& g = **small;
  EXPECT_EQ(g.max_rows(), 8);
  EXPECT_EQ(g.max_k(), 64);
  const int n = 16;
  DeviceBuffer dx = upload(random_floats(16 * 128, 61));
  const Weights wb = make_weights(DType::bf16, n, 128, 62);
  const std::vector<float> y0 = random_floats(16 * n, 63);
  DeviceBuffer dy = upload(y0);
  const float* x = dx.as<float>();
  float* y = dy.as<float>();
  const void* w = wb.dev.data();
  const auto code = [](const Status& s) { return s.ok() ? std::string("ok") : error_code_name(s.error().code); };
  const std::string inv = error_code_name(ErrorCode::invalid_argument);
  for (const GemmMode mode : {GemmMode::fast, GemmMode::batch_invariant}) {
    EXPECT_EQ(code(g.linear(x, 64, 9, 64, w, DType::bf16, n, y, n, false, mode, nullptr)), inv)
        << "m > max_rows";
    EXPECT_EQ(code(g.linear(x, 128, 4, 65, w, DType::bf16, n, y, n, false, mode, nullptr)), inv)
        << "k > max_k";
    EXPECT_EQ(code(g.linear(x, 64, -1, 64, w, DType::bf16, n, y, n, false, mode, nullptr)), inv);
    EXPECT_EQ(code(g.linear(nullptr, 64, 4, 64, w, DType::bf16, n, y, n, false, mode, nullptr)), inv);
    EXPECT_EQ(code(g.linear(x, 64, 4, 64, nullptr, DType::bf16, n, y, n, false, mode, nullptr)), inv);
    EXPECT_EQ(code(g.linear(x, 64, 4, 64, w, DType::bf16, n, nullptr, n, false, mode, nullptr)), inv);
    EXPECT_EQ(code(g.linear(x, 63, 4, 64, w, DType::bf16, n, y, n, false, mode, nullptr)), inv)
        << "x_stride < k";
    EXPECT_EQ(code(g.linear(x, 64, 4, 64, w, DType::bf16, n, y, n - 1, false, mode, nullptr)), inv)
        << "y_stride < n";
    EXPECT_EQ(code(g.linear(x, 64, 4, 64, w, DType::bf16, 0, y, n, false, mode, nullptr)), inv);
    EXPECT_EQ(code(g.linear(x, 64, 4, 64, w, static_cast<DType>(9), n, y, n, false, mode, nullptr)),
              error_code_name(ErrorCode::unsupported));
  }
  EXPECT_EQ(code(g.linear(x, 64, 4, 64, w, DType::bf16, n, y, n, false, static_cast<GemmMode>(7),
                          nullptr)),
            inv);
  EXPECT_EQ(code(g.linear_lowp(x, 64, 4, 64, w, DType::f32, n, y, n, false, nullptr)),
            error_code_name(ErrorCode::unsupported));
  ASSERT_STATUS_OK(synchronize(nullptr));
  expect_bits_equal(download<float>(dy), y0, "y after rejected calls");
  // The limits bound the 16-bit cast scratch only: F32 weights take any m, k.
  const Weights wf = make_weights(DType::f32, n, 128, 64);
  ASSERT_STATUS_OK(g.linear(x, 128, 16, 128, wf.dev.data(), DType::f32, n, y, n, false,
                            GemmMode::batch_invariant, nullptr));
  ASSERT_STATUS_OK(synchronize(nullptr));
}

// ---- cast_f32 --------------------------------------------------------------------------

TEST_F(CudaGemm, CastF32MatchesHostConversionsBitForBit) {
  std::vector<float> x;
  const std::uint32_t special_bits[] = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,  // +-0, +-1
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,  // BF16 ties to even / near ties
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u,  // 65504, just below / at 65520, 65536
      0x33000000u, 0x33000001u, 0x33c00000u, 0x387fc000u,  // 2^-25 (tie -> 0), F16 subnormals
      0x38800000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu,  // 2^-14, F32 denormals, FLT_MAX
      0x7f800000u, 0xff800000u,                            // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u, 0x7fffffffu,  // NaNs
  };
  for (const std::uint32_t b : special_bits) x.push_back(std::bit_cast<float>(b));
  std::mt19937 rng(71);
  // Random bit patterns (all exponents), then ordinary values; > 8192 * 256
  // elements so the grid-stride loop runs more than once.
  while (x.size() < 600000) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  for (float v : random_floats(1'900'001, 72, -70000.0f, 70000.0f)) x.push_back(v);
  const long n = static_cast<long>(x.size());
  DeviceBuffer dx = upload(x);

  {  // F32: a copy
    Result<DeviceBuffer> out = DeviceBuffer::allocate(x.size() * sizeof(float));
    ASSERT_TRUE(out.ok());
    ASSERT_STATUS_OK(cast_f32(dx.as<float>(), n, DType::f32, out->data(), nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    expect_bits_equal(download<float>(*out), x, "F32 copy");
  }
  for (const DType dtype : {DType::bf16, DType::f16}) {
    Result<DeviceBuffer> out = DeviceBuffer::allocate(x.size() * sizeof(std::uint16_t));
    ASSERT_TRUE(out.ok());
    ASSERT_STATUS_OK(cast_f32(dx.as<float>(), n, dtype, out->data(), nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    const std::vector<std::uint16_t> got = download<std::uint16_t>(*out);
    ASSERT_EQ(got.size(), x.size());
    std::size_t bad = 0, first = x.size();
    for (std::size_t i = 0; i < x.size(); ++i) {
      bool ok;
      if (dtype == DType::bf16) {
        ok = got[i] == f32_to_bf16(x[i]);  // NaN payloads included
      } else if (std::isnan(x[i])) {
        ok = std::isnan(f16_to_f32(got[i]));  // __float2half_rn's NaN bits are its own
      } else {
        ok = got[i] == host_f32_to_f16(x[i]);
      }
      if (!ok && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << dtype_name(dtype) << ": first mismatch at " << first << " (input bits 0x"
                       << std::hex << (first < x.size() ? std::bit_cast<std::uint32_t>(x[first]) : 0u)
                       << ", got 0x" << (first < x.size() ? got[first] : 0u) << ")";
  }
}

// ---- CUDA graphs ------------------------------------------------------------------------

TEST_F(CudaGemm, CapturedInACudaGraphAndReplayed) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  struct Case {
    DType dtype;
    GemmMode mode;
    bool warm;  ///< called once before the capture (fast: plan cached); else first seen inside it
  };
  const Case cases[] = {{DType::bf16, GemmMode::fast, true},
                        {DType::bf16, GemmMode::batch_invariant, true},
                        {DType::f16, GemmMode::fast, false},
                        {DType::f32, GemmMode::fast, true},
                        {DType::f32, GemmMode::batch_invariant, false}};
  int shape = 0;
  for (const Case& c : cases) {
    const int m = 24 + shape, n = 96 + 8 * shape, k = 136;  // a new fast-mode plan per case
    ++shape;
    const std::string what = std::string(dtype_name(c.dtype)) + " " + gemm_mode_name(c.mode) +
                             (c.warm ? " (warm)" : " (first call captured)");
    const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * k, 81);
    const Weights w = make_weights(c.dtype, n, k, 82);
    DeviceBuffer dx = upload(x);
    DeviceBuffer dy = upload(std::vector<float>(static_cast<std::size_t>(m) * n, 0.0f));
    const Shape s{m, n, k, 0, 0, false};
    const std::vector<float> ref = reference(x, k, w, c.dtype, s, {}, n);
    std::vector<float> direct;
    if (c.warm) {
      ASSERT_STATUS_OK(ctx_->linear(dx.as<float>(), k, m, k, w.dev.data(), c.dtype, n,
                                    dy.as<float>(), n, false, c.mode, stream));
      ASSERT_STATUS_OK(synchronize(stream));
      direct = download<float>(dy);
    }
    ASSERT_STATUS_OK(dy.fill_bytes(0xff));  // NaN: the replay must overwrite every element
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::size_t plans_before = ctx_->cached_plans();
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess) << what;
    const Status st = ctx_->linear(dx.as<float>(), k, m, k, w.dev.data(), c.dtype, n,
                                   dy.as<float>(), n, false, c.mode, stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    ASSERT_TRUE(st.ok()) << what << ": " << st.error().to_string();
    ASSERT_EQ(end, cudaSuccess) << what << ": " << cudaGetErrorString(end);
    if (c.mode == GemmMode::fast) {
      EXPECT_EQ(ctx_->cached_plans(), plans_before + (c.warm ? 0u : 1u)) << what;
    }
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess) << what;
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess) << what;
      ASSERT_STATUS_OK(synchronize(stream));
      const std::vector<float> y = download<float>(dy);
      EXPECT_LE(normalized_error(y, ref), c.dtype == DType::f32 ? kF32Tol : kLowpTol) << what;
      if (c.warm) expect_bits_equal(y, direct, what + " replay " + std::to_string(replay));
    }
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
  }
  (void)cudaStreamDestroy(stream);
}

// ---- roofline probes ---------------------------------------------------------------------

TEST_F(CudaGemm, RooflineProbesReturnPlausibleNumbers) {
  Result<double> bw = measure_d2d_bandwidth_gbs(std::size_t{256} << 20, 5);
  ASSERT_TRUE(bw.ok()) << bw.error().to_string();
  EXPECT_GT(*bw, 10.0);
  EXPECT_LT(*bw, 100000.0);
  std::printf("[ roofline ] d2d copy of 256 MiB: %.1f GB/s (read + write)\n", *bw);
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    const int size = dtype == DType::f32 ? 1024 : 4096;
    Result<double> tf = measure_gemm_tflops(dtype, size, size, size, 5);
    ASSERT_TRUE(tf.ok()) << tf.error().to_string();
    EXPECT_GT(*tf, 0.1) << dtype_name(dtype);
    EXPECT_LT(*tf, 10000.0) << dtype_name(dtype);
    std::printf("[ roofline ] %s GEMM %d^3: %.1f TFLOPS\n", dtype_name(dtype), size, *tf);
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
