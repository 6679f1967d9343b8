#include "kernels/cpu/linear.hpp"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernel_paths.hpp"
#include "kernels/cpu/linear_panels.hpp"

// The accumulation order every path keeps, the BF16 chain and the packed
// layout: linear_panels.hpp. This file packs, dispatches to the
// instruction path (linear_avx2.cpp, linear_avx512.cpp) and holds the
// portable path and the reference.

namespace shardline::kernels::cpu {
namespace {

/// Index of W[j, kk] in the packed copy (any column j < padded n).
[[nodiscard]] std::size_t packed_index(DType dt, int k, int j, int kk) {
  const std::size_t panel = static_cast<std::size_t>(j / kNr) * panel_elems(dt, k);
  if (dt == DType::f32) return panel + static_cast<std::size_t>(kk) * kNr + j % kNr;
  return panel + static_cast<std::size_t>(kk / 2) * 2 * kNr + (j % kNr) * 2 + kk % 2;
}

/// A BF16 input as VDPBF16PS reads it: denormals are zero (DAZ).
[[nodiscard]] float bf16_daz(std::uint16_t h) {
  return (h & 0x7f80u) == 0 ? ((h & 0x8000u) != 0 ? -0.0f : 0.0f) : bf16_to_f32(h);
}
/// A sum as VDPBF16PS writes it: denormals flush to signed zero (FTZ).
[[nodiscard]] float ftz(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }

/// x rounded to BF16 as VCVTNEPS2BF16 rounds it, widened back to F32
/// (exact): denormals go to signed zero, then common/dtype.hpp's
/// f32_to_bf16 (nearest even; NaN stays a quiet NaN).
[[nodiscard]] inline float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) return std::signbit(x) ? -0.0f : 0.0f;
  return bf16_to_f32(f32_to_bf16(x));
}

/// x [m, k] (row stride xs) -> xb [m, kp] rounded to BF16 and widened back
/// to F32 (kp = k padded to even; the pad element is zero); with `bits`,
/// BF16 bits by VCVTNEPS2BF16 instead (AVX512-BF16). Row-local, so
/// batch-invariant.
void round_rows_bf16(const float* x, int m, long xs, int k, int kp, void* xb, bool bits) {
#pragma omp parallel for schedule(static) if (static_cast<long>(m) * k > (1 << 16))
  for (int i = 0; i < m; ++i) {
    if (bits) {
      detail::round_row_bf16_avx512(x + i * xs, k, kp, static_cast<std::uint16_t*>(xb) + static_cast<long>(i) * kp);
      continue;
    }
    const float* xi = x + i * xs;
    float* out = static_cast<float*>(xb) + static_cast<long>(i) * kp;
    for (int kk = 0; kk < k; ++kk) out[kk] = round_bf16(xi[kk]);
    if (kp > k) out[k] = 0.0f;
  }
}

/// The paths, widest first; SHARDLINE_LINEAR_KERNEL may name the automatic
/// one.
constexpr detail::KernelPaths<LinearKernel, 4> kPaths{
    "linear",
    LinearKernel::automatic,
    "SHARDLINE_LINEAR_KERNEL",
    {{{LinearKernel::avx512_bf16, "avx512_bf16", detail::CpuFeatures::avx512_bf16},
      {LinearKernel::avx512, "avx512", detail::CpuFeatures::avx512},
      {LinearKernel::avx2, "avx2", detail::CpuFeatures::avx2},
      {LinearKernel::portable, "portable", detail::CpuFeatures::none}}}};

/// The BF16 chain of one output element (the definition every path meets):
/// xb = x rounded to BF16 (row of kp, zero pad), w = the BF16 row of W.
[[nodiscard]] float dot_bf16(const float* xb, const std::uint16_t* wrow, int k) {
  float acc = 0.0f;
  for (int q = 0; 2 * q < k; ++q) {
    const float wo = 2 * q + 1 < k ? bf16_daz(wrow[2 * q + 1]) : 0.0f;
    acc = ftz(std::fma(xb[2 * q + 1], wo, acc));
    acc = ftz(std::fma(xb[2 * q], bf16_daz(wrow[2 * q]), acc));
  }
  return acc;
}

/// Per-thread scratch for the rounded activations, reused across calls.
template <class T>
T* scratch(std::size_t elems) {
  thread_local std::vector<T> buf;
  if (buf.size() < elems) buf.resize(elems);
  return buf.data();
}

}  // namespace

std::size_t PackedLinear::packed_bytes(DType dtype, int n, int k) {
  const int panels = (n + kNr - 1) / kNr;
  return static_cast<std::size_t>(panels) * panel_elems(dtype, k) * dtype_size(dtype);
}

PackedLinear PackedLinear::view(const void* data, DType dtype, int n, int k) {
  PackedLinear out;
  out.n_ = n;
  out.k_ = k;
  out.dtype_ = dtype;
  out.bytes_ = packed_bytes(dtype, n, k);
  out.view_ = data;
  return out;
}

