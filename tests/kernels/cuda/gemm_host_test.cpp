// Host-side logic of kernels/cuda/gemm.hpp (label unit): the argument checks
// GemmContext::linear runs before any CUDA call and the grid / stride
// arithmetic. Header-only functions: no CUDA library is linked and no CUDA
// call is made, so this runs on machines without a driver (and in builds
// without the CUDA backend).
#include <gtest/gtest.h>

#include <climits>

#include "kernels/cuda/gemm.hpp"

namespace shardline::kernels::cuda {
namespace kernels_cuda_gemm_host_test {

ErrorCode code_of(const Status& s) { return s.ok() ? static_cast<ErrorCode>(-1) : s.error().code; }

TEST(GemmHost, BatchInvariantGridCoversTheOutputWithFixedTiles) {
  EXPECT_EQ(batch_invariant_grid(0, 0).tiles_m, 0);
  EXPECT_EQ(batch_invariant_grid(0, 0).tiles_n, 0);
  EXPECT_EQ(batch_invariant_grid(1, 1).tiles_m, 1);
  EXPECT_EQ(batch_invariant_grid(1, 1).tiles_n, 1);
  EXPECT_EQ(batch_invariant_grid(64, 64).tiles_m, 1);
  EXPECT_EQ(batch_invariant_grid(65, 129).tiles_m, 2);
  EXPECT_EQ(batch_invariant_grid(65, 129).tiles_n, 3);
  EXPECT_EQ(batch_invariant_grid(8192, 151936).tiles_n, 2374);
  static_assert(batch_invariant_grid(256, 4096).tiles_m * kInvariantTileM == 256);
  // The tile never depends on m: every m tiles rows 0..63, 64..127, ...
  for (int m = 1; m <= 300; ++m) {
    const GemmGrid g = batch_invariant_grid(m, 77);
    EXPECT_GE(g.tiles_m * kInvariantTileM, m);
    EXPECT_LT((g.tiles_m - 1) * kInvariantTileM, m);
    EXPECT_EQ(g.tiles_n, 2);
  }
}

TEST(GemmHost, CastRowStrideIsKRoundedUpToEight) {
  EXPECT_EQ(cast_row_stride(1), 8);
  EXPECT_EQ(cast_row_stride(8), 8);
  EXPECT_EQ(cast_row_stride(77), 80);
  EXPECT_EQ(cast_row_stride(4096), 4096);
  EXPECT_EQ(cast_row_stride(INT_MAX), 2147483648L);  // no int overflow
}

TEST(GemmHost, CheckLinearArgs) {
  float buf[4] = {};
  const float* x = buf;
  const void* w = buf;
  const float* y = buf;
  const auto check = [&](const float* xp, int xs, int m, int k, const void* wp, DType d, int n,
                         const float* yp, int ys, GemmMode mode, int max_rows, int max_k) {
    return check_linear_args(xp, xs, m, k, wp, d, n, yp, ys, mode, max_rows, max_k);
  };
  const GemmMode fast = GemmMode::fast, inv = GemmMode::batch_invariant;
  EXPECT_TRUE(check(x, 64, 4, 64, w, DType::bf16, 32, y, 32, fast, 8, 64).ok());
  EXPECT_TRUE(check(x, 64, 8, 64, w, DType::f16, 32, y, 40, inv, 8, 64).ok());
  // m == 0: nothing to do, nothing else looked at.
  EXPECT_TRUE(check(nullptr, 0, 0, 0, nullptr, static_cast<DType>(9), 0, nullptr, 0,
                    static_cast<GemmMode>(7), 0, 0)
                  .ok());
  EXPECT_EQ(code_of(check(x, 64, -1, 64, w, DType::bf16, 32, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 0, w, DType::bf16, 32, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, DType::bf16, 0, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 63, 4, 64, w, DType::bf16, 32, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, DType::bf16, 32, y, 31, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(nullptr, 64, 4, 64, w, DType::bf16, 32, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, nullptr, DType::bf16, 32, y, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, DType::bf16, 32, nullptr, 32, fast, 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, DType::bf16, 32, y, 32, static_cast<GemmMode>(7), 8, 64)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, static_cast<DType>(9), 32, y, 32, fast, 8, 64)),
            ErrorCode::unsupported);
  // The n tiles go on grid y (at most 65535 blocks of 64 columns).
  EXPECT_TRUE(check(x, 64, 4, 64, w, DType::f32, 65535 * 64, y, 65535 * 64, inv, 8, 64).ok());
  EXPECT_EQ(code_of(check(x, 64, 4, 64, w, DType::f32, 65535 * 64 + 1, y, 65535 * 64 + 1, inv, 8, 64)),
            ErrorCode::invalid_argument);
  // The context limits bound the 16-bit cast scratch, in both modes; F32 weights ignore them.
  for (const GemmMode mode : {fast, inv}) {
    EXPECT_EQ(code_of(check(x, 64, 9, 64, w, DType::bf16, 32, y, 32, mode, 8, 64)),
              ErrorCode::invalid_argument);
    EXPECT_EQ(code_of(check(x, 65, 8, 65, w, DType::f16, 32, y, 32, mode, 8, 64)),
              ErrorCode::invalid_argument);
    EXPECT_TRUE(check(x, 65, 9, 65, w, DType::f32, 32, y, 32, mode, 8, 64).ok());
  }
  const Status s = check(x, 64, 9, 64, w, DType::bf16, 32, y, 32, fast, 8, 64);
  EXPECT_NE(s.error().message.find("max_rows 8"), std::string::npos) << s.error().message;
}

TEST(GemmHost, ModeNames) {
  EXPECT_STREQ(gemm_mode_name(GemmMode::fast), "fast");
  EXPECT_STREQ(gemm_mode_name(GemmMode::batch_invariant), "batch_invariant");
  EXPECT_STREQ(gemm_mode_name(static_cast<GemmMode>(7)), "?");
}

}  // namespace
}  // namespace shardline::kernels::cuda
