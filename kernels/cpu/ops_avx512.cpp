// The AVX-512 row kernels of rms_norm / silu_and_mul (ops_paths.hpp),
// compiled with -mavx512f -mfma (kernels/CMakeLists.txt) whatever the build
// machine; ops.cpp calls them only on a CPU that has them.
#include "kernels/cpu/ops_paths.hpp"

#include "kernels/cpu/vec_math.hpp"  // first of the rest: includes immintrin.h

#include <cmath>

#if !(defined(__AVX512F__) && defined(__FMA__))
#error "ops_avx512.cpp needs -mavx512f -mfma (kernels/CMakeLists.txt)"
#endif

namespace shardline::kernels::cpu::detail {

float sum_squares_avx512(const float* x, int n) {
  int i = 0;
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  float s = hsum16(acc);
  for (; i < n; ++i) s = std::fma(x[i], x[i], s);
  return s;
}

void scale_row_avx512(const float* x, float inv_rms, const float* w, float* y, int n) {
  int i = 0;
  const __m512 r = _mm512_set1_ps(inv_rms);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), r), _mm512_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = (x[i] * inv_rms) * w[i];
}

void silu_mul_row_avx512(const float* g, const float* u, float* out, int n) {
  int i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace shardline::kernels::cpu::detail
