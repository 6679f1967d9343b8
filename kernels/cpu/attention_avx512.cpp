// paged_attention's AVX-512 path (AttentionKernel::avx512), compiled with
// -mavx512f -mavx512bw -mavx512vl -mfma (kernels/CMakeLists.txt) whatever
// the build machine; attention.cpp calls it only on a CPU that has them.
#include "kernels/cpu/attention_paths.hpp"
#include "kernels/cpu/local_buffer.hpp"

#include "kernels/cpu/vec_math.hpp"  // first of the rest: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__))
#error "attention_avx512.cpp needs -mavx512f -mavx512bw -mavx512vl -mfma (kernels/CMakeLists.txt)"
#endif

// KV cache layout per block (see attention.hpp): K transposed,
// [num_kv_heads, head_dim, block_size] (row i of a block = component i of its
// block_size keys), V as [num_kv_heads, block_size, head_dim].
//
// Work item = (sequence, a run of up to kQueryHeads/group consecutive query
// tokens, a range of KV heads); all query heads of each GQA group together.
// Prefill items take one KV head; decode items (one query token) take all KV
// heads of their sequence -- or a slice of them when there are too few decode
// sequences to keep every thread busy -- and walk the cache block-major, so
// that the K (then V) of all their heads in a block, contiguous in the
// layout, streams in one run. For each query head (token at position p, head
// h), two-pass softmax with a fixed order:
//   1. scores, lane = key: s[j] = tree(a_0..a_7) * scale, where a_r = fma
//      chain over i = r, r+8, r+16, ... < head_dim (in order, from 0) of
//      q[i] * k_j[i], and tree = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
//      Keys are independent lanes: s[j] depends only on q and k_j, however
//      the keys are grouped. Tiles of 16 keys (positions 16t..16t+15 from 0)
//      are read straight from the transposed block (block_size % 16 == 0),
//      or gathered / widened to a F32 tile first (other block sizes; BF16
//      tiles shared by many query heads); BF16 16-key blocks are also read
//      as pairs of rows (even keys / odd keys of rows 2p, 2p+1 in the two
//      halves of a vector: the same chains, re-interleaved at the end) --
//      every route does the same float ops per key;
//   2. m = max_j s (per-tile vector max, then lanes); e = exp16(s - m), 0 on
//      masked lanes; l = sum (per-tile vector sum in tile order, then lanes);
//   3. two accumulator sets, even and odd keys: A[c] = fma chain over even
//      j = 0, 2, .. <= p (in order) of e[j] * v_j[c], B[c] likewise over odd
//      j; out[c] = (A[c] + B[c]) * (1 / l). (BF16 V with head_dim % 32 == 0
//      is read as pairs: even / odd columns in separate vectors, same chain
//      per column, re-interleaved at the end.)
// Every float op of a (token, head) depends only on its q, p and the K/V of
// positions 0..p -- not on the chunk, the batch, the item's other queries or
// heads, or the thread -- so a token's output is bit-identical at any
// chunking, batch composition, thread count, prefill or decode. Masked-off
// lanes (keys > p, possibly unwritten NaN slots) never reach an FMA of V or a
// sum: softmax masks them and PV stops at p.
//
// BF16 KV cache: K/V are rounded to BF16 (nearest even) by write_kv and
// widened exactly (bits << 16) in registers on read; everything above runs in
// F32 on the widened values, unchanged.
//
// Without AVX-512, the AVX2+FMA path (attention_avx2.cpp) does the same float
// ops in the same order with 8-lane vectors: same bits. The portable scalar
// path (neither) keeps a plain order of its own (one FMA chain per score,
// std::exp, sequential sums): close, not bit-identical.

