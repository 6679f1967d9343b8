#include "kernels/cpu/quant_linear.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/kernel_paths.hpp"
#include "kernels/cpu/quant_linear_k.hpp"

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

/// Elements per block of `t`: 32, or 256 for the K-quants.
[[nodiscard]] int block_elements(GgmlType t) { return kquant::is_k_quant(t) ? kQuantSuperBlock : kQuantBlock; }

[[nodiscard]] Status check_shape(GgmlType type, std::size_t have, int n, int k) {
  if (type != GgmlType::q8_0 && type != GgmlType::q4_0 && type != GgmlType::q4_1 && !kquant::is_k_quant(type))
    return make_error(ErrorCode::unsupported, "quantized linear: weights of type " +
                                                  ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                  " (Q8_0, Q4_0, Q4_1, Q4_K and Q6_K are kept quantized)");
  const int unit = block_elements(type);
  if (n < 1 || k < 1 || k % unit != 0)
    return make_error(ErrorCode::invalid_argument, "quantized linear: a [" + std::to_string(n) + ", " +
                                                       std::to_string(k) + "] " +
                                                       ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                       " matrix (k must be a positive multiple of " +
                                                       std::to_string(unit) + ")");
  const std::size_t need = static_cast<std::size_t>(n) * *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  if (have < need)
    return make_error(ErrorCode::invalid_argument, "quantized linear: " + std::to_string(have) + " bytes for a [" +
                                                       std::to_string(n) + ", " + std::to_string(k) + "] " +
                                                       ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                       " matrix, which needs " + std::to_string(need));
  return {};
}

float quantize_block_q8(const float* v, std::int8_t* qs);
float quantize_block_q8_avx2(const float* v, std::int8_t* qs);

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
  const bool avx2 = detail::cpu_has(detail::CpuFeatures::avx2);  // the same bits as scalar
  // Rows are independent: quantized in parallel, each the same bits as
  // quantize_row_q8_1 (d and s through F16, as the blocks store them).
