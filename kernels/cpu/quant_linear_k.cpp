#include "kernels/cpu/quant_linear_k.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.hpp"

// Compiled with -ffp-contract=off (kernels/CMakeLists.txt): the float
// steps are the file comment's, no a*b+c fused into an FMA.

namespace shardline::kernels::cpu {

namespace {

/// ggml's nearest_int: round half to even through the float's mantissa
/// (|v| <= 4194303).
[[nodiscard]] int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  std::int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

}  // namespace

namespace {

/// quantize_row_q8_K_ref for one block (the header's definition).
void quantize_block_q8_k(const float* v, BlockQ8_K& out) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQuantSuperBlock; ++j)
    if (std::fabs(v[j]) > amax) {
      amax = std::fabs(v[j]);
      max = v[j];
    }
  if (amax == 0.0f) {
    out = BlockQ8_K{};
    return;
  }
  const float iscale = -127.0f / max;
  for (int j = 0; j < kQuantSuperBlock; ++j) {
    const float s = iscale * v[j];
    // Finite x gives |s| <= 127; a NaN (or an infinity's 0 x inf)
    // becomes 0 instead of garbage bits.
    out.qs[j] = std::isnan(s) ? 0 : static_cast<std::int8_t>(std::min(127, std::max(-128, nearest_int(s))));
  }
  for (int j = 0; j < kQuantSuperBlock / 16; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += out.qs[16 * j + i];
    out.bsums[j] = static_cast<std::int16_t>(sum);
  }
  out.d = 1.0f / iscale;
}

/// quantize_row_q8_k for one block with AVX2, the same bits: the same
/// first value of largest magnitude (NaN lanes never raise it), the same
/// multiply and nearest_int add, a NaN product to 0.
SHARDLINE_TARGET_AVX2 void quantize_block_q8_k_avx2(const float* v, BlockQ8_K& out) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 amax8 = _mm256_setzero_ps();
  for (int j = 0; j < kQuantSuperBlock; j += 8)
    amax8 = _mm256_max_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(v + j)), amax8);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  if (amax == 0.0f) {
    out = BlockQ8_K{};
    return;
  }
  int first = 0;
  while (!(std::fabs(v[first]) == amax)) ++first;
  const float iscale = -127.0f / v[first];
  const __m256 scale = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
  const __m256i mantissa = _mm256_set1_epi32(0x007fffff), offset = _mm256_set1_epi32(0x00400000);
  const __m256i lo = _mm256_set1_epi32(-128), hi = _mm256_set1_epi32(127);
  for (int j = 0; j < kQuantSuperBlock; j += 32) {
    __m256i q[4];
    for (int g = 0; g < 4; ++g) {
      __m256 s = _mm256_mul_ps(scale, _mm256_loadu_ps(v + j + 8 * g));
      s = _mm256_andnot_ps(_mm256_cmp_ps(s, s, _CMP_UNORD_Q), s);  // NaN -> 0
      const __m256i bits = _mm256_castps_si256(_mm256_add_ps(s, magic));
      q[g] = _mm256_sub_epi32(_mm256_and_si256(bits, mantissa), offset);
      q[g] = _mm256_min_epi32(_mm256_max_epi32(q[g], lo), hi);
    }
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + j),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  for (int j = 0; j < kQuantSuperBlock / 16; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += out.qs[16 * j + i];
    out.bsums[j] = static_cast<std::int16_t>(sum);
  }
  out.d = 1.0f / iscale;
}

}  // namespace

void quantize_row_q8_k(const float* x, int k, BlockQ8_K* y, QuantKernel kernel) {
  const bool avx2 = kernel != QuantKernel::scalar && quant_kernel_supported(QuantKernel::avx2);
  for (int b = 0; b < k / kQuantSuperBlock; ++b) {
    const float* v = x + static_cast<std::size_t>(b) * kQuantSuperBlock;
    if (avx2)
      quantize_block_q8_k_avx2(v, y[b]);
    else
      quantize_block_q8_k(v, y[b]);
  }
}

