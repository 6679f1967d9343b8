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
#endif
