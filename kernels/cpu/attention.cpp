#include "kernels/cpu/attention.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Per work item (one query token x one KV head, all query heads of its GQA
// group together), two-pass softmax:
//   1. s[g][j] = (q_g . k_j) * scale for j = 0..p, keys visited block by block
//      from position 0 (head_dim reduced in 16-lane chunks, fixed tree);
//   2. m_g = max_j s; e = exp(s - m_g); l_g = sum_j e (16-lane partials, fixed);
//   3. out_g = (sum_j e[g][j] v_j, sequential in j) * (1 / l_g).
// Nothing depends on the chunk, the batch or the thread that runs the item, so
// a token's output is bit-identical at any chunking.

namespace shardline::kernels::cpu {
namespace {

/// Pointers to the K (or V) rows of one KV head, position j at rows[j].
void gather_rows(const float* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                 int npos, std::vector<const float*>& rows) {
  rows.resize(npos);
  const long head_stride = static_cast<long>(c.block_size) * c.head_dim;
  for (int j = 0; j < npos; ++j) {
    const long block = table[j / c.block_size];
    rows[j] = base + (block * c.num_kv_heads + kv_head) * head_stride +
              static_cast<long>(j % c.block_size) * c.head_dim;
  }
}

#if defined(__AVX512F__)

/// Attention of G query heads for one token. NC = 16-float chunks per head
/// (the last one masked when head_dim % 16 == 8).
template <int NC>
void attend(const float* q, int head_dim, int group, float scale, const float* const* krows,
            const float* const* vrows, int npos, float* scores, float* out) {
  const __mmask16 last = head_dim % 16 == 0 ? __mmask16(0xffff) : __mmask16(0x00ff);
  auto mask_of = [&](int c) { return c == NC - 1 ? last : __mmask16(0xffff); };
  for (int g = 0; g < group; ++g) {
    const float* qg = q + g * head_dim;  // [head_dim]
    float* s = scores + static_cast<long>(g) * npos;  // [npos]
    __m512 qv[NC];
    for (int c = 0; c < NC; ++c) qv[c] = _mm512_maskz_loadu_ps(mask_of(c), qg + 16 * c);
    // 1. scores
    for (int j = 0; j < npos; ++j) {
      __m512 acc = _mm512_mul_ps(qv[0], _mm512_maskz_loadu_ps(mask_of(0), krows[j]));
      for (int c = 1; c < NC; ++c)
        acc = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(mask_of(c), krows[j] + 16 * c), acc);
      s[j] = detail::hsum16(acc) * scale;
    }
    // 2. softmax numerators and their sum
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < npos; ++j) mx = std::max(mx, s[j]);
    const __m512 mxv = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < npos; j += 16) {
      const __mmask16 m = npos - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (npos - j)) - 1u);
      const __m512 e = detail::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mxv));
      _mm512_mask_storeu_ps(s + j, m, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / detail::hsum16(sum));
    // 3. weighted sum of V rows
    __m512 o[NC];
    for (int c = 0; c < NC; ++c) o[c] = _mm512_setzero_ps();
    for (int j = 0; j < npos; ++j) {
      const __m512 pj = _mm512_set1_ps(s[j]);
      for (int c = 0; c < NC; ++c)
        o[c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mask_of(c), vrows[j] + 16 * c), o[c]);
    }
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(out + g * head_dim + 16 * c, mask_of(c), _mm512_mul_ps(o[c], inv));
  }
}

using AttendFn = void (*)(const float*, int, int, float, const float* const*, const float* const*,
                          int, float*, float*);

[[nodiscard]] AttendFn attend_for(int head_dim) {
  switch ((head_dim + 15) / 16) {
    case 1: return attend<1>;
    case 2: return attend<2>;
    case 3: return attend<3>;
    case 4: return attend<4>;
    case 5: return attend<5>;
    case 6: return attend<6>;
    case 7: return attend<7>;
    case 8: return attend<8>;
    default: return nullptr;
  }
}

#endif  // __AVX512F__

/// Portable path (also used for head_dim > 128): same three passes, scalar.
[[maybe_unused]] void attend_scalar(const float* q, int head_dim, int group, float scale,
                                    const float* const* krows, const float* const* vrows, int npos,
                                    float* scores, float* out) {
  for (int g = 0; g < group; ++g) {
    const float* qg = q + g * head_dim;
    float* s = scores + static_cast<long>(g) * npos;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < npos; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < head_dim; ++i) acc = std::fma(qg[i], krows[j][i], acc);
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < npos; ++j) sum += (s[j] = std::exp(s[j] - mx));
    float* o = out + g * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int j = 0; j < npos; ++j)
      for (int i = 0; i < head_dim; ++i) o[i] = std::fma(s[j], vrows[j][i], o[i]);
    const float inv = 1.0f / sum;
    for (int i = 0; i < head_dim; ++i) o[i] *= inv;
  }
}

}  // namespace

void write_kv(const float* k, const float* v, int row_stride, int num_tokens,
              const std::int32_t* slot_mapping, const KvCacheLayer& cache) {
  const long head_stride = static_cast<long>(cache.block_size) * cache.head_dim;
  const std::size_t row_bytes = sizeof(float) * cache.head_dim;
  for (int t = 0; t < num_tokens; ++t) {
    const std::int32_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const long block = slot / cache.block_size, off = slot % cache.block_size;
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      const long dst = (block * cache.num_kv_heads + h) * head_stride + off * cache.head_dim;
      const long src = static_cast<long>(t) * row_stride + static_cast<long>(h) * cache.head_dim;
      std::memcpy(cache.k + dst, k + src, row_bytes);
      std::memcpy(cache.v + dst, v + src, row_bytes);
    }
  }
}

void paged_attention(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                     const KvCacheLayer& cache, int num_heads, float scale, float* out,
                     int out_stride) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim;
  const int group = num_heads / hkv;
  // Work item w -> (sequence, query index, kv head) through a prefix sum.
  std::vector<long> first(seqs.size() + 1, 0);  // [num_seqs + 1]
  for (std::size_t s = 0; s < seqs.size(); ++s)
    first[s + 1] = first[s] + static_cast<long>(seqs[s].num_q) * hkv;
  const long items = first.back();
#if defined(__AVX512F__)
  const AttendFn fn = attend_for(d) ? attend_for(d) : attend_scalar;
#else
  const auto fn = attend_scalar;
#endif

#pragma omp parallel if (items > 1)
  {
    std::vector<const float*> krows, vrows;  // [npos]
    std::vector<float> scores;               // [group, npos]
#pragma omp for schedule(dynamic, 1)
    for (long w = 0; w < items; ++w) {
      const auto s = static_cast<std::size_t>(
          std::upper_bound(first.begin(), first.end(), w) - first.begin() - 1);
      const AttentionSeq& seq = seqs[s];
      const long local = w - first[s];
      const int i = static_cast<int>(local / hkv), kh = static_cast<int>(local % hkv);
      const int npos = seq.context_len - seq.num_q + i + 1;  // causal: positions 0..p
      const long row = seq.q_start + i;
      gather_rows(cache.k, cache, seq.block_table, kh, npos, krows);
      gather_rows(cache.v, cache, seq.block_table, kh, npos, vrows);
      scores.resize(static_cast<std::size_t>(group) * npos);
      fn(q + row * q_stride + static_cast<long>(kh) * group * d, d, group, scale, krows.data(),
         vrows.data(), npos, scores.data(), out + row * out_stride + static_cast<long>(kh) * group * d);
    }
  }
}

}  // namespace shardline::kernels::cpu