namespace shardline::kernels::cpu::detail {
namespace {

using bf16_t = std::uint16_t;  ///< BF16 bits, as stored in a BF16 KV cache

constexpr int kTile = 16;        ///< key positions per score tile (= zmm lanes)
constexpr int kQueryHeads = 16;  ///< query heads per prefill work item (tokens x group)

/// 16 K/V elements as F32 (masked-off lanes 0 and not read); BF16 widens exactly.
inline __m512 load16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(__mmask16 m, const bf16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/// Unmasked load16 (masked loads are slow on some cores).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
/// load16 of a chunk that is full (kFull) or masked by m.
template <bool kFull, typename T>
inline __m512 load16c(__mmask16 m, const T* p) {
  if constexpr (kFull) return load16(p);
  else return load16(m, p);
}

/// Pins a loaded vector in a register: without it GCC folds the load into
/// each use, and kernels that reuse a vector become load-port bound.
inline void keep(__m512& x) { asm("" : "+v"(x)); }
inline void keep(__m512i& x) { asm("" : "+v"(x)); }

/// 16 F32 -> 16 BF16 bits, round to nearest even, NaN stays NaN: the same
/// bits as shardline::f32_to_bf16 lane by lane.
inline __m256i to_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

/// Address of the V row of position j of one KV head ([block, head, offset, i]).
template <typename T>
inline const T* row_at(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                       int j) {
  const long block = table[j / c.block_size];
  return base + ((block * c.num_kv_heads + kv_head) * c.block_size + j % c.block_size) *
                    static_cast<long>(c.head_dim);
}

/// V row pointers of tile positions j0..j0+n-1 (n <= 16), nullptr past n.
template <typename T>
inline void tile_rows(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                      int j0, int n, const T** rows) {
  if (c.block_size % kTile == 0) {  // the whole tile lies in one block
    const T* r = row_at(base, c, table, kv_head, j0);
    for (int l = 0; l < kTile; ++l) rows[l] = l < n ? r + static_cast<long>(l) * c.head_dim : nullptr;
  } else {
    for (int l = 0; l < kTile; ++l) rows[l] = l < n ? row_at(base, c, table, kv_head, j0 + l) : nullptr;
  }
}

/// Start of the (block of position j, kv head) slab: head_dim * block_size
/// elements, K transposed ([i][offset]) or V ([offset][i]).
template <typename T>
inline const T* slab_at(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                        int j) {
  const long block = table[j / c.block_size];
  return base + (block * c.num_kv_heads + kv_head) * static_cast<long>(c.block_size) * c.head_dim;
}

/// Prefetches the (block of position j, kv head) slab into L2, every cache
/// line of it; nothing when j is past the context.
template <typename T>
inline void prefetch_slab(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                          int j, int npos) {
  if (j >= npos) return;
  detail::prefetch_l2(slab_at(base, c, table, kv_head, j),
                      static_cast<long>(c.block_size) * c.head_dim * static_cast<long>(sizeof(T)));
}

/// BF16 K tile shared by this many query heads or more: widened once to F32
/// (prefill); fewer read it in place, widening each load.
constexpr int kWidenMin = 8;
/// BF16 16-key blocks, fewer query heads per KV head than this in an item
/// (decode, MHA or GQA group <= 2): scores in the pair form from q pairs.
constexpr int kPairsMax = 4;
/// Decode: work items per thread below which decode sequences are split into
/// KV-head slices (few, long sequences) so that every thread gets work.
constexpr int kDecodeItemsPerThread = 8;
constexpr int kChains = 8;  ///< score partial sums a_r (component i mod 8)

/// Scores of NT tiles for QB query heads. Tile t's K rows: k[t] + i * rs
/// (16 keys each, lane = key; lanes past the keys may hold anything, even NaN:
/// they only feed their own lane). s[qq] + 16 t receives the 16 scores.
template <int QB, int NT, typename T>
inline void qk_tiles(const float* const* q, int d, const T* const* k, long rs, float scale,
                     float* const* s) {
  __m512 acc[QB * NT][kChains];
#pragma GCC unroll 64
  for (int a = 0; a < QB * NT; ++a)
#pragma GCC unroll 8
    for (int r = 0; r < kChains; ++r) acc[a][r] = _mm512_setzero_ps();
  int i = 0;
  for (; i + kChains <= d; i += kChains) {
#pragma GCC unroll 8
    for (int r = 0; r < kChains; ++r) {
      __m512 kv[NT];
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        kv[t] = load16(k[t] + (i + r) * rs);
        if constexpr (QB > 1) keep(kv[t]);
      }
#pragma GCC unroll 4
      for (int qq = 0; qq < QB; ++qq) {
        const __m512 qb = _mm512_set1_ps(q[qq][i + r]);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[qq * NT + t][r] = _mm512_fmadd_ps(qb, kv[t], acc[qq * NT + t][r]);
      }
    }
  }
  for (int r = 0; i < d; ++i, ++r) {  // head_dim % 8 != 0: chains 0.. take one more
    for (int t = 0; t < NT; ++t) {
      const __m512 kv = load16(k[t] + i * rs);
      for (int qq = 0; qq < QB; ++qq)
        acc[qq * NT + t][r] = _mm512_fmadd_ps(_mm512_set1_ps(q[qq][i]), kv, acc[qq * NT + t][r]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 64
  for (int a = 0; a < QB * NT; ++a) {
    const __m512* x = acc[a];
    const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x[0], x[4]), _mm512_add_ps(x[2], x[6])),
                                   _mm512_add_ps(_mm512_add_ps(x[1], x[5]), _mm512_add_ps(x[3], x[7])));
    _mm512_store_ps(s[a / NT] + kTile * (a % NT), _mm512_mul_ps(y, sc));
  }
}

/// Scores for query heads [x, xe) of NT tiles, QB heads at a time.
template <int NT, typename T>
inline void qk_run(const float* const* qp, float* const* sp, int x, int xe, int j0, int d,
                   const T* const* k, long rs, float scale) {
  float* s[3];
  while (x < xe) {
    const int n = std::min(NT == 1 ? 3 : 1, xe - x);
    for (int a = 0; a < n; ++a) s[a] = sp[x + a] + j0;
    switch (n) {
      case 3: qk_tiles<3, NT>(qp + x, d, k, rs, scale, s); break;
      case 2: qk_tiles<2, NT>(qp + x, d, k, rs, scale, s); break;
      default: qk_tiles<1, NT>(qp + x, d, k, rs, scale, s); break;
    }
    x += n;
  }
}

/// kt[i][l] = K component i of position j0 + l as F32 (l < n; 0 past n), any block size.
template <typename T>
inline void gather_tile(const T* kbase, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                        int j0, int n, float* kt) {
  const int d = c.head_dim, bs = c.block_size;
  if (n < kTile)
    for (int i = 0; i < d; ++i) _mm512_store_ps(kt + i * kTile, _mm512_setzero_ps());
  for (int l = 0; l < n;) {  // runs of keys within one block
    const int j = j0 + l, off = j % bs, len = std::min(n - l, bs - off);
    const T* src = slab_at(kbase, c, table, kv_head, j) + off;
    const __mmask16 m = static_cast<__mmask16>(((1u << len) - 1u) << l);
    for (int i = 0; i < d; ++i) {
      // lanes l..l+len-1 <- src[i*bs + 0..len-1]
      const __m512 v = load16(static_cast<__mmask16>((1u << len) - 1u), src + static_cast<long>(i) * bs);
      const __m512 sh = _mm512_castsi512_ps(_mm512_maskz_expand_epi32(m, _mm512_castps_si512(v)));
      _mm512_store_ps(kt + i * kTile, _mm512_mask_mov_ps(_mm512_load_ps(kt + i * kTile), m, sh));
    }
    l += len;
  }
}

/// kt[i][l] = widened k[i * rs + l], 16 lanes (NaN lanes kept: they stay in their lane).
inline void widen_tile(const bf16_t* k, long rs, int d, float* kt) {
  for (int i = 0; i < d; ++i) _mm512_store_ps(kt + i * kTile, load16(k + i * rs));
}

/// acc sets A (even keys) and B (odd keys): o[q][c] (A) and o[q][dp + c] (B)
/// += e[q][j] * v_j[c] for QB query heads, CB 16-float chunks from chunk c0,
/// keys j = 0..nk-1 of a tile (its first key even).
template <int QB, int CB, bool kFull, typename T>
inline void pv_tile(const float* const* e, float* const* o, const T* const* vrows, int nk, int c0,
                    int head_dim, int dp) {
  __mmask16 m[CB];
  for (int c = 0; c < CB; ++c) {
    const int w = std::min(16, head_dim - 16 * (c0 + c));
    m[c] = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
  }
  __m512 a[QB][CB], b[QB][CB];
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < CB; ++c) {
      a[q][c] = _mm512_load_ps(o[q] + 16 * (c0 + c));
      b[q][c] = _mm512_load_ps(o[q] + dp + 16 * (c0 + c));
    }
  int j = 0;
  for (; j + 2 <= nk; j += 2) {
    __m512 v[CB], w[CB];
    for (int c = 0; c < CB; ++c) {
      v[c] = load16c<kFull>(m[c], vrows[j] + 16 * (c0 + c));
      if constexpr (QB > 1) keep(v[c]);
    }
    for (int q = 0; q < QB; ++q) {
      const __m512 p = _mm512_set1_ps(e[q][j]);
      for (int c = 0; c < CB; ++c) a[q][c] = _mm512_fmadd_ps(p, v[c], a[q][c]);
    }
    for (int c = 0; c < CB; ++c) {
      w[c] = load16c<kFull>(m[c], vrows[j + 1] + 16 * (c0 + c));
      if constexpr (QB > 1) keep(w[c]);
    }
    for (int q = 0; q < QB; ++q) {
      const __m512 p = _mm512_set1_ps(e[q][j + 1]);
      for (int c = 0; c < CB; ++c) b[q][c] = _mm512_fmadd_ps(p, w[c], b[q][c]);
    }
  }
  if (j < nk) {
    __m512 v[CB];
    for (int c = 0; c < CB; ++c) v[c] = load16c<kFull>(m[c], vrows[j] + 16 * (c0 + c));
    for (int q = 0; q < QB; ++q) {
      const __m512 p = _mm512_set1_ps(e[q][j]);
      for (int c = 0; c < CB; ++c) a[q][c] = _mm512_fmadd_ps(p, v[c], a[q][c]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < CB; ++c) {
      _mm512_store_ps(o[q] + 16 * (c0 + c), a[q][c]);
      _mm512_store_ps(o[q] + dp + 16 * (c0 + c), b[q][c]);
    }
}

/// All chunks of a head, CB at a time (CB = 16 / (2 QB) accumulators' worth).
template <int QB, typename T>
inline void pv_tile_chunks(const float* const* e, float* const* o, const T* const* vrows, int nk,
                           int head_dim, int dp) {
  constexpr int kCB = QB == 1 ? 4 : QB == 2 ? 4 : 2;
  const int nc = (head_dim + 15) / 16;
  if (head_dim % (16 * kCB) == 0) {
    for (int c0 = 0; c0 < nc; c0 += kCB) pv_tile<QB, kCB, true>(e, o, vrows, nk, c0, head_dim, dp);
    return;
  }
  for (int c0 = 0; c0 < nc; c0 += kCB) {
    switch (std::min(kCB, nc - c0)) {
      case 1: pv_tile<QB, 1, false>(e, o, vrows, nk, c0, head_dim, dp); break;
      case 2: pv_tile<QB, 2, false>(e, o, vrows, nk, c0, head_dim, dp); break;
      case 3: pv_tile<QB, std::min(3, kCB), false>(e, o, vrows, nk, c0, head_dim, dp); break;
      default: pv_tile<QB, kCB, false>(e, o, vrows, nk, c0, head_dim, dp); break;
    }
  }
}

/// BF16 fast paths. A 64-byte load of BF16 pairs x gives, exactly widened,
/// the even elements (x << 16) and the odd ones (x & 0xffff0000) in the 16
/// lanes; the float ops per key / per column stay those of the F32 form.
inline __m512 bf16_even(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
inline __m512 bf16_odd(__m512i x) {
  return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

/// qq[p] = [q[2p] x 8 | q[2p+1] x 8], p < head_dim / 2 (head_dim % 16 == 0).
inline void make_qpairs(const float* q, int d, float* qq) {
  for (int i = 0; i < d; i += 2)
    _mm512_store_ps(qq + 8 * i, _mm512_mask_mov_ps(_mm512_set1_ps(q[i]), __mmask16(0xff00),
                                                   _mm512_set1_ps(q[i + 1])));
}

/// Scores of one BF16 tile of a 16-key block (rows i of 16 keys, 32 bytes
/// each; head_dim % 16 == 0) for QB query heads, from their q pairs. A load
/// covers rows 2p, 2p+1: even keys in E (lanes 0-7 row 2p, 8-15 row 2p+1),
/// odd keys in O. E[r] / O[r] over pairs p = r mod 4 hold chains a_{2r}
/// (low half) and a_{2r+1} (high half) of the F32 form, so (E0+E2)+(E1+E3)
/// gives its tree's two halves, added across halves, then keys re-interleaved.
template <int QB>
inline void qk_bf16_block(const float* const* qq, int d, const bf16_t* k, float scale,
                          float* const* s) {
  __m512 E[QB][4], O[QB][4];
  for (int a = 0; a < QB; ++a)
    for (int r = 0; r < 4; ++r) E[a][r] = O[a][r] = _mm512_setzero_ps();
  for (int i = 0; i < d; i += 8) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      __m512i x = _mm512_loadu_si512(k + (i + 2 * r) * kTile);
      keep(x);
      const __m512 ev = bf16_even(x), od = bf16_odd(x);
#pragma GCC unroll 4
      for (int a = 0; a < QB; ++a) {
        __m512 qv = _mm512_load_ps(qq[a] + 8 * (i + 2 * r));
        keep(qv);
        E[a][r] = _mm512_fmadd_ps(qv, ev, E[a][r]);
        O[a][r] = _mm512_fmadd_ps(qv, od, O[a][r]);
      }
    }
  }
  const __m512i inter = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int a = 0; a < QB; ++a) {
    const __m512 te = _mm512_add_ps(_mm512_add_ps(E[a][0], E[a][2]), _mm512_add_ps(E[a][1], E[a][3]));
    const __m512 to = _mm512_add_ps(_mm512_add_ps(O[a][0], O[a][2]), _mm512_add_ps(O[a][1], O[a][3]));
    const __m512 ue = _mm512_add_ps(te, _mm512_shuffle_f32x4(te, te, 0x4e));
    const __m512 uo = _mm512_add_ps(to, _mm512_shuffle_f32x4(to, to, 0x4e));
    _mm512_store_ps(s[a], _mm512_mul_ps(_mm512_permutex2var_ps(ue, inter, uo), sc));
  }
}

/// PV of a BF16 tile (head_dim % 32 == 0), columns in pair order: for each
/// 32-column group g, o[32g .. 32g+15] hold the even columns and o[32g+16 ..]
/// the odd ones (A set at o, B set at o + dp). Same FMA chains per column as
/// pv_tile. G groups from group g0.
template <int QB, int G>
inline void pv_bf16_tile(const float* const* e, float* const* o, const bf16_t* const* vrows, int nk,
                         int g0, int dp) {
  __m512 a[QB][G][2], b[QB][G][2];
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < 2; ++h) {
        a[q][g][h] = _mm512_load_ps(o[q] + 32 * (g0 + g) + 16 * h);
        b[q][g][h] = _mm512_load_ps(o[q] + dp + 32 * (g0 + g) + 16 * h);
      }
#define SHARDLINE_PV_BF16_STEP(J, ACC)                                   \
  {                                                                        \
    __m512 ve[G], vo[G];                                                   \
    for (int g = 0; g < G; ++g) {                                          \
      __m512i x = _mm512_loadu_si512(vrows[J] + 32 * (g0 + g));            \
      keep(x);                                                             \
      ve[g] = bf16_even(x), vo[g] = bf16_odd(x);                           \
    }                                                                      \
    for (int q = 0; q < QB; ++q) {                                         \
      const __m512 p = _mm512_set1_ps(e[q][J]);                            \
      for (int g = 0; g < G; ++g) {                                        \
        ACC[q][g][0] = _mm512_fmadd_ps(p, ve[g], ACC[q][g][0]);            \
        ACC[q][g][1] = _mm512_fmadd_ps(p, vo[g], ACC[q][g][1]);            \
      }                                                                    \
    }                                                                      \
  }
  int j = 0;
  for (; j + 2 <= nk; j += 2) {
    SHARDLINE_PV_BF16_STEP(j, a)
    SHARDLINE_PV_BF16_STEP(j + 1, b)
  }
  if (j < nk) SHARDLINE_PV_BF16_STEP(j, a)
#undef SHARDLINE_PV_BF16_STEP
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < 2; ++h) {
        _mm512_store_ps(o[q] + 32 * (g0 + g) + 16 * h, a[q][g][h]);
        _mm512_store_ps(o[q] + dp + 32 * (g0 + g) + 16 * h, b[q][g][h]);
      }
}

