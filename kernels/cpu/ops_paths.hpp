#pragma once
/// \file
/// Private to kernels/cpu/ops.cpp: the row kernels of its SIMD paths, each
/// in a file compiled for its own instructions whatever the build machine
/// (ops_avx512.cpp: AVX-512 F + FMA; ops_avx2.cpp: AVX2 + FMA), called only
/// on a CPU that has them. Both give the same bits: the sum of squares as
/// 16 lane chains over the full 16-blocks, the lanes reduced like
/// _mm512_reduce_add_ps, the tail in order (std::fma); SiLU with exp16's
/// polynomial on the 16-blocks and std::exp on the tail.

namespace shardline::kernels::cpu::detail {

/// sum of x[i]^2, i < n, in the order above.
[[nodiscard]] float sum_squares_avx512(const float* x, int n);
[[nodiscard]] float sum_squares_avx2(const float* x, int n);

/// y[i] = (x[i] * inv_rms) * w[i], i < n (two roundings; no FMA).
void scale_row_avx512(const float* x, float inv_rms, const float* w, float* y, int n);

/// out[j] = silu(g[j]) * u[j] = g[j] / (1 + e^-g[j]) * u[j], j < n.
void silu_mul_row_avx512(const float* g, const float* u, float* out, int n);
void silu_mul_row_avx2(const float* g, const float* u, float* out, int n);

}  // namespace shardline::kernels::cpu::detail