#pragma omp parallel for schedule(static) if (m > 1)
  for (int i = 0; i < m; ++i) {
    for (int b = 0; b < nb; ++b) {
      const std::size_t at = static_cast<std::size_t>(i) * k + static_cast<std::size_t>(b) * kQuantBlock;
      std::int8_t* qs = out.q.data() + at;
      const float d = avx2 ? quantize_block_q8_avx2(x + static_cast<std::size_t>(i) * xs + b * kQuantBlock, qs)
                           : quantize_block_q8(x + static_cast<std::size_t>(i) * xs + b * kQuantBlock, qs);
      std::int32_t sum = 0;
      for (int j = 0; j < kQuantBlock; ++j) sum += qs[j];
      out.d[static_cast<std::size_t>(i) * nb + b] = f16_to_f32(f32_to_f16(d));
      out.sum[static_cast<std::size_t>(i) * nb + b] = sum;
      out.s[static_cast<std::size_t>(i) * nb + b] = f16_to_f32(f32_to_f16(static_cast<float>(sum) * d));
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
SHARDLINE_TARGET_AVX2 void panel_avx2(const std::byte* panel, int nb, const QuantizedRows& xq, int k,
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

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() (`__Y = __Y`)
// and warn that it may be used uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

/// The AVX512-VNNI kernel: two panels side by side (columns [0, 8) from
/// `panel0`, [8, 16) from `panel1`; the same panel twice for an odd last
/// one, whose upper half is never stored), the block integers with
/// vpdpbusd and the same per-element F32 chain as the others, 16 columns
/// per register. vpdpbusd multiplies unsigned bytes by signed ones: Q4's
/// nibbles are unsigned already; Q8_0's values are flipped to w + 128
/// (xor 0x80) and 128 x (the x block's sum) taken back out, exactly.
template <GgmlType T, int R>
SHARDLINE_TARGET_AVX512_VNNI void pair_avx512(const std::byte* panel0,
                                                                       const std::byte* panel1, int nb,
                                                                       const QuantizedRows& xq, int k, int i0,
                                                                       float* y, int ys, int cols) {
  constexpr std::size_t offset = T == GgmlType::q4_1 ? 64 : 32;
  constexpr std::size_t stride = offset + (T == GgmlType::q8_0 ? 256 : 128);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // 32 bytes of each panel at `at` into one register.
  const auto load_pair = [&](std::size_t at) SHARDLINE_TARGET_AVX512_VNNI {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(panel0 + at))),
        _mm256_load_si256(reinterpret_cast<const __m256i*>(panel1 + at)), 1);
  };
  const auto load_pair_ps = [&](std::size_t at) SHARDLINE_TARGET_AVX512_VNNI {
    return _mm512_castsi512_ps(load_pair(at));
  };
  const auto x_word = [](const std::int8_t* p) SHARDLINE_TARGET_AVX512_VNNI {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  };
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const std::int8_t* qx[R];
  for (int r = 0; r < R; ++r) qx[r] = xq.q.data() + static_cast<std::size_t>(i0 + r) * k;
  for (int b = 0; b < nb; ++b) {
    const std::size_t blk = static_cast<std::size_t>(b) * stride;
    __m512i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    if constexpr (T == GgmlType::q8_0) {
      for (int g = 0; g < 8; ++g) {
        const __m512i w = _mm512_xor_si512(load_pair(blk + offset + 32 * static_cast<std::size_t>(g)), flip);
        for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], w, x_word(qx[r] + b * kQuantBlock + 4 * g));
      }
    } else {
      for (int h = 0; h < 4; ++h) {
        const __m512i bytes = load_pair(blk + offset + 32 * static_cast<std::size_t>(h));
        const __m512i lo = _mm512_and_si512(bytes, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
        for (int r = 0; r < R; ++r) {
          isum[r] = _mm512_dpbusd_epi32(isum[r], lo, x_word(qx[r] + b * kQuantBlock + 8 * h));
          isum[r] = _mm512_dpbusd_epi32(isum[r], hi, x_word(qx[r] + b * kQuantBlock + 8 * h + 4));
        }
      }
    }
    // Q8_0: sum (w + 128) x - 128 sum x; Q4_0: sum n x - 8 sum x; exact.
    if constexpr (T != GgmlType::q4_1) {
      constexpr int kOffset = T == GgmlType::q8_0 ? 128 : 8;
      for (int r = 0; r < R; ++r)
        isum[r] = _mm512_sub_epi32(
            isum[r], _mm512_set1_epi32(kOffset * xq.sum[static_cast<std::size_t>(i0 + r) * nb + b]));
    }
    const __m512 dw = load_pair_ps(blk);
    for (int r = 0; r < R; ++r) {
      const std::size_t xb = static_cast<std::size_t>(i0 + r) * nb + b;
      const __m512 dx = _mm512_set1_ps(xq.d[xb]);
      const __m512 s = _mm512_cvtepi32_ps(isum[r]);
      __m512 term;
      if constexpr (T == GgmlType::q8_0) {
        term = _mm512_mul_ps(s, _mm512_mul_ps(dw, dx));
      } else if constexpr (T == GgmlType::q4_0) {
        term = _mm512_mul_ps(_mm512_mul_ps(s, dw), dx);
      } else {
        const __m512 mw = load_pair_ps(blk + 32);
        term = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dw, dx), s), _mm512_mul_ps(mw, _mm512_set1_ps(xq.s[xb])));
      }
      acc[r] = _mm512_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float out[2 * kPanel];
    _mm512_store_ps(out, acc[r]);
    std::memcpy(y + static_cast<std::size_t>(i0 + r) * ys, out, sizeof(float) * static_cast<std::size_t>(cols));
  }
}

#pragma GCC diagnostic pop

template <GgmlType T>
void pair_rows_avx512(const std::byte* panel0, const std::byte* panel1, int nb, const QuantizedRows& xq, int k,
                      int m, float* y, int ys, int cols) {
  constexpr int kPairRows = 4;
  int i = 0;
  for (; i + kPairRows <= m; i += kPairRows) pair_avx512<T, kPairRows>(panel0, panel1, nb, xq, k, i, y, ys, cols);
  for (; i < m; ++i) pair_avx512<T, 1>(panel0, panel1, nb, xq, k, i, y, ys, cols);
}

/// The paths, widest first; SHARDLINE_QUANT_KERNEL may name the automatic
/// one.
constexpr detail::KernelPaths<QuantKernel, 3> kPaths{
    "quantized linear",
    QuantKernel::automatic,
    "SHARDLINE_QUANT_KERNEL",
    {{{QuantKernel::avx512_vnni, "avx512_vnni", detail::CpuFeatures::avx512_vnni},
      {QuantKernel::avx2, "avx2", detail::CpuFeatures::avx2},
      {QuantKernel::scalar, "scalar", detail::CpuFeatures::none}}}};

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

