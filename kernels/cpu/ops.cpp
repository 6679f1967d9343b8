#include "kernels/cpu/ops.hpp"

#include "kernels/cpu/kernel_paths.hpp"
#include "kernels/cpu/ops_paths.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <numbers>

// Every row-wise op computes a row with the same instruction sequence whatever
// the number of rows or the thread split (OpenMP over rows), so each row's
// result is independent of the batch.

namespace shardline::kernels::cpu {
namespace {

/// The paths, widest first; SHARDLINE_OPS_KERNEL may name the automatic one.
constexpr detail::KernelPaths<OpsKernel, 3> kPaths{
    "ops",
    OpsKernel::automatic,
    "SHARDLINE_OPS_KERNEL",
    {{{OpsKernel::avx512, "avx512", detail::CpuFeatures::avx512},
      {OpsKernel::avx2, "avx2", detail::CpuFeatures::avx2},
      {OpsKernel::portable, "portable", detail::CpuFeatures::none}}}};

[[nodiscard]] OpsKernel resolve(OpsKernel kernel) { return kPaths.resolve(kernel); }

// The portable path: one FMA chain, in order.
[[nodiscard]] float sum_squares_portable(const float* x, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s = std::fma(x[i], x[i], s);
  return s;
}

void scale_row_portable(const float* x, float inv_rms, const float* w, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = (x[i] * inv_rms) * w[i];
}

void silu_mul_row_portable(const float* g, const float* u, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

/// y = rms_norm(x) of one row on path `k` (resolved).
void norm_row(OpsKernel k, const float* x, const float* w, float* y, int n, float eps) {
  const float ss = k == OpsKernel::avx512 ? detail::sum_squares_avx512(x, n)
                   : k == OpsKernel::avx2 ? detail::sum_squares_avx2(x, n)
                                          : sum_squares_portable(x, n);
  const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  if (k == OpsKernel::avx512)
    detail::scale_row_avx512(x, inv_rms, w, y, n);
  else
    scale_row_portable(x, inv_rms, w, y, n);  // two roundings per element: any vector width, the same bits
}

}  // namespace

bool ops_kernel_supported(OpsKernel kernel) { return kPaths.supported(kernel); }

const char* ops_kernel_name(OpsKernel kernel) { return kPaths.name(kernel); }

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
              int rows, int dim, float eps, OpsKernel kernel) {
  const OpsKernel k = resolve(kernel);
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int r = 0; r < rows; ++r)
    norm_row(k, x + static_cast<long>(r) * x_stride, weight, y + static_cast<long>(r) * y_stride, dim, eps);
}

void add_rms_norm(float* residual, const float* x, const float* weight, float* y, int rows,
                  int dim, float eps, OpsKernel kernel) {
  const OpsKernel k = resolve(kernel);
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int r = 0; r < rows; ++r) {
    float* res = residual + static_cast<long>(r) * dim;  // [dim]
    const float* xr = x + static_cast<long>(r) * dim;
    for (int i = 0; i < dim; ++i) res[i] += xr[i];
    norm_row(k, res, weight, y + static_cast<long>(r) * dim, dim, eps);
  }
}

void add_inplace(float* residual, const float* x, long n) {
#pragma omp parallel for schedule(static) if (n > (1L << 16))
  for (long i = 0; i < n; ++i) residual[i] += x[i];
}

void silu_and_mul(const float* gate_up, float* out, int rows, int inter, OpsKernel kernel) {
  const OpsKernel k = resolve(kernel);
#pragma omp parallel for schedule(static) if (static_cast<long>(rows) * inter > 8192)
  for (int r = 0; r < rows; ++r) {
    const float* g = gate_up + static_cast<long>(r) * 2 * inter;  // [2 * inter]
    const float* u = g + inter;
    float* o = out + static_cast<long>(r) * inter;  // [inter]
    if (k == OpsKernel::avx512)
      detail::silu_mul_row_avx512(g, u, o, inter);
    else if (k == OpsKernel::avx2)
      detail::silu_mul_row_avx2(g, u, o, inter);
    else
      silu_mul_row_portable(g, u, o, inter);
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
