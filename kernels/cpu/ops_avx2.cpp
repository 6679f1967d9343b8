// The AVX2 row kernels of rms_norm / silu_and_mul (ops_paths.hpp), compiled
// with -mavx2 -mfma -mno-avx512f (kernels/CMakeLists.txt) whatever the build
// machine; ops.cpp calls them only on a CPU that has them. Each 16-lane
// vector of the AVX-512 path is two 8-lane halves here: the same bits.
#include "kernels/cpu/ops_paths.hpp"

#include "kernels/cpu/vec_math.hpp"  // first of the rest: includes immintrin.h

#include <cmath>

#if !(defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#error "ops_avx2.cpp needs -mavx2 -mfma -mno-avx512f (kernels/CMakeLists.txt)"
#endif

namespace shardline::kernels::cpu::detail {

float sum_squares_avx2(const float* x, int n) {
  int i = 0;
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // the 16 lanes as two halves
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  float s = hsum16(lo, hi);
  for (; i < n; ++i) s = std::fma(x[i], x[i], s);
  return s;
}

void silu_mul_row_avx2(const float* g, const float* u, float* out, int n) {
  int i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (const int full = n / 16 * 16; i < full; i += 8) {  // the AVX-512 path's 16-blocks
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace shardline::kernels::cpu::detail