namespace kquant {
namespace {

constexpr int kPanel = 8;   // output columns per panel (as quant_linear.cpp)
constexpr int kRows = 4;    // rows of x per AVX2 register tile
constexpr int kGroup = 32;  // elements per group of packed values

/// Offsets in a packed super-block (see the header).
constexpr std::size_t kQ4kScales = 64, kQ4kMins = 128, kQ4kValues = 192, kQ4kGroup = 128;
constexpr std::size_t kQ6kScales = 32, kQ6kValues = 160, kQ6kGroup = 192;

[[nodiscard]] float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

/// Q4_K: sub-block j's 6-bit scale and minimum (ggml's get_scale_min_k4).
void q4k_scale_min(const std::uint8_t* block, int j, int& sc, int& m) {
  const std::uint8_t* q = block + 4;
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// Q4_K: element e's nibble (0..15). Chunks of 64: low nibbles of 32 bytes
/// are elements 0..31, high nibbles 32..63.
[[nodiscard]] int q4k_value(const std::uint8_t* block, int e) {
  const int chunk = e / 64, l = e % 64;
  const std::uint8_t byte = block[16 + 32 * chunk + l % 32];
  return l < 32 ? (byte & 0x0F) : (byte >> 4);
}

/// Q6_K: element e's value (0..63; the weight is d sc (value - 32)).
[[nodiscard]] int q6k_value(const std::uint8_t* block, int e) {
  const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
  const std::uint8_t* ql = block + 64 * half;
  const std::uint8_t* qh = block + 128 + 32 * half;
  const std::uint8_t low = quarter % 2 == 0 ? ql[l] : ql[l + 32];
  const int low4 = quarter < 2 ? (low & 0x0F) : (low >> 4);
  return low4 | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

[[nodiscard]] int q6k_scale(const std::uint8_t* block, int j) { return static_cast<std::int8_t>(block[192 + j]); }

/// Places column c's value `v` (low 4 bits) of element e (0..31) of a
/// group in Q4_0's packed layout (128 bytes).
void put_nibble(std::uint8_t* values, int c, int e, int v) {
  std::uint8_t& byte = values[(e / 8) * 32 + c * 4 + e % 4];
  byte = static_cast<std::uint8_t>((e % 8) < 4 ? ((byte & 0xF0) | v) : ((byte & 0x0F) | (v << 4)));
}

[[nodiscard]] int get_nibble(const std::uint8_t* values, int c, int e) {
  const std::uint8_t byte = values[(e / 8) * 32 + c * 4 + e % 4];
  return (e % 8) < 4 ? (byte & 0x0F) : (byte >> 4);
}

/// Q6_K's high 2 bits of element e of a group (64 bytes after its nibbles).
void put_high(std::uint8_t* high, int c, int e, int v) {
  std::uint8_t& byte = high[((e % 8) < 4 ? 0 : 32) + c * 4 + e % 4];
  byte = static_cast<std::uint8_t>(byte | (v << (2 * (e / 8))));
}

[[nodiscard]] int get_high(const std::uint8_t* high, int c, int e) {
  return (high[((e % 8) < 4 ? 0 : 32) + c * 4 + e % 4] >> (2 * (e / 8))) & 3;
}

/// The float step of one super-block (the header's).
[[nodiscard]] inline float add_block(GgmlType t, float acc, std::int32_t isum, std::int32_t imin, float dw, float dmin,
                                     float dx) {
  if (t == GgmlType::q4_k)
    return acc + ((dw * dx) * static_cast<float>(isum) - (dmin * dx) * static_cast<float>(imin));
  return acc + (dw * dx) * static_cast<float>(isum);
}

/// The portable kernel on the packed layout.
void panel_scalar(GgmlType t, const std::byte* panel, int nb, const Rows& xq, int k, int m, float* y, int ys,
                  int cols) {
  const std::size_t stride = packed_block_bytes(t);
  for (int i = 0; i < m; ++i) {
    float acc[kPanel] = {};
    for (int b = 0; b < nb; ++b) {
      const auto* blk = reinterpret_cast<const std::uint8_t*>(panel) + static_cast<std::size_t>(b) * stride;
      const std::int8_t* qx = xq.q.data() + static_cast<std::size_t>(i) * k + static_cast<std::size_t>(b) * kSuperBlock;
      const float dx = xq.d[static_cast<std::size_t>(i) * nb + b];
      for (int c = 0; c < kPanel; ++c) {
        std::int32_t isum = 0, imin = 0;
        float dw, dmin = 0.0f;
        std::memcpy(&dw, blk + 4 * c, 4);
        if (t == GgmlType::q4_k) {
          std::memcpy(&dmin, blk + 32 + 4 * c, 4);
          for (int g = 0; g < 8; ++g) {
            const int sc = blk[kQ4kScales + 16 * (g / 2) + 2 * c + g % 2];
            const int mn = blk[kQ4kMins + 16 * (g / 2) + 2 * c + g % 2];
            const std::uint8_t* values = blk + kQ4kValues + kQ4kGroup * g;
            std::int32_t dot = 0, xsum = 0;
            for (int e = 0; e < kGroup; ++e) {
              dot += get_nibble(values, c, e) * qx[kGroup * g + e];
              xsum += qx[kGroup * g + e];
            }
            isum += sc * dot;
            imin += mn * xsum;
          }
        } else {
          for (int g = 0; g < 8; ++g) {
            const std::uint8_t* values = blk + kQ6kValues + kQ6kGroup * g;
            for (int half = 0; half < 2; ++half) {
              const int sc = static_cast<std::int8_t>(blk[kQ6kScales + 16 * g + 2 * c + half]);
              std::int32_t dot = 0;
              for (int e = 16 * half; e < 16 * half + 16; ++e)
                dot += ((get_nibble(values, c, e) | (get_high(values + 128, c, e) << 4)) - 32) * qx[kGroup * g + e];
              isum += sc * dot;
            }
          }
        }
        acc[c] = add_block(t, acc[c], isum, imin, dw, dmin, dx);
      }
    }
    std::memcpy(y + static_cast<std::size_t>(i) * ys, acc, sizeof(float) * static_cast<std::size_t>(cols));
  }
}

/// The AVX2 kernel: R rows x 8 columns. Each 4-element product group is
/// one vpmaddubsw (unsigned values x signed x, pairs summed to 16 bits:
/// at most 2 x 63 x 127, and two of them added, 32,004, no overflow), and
/// vpmaddwd by the column's sub-block scale sums pairs into 32 bits.
template <GgmlType T, int R>
SHARDLINE_TARGET_AVX2 void panel_avx2(const std::byte* panel, int nb, const Rows& xq, int k, int i0,
                                                float* y, int ys, int cols) {
  constexpr std::size_t stride = T == GgmlType::q4_k ? 1216 : 1696;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // vpshufb patterns copying each 32-bit lane's first (second) 16-bit half
  // into both halves: (sc_{2p}, sc_{2p+1}) -> (sc_{2p}, sc_{2p}).
  const __m256i dup_first = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,  //
                                             0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i dup_second = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,  //
                                              2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  const auto x_word = [](const std::int8_t* p) SHARDLINE_TARGET_AVX2 {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  };
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const auto* blk = reinterpret_cast<const std::uint8_t*>(panel) + static_cast<std::size_t>(b) * stride;
    const std::int8_t* qx[R];
    const std::int32_t* pairs[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = xq.q.data() + static_cast<std::size_t>(i0 + r) * k + static_cast<std::size_t>(b) * kSuperBlock;
      pairs[r] = xq.pairs.data() + (static_cast<std::size_t>(i0 + r) * nb + b) * xq.pairs_per_block;
    }
    __m256i isum[R], ioff[R];
    for (int r = 0; r < R; ++r) isum[r] = ioff[r] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      __m256i scale[2];  // the scale of elements 0..15 and 16..31 of the group, as 16-bit pairs
      const std::uint8_t* values;
      __m256i high_lo = _mm256_setzero_si256(), high_hi = _mm256_setzero_si256();
      if constexpr (T == GgmlType::q4_k) {
        const __m256i sc = _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4kScales + 16 * (g / 2))));
        scale[0] = scale[1] = _mm256_shuffle_epi8(sc, g % 2 == 0 ? dup_first : dup_second);
        if (g % 2 == 0) {
          // imin += m_{2p} xsum_{2p} + m_{2p+1} xsum_{2p+1}
          const __m256i mn = _mm256_cvtepu8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4kMins + 16 * (g / 2))));
          for (int r = 0; r < R; ++r)
            ioff[r] = _mm256_add_epi32(ioff[r], _mm256_madd_epi16(mn, _mm256_set1_epi32(pairs[r][g / 2])));
        }
        values = blk + kQ4kValues + kQ4kGroup * g;
      } else {
        const __m256i sc =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ6kScales + 16 * g)));
        scale[0] = _mm256_shuffle_epi8(sc, dup_first);
        scale[1] = _mm256_shuffle_epi8(sc, dup_second);
        // ioff += sc_{2g} xsum_{2g} + sc_{2g+1} xsum_{2g+1} (taken x 32 below)
        for (int r = 0; r < R; ++r)
          ioff[r] = _mm256_add_epi32(ioff[r], _mm256_madd_epi16(sc, _mm256_set1_epi32(pairs[r][g])));
        values = blk + kQ6kValues + kQ6kGroup * g;
        high_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(values + 128));
        high_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(values + 160));
      }
      for (int h = 0; h < 4; ++h) {
        const __m256i bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(values + 32 * h));
        __m256i lo = _mm256_and_si256(bytes, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
        if constexpr (T == GgmlType::q6_k) {
          // Bits 2h..2h+1 of each byte to bits 4..5 (16-bit shifts: the mask
          // keeps only bits that came from the same byte).
          const __m256i bits45 = _mm256_set1_epi8(0x30);
          const auto to45 = [&](__m256i v) SHARDLINE_TARGET_AVX2 {
            return _mm256_and_si256(h < 2 ? _mm256_slli_epi16(v, 4 - 2 * h) : _mm256_srli_epi16(v, 2 * h - 4), bits45);
          };
          lo = _mm256_or_si256(lo, to45(high_lo));
          hi = _mm256_or_si256(hi, to45(high_hi));
        }
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_word(qx[r] + kGroup * g + 8 * h)),
                                             _mm256_maddubs_epi16(hi, x_word(qx[r] + kGroup * g + 8 * h + 4)));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scale[h / 2]));
        }
      }
    }
    const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(blk));
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(xq.d[static_cast<std::size_t>(i0 + r) * nb + b]);
      if constexpr (T == GgmlType::q4_k) {
        const __m256 dmin = _mm256_load_ps(reinterpret_cast<const float*>(blk + 32));
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[r]));
        const __m256 u = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(ioff[r]));
        acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(t, u));
      } else {
        // sum sc (q - 32) x = sum sc q x - 32 sum sc xsum, exactly.
        const __m256i exact = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(ioff[r], 5));
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(exact)));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kPanel];
    _mm256_store_ps(out, acc[r]);
    std::memcpy(y + static_cast<std::size_t>(i0 + r) * ys, out, sizeof(float) * static_cast<std::size_t>(cols));
  }
}

