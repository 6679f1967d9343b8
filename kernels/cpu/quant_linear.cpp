#include "kernels/cpu/quant_linear.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.hpp"

// Compiled with -ffp-contract=off (kernels/CMakeLists.txt): the scalar
// loops are ggml-quants.c's arithmetic, no a*b+c fused into an FMA.
//
// Packed layout: W's columns (output features) in panels of kPanel = 8 (the
// last one padded with zero blocks). Panel p holds, for each block b of k
// (32 elements), in order:
//   8 F32 scales d_w of the panel's columns (32 bytes), then the values:
//   Q8_0: 8 groups of 4 elements; group g is 32 bytes, column c's
//         w[c][32b + 4g .. + 3] at bytes 4c .. 4c + 3 (256 bytes);
//   Q4_0: 4 pairs of groups; pair h is 32 bytes, byte 4c + j holds column
//         c's nibble of element 32b + 8h + j in its low half and of element
//         32b + 8h + 4 + j in its high half (128 bytes).
// One vpmaddubsw then multiplies 4 consecutive elements of x (broadcast) with
// the same 4 elements of all 8 columns.

namespace shardline::kernels::cpu {
namespace {

constexpr int kPanel = 8;  // output columns per panel
constexpr int kRows = 4;   // rows of x per register tile

/// Bytes of one GGUF block of `t`.
[[nodiscard]] std::size_t gguf_block_bytes(GgmlType t) {
  return t == GgmlType::q8_0 ? 34 : t == GgmlType::q4_0 ? 18 : 20;
}
/// Where a block's values start in the packed layout (after its scales,
/// and Q4_1's minimums).
[[nodiscard]] std::size_t values_offset(GgmlType t) { return t == GgmlType::q4_1 ? 64 : 32; }
[[nodiscard]] std::size_t block_stride(GgmlType t) {
  return values_offset(t) + (t == GgmlType::q8_0 ? 256 : 128);
}

/// One element of row `row` of the GGUF blocks: Q8_0's int8, or Q4_0's /
/// Q4_1's nibble (0..15; Q4_0's before the -8).
[[nodiscard]] int gguf_value(GgmlType t, const std::uint8_t* row, int e) {
  const int b = e / kQuantBlock, i = e % kQuantBlock;
  const std::uint8_t* block = row + static_cast<std::size_t>(b) * gguf_block_bytes(t);
  if (t == GgmlType::q8_0) return static_cast<std::int8_t>(block[2 + i]);
  const std::uint8_t byte = block[(t == GgmlType::q4_0 ? 2 : 4) + i % 16];
  return i < 16 ? (byte & 0x0F) : (byte >> 4);
}

/// A block's F16 field at byte `field` (0: d; 2: Q4_1's m), widened.
[[nodiscard]] float gguf_half(GgmlType t, const std::uint8_t* row, int b, int field = 0) {
  std::uint16_t h;
  std::memcpy(&h, row + static_cast<std::size_t>(b) * gguf_block_bytes(t) + field, 2);
  return f16_to_f32(h);
}

[[nodiscard]] Status check_shape(GgmlType type, std::size_t have, int n, int k) {
  if (type != GgmlType::q8_0 && type != GgmlType::q4_0 && type != GgmlType::q4_1)
    return make_error(ErrorCode::unsupported, "quantized linear: weights of type " +
                                                  ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                  " (Q8_0, Q4_0 and Q4_1 are kept quantized)");
  if (n < 1 || k < 1 || k % kQuantBlock != 0)
    return make_error(ErrorCode::invalid_argument, "quantized linear: a [" + std::to_string(n) + ", " +
                                                       std::to_string(k) +
                                                       "] matrix (k must be a positive multiple of 32)");
  const std::size_t need = static_cast<std::size_t>(n) * *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  if (have < need)
    return make_error(ErrorCode::invalid_argument, "quantized linear: " + std::to_string(have) + " bytes for a [" +
                                                       std::to_string(n) + ", " + std::to_string(k) + "] " +
                                                       ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                       " matrix, which needs " + std::to_string(need));
  return {};
}

/// x rows quantized to Q8_0: values, scales widened to F32, and each
/// block's sum of values (Q4_0 subtracts 8 x that).
struct QuantizedRows {
  std::vector<std::int8_t> q;  // [m, k]
  std::vector<float> d;        // [m, nb]
  std::vector<std::int32_t> sum;  // [m, nb]
  std::vector<float> s;        // [m, nb]: Q8_1's s (F16 of sum x d), widened
};

QuantizedRows quantize_rows(const float* x, int m, int xs, int k) {
  const int nb = k / kQuantBlock;
  QuantizedRows out;
  out.q.resize(static_cast<std::size_t>(m) * k);
  out.d.resize(static_cast<std::size_t>(m) * nb);
  out.sum.resize(static_cast<std::size_t>(m) * nb);
  out.s.resize(static_cast<std::size_t>(m) * nb);
  std::vector<BlockQ8_1> row(static_cast<std::size_t>(nb));
  for (int i = 0; i < m; ++i) {
    quantize_row_q8_1(x + static_cast<std::size_t>(i) * xs, k, row.data());
    for (int b = 0; b < nb; ++b) {
      const BlockQ8_1& blk = row[static_cast<std::size_t>(b)];
      std::int32_t s = 0;
      for (int j = 0; j < kQuantBlock; ++j) {
        out.q[static_cast<std::size_t>(i) * k + static_cast<std::size_t>(b) * kQuantBlock + j] = blk.qs[j];
        s += blk.qs[j];
      }
      out.d[static_cast<std::size_t>(i) * nb + b] = f16_to_f32(blk.d);
      out.sum[static_cast<std::size_t>(i) * nb + b] = s;
      out.s[static_cast<std::size_t>(i) * nb + b] = f16_to_f32(blk.s);
    }
  }
  return out;
}

/// The float step of one block, ggml-quants.c's association for each type
/// (mw, sx: Q4_1's minimum and the Q8_1 block's s; unused otherwise).
[[nodiscard]] inline float add_block(GgmlType t, float sumf, std::int32_t sumi, float dw, float dx, float mw = 0.0f,
                                     float sx = 0.0f) {
  if (t == GgmlType::q8_0) return sumf + static_cast<float>(sumi) * (dw * dx);
  if (t == GgmlType::q4_0) return sumf + static_cast<float>(sumi) * dw * dx;
  return sumf + ((dw * dx) * static_cast<float>(sumi) + mw * sx);
}

/// The portable kernel on the packed layout: columns [c0, c0 + 8) of panel
/// `panel` for rows [i0, i0 + rows).
void panel_scalar(GgmlType t, const std::byte* panel, int nb, const QuantizedRows& xq, int k, int i0, int rows,
                  float* y, int ys, int cols) {
  const std::size_t stride = block_stride(t);
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r;
    float acc[kPanel] = {};
    for (int b = 0; b < nb; ++b) {
      const std::byte* blk = panel + static_cast<std::size_t>(b) * stride;
      float dw[kPanel], mw[kPanel] = {};
      std::memcpy(dw, blk, sizeof(dw));
      if (t == GgmlType::q4_1) std::memcpy(mw, blk + 32, sizeof(mw));
      const auto* v = reinterpret_cast<const std::uint8_t*>(blk + values_offset(t));
      const std::int8_t* qx = xq.q.data() + static_cast<std::size_t>(i) * k + static_cast<std::size_t>(b) * kQuantBlock;
      for (int c = 0; c < kPanel; ++c) {
        std::int32_t sumi = 0;
        for (int e = 0; e < kQuantBlock; ++e) {
          int w;
          if (t == GgmlType::q8_0) {
            w = static_cast<std::int8_t>(v[(e / 4) * 32 + c * 4 + e % 4]);
          } else {
            const std::uint8_t byte = v[(e / 8) * 32 + c * 4 + e % 4];
            w = ((e % 8) < 4 ? (byte & 0x0F) : (byte >> 4)) - (t == GgmlType::q4_0 ? 8 : 0);
          }
          sumi += w * qx[e];
        }
        const std::size_t xb = static_cast<std::size_t>(i) * nb + b;
        acc[c] = add_block(t, acc[c], sumi, dw[c], xq.d[xb], mw[c], xq.s[xb]);
      }
    }
    std::memcpy(y + static_cast<std::size_t>(i) * ys, acc, sizeof(float) * static_cast<std::size_t>(cols));
  }
}

/// The AVX2 kernel: the same per-element chain, 8 columns per register.
template <GgmlType T, int R>
__attribute__((target("avx2"))) void panel_avx2(const std::byte* panel, int nb, const QuantizedRows& xq, int k,
                                                int i0, float* y, int ys, int cols) {
  constexpr std::size_t offset = T == GgmlType::q4_1 ? 64 : 32;
  constexpr std::size_t stride = offset + (T == GgmlType::q8_0 ? 256 : 128);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const std::int8_t* qx[R];
  for (int r = 0; r < R; ++r) qx[r] = xq.q.data() + static_cast<std::size_t>(i0 + r) * k;
  for (int b = 0; b < nb; ++b) {
    const std::byte* blk = panel + static_cast<std::size_t>(b) * stride;
    const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(blk));
    const auto* v = reinterpret_cast<const __m256i*>(blk + offset);
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    if constexpr (T == GgmlType::q8_0) {
      for (int g = 0; g < 8; ++g) {
        const __m256i w = _mm256_load_si256(v + g);
        const __m256i aw = _mm256_abs_epi8(w);  // |w| <= 128 as u8
        for (int r = 0; r < R; ++r) {
          std::int32_t x4;
          std::memcpy(&x4, qx[r] + b * kQuantBlock + 4 * g, 4);
          // x * sign(w) (|x| <= 127: no overflow), times |w|: w * x, pairs
          // summed to 16 bits (<= 2 x 128 x 127, no saturation), then 32.
          const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4), w);
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
        }
      }
    } else {
      for (int h = 0; h < 4; ++h) {
        const __m256i bytes = _mm256_load_si256(v + h);
        const __m256i lo = _mm256_and_si256(bytes, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
        for (int r = 0; r < R; ++r) {
          std::int32_t x0, x1;
          std::memcpy(&x0, qx[r] + b * kQuantBlock + 8 * h, 4);
          std::memcpy(&x1, qx[r] + b * kQuantBlock + 8 * h + 4, 4);
          // Nibbles 0..15 (unsigned) times x: pairs <= 2 x 15 x 127 each.
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x0)),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x1)));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
        }
      }
      // Q4_0: sum (n - 8) x = sum n x - 8 sum x, exactly.
      if constexpr (T == GgmlType::q4_0)
        for (int r = 0; r < R; ++r)
          isum[r] = _mm256_sub_epi32(
              isum[r], _mm256_set1_epi32(8 * xq.sum[static_cast<std::size_t>(i0 + r) * nb + b]));
    }
    for (int r = 0; r < R; ++r) {
      const std::size_t xb = static_cast<std::size_t>(i0 + r) * nb + b;
      const __m256 dx = _mm256_set1_ps(xq.d[xb]);
      const __m256 s = _mm256_cvtepi32_ps(isum[r]);
      __m256 term;
      if constexpr (T == GgmlType::q8_0) {
        term = _mm256_mul_ps(s, _mm256_mul_ps(dw, dx));
      } else if constexpr (T == GgmlType::q4_0) {
        term = _mm256_mul_ps(_mm256_mul_ps(s, dw), dx);
      } else {
        const __m256 mw = _mm256_load_ps(reinterpret_cast<const float*>(blk + 32));
        term = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dw, dx), s), _mm256_mul_ps(mw, _mm256_set1_ps(xq.s[xb])));
      }
      acc[r] = _mm256_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kPanel];
    _mm256_store_ps(out, acc[r]);
    std::memcpy(y + static_cast<std::size_t>(i0 + r) * ys, out, sizeof(float) * static_cast<std::size_t>(cols));
  }
}