/// quantize_block_q8 with AVX2, the same bits: the same multiply by 1 / d,
/// roundf as truncation plus one step away from zero where the dropped
/// fraction is at least a half (exact: no x + 0.5 rounding), a NaN (or an
/// infinity's 0 x inf) to 0, and NaN lanes never raise the maximum.
SHARDLINE_TARGET_AVX2 float quantize_block_q8_avx2(const float* v, std::int8_t* qs) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 x[4];
  __m256 amax = _mm256_setzero_ps();
  for (int g = 0; g < 4; ++g) {
    x[g] = _mm256_loadu_ps(v + 8 * g);
    // max(new, acc): a NaN in `new` returns acc, as std::max(acc, new) does.
    amax = _mm256_max_ps(_mm256_andnot_ps(sign_bit, x[g]), amax);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
  __m256i q[4];
  for (int g = 0; g < 4; ++g) {
    const __m256 p = _mm256_mul_ps(x[g], vid);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(p, t));
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ),
                                      _mm256_or_ps(one, _mm256_and_ps(sign_bit, p)));
    __m256 r = _mm256_add_ps(t, step);
    r = _mm256_andnot_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q), r);  // NaN -> 0
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    q[g] = _mm256_cvttps_epi32(r);
  }
  // 32 int32 -> 32 int8 in order (packs work per 128-bit lane: permute back).
  const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i b = _mm256_packs_epi16(w01, w23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
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

const char* quant_kernel_name(GgmlType /*type*/) { return kPaths.name(QuantKernel::automatic); }

bool quant_kernel_supported(QuantKernel kernel) { return kPaths.supported(kernel); }

namespace {

/// Panels of kPanel columns, each nb blocks of `stride` bytes.
[[nodiscard]] std::size_t packed_size(GgmlType type, int n, int k) {
  const std::size_t stride = kquant::is_k_quant(type) ? kquant::packed_block_bytes(type) : block_stride(type);
  const std::size_t panels = static_cast<std::size_t>((n + kPanel - 1) / kPanel);
  return panels * static_cast<std::size_t>(k / block_elements(type)) * stride;
}

}  // namespace

Result<std::size_t> PackedQuantLinear::packed_bytes(GgmlType type, int n, int k) {
  const std::size_t row_bytes = ggml_row_bytes(static_cast<std::uint32_t>(type), k).value_or(0);
  if (Status s = check_shape(type, row_bytes * static_cast<std::size_t>(std::max(n, 0)), n, k); !s.ok())
    return s.error();
  return packed_size(type, n, k);
}

Result<PackedQuantLinear> PackedQuantLinear::view(const void* data, GgmlType type, int n, int k) {
  auto bytes = packed_bytes(type, n, k);
  if (!bytes.ok()) return bytes.error();
  if (reinterpret_cast<std::uintptr_t>(data) % 64 != 0)
    return make_error(ErrorCode::invalid_argument, "quantized linear: a view's data must be 64-byte aligned");
  PackedQuantLinear out;
  out.type_ = type;
  out.n_ = n;
  out.k_ = k;
  out.bytes_ = *bytes;
  out.view_ = static_cast<const std::byte*>(data);
  return out;
}

Result<PackedQuantLinear> PackedQuantLinear::pack(GgmlType type, std::span<const std::uint8_t> blocks, int n, int k) {
  if (Status s = check_shape(type, blocks.size(), n, k); !s.ok()) return s.error();
  const bool k_quant = kquant::is_k_quant(type);
  const int nb = k / block_elements(type);
  const int panels = (n + kPanel - 1) / kPanel;
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  const std::size_t stride = k_quant ? kquant::packed_block_bytes(type) : block_stride(type);
  PackedQuantLinear out;
  out.type_ = type;
  out.n_ = n;
  out.k_ = k;
  out.bytes_ = packed_size(type, n, k);
  out.data_ = allocate_aligned(out.bytes_);
  auto* base = static_cast<std::uint8_t*>(out.data_.get());
  std::memset(base, 0, out.bytes_);
  if (k_quant) {
    // Padding columns keep zero scales (their results are never stored).
    const std::size_t gguf_bytes = row_bytes / static_cast<std::size_t>(nb);
    for (int j = 0; j < n; ++j)
      for (int b = 0; b < nb; ++b)
        kquant::pack_column_block(type, blocks.data() + static_cast<std::size_t>(j) * row_bytes + b * gguf_bytes,
                                  j % kPanel, base + (static_cast<std::size_t>(j / kPanel) * nb + b) * stride);
    return out;
  }
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

namespace {
/// Panels (or panel pairs) a thread takes at a time out of `count`: about
/// eight chunks per thread, so that a thread slowed by another process on
/// its core hands its share to the others (ggml's chunked mul_mat does the
/// same). Which thread computes a panel never changes its bits.
[[nodiscard]] int panel_chunk(int count) {
  return std::max(1, count / (8 * std::max(1, omp_get_max_threads())));
}
}  // namespace

Status quant_linear(const float* x, int m, int x_stride, const PackedQuantLinear& w, float* y, int y_stride,
                    QuantKernel kernel) {
  const int n = w.out_features(), k = w.in_features();
  if (m < 0 || w.empty() || x_stride < k || y_stride < n)
    return make_error(ErrorCode::invalid_argument,
                      "quantized linear: m " + std::to_string(m) + ", x stride " + std::to_string(x_stride) +
                          ", y stride " + std::to_string(y_stride) + " for a [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] matrix");
  if (!kPaths.supported(kernel))
    return make_error(ErrorCode::unsupported,
                      std::string("quantized linear: the ") + kPaths.name(kernel) + " kernel on a CPU without it");
  if (m == 0) return {};
  const QuantKernel chosen = kPaths.resolve(kernel);
  const GgmlType t = w.type();
  const int panels = (n + kPanel - 1) / kPanel;
  if (kquant::is_k_quant(t)) {
    const kquant::Rows xq = kquant::quantize_rows(t, x, m, x_stride, k);
    const int nb = k / kQuantSuperBlock;
    const std::size_t panel_bytes = static_cast<std::size_t>(nb) * kquant::packed_block_bytes(t);
    if (chosen == QuantKernel::avx512_vnni) {
      const int pairs = (panels + 1) / 2;
      const int chunk = panel_chunk(pairs);
#pragma omp parallel for schedule(dynamic, chunk)
      for (int q = 0; q < pairs; ++q)
        kquant::panel_pair_avx512(t, w.data() + static_cast<std::size_t>(2 * q) * panel_bytes,
                                  w.data() + static_cast<std::size_t>(std::min(2 * q + 1, panels - 1)) * panel_bytes,
                                  nb, xq, k, m, y + static_cast<std::size_t>(2 * q) * kPanel, y_stride,
                                  std::min(2 * kPanel, n - 2 * q * kPanel));
      return {};
    }
    const int chunk = panel_chunk(panels);
#pragma omp parallel for schedule(dynamic, chunk)
    for (int p = 0; p < panels; ++p)
      kquant::panel(t, chosen != QuantKernel::scalar, w.data() + static_cast<std::size_t>(p) * panel_bytes, nb, xq,
                    k, m, y + static_cast<std::size_t>(p) * kPanel, y_stride, std::min(kPanel, n - p * kPanel));
    return {};
  }
  const QuantizedRows xq = quantize_rows(x, m, x_stride, k);
  const int nb = k / kQuantBlock;
  const std::size_t panel_bytes = static_cast<std::size_t>(nb) * block_stride(w.type());
  if (chosen == QuantKernel::avx512_vnni) {
    const int pairs = (panels + 1) / 2;
    const int chunk = panel_chunk(pairs);
#pragma omp parallel for schedule(dynamic, chunk)
    for (int q = 0; q < pairs; ++q) {
      const std::byte* panel0 = w.data() + static_cast<std::size_t>(2 * q) * panel_bytes;
      const std::byte* panel1 = w.data() + static_cast<std::size_t>(std::min(2 * q + 1, panels - 1)) * panel_bytes;
      const int cols = std::min(2 * kPanel, n - 2 * q * kPanel);
      float* yp = y + static_cast<std::size_t>(2 * q) * kPanel;
      if (t == GgmlType::q8_0)
        pair_rows_avx512<GgmlType::q8_0>(panel0, panel1, nb, xq, k, m, yp, y_stride, cols);
      else if (t == GgmlType::q4_0)
        pair_rows_avx512<GgmlType::q4_0>(panel0, panel1, nb, xq, k, m, yp, y_stride, cols);
      else
        pair_rows_avx512<GgmlType::q4_1>(panel0, panel1, nb, xq, k, m, yp, y_stride, cols);
    }
    return {};
  }
  const int chunk = panel_chunk(panels);
#pragma omp parallel for schedule(dynamic, chunk)
  for (int p = 0; p < panels; ++p) {
    const std::byte* panel = w.data() + static_cast<std::size_t>(p) * panel_bytes;
    const int cols = std::min(kPanel, n - p * kPanel);
    float* yp = y + static_cast<std::size_t>(p) * kPanel;
    if (chosen == QuantKernel::scalar)
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
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  if (kquant::is_k_quant(type)) {
    std::vector<BlockQ8_K> xq(static_cast<std::size_t>(k / kQuantSuperBlock));
    for (int i = 0; i < m; ++i) {
      quantize_row_q8_k(x + static_cast<std::size_t>(i) * x_stride, k, xq.data(), QuantKernel::scalar);
      for (int j = 0; j < n; ++j)
        y[static_cast<std::size_t>(i) * y_stride + j] =
            kquant::reference_row(type, blocks.data() + static_cast<std::size_t>(j) * row_bytes, xq.data(), k);
    }
    return {};
  }
  const int nb = k / kQuantBlock;
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