template <GgmlType T>
void panel_rows_avx2(const std::byte* panel, int nb, const Rows& xq, int k, int m, float* y, int ys, int cols) {
  int i = 0;
  for (; i + kRows <= m; i += kRows) panel_avx2<T, kRows>(panel, nb, xq, k, i, y, ys, cols);
  for (; i < m; ++i) panel_avx2<T, 1>(panel, nb, xq, k, i, y, ys, cols);
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and warn
// that it may be used uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

/// The AVX512-VNNI kernel: panel_avx2's arithmetic on two panels side by
/// side (columns [0, 8) from `panel0`, [8, 16) from `panel1`; the same panel
/// twice for an odd last one, whose upper half is never stored), 16 columns
/// per register, with vpdpwssd adding the scale-weighted pairs into 32 bits
/// (vpmaddwd + vpaddd in one).
template <GgmlType T, int R>
SHARDLINE_TARGET_AVX512_VNNI void pair_avx512(const std::byte* panel0,
                                                                       const std::byte* panel1, int nb,
                                                                       const Rows& xq, int k, int i0, float* y,
                                                                       int ys, int cols) {
  constexpr std::size_t stride = T == GgmlType::q4_k ? 1216 : 1696;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // panel_avx2's vpshufb patterns, in each 128-bit lane.
  alignas(64) static constexpr std::uint8_t kDup[2][64] = {
      {0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
       0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13},
      {2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
       2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15}};
  const __m512i dup_first = _mm512_load_si512(kDup[0]);
  const __m512i dup_second = _mm512_load_si512(kDup[1]);
  const auto* base0 = reinterpret_cast<const std::uint8_t*>(panel0);
  const auto* base1 = reinterpret_cast<const std::uint8_t*>(panel1);
  // 32 bytes of each panel at `at` into one register.
  const auto load_pair = [&](std::size_t at) SHARDLINE_TARGET_AVX512_VNNI {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(base0 + at))),
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(base1 + at)), 1);
  };
  // 16 bytes of each panel at `at`, widened to 16-bit lanes (signed or not).
  const auto widen_pair = [&](std::size_t at, bool is_signed) SHARDLINE_TARGET_AVX512_VNNI {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base0 + at));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base1 + at));
    return _mm512_inserti64x4(_mm512_castsi256_si512(is_signed ? _mm256_cvtepi8_epi16(a) : _mm256_cvtepu8_epi16(a)),
                              is_signed ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b), 1);
  };
  const auto x_word = [](const std::int8_t* p) SHARDLINE_TARGET_AVX512_VNNI {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  };
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const std::size_t blk = static_cast<std::size_t>(b) * stride;
    const std::int8_t* qx[R];
    const std::int32_t* pairs[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = xq.q.data() + static_cast<std::size_t>(i0 + r) * k + static_cast<std::size_t>(b) * kSuperBlock;
      pairs[r] = xq.pairs.data() + (static_cast<std::size_t>(i0 + r) * nb + b) * xq.pairs_per_block;
    }
    __m512i isum[R], ioff[R];
    for (int r = 0; r < R; ++r) isum[r] = ioff[r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      __m512i scale[2];
      std::size_t values;
      __m512i high_lo = _mm512_setzero_si512(), high_hi = _mm512_setzero_si512();
      if constexpr (T == GgmlType::q4_k) {
        const __m512i sc = widen_pair(blk + kQ4kScales + 16 * (g / 2), false);
        scale[0] = scale[1] = _mm512_shuffle_epi8(sc, g % 2 == 0 ? dup_first : dup_second);
        if (g % 2 == 0) {
          const __m512i mn = widen_pair(blk + kQ4kMins + 16 * (g / 2), false);
          for (int r = 0; r < R; ++r) ioff[r] = _mm512_dpwssd_epi32(ioff[r], mn, _mm512_set1_epi32(pairs[r][g / 2]));
        }
        values = blk + kQ4kValues + kQ4kGroup * g;
      } else {
        const __m512i sc = widen_pair(blk + kQ6kScales + 16 * g, true);
        scale[0] = _mm512_shuffle_epi8(sc, dup_first);
        scale[1] = _mm512_shuffle_epi8(sc, dup_second);
        for (int r = 0; r < R; ++r) ioff[r] = _mm512_dpwssd_epi32(ioff[r], sc, _mm512_set1_epi32(pairs[r][g]));
        values = blk + kQ6kValues + kQ6kGroup * g;
        high_lo = load_pair(values + 128);
        high_hi = load_pair(values + 160);
      }
      for (int h = 0; h < 4; ++h) {
        const __m512i bytes = load_pair(values + 32 * static_cast<std::size_t>(h));
        __m512i lo = _mm512_and_si512(bytes, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
        if constexpr (T == GgmlType::q6_k) {
          const __m512i bits45 = _mm512_set1_epi8(0x30);
          const auto to45 = [&](__m512i v) SHARDLINE_TARGET_AVX512_VNNI {
            return _mm512_and_si512(h < 2 ? _mm512_slli_epi16(v, 4 - 2 * h) : _mm512_srli_epi16(v, 2 * h - 4), bits45);
          };
          lo = _mm512_or_si512(lo, to45(high_lo));
          hi = _mm512_or_si512(hi, to45(high_hi));
        }
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(lo, x_word(qx[r] + kGroup * g + 8 * h)),
                                             _mm512_maddubs_epi16(hi, x_word(qx[r] + kGroup * g + 8 * h + 4)));
          isum[r] = _mm512_dpwssd_epi32(isum[r], p, scale[h / 2]);
        }
      }
    }
    const __m512 dw = _mm512_castsi512_ps(load_pair(blk));
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(xq.d[static_cast<std::size_t>(i0 + r) * nb + b]);
      if constexpr (T == GgmlType::q4_k) {
        const __m512 dmin = _mm512_castsi512_ps(load_pair(blk + 32));
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[r]));
        const __m512 u = _mm512_mul_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(ioff[r]));
        acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(t, u));
      } else {
        const __m512i exact = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(ioff[r], 5));
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(exact)));
      }
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
void pair_rows_avx512(const std::byte* panel0, const std::byte* panel1, int nb, const Rows& xq, int k, int m, float* y,
                      int ys, int cols) {
  int i = 0;
  for (; i + kRows <= m; i += kRows) pair_avx512<T, kRows>(panel0, panel1, nb, xq, k, i, y, ys, cols);
  for (; i < m; ++i) pair_avx512<T, 1>(panel0, panel1, nb, xq, k, i, y, ys, cols);
}

}  // namespace