template <GgmlType T>
void panel_rows_avx2(const std::byte* panel, int nb, const QuantizedRows& xq, int k, int m, float* y, int ys,
                     int cols) {
  int i = 0;
  for (; i + kRows <= m; i += kRows) panel_avx2<T, kRows>(panel, nb, xq, k, i, y, ys, cols);
  for (; i < m; ++i) panel_avx2<T, 1>(panel, nb, xq, k, i, y, ys, cols);
}

[[nodiscard]] bool cpu_has_avx2() { return __builtin_cpu_supports("avx2"); }

}  // namespace

namespace {

/// One block of ggml's quantize_row_q8_{0,1}_ref: values into `qs`; returns
/// the F32 scale d = amax / 127 (stored as F16 by the caller). Finite x
/// gives |value| <= 127; a NaN or infinity (which llama.cpp leaves
/// undefined) becomes 0 or the nearest end instead of an undefined
/// conversion.
float quantize_block_q8(const float* v, std::int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQuantBlock; ++j) {
    const float r = std::roundf(v[j] * id);
    qs[j] = std::isnan(r) ? 0 : static_cast<std::int8_t>(std::clamp(r, -128.0f, 127.0f));
  }
  return d;
}

}  // namespace

void quantize_row_q8_0(const float* x, int k, BlockQ8_0* y) {
  for (int b = 0; b < k / kQuantBlock; ++b)
    y[b].d = f32_to_f16(quantize_block_q8(x + static_cast<std::size_t>(b) * kQuantBlock, y[b].qs));
}