PackedLinear PackedLinear::pack(const void* w, DType dtype, int n, int k) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw std::invalid_argument("PackedLinear::pack: weights must be F32 or BF16");
  PackedLinear out;
  out.n_ = n;
  out.k_ = k;
  out.dtype_ = dtype;
  out.bytes_ = packed_bytes(dtype, n, k);
  out.data_ = allocate_aligned(out.bytes_);
  if (!out.data_) throw std::bad_alloc();
  void* mem = out.data_.get();
  std::memset(mem, 0, out.bytes_);  // zero padding: the last panel's columns, an odd k's pair

  if (dtype == DType::f32) {
    const auto* src = static_cast<const float*>(w);  // [n, k]
    auto* dst = static_cast<float*>(mem);
    for (int j = 0; j < n; ++j)
      for (int kk = 0; kk < k; ++kk)
        dst[packed_index(dtype, k, j, kk)] = src[static_cast<std::size_t>(j) * k + kk];
  } else {
    const auto* src = static_cast<const std::uint16_t*>(w);  // [n, k] bf16 bits
    auto* dst = static_cast<std::uint16_t*>(mem);
    for (int j = 0; j < n; ++j)
      for (int kk = 0; kk < k; ++kk)
        dst[packed_index(dtype, k, j, kk)] = src[static_cast<std::size_t>(j) * k + kk];
  }
  return out;
}

const char* linear_kernel_name(LinearKernel kernel) { return kPaths.name(kernel); }

bool linear_kernel_supported(LinearKernel kernel) { return kPaths.supported(kernel); }

void linear(const float* x, int m, int x_stride, const PackedLinear& w, const float* bias, float* y, int y_stride,
            LinePrefetchQueue* side, LinearKernel kernel) {
  if (m <= 0 || w.out_features() <= 0) return;
  kernel = kPaths.resolve(kernel);
  const int n = w.out_features(), k = w.in_features();
  const int panels = (n + kNr - 1) / kNr;
  const bool bf16 = w.dtype() == DType::bf16;
  const int kp = k_padded(w.dtype(), k);
  if (kernel != LinearKernel::portable) {
    const bool bits = bf16 && kernel == LinearKernel::avx512_bf16;  // x as BF16 bits for VDPBF16PS
    const void* xin = x;  // [m, xs]: x, or x rounded to BF16 (F32 values or bits) [m, kp]
    long xs = x_stride;
    if (bf16) {
      void* xb = bits ? static_cast<void*>(scratch<std::uint16_t>(static_cast<std::size_t>(m) * kp))
                      : static_cast<void*>(scratch<float>(static_cast<std::size_t>(m) * kp));
      round_rows_bf16(x, m, x_stride, k, kp, xb, bits);
      xin = xb;
      xs = kp;
    }
    // Contiguous panel ranges per thread: each thread streams its own slice of W.
#pragma omp parallel num_threads(std::min(omp_get_max_threads(), panels))
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int p0 = static_cast<int>(static_cast<long>(panels) * t / nt);
      const int p1 = static_cast<int>(static_cast<long>(panels) * (t + 1) / nt);
      if (kernel == LinearKernel::avx2)
        detail::linear_panels_avx2(xin, m, xs, w, bias, y, y_stride, p0, p1, side, t);
      else
        detail::linear_panels_avx512(xin, m, xs, w, bias, y, y_stride, p0, p1, side, t, bits);
    }
    return;
  }
  // The portable path: the same per-element chains, read from the packed copy.
  std::vector<float> xb;  // [m, kp] BF16-rounded x, widened
  if (bf16) {
    xb.resize(static_cast<std::size_t>(m) * kp);
    round_rows_bf16(x, m, x_stride, k, kp, xb.data(), false);
  }
  const auto* wb = static_cast<const std::uint16_t*>(w.data());
  const auto* wf = static_cast<const float*>(w.data());
#pragma omp parallel
  {
    std::vector<std::uint16_t> wrow(bf16 ? kp : 0);  // [k] column j of W, one per thread
#pragma omp for schedule(static)
    for (int j = 0; j < n; ++j) {
      for (int kk = 0; kk < (bf16 ? k : 0); ++kk) wrow[kk] = wb[packed_index(DType::bf16, k, j, kk)];
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        if (bf16) {
          acc = dot_bf16(xb.data() + static_cast<std::size_t>(i) * kp, wrow.data(), k);
        } else {
          const float* xi = x + static_cast<long>(i) * x_stride;
          for (int kk = 0; kk < k; ++kk) acc = std::fma(xi[kk], wf[packed_index(DType::f32, k, j, kk)], acc);
        }
        y[static_cast<long>(i) * y_stride + j] = bias ? acc + bias[j] : acc;
      }
    }
  }
}

bool linear_uses_side_prefetch() { return kPaths.chosen() != LinearKernel::portable; }

void linear_reference(const float* x, int m, int x_stride, const void* w, DType dtype, int n,
                      int k, const float* bias, float* y, int y_stride) {
  std::vector<float> xb(static_cast<std::size_t>(k_padded(dtype, k)), 0.0f);  // [kp]
  for (int i = 0; i < m; ++i) {
    const float* xi = x + static_cast<long>(i) * x_stride;  // [k]
    if (dtype == DType::bf16)
      for (int kk = 0; kk < k; ++kk) xb[kk] = round_bf16(xi[kk]);
    for (int j = 0; j < n; ++j) {
      const std::size_t row = static_cast<std::size_t>(j) * k;
      float acc = 0.0f;
      if (dtype == DType::f32) {
        for (int kk = 0; kk < k; ++kk) acc = std::fma(xi[kk], static_cast<const float*>(w)[row + kk], acc);
      } else {
        acc = dot_bf16(xb.data(), static_cast<const std::uint16_t*>(w) + row, k);
      }
      y[static_cast<long>(i) * y_stride + j] = bias ? acc + bias[j] : acc;
    }
  }
}

}  // namespace shardline::kernels::cpu
