// linear()'s AVX-512 path (kernels/cpu/linear.hpp). Compiled with AVX-512F/BW/VL
// and FMA whatever the build machine (kernels/CMakeLists.txt); linear.cpp
// calls it only where the CPU has them. The native BF16 tile also needs
// AVX512-BF16 and carries it as a function target. The chains and the
// packed layout: linear_panels.hpp.

// GCC 12 reports -Wmaybe-uninitialized and -Wuninitialized inside its own
// intrinsic headers (_mm512_undefined_*): the state at the header's lines is
// what counts, so they are set before immintrin.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/linear_panels.hpp"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__FMA__)
#error "linear_avx512.cpp is compiled with -mavx512f -mavx512bw -mavx512vl -mfma (kernels/CMakeLists.txt)"
#endif

#define SHARDLINE_BF16_TARGET __attribute__((target("avx512bf16")))

namespace shardline::kernels::cpu {
namespace {

/// The AVX-512 path: 6 x 4 zmm register tiles.
struct Avx512 {
  static constexpr int kMr = 6;                              // rows per register tile (6 x 4 zmm accumulators)
  static constexpr std::size_t kXBlockBytes = 384 * 1024;   // x rows kept hot in L2 per pass
  template <bool kBf16, class X>
  static void tile(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias, float* y,
                   long ys, int ncols, const Prefetch& pf);
};

/// The same with VDPBF16PS for BF16 weights (x as BF16 bits).
struct Avx512Bf16 {
  static constexpr int kMr = Avx512::kMr;
  static constexpr std::size_t kXBlockBytes = Avx512::kXBlockBytes;
  template <bool kBf16, class X>
  static void tile(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias, float* y,
                   long ys, int ncols, const Prefetch& pf);
};

/// Stores a 6 x 4 zmm register tile's first M rows (+ bias), `ncols`
/// (1..64) valid columns; padded ones are discarded.
template <int M>
[[gnu::always_inline]] inline void store_tile(__m512 (&acc)[M][4], const float* bias, float* y, long y_stride,
                                              int ncols) {
  for (int c = 0; c < 4; ++c) {
    const int valid = std::clamp(ncols - 16 * c, 0, 16);
    if (valid == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * c) : _mm512_setzero_ps();
    for (int r = 0; r < M; ++r) {
      const __m512 v = bias ? _mm512_add_ps(acc[r][c], b) : acc[r][c];
      _mm512_mask_storeu_ps(y + r * y_stride + 16 * c, mask, v);
    }
  }
}

/// Register tile: rows [0, M) x 64 columns of one panel over the full k.
/// Meanwhile a slice of the next panel is prefetched into L2, so the first
/// tile of that panel does not stall on DRAM (weights stream once per step).
template <int M>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel, int k,
                                              const float* bias, float* y, long y_stride, int ncols,
                                              const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;
  const float* w = static_cast<const float*>(panel);
  for (int kk = 0; kk < k; ++kk, w += kNr) {
    prefetch_step(pf, kk);
    const __m512 b[4] = {_mm512_load_ps(w), _mm512_load_ps(w + 16), _mm512_load_ps(w + 32), _mm512_load_ps(w + 48)};
    for (int r = 0; r < M; ++r) {
      const __m512 a = _mm512_set1_ps(xr[r][kk]);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(a, b[c], acc[r][c]);
    }
  }
  store_tile<M>(acc, bias, y, y_stride, ncols);
}

/// One pair step q of the widened BF16 tile: 4 zmm of pairs at `wq`
/// widened to F32 (even: shift, odd: AND), the odd element's FMA before
/// the even one's (under the caller's DAZ+FTZ).
template <int M>
[[gnu::always_inline]] inline void widened_bf16_step(__m512 (&acc)[M][4], const float* const (&xr)[M], int q,
                                                     const __m512i* wq, __m512i hi_mask) {
  __m512 even[4], odd[4];
  for (int c = 0; c < 4; ++c) {
    const __m512i wc = _mm512_load_si512(wq + c);
    even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(wc, 16));
    odd[c] = _mm512_castsi512_ps(_mm512_and_si512(wc, hi_mask));
  }
  for (int r = 0; r < M; ++r) {
    const __m512 ao = _mm512_set1_ps(xr[r][2 * q + 1]), ae = _mm512_set1_ps(xr[r][2 * q]);
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(ao, odd[c], acc[r][c]);
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(ae, even[c], acc[r][c]);
  }
}