void quantize_row_q8_1(const float* x, int k, BlockQ8_1* y) {
  for (int b = 0; b < k / kQuantBlock; ++b) {
    const float d = quantize_block_q8(x + static_cast<std::size_t>(b) * kQuantBlock, y[b].qs);
    y[b].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQuantBlock; ++j) sum += y[b].qs[j];
    y[b].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

namespace {

/// (uint8)MIN(15, (int8_t)v) for v >= 0 as ggml writes it; a NaN becomes 0.
std::uint8_t nibble_of(float v) {
  const float t = std::trunc(v);
  return std::isnan(t) ? 0 : static_cast<std::uint8_t>(std::clamp(t, 0.0f, 15.0f));
}

/// ggml's quantize_row_q4_0_ref for one block: d = (the value of largest
/// magnitude, the first one) / -8, nibbles MIN(15, (int8)(x / d + 8.5)).
void quantize_block_q4_0(const float* v, std::uint8_t* out) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQuantBlock; ++j)
    if (amax < std::fabs(v[j])) {
      amax = std::fabs(v[j]);
      max = v[j];
    }
  const float d = max / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t dh = f32_to_f16(d);
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < kQuantBlock / 2; ++j)
    out[2 + j] = static_cast<std::uint8_t>(nibble_of(v[j] * id + 8.5f) |
                                           (nibble_of(v[kQuantBlock / 2 + j] * id + 8.5f) << 4));
}