template <int QB>
inline void pv_bf16_groups(const float* const* e, float* const* o, const bf16_t* const* vrows, int nk,
                           int head_dim, int dp) {
  constexpr int kG = QB == 1 ? 4 : QB == 2 ? 2 : 1;
  const int ng = head_dim / 32;
  for (int g0 = 0; g0 < ng;) {
    const int rem = ng - g0;
    if (rem >= kG) {
      pv_bf16_tile<QB, kG>(e, o, vrows, nk, g0, dp);
      g0 += kG;
    } else if (rem >= 2 && kG >= 2) {
      pv_bf16_tile<QB, std::min(2, kG)>(e, o, vrows, nk, g0, dp);
      g0 += 2;
    } else {
      pv_bf16_tile<QB, 1>(e, o, vrows, nk, g0, dp);
      g0 += 1;
    }
  }
}

/// PV over query heads [b, e) that all take nk keys of this tile, 4 at a time.
template <typename T>
inline void pv_run(float* const* eptr, float* const* optr, const T* const* vrows, int nk,
                   int head_dim, int dp, int b, int end) {
  if constexpr (sizeof(T) == 2) {
    if (head_dim % 32 == 0) {  // pair-order columns
      for (; b < end; b += 4) {
        const float* const* ep = eptr + b;
        switch (std::min(4, end - b)) {
          case 1: pv_bf16_groups<1>(ep, optr + b, vrows, nk, head_dim, dp); break;
          case 2: pv_bf16_groups<2>(ep, optr + b, vrows, nk, head_dim, dp); break;
          case 3: pv_bf16_groups<3>(ep, optr + b, vrows, nk, head_dim, dp); break;
          default: pv_bf16_groups<4>(ep, optr + b, vrows, nk, head_dim, dp); break;
        }
      }
      return;
    }
  }
  for (; b < end; b += 4) {
    const float* const* ep = eptr + b;
    switch (std::min(4, end - b)) {
      case 1: pv_tile_chunks<1>(ep, optr + b, vrows, nk, head_dim, dp); break;
      case 2: pv_tile_chunks<2>(ep, optr + b, vrows, nk, head_dim, dp); break;
      case 3: pv_tile_chunks<3>(ep, optr + b, vrows, nk, head_dim, dp); break;
      default: pv_tile_chunks<4>(ep, optr + b, vrows, nk, head_dim, dp); break;
    }
  }
}

