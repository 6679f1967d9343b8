#include "kernels/cpu/attention_paths.hpp"
#include "kernels/cpu/local_buffer.hpp"

#include "kernels/cpu/vec_math.hpp"  // first of the rest: includes immintrin.h

#if !(defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__)
#error "attention_avx2.cpp needs -mavx2 -mfma -mno-avx512f (kernels/CMakeLists.txt)"
#endif

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// Per (query token at position p, query head), the order of attention.cpp,
// with each 16-lane vector of the AVX-512 path held as two 8-lane halves
// (lanes 0-7, 8-15); every op is lane-wise except the two reductions, which
// follow GCC's _mm512_reduce_{max,add}_ps (detail::hmax16 / hsum16):
//   1. s[j] = tree(a_0..a_7) * scale, a_r = FMA chain over i = r, r+8, ...;
//      8 keys per vector (lane = key), K rows read in place from the
//      transposed block (block_size % 8 == 0) or gathered to a F32 tile;
//   2. per 16-key tile t: max / sum lanes over t in order, e = exp8(s - m)
//      (exp16's bits), masked lanes 0; inv = 1 / hsum16;
//   3. A[c] / B[c] = FMA chains over even / odd keys j <= p in order,
//      out[c] = (A[c] + B[c]) * inv.
// Work item = (sequence, query token, KV head), all query heads of its GQA
// group together (they share the K tile and the V rows in cache).

namespace shardline::kernels::cpu::detail {
namespace {

using bf16_t = std::uint16_t;

constexpr int kLanes = 8;

/// 8 consecutive elements as F32 (BF16 widened exactly).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/// The first n (< 8) elements as F32, lanes past n 0 (nothing past n is read).
template <typename T>
inline __m256 load8_part(const T* p, int n) {
  alignas(32) T tmp[kLanes] = {};
  std::memcpy(tmp, p, sizeof(T) * n);
  return load8(tmp);
}

/// Lanes l with l < n all ones (n may be <= 0 or >= 8).
inline __m256 lanes_below(int n) {
  return _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/// Scores of 8 keys for one query head: K component i of key l at k[i * rs + l].
template <typename T>
inline void score_tile(const float* q, int d, const T* k, long rs, float scale, float* s) {
  __m256 a[8];
  for (auto& x : a) x = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= d; i += 8)
    for (int r = 0; r < 8; ++r)
      a[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[i + r]), load8(k + (i + r) * rs), a[r]);
  for (int r = 0; i < d; ++i, ++r)  // head_dim % 8 != 0: chains 0.. take one more
    a[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[i]), load8(k + i * rs), a[r]);
  const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                 _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
  _mm256_storeu_ps(s, _mm256_mul_ps(y, _mm256_set1_ps(scale)));
}

/// Softmax numerators in place over s[0..n) (s padded to a multiple of 16);
/// returns 1 / sum.
inline float softmax_tiles(float* s, int n) {
  const int nt = (n + 15) / 16;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mlo = ninf, mhi = ninf;
  for (int t = 0; t < nt; ++t) {
    const int w = n - 16 * t;
    mlo = _mm256_max_ps(mlo, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 16 * t), lanes_below(w)));
    mhi = _mm256_max_ps(mhi, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 16 * t + 8), lanes_below(w - 8)));
  }
  const __m256 mv = _mm256_set1_ps(hmax16(mlo, mhi));
  __m256 slo = _mm256_setzero_ps(), shi = _mm256_setzero_ps();
  for (int t = 0; t < nt; ++t) {
    const int w = n - 16 * t;
    const __m256 elo = _mm256_and_ps(lanes_below(w), exp8(_mm256_sub_ps(_mm256_loadu_ps(s + 16 * t), mv)));
    const __m256 ehi =
        _mm256_and_ps(lanes_below(w - 8), exp8(_mm256_sub_ps(_mm256_loadu_ps(s + 16 * t + 8), mv)));
    _mm256_storeu_ps(s + 16 * t, elo);
    _mm256_storeu_ps(s + 16 * t + 8, ehi);
    slo = _mm256_add_ps(slo, elo);
    shi = _mm256_add_ps(shi, ehi);
  }
  return 1.0f / hsum16(slo, shi);
}