/// ggml's quantize_row_q4_1_ref for one block: d = (max - min) / 15, m =
/// min, nibbles MIN(15, (int8)((x - min) / d + 0.5)).
void quantize_block_q4_1(const float* v, std::uint8_t* out) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < kQuantBlock; ++j) {
    if (v[j] < min) min = v[j];
    if (v[j] > max) max = v[j];
  }
  const float d = (max - min) / ((1 << 4) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t dh = f32_to_f16(d), mh = f32_to_f16(min);
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  for (int j = 0; j < kQuantBlock / 2; ++j)
    out[4 + j] = static_cast<std::uint8_t>(nibble_of((v[j] - min) * id + 0.5f) |
                                           (nibble_of((v[kQuantBlock / 2 + j] - min) * id + 0.5f) << 4));
}

}  // namespace

Status quantize_row(GgmlType type, const float* x, int k, void* blocks) {
  if (k < 1 || k % kQuantBlock != 0)
    return make_error(ErrorCode::invalid_argument,
                      "quantize_row: " + std::to_string(k) + " elements are not whole blocks of 32");
  auto* out = static_cast<std::uint8_t*>(blocks);
  const std::size_t block_bytes = gguf_block_bytes(type);
  for (int b = 0; b < k / kQuantBlock; ++b) {
    const float* v = x + static_cast<std::size_t>(b) * kQuantBlock;
    std::uint8_t* o = out + static_cast<std::size_t>(b) * block_bytes;
    switch (type) {
      case GgmlType::q8_0: {
        BlockQ8_0 q;
        q.d = f32_to_f16(quantize_block_q8(v, q.qs));
        std::memcpy(o, &q, sizeof q);
        break;
      }
      case GgmlType::q4_0: quantize_block_q4_0(v, o); break;
      case GgmlType::q4_1: quantize_block_q4_1(v, o); break;
      default:
        return make_error(ErrorCode::unsupported, "quantize_row: GGML " +
                                                      ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                      " (this build quantizes to Q8_0, Q4_0 and Q4_1)");
    }
  }
  return Status::ok_status();
}