/// Per-thread scratch, 64-byte aligned.
struct Scratch {
  LocalBuffer<float> kt_buf, s_buf, o_buf, qq_buf;
  LocalBuffer<const float*> qp;
  LocalBuffer<float*> sp, op, ep;
  LocalBuffer<int> pos;
  LocalBuffer<float> inv_l;
  static float* aligned(LocalBuffer<float>& v, std::size_t n) {
    if (v.size() < n + 16) v.resize(n + 16);
    auto a = reinterpret_cast<std::uintptr_t>(v.data());
    return reinterpret_cast<float*>((a + 63) & ~std::uintptr_t(63));
  }
};

struct Item {
  int seq, i0, nq, kh0, kh1;
  double cost;
};

/// One work item: query tokens i0..i0+nq-1 of `seq` (positions p0..p0+nq-1),
/// all `group` query heads of each KV head kh0..kh1-1.
///
/// The cache is walked in steps of whole KV blocks (two 16-key blocks, or one
/// block of a multiple of 16 keys) or single tiles (block_size % 16 != 0), and
/// within a step head by head, each head's tiles in order: a step reads one
/// contiguous run per block for all the item's heads. Query heads are
/// numbered (kv head, token, group member), so each KV head owns a segment of
/// nq * group of them with p nondecreasing.
template <typename T>
void attend_item(const float* q, int q_stride, const AttentionSeq& seq, int i0, int nq, int kh0,
                 int kh1, const KvCacheLayer& cache, int group, float scale, float* out,
                 int out_stride, Scratch& scr) {
  constexpr bool kBf16 = sizeof(T) == 2;
  const T* const kbase = static_cast<const T*>(cache.k);
  const T* const vbase = static_cast<const T*>(cache.v);
  const int d = cache.head_dim, dp = (d + 15) / 16 * 16, bs = cache.block_size;
  const int p0 = seq.context_len - seq.num_q + i0;  // position of the first query token
  const int pmax = p0 + nq - 1, npos = pmax + 1;
  const int ntile = pmax / kTile + 1, sstride = ntile * kTile;
  const int nh = kh1 - kh0;
  const int nseg = nq * group;  // query heads per KV head
  const int nqh = nh * nseg;
  float* kt = Scratch::aligned(scr.kt_buf, static_cast<std::size_t>(d) * kTile);  // gathered / widened K tile
  float* S = Scratch::aligned(scr.s_buf, static_cast<std::size_t>(nqh) * sstride);
  float* O = Scratch::aligned(scr.o_buf, static_cast<std::size_t>(nqh) * 2 * dp);
  std::fill(O, O + static_cast<std::size_t>(nqh) * 2 * dp, 0.0f);

  scr.qp.resize(nqh), scr.sp.resize(nqh), scr.op.resize(nqh), scr.ep.resize(nqh);
  scr.pos.resize(nqh), scr.inv_l.resize(nqh);
  const float** qp = scr.qp.data();
  float** sp = scr.sp.data();
  float** op = scr.op.data();
  float** ep = scr.ep.data();
  int* pos = scr.pos.data();
  float* inv_l = scr.inv_l.data();
  for (int x = 0; x < nqh; ++x) {
    const int h = kh0 + x / nseg, t = x % nseg / group, g = x % group;
    qp[x] = q + static_cast<long>(seq.q_start + i0 + t) * q_stride + static_cast<long>(h * group + g) * d;
    sp[x] = S + static_cast<long>(x) * sstride;
    op[x] = O + static_cast<long>(x) * 2 * dp;
    pos[x] = p0 + t;
  }
  const T* rows[kTile];
  const std::int32_t* table = seq.block_table;
  // BF16, 16-key blocks: scores straight from the BF16 pairs, per query head's q pairs
  const bool pairs = kBf16 && bs == kTile && d % 16 == 0 && nseg < kPairsMax;
  float* QQ = pairs ? Scratch::aligned(scr.qq_buf, static_cast<std::size_t>(nqh) * d * 8) : nullptr;
  if (pairs)
    for (int x = 0; x < nqh; ++x) make_qpairs(qp[x], d, QQ + static_cast<std::size_t>(x) * d * 8);

  // Walk: steps of `tps` tiles (two 16-key blocks, one block of a multiple
  // of 16 keys, or one gathered tile), and in a step KV head by KV head.
  const bool direct = bs % kTile == 0;  // tiles read in place (else gathered)
  const int tps = !direct ? 1 : bs == kTile ? 2 : bs / kTile;
  const int nstep = (ntile + tps - 1) / tps;
  // Software prefetch into L2, one walk step ahead: while a step's KV head
  // kh is read, the slabs of kh in the next step are prefetched (the K walk
  // runs on into the V walk's first step). Blocks are scattered and each
  // slab is a few KB, so the hardware prefetchers, which stop at 4 KB pages,
  // see short runs; one core then keeps too few misses in flight and decode
  // attention is latency-bound. BM_DecodeAttention (bench/micro_bench.cpp,
  // 64 x 256 positions, 12 heads, BF16 KV, 2 threads, 2026-11-28) read
  // 13.9-18.6 GB/s without a prefetch, 13.7-17.4 with prefetcht0,
  // 13.7-16.5 with prefetchnta, 25.4-26.7 with prefetcht1 and 27.6-30.6
  // with prefetcht2 (triad 22-31 GB/s); two steps ahead or every other line
  // were slower. An earlier prefetcht0 4 KB ahead was slower than none.
  const int nunit = nstep * nh;  // walk units (step, kv head): K's, then V's
  auto prefetch_unit = [&](int w) {
    const bool v = w >= nunit;
    if (v) w -= nunit;
    if (!direct || w >= nunit) return;
    const int st = w / nh, kh = kh0 + w % nh;
    for (int b = 0; b < tps; ++b)
      prefetch_slab(v ? vbase : kbase, cache, table, kh, st * tps * kTile + b * bs, npos);
  };
  auto first_seeing = [&](int x, int xe, int j) {  // first query head of [x, xe) with pos >= j
    while (x < xe && pos[x] < j) ++x;
    return x;
  };
  // 1. scores
  for (int st = 0; st < nstep; ++st) {
    for (int kh = kh0; kh < kh1; ++kh) {
      prefetch_unit((st + 1) * nh + (kh - kh0));
      const int xb = (kh - kh0) * nseg, xe = xb + nseg;
      const int tend = std::min(ntile, (st + 1) * tps);
      for (int tb = st * tps; tb < tend;) {
        const int j0 = tb * kTile;
        const int x = first_seeing(xb, xe, j0);
        if (!direct) {
          gather_tile(kbase, cache, table, kh, j0, std::min(kTile, npos - j0), kt);
          const float* kp[1] = {kt};
          qk_run<1>(qp, sp, x, xe, j0, d, kp, kTile, scale);
          ++tb;
          continue;
        }
        // in place: rows i of a tile at stride bs; pairs of tiles where both
        // are seen by one or two query heads. Three or more (GQA decode,
        // prefill) take a tile at a time, three heads per pass over it: each
        // pair pass reads both tiles again per head. BM_DecodeAttention's
        // 32 / 8 heads, BF16 KV: 14.6-18.3 GB/s against 13.6-16.0 (4
        // alternating runs, 2026-11-28).
        const bool pair = tb + 1 < tend && xe - x < 3;
        const int x2 = pair ? first_seeing(x, xe, j0 + kTile) : xe;
        if (pairs) {
          for (; tb < tend; ++tb) {
            const int jt = tb * kTile;
            const bf16_t* kb = reinterpret_cast<const bf16_t*>(slab_at(kbase, cache, table, kh, jt));
            for (int y = first_seeing(x, xe, jt); y < xe;) {
              const int n = std::min(2, xe - y);
              const float* qqs[2] = {QQ + static_cast<std::size_t>(y) * d * 8,
                                     QQ + static_cast<std::size_t>(y + n - 1) * d * 8};
              float* ss[2] = {sp[y] + jt, sp[y + n - 1] + jt};
              if (n == 2) qk_bf16_block<2>(qqs, d, kb, scale, ss);
              else qk_bf16_block<1>(qqs, d, kb, scale, ss);
              y += n;
            }
          }
          continue;
        }
        const T* k0 = slab_at(kbase, cache, table, kh, j0) + j0 % bs;
        if (kBf16 && xe - x >= kWidenMin) {  // widen once, share across heads
          widen_tile(reinterpret_cast<const bf16_t*>(k0), bs, d, kt);
          const float* kp0[1] = {kt};
          qk_run<1>(qp, sp, x, xe, j0, d, kp0, kTile, scale);
          ++tb;
          continue;
        }
        const T* kp[2] = {k0, pair ? slab_at(kbase, cache, table, kh, j0 + kTile) + (j0 + kTile) % bs : nullptr};
        qk_run<1>(qp, sp, x, x2, j0, d, kp, bs, scale);
        if (pair) qk_run<2>(qp, sp, x2, xe, j0, d, kp, bs, scale);
        tb += pair ? 2 : 1;
      }
    }
  }

  // 2. softmax numerators (in place) and 1 / sum
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int x = 0; x < nqh; ++x) {
    float* s = sp[x];
    const int n = pos[x] + 1, nt = (n + kTile - 1) / kTile;
    auto mask_of = [&](int t) {
      const int w = n - t * kTile;
      return w >= 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
    };
    __m512 mx = ninf;
    for (int t = 0; t < nt; ++t)
      mx = _mm512_max_ps(mx, _mm512_mask_load_ps(ninf, mask_of(t), s + t * kTile));
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int t = 0; t < nt; ++t) {
      const __mmask16 m = mask_of(t);
      const __m512 e =
          _mm512_maskz_mov_ps(m, detail::exp16(_mm512_sub_ps(_mm512_load_ps(s + t * kTile), mv)));
      _mm512_store_ps(s + t * kTile, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_l[x] = 1.0f / detail::hsum16(sum);
  }

  // 3. weighted sum of V rows
  for (int st = 0; st < nstep; ++st) {
    for (int kh = kh0; kh < kh1; ++kh) {
      prefetch_unit(nunit + (st + 1) * nh + (kh - kh0));
      const int xb = (kh - kh0) * nseg, xe = xb + nseg;
      for (int tb = st * tps; tb < std::min(ntile, (st + 1) * tps); ++tb) {
        const int j0 = tb * kTile;
        tile_rows(vbase, cache, table, kh, j0, std::min(kTile, pmax - j0 + 1), rows);
        for (int x = xb; x < xe; ++x) ep[x] = sp[x] + j0;
        int x = first_seeing(xb, xe, j0);
        // runs of query heads with the same key count in this tile
        while (x < xe) {
          const int nk = std::min(kTile, pos[x] - j0 + 1);
          int end = x + 1;
          while (end < xe && std::min(kTile, pos[end] - j0 + 1) == nk) ++end;
          pv_run(ep, op, rows, nk, d, dp, x, end);
          x = end;
        }
      }
    }
  }

  for (int x = 0; x < nqh; ++x) {
    const int h = kh0 + x / nseg, t = x % nseg / group, g = x % group;
    float* dst = out + static_cast<long>(seq.q_start + i0 + t) * out_stride +
                 static_cast<long>(h * group + g) * d;
    const __m512 inv = _mm512_set1_ps(inv_l[x]);
    if (kBf16 && d % 32 == 0) {  // pair-order columns back to natural order
      const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      for (int c = 0; c < d; c += 32) {
        const __m512 ev = _mm512_mul_ps(_mm512_add_ps(_mm512_load_ps(op[x] + c), _mm512_load_ps(op[x] + dp + c)), inv);
        const __m512 od = _mm512_mul_ps(
            _mm512_add_ps(_mm512_load_ps(op[x] + c + 16), _mm512_load_ps(op[x] + dp + c + 16)), inv);
        _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(ev, lo, od));
        _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(ev, hi, od));
      }
      continue;
    }
    for (int c = 0; c < d; c += 16) {
      const int w = std::min(16, d - c);
      const __mmask16 m = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
      const __m512 ab = _mm512_add_ps(_mm512_load_ps(op[x] + c), _mm512_load_ps(op[x] + dp + c));
      _mm512_mask_storeu_ps(dst + c, m, _mm512_mul_ps(ab, inv));
    }
  }
}

}  // namespace

