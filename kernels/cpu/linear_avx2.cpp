// linear()'s AVX2+FMA path (kernels/cpu/linear.hpp), for CPUs without
// AVX-512 (AMD Zen 2/3). Compiled with -mavx2 -mfma -mno-avx512f whatever the
// build machine (kernels/CMakeLists.txt), so that it is the code such a CPU
// runs even when measured on an AVX-512 machine (16 ymm registers, no EVEX);
// linear.cpp calls it only where the CPU has AVX2 and FMA. The chains and
// the packed layout: linear_panels.hpp.

#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/linear_panels.hpp"

#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "linear_avx2.cpp is compiled with -mavx2 -mfma -mno-avx512f (kernels/CMakeLists.txt)"
#endif

namespace shardline::kernels::cpu {
namespace {

// 16 ymm registers, 8 floats each. A 64-column panel is covered by
// sub-blocks of NV ymm columns (8 NV output columns) chosen by the row
// count, each sweeping the full k. Per element it is the same chain in k;
// only which register holds it changes. Accumulator v of the sub-block at
// c0 holds columns c0 + 8v .. c0 + 8v + 7 (F32: 8 floats; BF16: 8 lanes of
// pairs).

/// Stores acc (+ bias) into the first `valid` (0..8) of 8 columns.
[[gnu::always_inline]] inline void store8(float* y, const float* bias, __m256 acc, int valid) {
  if (valid >= 8) {
    _mm256_storeu_ps(y, bias ? _mm256_add_ps(acc, _mm256_loadu_ps(bias)) : acc);
    return;
  }
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 v = bias ? _mm256_add_ps(acc, _mm256_maskload_ps(bias, mask)) : acc;
  _mm256_maskstore_ps(y, mask, v);
}

/// One F32 k step of an M x NV register tile: NV weight vectors at `wk`,
/// one broadcast of x per row.
template <int M, int NV>
[[gnu::always_inline]] inline void f32_step(__m256 (&acc)[M][NV], const float* const (&xr)[M], int kk,
                                            const float* wk) {
  __m256 b[NV];
  for (int c = 0; c < NV; ++c) {
    __m256 v = _mm256_load_ps(wk + 8 * c);
    // Pin the vector in a register: GCC would fold the load into each row's
    // FMA, M loads per vector instead of one (load-port bound on Zen 3).
    if constexpr (M > 1) asm("" : "+x"(v));
    b[c] = v;
  }
  for (int r = 0; r < M; ++r) {
    const __m256 a = _mm256_broadcast_ss(xr[r] + kk);
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(a, b[c], acc[r][c]);
  }
}

/// One BF16 pair step q of an M x NV register tile: NV lanes of pairs at
/// `wq` widened to F32 (even: shift, odd: AND), the odd element's FMA
/// before the even one's (under the caller's DAZ+FTZ).
template <int M, int NV>
[[gnu::always_inline]] inline void bf16_step(__m256 (&acc)[M][NV], const float* const (&xr)[M], int q,
                                             const __m256i* wq, __m256i hi_mask) {
  __m256 even[NV], odd[NV];
  for (int v = 0; v < NV; ++v) {
    const __m256i wv = _mm256_load_si256(wq + v);
    even[v] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
    odd[v] = _mm256_castsi256_ps(_mm256_and_si256(wv, hi_mask));
  }
  for (int r = 0; r < M; ++r) {
    const __m256 ao = _mm256_broadcast_ss(xr[r] + 2 * q + 1);
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ao, odd[v], acc[r][v]);
    const __m256 ae = _mm256_broadcast_ss(xr[r] + 2 * q);
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ae, even[v], acc[r][v]);
  }
}