/// out[c0 .. c0 + 8 CB) (the last vector cut to `last` columns, 1..8) of one
/// query head: even / odd key chains over rows[0..n) weighted by e, then
/// (A + B) * inv.
template <int CB, bool kPart, typename T>
inline void pv_chunk(const float* e, const T* const* rows, int n, int c0, int last, float inv,
                     float* out) {
  __m256 a[CB], b[CB];
  for (int c = 0; c < CB; ++c) a[c] = b[c] = _mm256_setzero_ps();
  auto load = [&](const T* row, int c) {
    if constexpr (kPart) {
      if (c == CB - 1 && last < kLanes) return load8_part(row + c0 + 8 * c, last);
    }
    return load8(row + c0 + 8 * c);
  };
  int j = 0;
  for (; j + 2 <= n; j += 2) {
    const __m256 pe = _mm256_set1_ps(e[j]), po = _mm256_set1_ps(e[j + 1]);
    for (int c = 0; c < CB; ++c) a[c] = _mm256_fmadd_ps(pe, load(rows[j], c), a[c]);
    for (int c = 0; c < CB; ++c) b[c] = _mm256_fmadd_ps(po, load(rows[j + 1], c), b[c]);
  }
  if (j < n) {
    const __m256 pe = _mm256_set1_ps(e[j]);
    for (int c = 0; c < CB; ++c) a[c] = _mm256_fmadd_ps(pe, load(rows[j], c), a[c]);
  }
  const __m256 iv = _mm256_set1_ps(inv);
  for (int c = 0; c < CB; ++c) {
    const __m256 o = _mm256_mul_ps(_mm256_add_ps(a[c], b[c]), iv);
    if (kPart && c == CB - 1 && last < kLanes)
      _mm256_maskstore_ps(out + c0 + 8 * c, _mm256_castps_si256(lanes_below(last)), o);
    else
      _mm256_storeu_ps(out + c0 + 8 * c, o);
  }
}

/// All columns of one query head, 4 vectors (32 columns) at a time.
template <typename T>
inline void pv_head(const float* e, const T* const* rows, int n, int d, float inv, float* out) {
  constexpr int kCB = 4;
  const int nv = (d + 7) / 8, last = d - 8 * (nv - 1);
  int v = 0;
  for (; v + kCB <= nv; v += kCB) {
    if (v + kCB == nv && last < kLanes) pv_chunk<kCB, true>(e, rows, n, 8 * v, last, inv, out);
    else pv_chunk<kCB, false>(e, rows, n, 8 * v, kLanes, inv, out);
  }
  switch (nv - v) {
    case 3: pv_chunk<3, true>(e, rows, n, 8 * v, last, inv, out); break;
    case 2: pv_chunk<2, true>(e, rows, n, 8 * v, last, inv, out); break;
    case 1: pv_chunk<1, true>(e, rows, n, 8 * v, last, inv, out); break;
    default: break;
  }
}

struct Scratch {
  LocalBuffer<float> kt;  ///< gathered K tile [head_dim][8]
  LocalBuffer<float> s;   ///< scores, [group][padded positions]
  LocalBuffer<const float*> rows_f32;  ///< V row of each position (F32 cache)
  LocalBuffer<const bf16_t*> rows_bf16;  ///< V row of each position (BF16 cache)
  template <typename T>
  LocalBuffer<const T*>& rows() {
    if constexpr (sizeof(T) == 2) return rows_bf16;
    else return rows_f32;
  }
};