bool is_k_quant(GgmlType t) { return t == GgmlType::q4_k || t == GgmlType::q6_k; }

std::size_t packed_block_bytes(GgmlType t) { return t == GgmlType::q4_k ? 1216 : 1696; }

void pack_column_block(GgmlType t, const std::uint8_t* block, int c, std::uint8_t* packed) {
  if (t == GgmlType::q4_k) {
    const float d = half_at(block), dmin = half_at(block + 2);
    std::memcpy(packed + 4 * c, &d, 4);
    std::memcpy(packed + 32 + 4 * c, &dmin, 4);
    for (int g = 0; g < 8; ++g) {
      int sc, m;
      q4k_scale_min(block, g, sc, m);
      packed[kQ4kScales + 16 * (g / 2) + 2 * c + g % 2] = static_cast<std::uint8_t>(sc);
      packed[kQ4kMins + 16 * (g / 2) + 2 * c + g % 2] = static_cast<std::uint8_t>(m);
      for (int e = 0; e < kGroup; ++e) put_nibble(packed + kQ4kValues + kQ4kGroup * g, c, e, q4k_value(block, kGroup * g + e));
    }
    return;
  }
  const float d = half_at(block + 208);
  std::memcpy(packed + 4 * c, &d, 4);
  for (int j = 0; j < 16; ++j) packed[kQ6kScales + 16 * (j / 2) + 2 * c + j % 2] = block[192 + j];
  for (int g = 0; g < 8; ++g) {
    std::uint8_t* values = packed + kQ6kValues + kQ6kGroup * g;
    for (int e = 0; e < kGroup; ++e) {
      const int v = q6k_value(block, kGroup * g + e);
      put_nibble(values, c, e, v & 0x0F);
      put_high(values + 128, c, e, v >> 4);
    }
  }
}