/// Register tile: rows [0, M) x NV ymm columns of the sub-block at c0 of one
/// panel, over the full k (F32) or its ksteps pairs (BF16, under DAZ+FTZ:
/// the odd element's FMA, then the even one's). Columns >= ncols (panel
/// padding) are not stored.
template <int M, int NV, bool kBf16>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel, int ksteps, int c0,
                                              const float* bias, float* y, long y_stride, int ncols,
                                              const Prefetch& pf) {
  __m256 acc[M][NV];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;

  if constexpr (kBf16) {
    // 64 lanes (8 ymm) per pair; this sub-block's from lane c0.
    const __m256i* w = reinterpret_cast<const __m256i*>(static_cast<const std::uint32_t*>(panel) + c0);
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const DazFtzScope daz_ftz;
    // Two pairs per prefetch bookkeeping (as the F32 loop below).
    int q = 0;
    for (; q + 2 <= ksteps; q += 2, w += 2 * (kNr / 8)) {
      prefetch_steps(pf, q, 2);
      bf16_step<M, NV>(acc, xr, q, w, hi_mask);
      bf16_step<M, NV>(acc, xr, q + 1, w + kNr / 8, hi_mask);
    }
    for (; q < ksteps; ++q, w += kNr / 8) {
      prefetch_step(pf, q);
      bf16_step<M, NV>(acc, xr, q, w, hi_mask);
    }
  } else {
    const float* w = static_cast<const float*>(panel) + c0;
    // Four steps per prefetch bookkeeping: with it every step, the loop
    // issued about as many scalar instructions as FMAs (front-end bound).
    int kk = 0;
    for (; kk + 4 <= ksteps; kk += 4, w += 4 * kNr) {
      prefetch_steps(pf, kk, 4);
      f32_step<M, NV>(acc, xr, kk, w);
      f32_step<M, NV>(acc, xr, kk + 1, w + kNr);
      f32_step<M, NV>(acc, xr, kk + 2, w + 2 * kNr);
      f32_step<M, NV>(acc, xr, kk + 3, w + 3 * kNr);
    }
    for (; kk < ksteps; ++kk, w += kNr) {
      prefetch_step(pf, kk);
      f32_step<M, NV>(acc, xr, kk, w);
    }
  }

  for (int c = 0; c < NV; ++c) {
    const int col = c0 + 8 * c;
    const int valid = std::clamp(ncols - col, 0, 8);
    if (valid == 0) continue;
    for (int r = 0; r < M; ++r) store8(y + r * y_stride + col, bias ? bias + col : nullptr, acc[r][c], valid);
  }
}

/// All sub-blocks of one panel for M rows. Sub-blocks narrower than the
/// panel read only part of each k step of it: the first one pulls the whole
/// steps into L2 for the others, the second one prefetches the next panel.
template <int M, int NV, bool kBf16>
void panel_tile(const float* x, long xs, const void* panel, int ksteps, const float* bias, float* y, long ys,
                int ncols, const Prefetch& pf) {
  constexpr int kRowLines = kNr * 4 / 64;  // cache lines per k step (256 bytes either way)
  const Prefetch self{static_cast<const char*>(panel), kRowLines * ksteps, kRowLines};
  for (int c0 = 0; c0 < kNr; c0 += 8 * NV) {
    if (c0 >= ncols) continue;  // only padding columns
    const Prefetch& p = 8 * NV == kNr ? pf : c0 == 0 ? self : c0 == 8 * NV ? pf : Prefetch{};
    micro_tile<M, NV, kBf16>(x, xs, panel, ksteps, c0, bias, y, ys, ncols, p);
  }
}

/// The AVX2 path: 4 x 2 ymm tiles (6-row tiles measured ~1.5x slower on
/// Zen 3); the x block and a F32 panel (256 KiB at k = 1024) share a
/// 512 KiB L2.
struct Avx2 {
  static constexpr int kMr = 4;
  static constexpr std::size_t kXBlockBytes = 128 * 1024;
  template <bool kBf16, class X>
  static void tile(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias, float* y,
                   long ys, int ncols, const Prefetch& pf) {
    static_assert(std::is_same_v<X, float>);
    // BF16 widens each weight vector to two registers: narrower sub-blocks.
    constexpr int kNv2 = kBf16 ? 2 : 4, kNv1 = kBf16 ? 4 : 8;
    switch (rows) {
      case 4: panel_tile<4, 2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
      case 3: panel_tile<3, 2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
      case 2: panel_tile<2, kNv2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
      default: panel_tile<1, kNv1, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
    }
  }
};

}  // namespace

void detail::linear_panels_avx2(const void* x, int m, long xs, const PackedLinear& w, const float* bias, float* y,
                                long ys, int p0, int p1, LinePrefetchQueue* side, int thread) {
  if (w.dtype() == DType::bf16)
    linear_panels<Avx2, true>(static_cast<const float*>(x), m, xs, w, bias, y, ys, p0, p1, side, thread);
  else
    linear_panels<Avx2, false>(static_cast<const float*>(x), m, xs, w, bias, y, ys, p0, p1, side, thread);
}

}  // namespace shardline::kernels::cpu