void paged_attention_avx512(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                            const KvCacheLayer& cache, int num_heads, float scale, float* out, int out_stride) {
  const int hkv = cache.num_kv_heads;
  const int group = num_heads / hkv;
  const bool bf16 = cache.dtype == DType::bf16;
  // Decode sequences (one query token) take all their KV heads per item, or
  // slices of heads_per_item when there are too few of them for the threads.
  int n_decode = 0;
  for (const AttentionSeq& seq : seqs) n_decode += seq.num_q == 1;
  int heads_per_item = hkv;
  if (n_decode > 0) {
    const int want = kDecodeItemsPerThread * omp_get_max_threads();
    const int slices = std::clamp((want + n_decode - 1) / n_decode, 1, hkv);
    heads_per_item = (hkv + slices - 1) / slices;
  }
  // Items: (sequence, run of query tokens, kv heads), costliest first so that
  // dynamic scheduling balances the long tail of late prompt tokens.
  std::vector<Item> items;
  const int run = std::max(1, kQueryHeads / group);
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSeq& seq = seqs[s];
    const int hpi = seq.num_q == 1 ? heads_per_item : 1;
    for (int i0 = 0; i0 < seq.num_q; i0 += run) {
      const int nq = std::min(run, seq.num_q - i0);
      const int plast = seq.context_len - seq.num_q + i0 + nq - 1;
      for (int kh = 0; kh < hkv; kh += hpi) {
        const int kh1 = std::min(hkv, kh + hpi);
        const double cost = static_cast<double>(nq) * group * (kh1 - kh) * (plast + 1) + 64.0;
        items.push_back({static_cast<int>(s), i0, nq, kh, kh1, cost});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const long n_items = static_cast<long>(items.size());
#pragma omp parallel if (n_items > 1)
  {
    Scratch scr;
#pragma omp for schedule(dynamic, 1)
    for (long w = 0; w < n_items; ++w) {
      const Item& it = items[w];
      if (bf16)
        attend_item<bf16_t>(q, q_stride, seqs[it.seq], it.i0, it.nq, it.kh0, it.kh1, cache, group,
                            scale, out, out_stride, scr);
      else
        attend_item<float>(q, q_stride, seqs[it.seq], it.i0, it.nq, it.kh0, it.kh1, cache, group,
                           scale, out, out_stride, scr);
    }
  }
}

}  // namespace shardline::kernels::cpu::detail