Rows quantize_rows(GgmlType t, const float* x, int m, int x_stride, int k) {
  const int nb = k / kSuperBlock;
  Rows out;
  out.pairs_per_block = t == GgmlType::q4_k ? 4 : 8;
  out.q.resize(static_cast<std::size_t>(m) * k);
  out.d.resize(static_cast<std::size_t>(m) * nb);
  out.pairs.resize(static_cast<std::size_t>(m) * nb * out.pairs_per_block);
  // Rows are independent: quantized in parallel, each the same bits.
#pragma omp parallel for schedule(static) if (m > 1)
  for (int i = 0; i < m; ++i) {
    for (int b = 0; b < nb; ++b) {
      BlockQ8_K blk;
      quantize_row_q8_k(x + static_cast<std::size_t>(i) * x_stride + static_cast<std::size_t>(b) * kSuperBlock,
                        kSuperBlock, &blk);
      std::memcpy(out.q.data() + static_cast<std::size_t>(i) * k + static_cast<std::size_t>(b) * kSuperBlock, blk.qs,
                  kSuperBlock);
      out.d[static_cast<std::size_t>(i) * nb + b] = blk.d;
      std::int32_t* words = out.pairs.data() + (static_cast<std::size_t>(i) * nb + b) * out.pairs_per_block;
      for (int p = 0; p < out.pairs_per_block; ++p) {
        // Sums over sub-blocks of 32 (Q4_K: two bsums each, at most 4,064)
        // or of 16 (Q6_K): both fit 16 bits.
        const int per = t == GgmlType::q4_k ? 2 : 1;
        int s0 = 0, s1 = 0;
        for (int j = 0; j < per; ++j) {
          s0 += blk.bsums[per * (2 * p) + j];
          s1 += blk.bsums[per * (2 * p + 1) + j];
        }
        words[p] = static_cast<std::int32_t>((static_cast<std::uint32_t>(s0) & 0xFFFFu) |
                                             (static_cast<std::uint32_t>(s1) << 16));
      }
    }
  }
  return out;
}

