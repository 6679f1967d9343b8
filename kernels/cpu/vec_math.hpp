#pragma once
/// \file
/// Private SIMD math helpers of the CPU kernels (not part of the API):
/// AVX-512 ones, and AVX2+FMA ones for CPUs without AVX-512 (AMD Zen 2/3)
/// that give the same bits lane by lane.

#if defined(__AVX512F__)
// GCC 12 reports -Wmaybe-uninitialized inside its own intrinsic headers
// (_mm512_undefined_*); the state at the header's lines is what counts, so
// this header must be included before anything else pulls in immintrin.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Same for -Wuninitialized (_mm512_shuffle_f32x4, _mm512_unpack*_pd with -O3).
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace shardline::kernels::cpu::detail {

/// e^x for 16 floats (Cephes expf polynomial, ~1-2 ulp on the normal range).
/// Deterministic: no table, no data-dependent path. Inputs are clamped to
/// [-103, 88.7]; below about -87.3 results are denormal, then 0.
[[nodiscard]] inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(88.7f));
  // x = n ln2 + r, |r| <= ln2/2; ln2 split in a hi part exact in float and a lo part.
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p * 2^n, with gradual underflow
}

/// Lanes summed in a fixed pairwise order (same result for the same input).
[[nodiscard]] inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

}  // namespace shardline::kernels::cpu::detail
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace shardline::kernels::cpu::detail {

/// e^x for 8 floats, the same bits lane by lane as exp16 (same clamps, same
/// polynomial, same FMAs). exp16's final p * 2^n (scalef, one rounding) is
/// done as (p * 2^(n >> 1)) * 2^(n - (n >> 1)): with n in [-149, 128] both
/// factors are normal floats and the first product is exact (p is about 1),
/// so the only rounding is the second product's -- the same as scalef's,
/// denormal results included.
[[nodiscard]] inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-103.0f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is integral
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
  // Opaque to the optimizer: GCC contracts a multiply feeding an add into an
  // FMA (-ffp-contract=fast), which would change e.g. SiLU's 1 + e. exp16
  // ends in scalef, which it cannot contract.
  asm("" : "+x"(y));
  return y;
}

/// hsum16 of the 16 lanes lo[0..7], hi[0..7], in the same order as
/// GCC's _mm512_reduce_add_ps (halves, quarters, pairs).
[[nodiscard]] inline float hsum16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}

/// Max of the 16 lanes lo, hi in the order of GCC's _mm512_reduce_max_ps.
[[nodiscard]] inline float hmax16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_max_ps(hi, lo);
  const __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1))));
}

}  // namespace shardline::kernels::cpu::detail
#endif

#if defined(__x86_64__) || defined(__i386__)
namespace shardline::kernels::cpu::detail {

/// prefetcht2 (into L2) of `bytes` from p, a cache line at a time. asm, not
/// _mm_prefetch: GCC 12 deletes loops of _mm_prefetch whose trip count is
/// not a constant.
inline void prefetch_l2(const void* p, long bytes) {
  const char* c = static_cast<const char*>(p);
  for (long o = 0; o < bytes; o += 64) asm volatile("prefetcht2 %0" : : "m"(c[o]));
}

}  // namespace shardline::kernels::cpu::detail
#endif
