#include "kernels/cpu/ops.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <cmath>
#include <cstring>
#include <numbers>

// Every row-wise op computes a row with the same instruction sequence whatever
// the number of rows or the thread split (OpenMP over rows), so each row's
// result is independent of the batch.

namespace shardline::kernels::cpu {
namespace {

/// Sum of squares of x[0..n) in a fixed order: 16 lane-wise partial sums over
/// the full 16-blocks, the lanes reduced in a fixed tree, then the tail in order.
[[nodiscard]] float sum_squares(const float* x, int n) {
  int i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  s = detail::hsum16(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // the 16 lanes as two halves
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  s = detail::hsum16(lo, hi);
#endif
  for (; i < n; ++i) s = std::fma(x[i], x[i], s);
  return s;
}

/// y[0..n) = x * inv_rms * w  (x == y allowed).
void scale_row(const float* x, float inv_rms, const float* w, float* y, int n) {
  int i = 0;
#if defined(__AVX512F__)
  const __m512 r = _mm512_set1_ps(inv_rms);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), r),
                                          _mm512_loadu_ps(w + i)));
#endif
  for (; i < n; ++i) y[i] = (x[i] * inv_rms) * w[i];
}

[[nodiscard]] float inv_rms(const float* x, int n, float eps) {
  return 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
}

}  // namespace

void embedding(const std::int32_t* token_ids, int num_tokens, const void* table, DType dtype,
               int hidden, float* out) {
#pragma omp parallel for schedule(static) if (num_tokens > 16)
  for (int t = 0; t < num_tokens; ++t) {
    const std::size_t row = static_cast<std::size_t>(token_ids[t]) * hidden;
    float* o = out + static_cast<std::size_t>(t) * hidden;  // [hidden]
    if (dtype == DType::f32) {
      std::memcpy(o, static_cast<const float*>(table) + row, sizeof(float) * hidden);
    } else if (dtype == DType::bf16) {
      const auto* src = static_cast<const std::uint16_t*>(table) + row;
      for (int i = 0; i < hidden; ++i) o[i] = bf16_to_f32(src[i]);
    } else {
      const auto* src = static_cast<const std::uint16_t*>(table) + row;
      for (int i = 0; i < hidden; ++i) o[i] = f16_to_f32(src[i]);
    }
  }
}

void rms_norm(const float* x, int x_stride, const float* weight, float* y, int y_stride,
              int rows, int dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * x_stride;
    scale_row(xr, inv_rms(xr, dim, eps), weight, y + static_cast<long>(r) * y_stride, dim);
  }
}

void add_rms_norm(float* residual, const float* x, const float* weight, float* y, int rows,
                  int dim, float eps) {
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int r = 0; r < rows; ++r) {
    float* res = residual + static_cast<long>(r) * dim;  // [dim]
    const float* xr = x + static_cast<long>(r) * dim;
    for (int i = 0; i < dim; ++i) res[i] += xr[i];
    scale_row(res, inv_rms(res, dim, eps), weight, y + static_cast<long>(r) * dim, dim);
  }
}

void add_inplace(float* residual, const float* x, long n) {
#pragma omp parallel for schedule(static) if (n > (1L << 16))
  for (long i = 0; i < n; ++i) residual[i] += x[i];
}

void silu_and_mul(const float* gate_up, float* out, int rows, int inter) {
#pragma omp parallel for schedule(static) if (static_cast<long>(rows) * inter > 8192)
  for (int r = 0; r < rows; ++r) {
    const float* g = gate_up + static_cast<long>(r) * 2 * inter;  // [2 * inter]
    const float* u = g + inter;
    float* o = out + static_cast<long>(r) * inter;  // [inter]
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= inter; i += 16) {
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
      const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (const int full = inter / 16 * 16; i < full; i += 8) {  // the AVX-512 path's 16-blocks
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

std::vector<float> rope_inv_freq(const RopeParams& p) {
  const int half = p.head_dim / 2;
  std::vector<float> inv(half);
  // HF: 1.0 / (base ** (arange(0, d, 2).float() / d)), all in float32.
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(p.head_dim);
    inv[i] = 1.0f / std::pow(p.theta, e);
  }
  for (std::size_t i = 0; i < p.freq_factors.size() && i < inv.size(); ++i) inv[i] /= p.freq_factors[i];
  if (!p.llama3_scaling) return inv;  // (a model has freq_factors or llama3 scaling, not both)
  // HF _compute_llama3_parameters, in float32 like torch. torch evaluates
  // `scalar / tensor` as tensor.reciprocal() * scalar; mirrored here.
  const float orig = static_cast<float>(p.original_max_position_embeddings);
  const float low_wavelen = static_cast<float>(static_cast<double>(p.original_max_position_embeddings) /
                                               p.low_freq_factor);
  const float high_wavelen = static_cast<float>(static_cast<double>(p.original_max_position_embeddings) /
                                                p.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float ff_span = static_cast<float>(static_cast<double>(p.high_freq_factor) - p.low_freq_factor);
  for (int i = 0; i < half; ++i) {
    const float f = inv[i];
    const float wavelen = (1.0f / f) * two_pi;
    const float scaled = wavelen > low_wavelen ? f / p.factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {  // medium band
      const float smooth = ((1.0f / wavelen) * orig - p.low_freq_factor) / ff_span;
      inv[i] = (1.0f - smooth) * scaled / p.factor + smooth * scaled;
    } else {
      inv[i] = scaled;
    }
  }
  return inv;
}

void rope(float* x, int num_tokens, int row_stride, int num_heads, int head_dim,
          const std::int32_t* positions, const float* inv_freq) {
  const int half = head_dim / 2;
#pragma omp parallel if (num_tokens > 4)
  {
    std::vector<float> cs(half), sn(half);  // [half] cos / sin of this token
#pragma omp for schedule(static)
    for (int t = 0; t < num_tokens; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int i = 0; i < half; ++i) {
        const float a = pos * inv_freq[i];  // float angle, like HF
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
      }
      float* row = x + static_cast<long>(t) * row_stride;
      for (int h = 0; h < num_heads; ++h) {
        float* x1 = row + h * head_dim;  // [half]
        float* x2 = x1 + half;           // [half]
        for (int i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * cs[i] - b * sn[i];
          x2[i] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

}  // namespace shardline::kernels::cpu