const char* quant_kernel_name() { return cpu_has_avx2() ? "avx2" : "scalar"; }

Result<PackedQuantLinear> PackedQuantLinear::pack(GgmlType type, std::span<const std::uint8_t> blocks, int n, int k) {
  if (Status s = check_shape(type, blocks.size(), n, k); !s.ok()) return s.error();
  const int nb = k / kQuantBlock;
  const int panels = (n + kPanel - 1) / kPanel;
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  const std::size_t stride = block_stride(type);
  PackedQuantLinear out;
  out.type_ = type;
  out.n_ = n;
  out.k_ = k;
  out.bytes_ = static_cast<std::size_t>(panels) * nb * stride;
  out.data_ = allocate_aligned(out.bytes_);
  auto* base = static_cast<std::uint8_t*>(out.data_.get());
  std::memset(base, 0, out.bytes_);
  for (int p = 0; p < panels; ++p) {
    for (int b = 0; b < nb; ++b) {
      std::uint8_t* blk = base + (static_cast<std::size_t>(p) * nb + b) * stride;
      for (int c = 0; c < kPanel; ++c) {
        const int j = p * kPanel + c;
        if (j >= n) {
          // A padding column: zero scales (its result is never stored).
          continue;
        }
        const std::uint8_t* row = blocks.data() + static_cast<std::size_t>(j) * row_bytes;
        const float dw = gguf_half(type, row, b);
        std::memcpy(blk + static_cast<std::size_t>(c) * 4, &dw, 4);
        if (type == GgmlType::q4_1) {
          const float mw = gguf_half(type, row, b, 2);
          std::memcpy(blk + 32 + static_cast<std::size_t>(c) * 4, &mw, 4);
        }
        std::uint8_t* values = blk + values_offset(type);
        for (int e = 0; e < kQuantBlock; ++e) {
          const int value = gguf_value(type, row, b * kQuantBlock + e);
          if (type == GgmlType::q8_0) {
            values[(e / 4) * 32 + c * 4 + e % 4] = static_cast<std::uint8_t>(static_cast<std::int8_t>(value));
          } else {
            std::uint8_t& byte = values[(e / 8) * 32 + c * 4 + e % 4];
            byte = static_cast<std::uint8_t>((e % 8) < 4 ? ((byte & 0xF0) | value) : ((byte & 0x0F) | (value << 4)));
          }
        }
      }
    }
  }
  return out;
}