/// The BF16 register tile without AVX512-BF16: rows [0, M) x 64 columns
/// over the `pairs` pairs, the odd and the even element's F32 FMA under
/// DAZ+FTZ (the bits of VDPBF16PS).
template <int M>
[[gnu::always_inline]] inline void micro_tile_bf16(const float* x, long x_stride, const void* panel, int pairs,
                                                   const float* bias, float* y, long y_stride, int ncols,
                                                   const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i* w = static_cast<const __m512i*>(panel);  // 4 zmm per pair
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  {
    const DazFtzScope daz_ftz;
    // Two pairs per prefetch bookkeeping (as the AVX2 path).
    int q = 0;
    for (; q + 2 <= pairs; q += 2, w += 8) {
      prefetch_steps(pf, q, 2);
      widened_bf16_step<M>(acc, xr, q, w, hi_mask);
      widened_bf16_step<M>(acc, xr, q + 1, w + 4, hi_mask);
    }
    for (; q < pairs; ++q, w += 4) {
      prefetch_step(pf, q);
      widened_bf16_step<M>(acc, xr, q, w, hi_mask);
    }
  }
  store_tile<M>(acc, bias, y, y_stride, ncols);
}

/// The native BF16 register tile: one VDPBF16PS per (row, 16 columns, pair).
template <int M>
[[gnu::always_inline]] SHARDLINE_BF16_TARGET inline void micro_tile_dpbf16(const std::uint16_t* x, long x_stride,
                                                                           const void* panel, int pairs,
                                                                           const float* bias, float* y,
                                                                           long y_stride, int ncols,
                                                                           const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i* w = static_cast<const __m512i*>(panel);  // 4 zmm per pair
  const std::uint32_t* xr[M];                             // a pair of BF16 per 32 bits
  for (int r = 0; r < M; ++r) xr[r] = reinterpret_cast<const std::uint32_t*>(x + r * x_stride);
  for (int q = 0; q < pairs; ++q, w += 4) {
    prefetch_step(pf, q);
    const __m512i b[4] = {_mm512_load_si512(w), _mm512_load_si512(w + 1), _mm512_load_si512(w + 2),
                          _mm512_load_si512(w + 3)};
    for (int r = 0; r < M; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(xr[r][q]));
      for (int c = 0; c < 4; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b[c]));
    }
  }
  store_tile<M>(acc, bias, y, y_stride, ncols);
}

#define SHARDLINE_TILE_SWITCH(CALL) \
  switch (rows) {                   \
    case 6: CALL(6); break;         \
    case 5: CALL(5); break;         \
    case 4: CALL(4); break;         \
    case 3: CALL(3); break;         \
    case 2: CALL(2); break;         \
    default: CALL(1); break;        \
  }

template <bool kBf16, class X>
void Avx512::tile(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias, float* y, long ys,
                  int ncols, const Prefetch& pf) {
  static_assert(std::is_same_v<X, float>);
#define SHARDLINE_CALL(M)                                                    \
  if constexpr (kBf16)                                                       \
    micro_tile_bf16<M>(x, xs, panel, ksteps, bias, y, ys, ncols, pf);        \
  else                                                                       \
    micro_tile<M>(x, xs, panel, ksteps, bias, y, ys, ncols, pf)
  SHARDLINE_TILE_SWITCH(SHARDLINE_CALL)
#undef SHARDLINE_CALL
}

template <bool kBf16, class X>
SHARDLINE_BF16_TARGET void Avx512Bf16::tile(int rows, const X* x, long xs, const void* panel, int ksteps,
                                             const float* bias, float* y, long ys, int ncols, const Prefetch& pf) {
  static_assert(kBf16 && std::is_same_v<X, std::uint16_t>);
#define SHARDLINE_CALL(M) micro_tile_dpbf16<M>(x, xs, panel, ksteps, bias, y, ys, ncols, pf)
  SHARDLINE_TILE_SWITCH(SHARDLINE_CALL)
#undef SHARDLINE_CALL
}

#undef SHARDLINE_TILE_SWITCH

}  // namespace

namespace detail {

void linear_panels_avx512(const void* x, int m, long xs, const PackedLinear& w, const float* bias, float* y,
                          long ys, int p0, int p1, LinePrefetchQueue* side, int thread, bool native_bf16) {
  if (w.dtype() != DType::bf16)
    linear_panels<Avx512, false>(static_cast<const float*>(x), m, xs, w, bias, y, ys, p0, p1, side, thread);
  else if (native_bf16)
    linear_panels<Avx512Bf16, true>(static_cast<const std::uint16_t*>(x), m, xs, w, bias, y, ys, p0, p1, side,
                                    thread);
  else
    linear_panels<Avx512, true>(static_cast<const float*>(x), m, xs, w, bias, y, ys, p0, p1, side, thread);
}

SHARDLINE_BF16_TARGET void round_row_bf16_avx512(const float* x, int k, int kp, std::uint16_t* xb) {
  int kk = 0;
  for (; kk + 16 <= k; kk += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + kk),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + kk))));
  if (kk < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - kk)) - 1u);
    _mm256_mask_storeu_epi16(xb + kk, mask,
                             reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + kk))));
  }
  if (kp > k) xb[k] = 0;
}

}  // namespace detail
}  // namespace shardline::kernels::cpu