/// One query token at position p (q, out: its `group` query heads of KV head
/// kh, head_dim apart), against the keys 0..p of its block table.
template <typename T>
void attend(const float* q, float* out, int p, const std::int32_t* table, int kh,
            const KvCacheLayer& c, int group, float scale, Scratch& scr) {
  const T* kbase = static_cast<const T*>(c.k);
  const T* vbase = static_cast<const T*>(c.v);
  const int d = c.head_dim, bs = c.block_size, n = p + 1;
  const int sstride = (n + 15) / 16 * 16;
  scr.s.resize(static_cast<std::size_t>(group) * sstride);
  float* s = scr.s.data();
  auto slab = [&](const T* base, int j) {
    const long block = table[j / bs];
    return base + (block * c.num_kv_heads + kh) * static_cast<long>(bs) * d;
  };

  // 1. scores, 8 keys at a time (positions 8u.., all seen by every head).
  // Blocks are scattered slabs of a few KB: as the walk enters a block it
  // prefetches the next block's K slab and this block's V slab into L2
  // (attention.cpp says why and what it measured).
  const bool direct = bs % kLanes == 0;  // a tile lies in one block: read in place
  if (!direct) scr.kt.resize(static_cast<std::size_t>(d) * kLanes);
  const long slab_bytes = static_cast<long>(bs) * d * static_cast<long>(sizeof(T));
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    if (j0 % bs < kLanes) {  // the first tile in a block
      if (j0 + bs < n) prefetch_l2(slab(kbase, j0 + bs), slab_bytes);
      prefetch_l2(slab(vbase, j0), slab_bytes);
    }
    if (direct) {
      const T* k = slab(kbase, j0) + j0 % bs;
      for (int g = 0; g < group; ++g)
        score_tile(q + static_cast<long>(g) * d, d, k, bs, scale, s + static_cast<long>(g) * sstride + j0);
      continue;
    }
    float* kt = scr.kt.data();
    const int w = std::min(kLanes, n - j0);
    std::fill(kt, kt + static_cast<std::size_t>(d) * kLanes, 0.0f);
    for (int l = 0; l < w; ++l) {
      const T* src = slab(kbase, j0 + l) + (j0 + l) % bs;
      for (int i = 0; i < d; ++i) {
        if constexpr (sizeof(T) == 2) kt[i * kLanes + l] = bf16_to_f32(src[static_cast<long>(i) * bs]);
        else kt[i * kLanes + l] = src[static_cast<long>(i) * bs];
      }
    }
    for (int g = 0; g < group; ++g)
      score_tile(q + static_cast<long>(g) * d, d, static_cast<const float*>(kt), kLanes, scale,
                 s + static_cast<long>(g) * sstride + j0);
  }

  // 2. + 3. softmax, then V rows weighted, per query head
  LocalBuffer<const T*>& rv = scr.rows<T>();
  rv.resize(n);
  const T** rows = rv.data();
  for (int j = 0; j < n; ++j) rows[j] = slab(vbase, j) + static_cast<long>(j % bs) * d;
  for (int g = 0; g < group; ++g) {
    float* sg = s + static_cast<long>(g) * sstride;
    const float inv = softmax_tiles(sg, n);
    pv_head(sg, rows, n, d, inv, out + static_cast<long>(g) * d);
  }
}

}  // namespace

void paged_attention_avx2(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                          const KvCacheLayer& cache, int num_heads, float scale, float* out,
                          int out_stride) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim;
  const int group = num_heads / hkv;
  const bool bf16 = cache.dtype == DType::bf16;
  // Work item w -> (sequence, query token, kv head) through a prefix sum;
  // walked from the last (latest token, costliest) for dynamic balance.
  LocalBuffer<long> first;  // [num_seqs + 1]
  first.resize(seqs.size() + 1);
  for (std::size_t s = 0; s < seqs.size(); ++s)
    first[s + 1] = first[s] + static_cast<long>(seqs[s].num_q) * hkv;
  const long items = first.back();
#pragma omp parallel if (items > 1)
  {
    Scratch scr;
#pragma omp for schedule(dynamic, 1)
    for (long r = 0; r < items; ++r) {
      const long w = items - 1 - r;
      const auto s = static_cast<std::size_t>(
          std::upper_bound(first.begin(), first.end(), w) - first.begin() - 1);
      const AttentionSeq& seq = seqs[s];
      const long local = w - first[s];
      const int i = static_cast<int>(local / hkv), kh = static_cast<int>(local % hkv);
      const int p = seq.context_len - seq.num_q + i;
      const long row = seq.q_start + i;
      const float* qh = q + row * q_stride + static_cast<long>(kh) * group * d;
      float* oh = out + row * out_stride + static_cast<long>(kh) * group * d;
      if (bf16)
        attend<bf16_t>(qh, oh, p, seq.block_table, kh, cache, group, scale, scr);
      else
        attend<float>(qh, oh, p, seq.block_table, kh, cache, group, scale, scr);
    }
  }
}

}  // namespace shardline::kernels::cpu::detail