Status quant_linear(const float* x, int m, int x_stride, const PackedQuantLinear& w, float* y, int y_stride,
                    QuantKernel kernel) {
  const int n = w.out_features(), k = w.in_features();
  if (m < 0 || w.empty() || x_stride < k || y_stride < n)
    return make_error(ErrorCode::invalid_argument,
                      "quantized linear: m " + std::to_string(m) + ", x stride " + std::to_string(x_stride) +
                          ", y stride " + std::to_string(y_stride) + " for a [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] matrix");
  if (kernel == QuantKernel::avx2 && !cpu_has_avx2())
    return make_error(ErrorCode::unsupported, "quantized linear: the AVX2 kernel on a CPU without AVX2");
  if (m == 0) return {};
  const bool avx2 = kernel == QuantKernel::avx2 || (kernel == QuantKernel::automatic && cpu_has_avx2());
  const QuantizedRows xq = quantize_rows(x, m, x_stride, k);
  const int nb = k / kQuantBlock;
  const int panels = (n + kPanel - 1) / kPanel;
  const std::size_t panel_bytes = static_cast<std::size_t>(nb) * block_stride(w.type());
  const GgmlType t = w.type();
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; ++p) {
    const std::byte* panel = w.data() + static_cast<std::size_t>(p) * panel_bytes;
    const int cols = std::min(kPanel, n - p * kPanel);
    float* yp = y + static_cast<std::size_t>(p) * kPanel;
    if (!avx2)
      panel_scalar(t, panel, nb, xq, k, 0, m, yp, y_stride, cols);
    else if (t == GgmlType::q8_0)
      panel_rows_avx2<GgmlType::q8_0>(panel, nb, xq, k, m, yp, y_stride, cols);
    else if (t == GgmlType::q4_0)
      panel_rows_avx2<GgmlType::q4_0>(panel, nb, xq, k, m, yp, y_stride, cols);
    else
      panel_rows_avx2<GgmlType::q4_1>(panel, nb, xq, k, m, yp, y_stride, cols);
  }
  return {};
}

Status quant_linear_reference(const float* x, int m, int x_stride, GgmlType type, std::span<const std::uint8_t> blocks,
                              int n, int k, float* y, int y_stride) {
  if (Status s = check_shape(type, blocks.size(), n, k); !s.ok()) return s;
  const int nb = k / kQuantBlock;
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  // Q8_0 and Q4_0 take x as Q8_0, Q4_1 as Q8_1 (the same values and d,
  // plus s).
  std::vector<BlockQ8_1> xq(static_cast<std::size_t>(nb));
  for (int i = 0; i < m; ++i) {
    quantize_row_q8_1(x + static_cast<std::size_t>(i) * x_stride, k, xq.data());
    for (int j = 0; j < n; ++j) {
      const std::uint8_t* row = blocks.data() + static_cast<std::size_t>(j) * row_bytes;
      float sumf = 0.0f;
      for (int b = 0; b < nb; ++b) {
        const BlockQ8_1& bx = xq[static_cast<std::size_t>(b)];
        std::int32_t sumi = 0;
        if (type == GgmlType::q8_0) {
          for (int e = 0; e < kQuantBlock; ++e) sumi += gguf_value(type, row, b * kQuantBlock + e) * bx.qs[e];
        } else {
          // ggml_vec_dot_q4_{0,1}_q8_{0,1}: low nibbles with x[0, 16), high
          // with x[16, 32); Q4_0's minus 8.
          const int offset = type == GgmlType::q4_0 ? 8 : 0;
          std::int32_t sumi0 = 0, sumi1 = 0;
          for (int e = 0; e < 16; ++e) {
            sumi0 += (gguf_value(type, row, b * kQuantBlock + e) - offset) * bx.qs[e];
            sumi1 += (gguf_value(type, row, b * kQuantBlock + e + 16) - offset) * bx.qs[e + 16];
          }
          sumi = sumi0 + sumi1;
        }
        const float mw = type == GgmlType::q4_1 ? gguf_half(type, row, b, 2) : 0.0f;
        sumf = add_block(type, sumf, sumi, gguf_half(type, row, b), f16_to_f32(bx.d), mw, f16_to_f32(bx.s));
      }
      y[static_cast<std::size_t>(i) * y_stride + j] = sumf;
    }
  }
  return {};
}

}  // namespace shardline::kernels::cpu