void panel(GgmlType t, bool avx2, const std::byte* panel, int nb, const Rows& xq, int k, int m, float* y, int y_stride,
           int cols) {
  if (!avx2)
    panel_scalar(t, panel, nb, xq, k, m, y, y_stride, cols);
  else if (t == GgmlType::q4_k)
    panel_rows_avx2<GgmlType::q4_k>(panel, nb, xq, k, m, y, y_stride, cols);
  else
    panel_rows_avx2<GgmlType::q6_k>(panel, nb, xq, k, m, y, y_stride, cols);
}

void panel_pair_avx512(GgmlType t, const std::byte* panel0, const std::byte* panel1, int nb, const Rows& xq, int k,
                       int m, float* y, int y_stride, int cols) {
  if (t == GgmlType::q4_k)
    pair_rows_avx512<GgmlType::q4_k>(panel0, panel1, nb, xq, k, m, y, y_stride, cols);
  else
    pair_rows_avx512<GgmlType::q6_k>(panel0, panel1, nb, xq, k, m, y, y_stride, cols);
}

float reference_row(GgmlType t, const std::uint8_t* w_row, const BlockQ8_K* x, int k) {
  const std::size_t block_bytes = t == GgmlType::q4_k ? 144 : 210;
  float acc = 0.0f;
  for (int b = 0; b < k / kSuperBlock; ++b) {
    const std::uint8_t* block = w_row + static_cast<std::size_t>(b) * block_bytes;
    const BlockQ8_K& xb = x[b];
    std::int32_t isum = 0, imin = 0;
    if (t == GgmlType::q4_k) {
      for (int g = 0; g < 8; ++g) {
        int sc, mn;
        q4k_scale_min(block, g, sc, mn);
        std::int32_t dot = 0;
        for (int e = kGroup * g; e < kGroup * (g + 1); ++e) dot += q4k_value(block, e) * xb.qs[e];
        isum += sc * dot;
        imin += mn * (xb.bsums[2 * g] + xb.bsums[2 * g + 1]);
      }
      acc = add_block(t, acc, isum, imin, half_at(block), half_at(block + 2), xb.d);
    } else {
      for (int j = 0; j < 16; ++j) {
        std::int32_t dot = 0;
        for (int e = 16 * j; e < 16 * (j + 1); ++e) dot += (q6k_value(block, e) - 32) * xb.qs[e];
        isum += q6k_scale(block, j) * dot;
      }
      acc = add_block(t, acc, isum, 0, half_at(block + 208), 0.0f, xb.d);
    }
  }
  return acc;
}

}  // namespace kquant
}  // namespace shardline::kernels::cpu
