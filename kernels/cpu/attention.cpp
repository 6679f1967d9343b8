#include "kernels/cpu/attention.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

// Work item = (sequence, a run of up to kQueryHeads/group consecutive query
// tokens, a range of KV heads); all query heads of each GQA group together.
// Prefill items take one KV head; decode items (one query token) take all KV
// heads of their sequence -- or a slice of them when there are too few decode
// sequences to keep every thread busy -- and walk the cache block-major, so
// that the K (then V) of all their heads in a block, contiguous in the HND
// layout, streams in one run. For each query head (token at position p, head
// h), two-pass softmax with a fixed order:
//   1. keys in tiles of 16 positions from position 0 (tile t = positions
//      16t..16t+15, whatever the block size; lanes > p masked):
//      s[j] = tree_r(x_r) * scale, x_r = fma chain over c (in order) of
//      q[16c+r] * k_j[16c+r], tree = fixed pairwise (r+8, r+4, r+2, r+1) --
//      computed per key + transpose-reduce (few query heads), or from a K tile
//      transposed once and shared by many query heads: same float ops;
//   2. m = max_j s (per-tile vector max, then lanes); e = exp16(s - m), 0 on
//      masked lanes; l = sum (per-tile vector sum in tile order, then lanes);
//   3. out[c] = (fma chain over j = 0..p in order of e[j] * v_j[c]) * (1 / l).
// Every float op of a (token, head) depends only on its q, p and the K/V of
// positions 0..p -- not on the chunk, the batch, the item's other queries or
// heads, or the thread -- so a token's output is bit-identical at any
// chunking, batch composition, thread count, prefill or decode.
//
// BF16 KV cache: K/V are rounded to BF16 (nearest even) by write_kv and
// widened exactly (bits << 16) in registers on read; everything above runs in
// F32 on the widened values, unchanged.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SHARDLINE_ATTENTION_AVX512 1
#endif

namespace shardline::kernels::cpu {
namespace {

using bf16_t = std::uint16_t;  ///< BF16 bits, as stored in a BF16 KV cache

#if defined(SHARDLINE_ATTENTION_AVX512)

constexpr int kTile = 16;        ///< key positions per score tile (= zmm lanes)
constexpr int kQueryHeads = 16;  ///< query heads per prefill work item (tokens x group)

/// 16 K/V elements as F32 (masked-off lanes 0 and not read); BF16 widens exactly.
inline __m512 load16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(__mmask16 m, const bf16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

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

/// Address of the K (or V) row of position j of one KV head.
template <typename T>
inline const T* row_at(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                       int j) {
  const long block = table[j / c.block_size];
  return base + ((block * c.num_kv_heads + kv_head) * c.block_size + j % c.block_size) *
                    static_cast<long>(c.head_dim);
}

/// Row pointers of tile positions j0..j0+n-1 (n <= 16), nullptr past n.
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

/// prefetcht0 that the optimizer cannot drop (GCC 12 deletes loops of
/// _mm_prefetch whose trip count is not a constant).
inline void prefetch_line(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

/// Prefetches the rows of tile tb (positions 16tb.., up to npos) of one KV
/// head if the tile exists.
template <typename T>
inline void prefetch_tile(const T* base, const KvCacheLayer& c, const std::int32_t* table,
                          int kv_head, int tb, int npos) {
  const int j0 = tb * kTile;
  if (j0 >= npos) return;
  const int n = std::min(kTile, npos - j0);
  if (c.block_size % kTile == 0) {  // contiguous
    const char* r = reinterpret_cast<const char*>(row_at(base, c, table, kv_head, j0));
    const int bytes = n * c.head_dim * static_cast<int>(sizeof(T));
    for (int b = 0; b < bytes; b += 64) prefetch_line(r + b);
  } else {
    const int row_bytes = c.head_dim * static_cast<int>(sizeof(T));
    for (int l = 0; l < n; ++l) {
      const char* r = reinterpret_cast<const char*>(row_at(base, c, table, kv_head, j0 + l));
      for (int b = 0; b < row_bytes; b += 64) prefetch_line(r + b);
    }
  }
}

constexpr int kTransposeMin = 4;  ///< query heads sharing a tile from which transposing pays
/// Prefetch distance: about this many bytes of K (or V) ahead of the reads,
/// in whole walk steps (KV blocks are scattered) ...
constexpr int kPrefetchBytes = 32 * 1024;
constexpr int kPrefetchMaxSteps = 8;  ///< ... and at most this many steps
/// Decode: work items per thread below which decode sequences are split into
/// KV-head slices (few, long sequences) so that every thread gets work.
constexpr int kDecodeItemsPerThread = 8;

/// Fixed-order transpose-reduce: v[l] holds 16 partial sums (lane r) of key l;
/// returns lane l = tree(v[l]) with tree(x) = ((((x0+x8)+(x4+x12)) + ((x2+x10)+
/// (x6+x14))) + (((x1+x9)+(x5+x13)) + ((x3+x11)+(x7+x15)))).
inline __m512 reduce16x16(const __m512 v[16]) {
  // level 1: lanes r + r+8; result = [key a: y0..7 | key b: y0..7]
  auto l1 = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  };
  // level 2: r + r+4; result 128-bit lanes = [P.lo key, P.hi key, Q.lo key, Q.hi key]
  auto l2 = [](__m512 p, __m512 q) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xdd));
  };
  // level 3: r + r+2; per 128-bit lane [R key w0 w1, T key w0 w1]
  auto l3 = [](__m512 r, __m512 t) {
    const __m512d a = _mm512_castps_pd(r), b = _mm512_castps_pd(t);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  };
  // level 4: r + r+1; per 128-bit lane [X key0, X key1, Y key0, Y key1]
  auto l4 = [](__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xdd));
  };
  const __m512 r = l2(l1(v[0], v[4]), l1(v[8], v[12]));   // keys 0 4 8 12
  const __m512 t = l2(l1(v[1], v[5]), l1(v[9], v[13]));   // keys 1 5 9 13
  const __m512 r2 = l2(l1(v[2], v[6]), l1(v[10], v[14]));  // keys 2 6 10 14
  const __m512 t2 = l2(l1(v[3], v[7]), l1(v[11], v[15]));  // keys 3 7 11 15
  return l4(l3(r, t), l3(r2, t2));
}

/// Scores of one tile for one query head: lane l = tree_r(sum over chunks c,
/// in order, of q[16c+r] * k_l[16c+r]) * scale. NC = 16-float chunks (0: any,
/// read at run time); the last chunk is masked when head_dim % 16 == 8.
template <int NC, typename T>
inline __m512 qk_tile(const float* q, int head_dim, const T* const* rows, float scale) {
  constexpr int kMaxRegs = 8;
  const int nc = NC > 0 ? NC : (head_dim + 15) / 16;
  const __mmask16 last = head_dim % 16 == 0 ? __mmask16(0xffff) : __mmask16(0x00ff);
  __m512 qv[NC > 0 ? NC : kMaxRegs];
  const int nreg = NC > 0 ? NC : std::min(nc, kMaxRegs);
  for (int c = 0; c < nreg; ++c)
    qv[c] = _mm512_maskz_loadu_ps(c == nc - 1 ? last : __mmask16(0xffff), q + 16 * c);
  __m512 acc[kTile];
  for (int l = 0; l < kTile; ++l) {  // (no early continue: keeps acc in registers)
    __m512 a = _mm512_setzero_ps();
    if (rows[l]) {
      for (int c = 0; c < nc; ++c) {
        const __mmask16 m = c == nc - 1 ? last : __mmask16(0xffff);
        const __m512 qc = c < nreg ? qv[c] : _mm512_maskz_loadu_ps(m, q + 16 * c);
        a = _mm512_fmadd_ps(qc, load16(m, rows[l] + 16 * c), a);
      }
    }
    acc[l] = a;
  }
  return _mm512_mul_ps(reduce16x16(acc), _mm512_set1_ps(scale));
}

/// In-register 16x16 transpose: r[c] becomes column c of the input rows.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int k = 0; k < 16; k += 2) {
    t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 16; k += 4) {
    const __m512d a = _mm512_castps_pd(t[k]), b = _mm512_castps_pd(t[k + 1]);
    const __m512d c = _mm512_castps_pd(t[k + 2]), d = _mm512_castps_pd(t[k + 3]);
    r[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 16; h += 8)
    for (int m = 0; m < 4; ++m) {
      t[h + m] = _mm512_shuffle_f32x4(r[h + m], r[h + 4 + m], 0x88);
      t[h + 4 + m] = _mm512_shuffle_f32x4(r[h + m], r[h + 4 + m], 0xdd);
    }
  for (int x = 0; x < 8; ++x) {
    r[x] = _mm512_shuffle_f32x4(t[x], t[8 + x], 0x88);
    r[8 + x] = _mm512_shuffle_f32x4(t[x], t[8 + x], 0xdd);
  }
}

/// kt[i][l] = rows[l][i] (zeros for missing rows); head_dim % 16 == 0.
template <typename T>
inline void transpose_tile(const T* const* rows, int head_dim, float* kt) {
  for (int c0 = 0; c0 < head_dim; c0 += 16) {
    __m512 r[16];
    for (int l = 0; l < 16; ++l) r[l] = rows[l] ? load16(__mmask16(0xffff), rows[l] + c0) : _mm512_setzero_ps();
    transpose16(r);
    for (int c = 0; c < 16; ++c) _mm512_store_ps(kt + (c0 + c) * kTile, r[c]);
  }
}

/// Same scores as qk_tile (same float ops per lane, same tree) from a
/// transposed tile, lane = key: x_r = chain over c of q[16c+r] * kt[16c+r],
/// reduced by vertical adds. For many query heads per tile (prefill).
inline __m512 qk_tile_t(const float* q, int head_dim, const float* kt, float scale) {
  const int nc = head_dim / 16;
  __m512 y[8];
  for (int r = 0; r < 8; ++r) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    for (int c = 0; c < nc; ++c) {
      a = _mm512_fmadd_ps(_mm512_set1_ps(q[16 * c + r]), _mm512_load_ps(kt + (16 * c + r) * kTile), a);
      b = _mm512_fmadd_ps(_mm512_set1_ps(q[16 * c + r + 8]),
                          _mm512_load_ps(kt + (16 * c + r + 8) * kTile), b);
    }
    y[r] = _mm512_add_ps(a, b);
  }
  const __m512 z0 = _mm512_add_ps(y[0], y[4]), z1 = _mm512_add_ps(y[1], y[5]);
  const __m512 z2 = _mm512_add_ps(y[2], y[6]), z3 = _mm512_add_ps(y[3], y[7]);
  const __m512 w0 = _mm512_add_ps(z0, z2), w1 = _mm512_add_ps(z1, z3);
  return _mm512_mul_ps(_mm512_add_ps(w0, w1), _mm512_set1_ps(scale));
}

template <typename T>
using QkFn = __m512 (*)(const float*, int, const T* const*, float);

template <typename T>
[[nodiscard]] QkFn<T> qk_for(int head_dim) {
  switch ((head_dim + 15) / 16) {
    case 1: return qk_tile<1, T>;
    case 2: return qk_tile<2, T>;
    case 3: return qk_tile<3, T>;
    case 4: return qk_tile<4, T>;
    case 5: return qk_tile<5, T>;
    case 6: return qk_tile<6, T>;
    case 7: return qk_tile<7, T>;
    case 8: return qk_tile<8, T>;
    default: return qk_tile<0, T>;
  }
}

/// acc[q][c] += sum_{j < nk} (in order) e[q][j] * v_j[c] for QB query heads and
/// CB 16-float chunks starting at chunk c0 (the last chunk of a head masked).
template <int QB, int CB, typename T>
inline void pv_tile(const float* const* e, float* const* o, const T* const* vrows, int nk, int c0,
                    int head_dim) {
  __mmask16 m[CB];
  for (int c = 0; c < CB; ++c) {
    const int w = std::min(16, head_dim - 16 * (c0 + c));
    m[c] = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
  }
  __m512 acc[QB][CB];
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < CB; ++c) acc[q][c] = _mm512_load_ps(o[q] + 16 * (c0 + c));
  for (int j = 0; j < nk; ++j) {
    __m512 v[CB];
    for (int c = 0; c < CB; ++c) v[c] = load16(m[c], vrows[j] + 16 * (c0 + c));
    for (int q = 0; q < QB; ++q) {
      const __m512 p = _mm512_set1_ps(e[q][j]);
      for (int c = 0; c < CB; ++c) acc[q][c] = _mm512_fmadd_ps(p, v[c], acc[q][c]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < CB; ++c) _mm512_store_ps(o[q] + 16 * (c0 + c), acc[q][c]);
}

template <int QB, typename T>
inline void pv_tile_chunks(const float* const* e, float* const* o, const T* const* vrows, int nk,
                           int head_dim) {
  const int nc = (head_dim + 15) / 16;
  for (int c0 = 0; c0 < nc; c0 += 4) {
    switch (std::min(4, nc - c0)) {
      case 1: pv_tile<QB, 1>(e, o, vrows, nk, c0, head_dim); break;
      case 2: pv_tile<QB, 2>(e, o, vrows, nk, c0, head_dim); break;
      case 3: pv_tile<QB, 3>(e, o, vrows, nk, c0, head_dim); break;
      default: pv_tile<QB, 4>(e, o, vrows, nk, c0, head_dim); break;
    }
  }
}

/// PV over query heads [b, e) that all take nk keys of this tile, 4 at a time.
template <typename T>
inline void pv_run(float* const* eptr, float* const* optr, const T* const* vrows, int nk,
                   int head_dim, int b, int end) {
  for (; b < end; b += 4) {
    const float* const* ep = eptr + b;
    switch (std::min(4, end - b)) {
      case 1: pv_tile_chunks<1>(ep, optr + b, vrows, nk, head_dim); break;
      case 2: pv_tile_chunks<2>(ep, optr + b, vrows, nk, head_dim); break;
      case 3: pv_tile_chunks<3>(ep, optr + b, vrows, nk, head_dim); break;
      default: pv_tile_chunks<4>(ep, optr + b, vrows, nk, head_dim); break;
    }
  }
}

/// Per-thread scratch, 64-byte aligned.
struct Scratch {
  std::vector<float> kt_buf, s_buf, o_buf;
  std::vector<const float*> qp;
  std::vector<float*> sp, op, ep;
  std::vector<int> pos;
  std::vector<float> inv_l;
  static float* aligned(std::vector<float>& v, std::size_t n) {
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
/// The cache is walked in steps of whole KV blocks (block_size % 16 == 0) or
/// single tiles, and within a step head by head, each head's tiles in order:
/// with the HND layout a step reads one contiguous run per block for all the
/// item's heads. Query heads are numbered (kv head, token, group member), so
/// each KV head owns a segment of nq * group of them with p nondecreasing.
template <typename T>
void attend_item(const float* q, int q_stride, const AttentionSeq& seq, int i0, int nq, int kh0,
                 int kh1, const KvCacheLayer& cache, int group, float scale, float* out,
                 int out_stride, Scratch& scr) {
  const T* const kbase = static_cast<const T*>(cache.k);
  const T* const vbase = static_cast<const T*>(cache.v);
  const int d = cache.head_dim, dp = (d + 15) / 16 * 16;
  const int p0 = seq.context_len - seq.num_q + i0;  // position of the first query token
  const int pmax = p0 + nq - 1, npos = pmax + 1;
  const int ntile = pmax / kTile + 1, sstride = ntile * kTile;
  const int nh = kh1 - kh0;
  const int nseg = nq * group;  // query heads per KV head
  const int nqh = nh * nseg;
  float* kt = Scratch::aligned(scr.kt_buf, static_cast<std::size_t>(d) * kTile);
  float* S = Scratch::aligned(scr.s_buf, static_cast<std::size_t>(nqh) * sstride);
  float* O = Scratch::aligned(scr.o_buf, static_cast<std::size_t>(nqh) * dp);
  std::fill(O, O + static_cast<std::size_t>(nqh) * dp, 0.0f);

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
    op[x] = O + static_cast<long>(x) * dp;
    pos[x] = p0 + t;
  }
  const T* rows[kTile];
  const std::int32_t* table = seq.block_table;

  // Walk: steps of `tps` tiles; prefetch `pf` steps ahead (about
  // kPrefetchBytes of the item's heads).
  const int tps = cache.block_size % kTile == 0 ? cache.block_size / kTile : 1;
  const int nstep = (ntile + tps - 1) / tps;
  const long step_bytes = static_cast<long>(nh) * tps * kTile * d * static_cast<long>(sizeof(T));
  const int pf = static_cast<int>(std::clamp<long>(kPrefetchBytes / step_bytes, 1, kPrefetchMaxSteps));
  auto prefetch_step = [&](const T* base, int kh, int st) {
    for (int tb = st * tps; tb < (st + 1) * tps; ++tb) prefetch_tile(base, cache, table, kh, tb, npos);
  };

  // 1. scores
  const QkFn<T> qk = qk_for<T>(d);
  for (int st = 0; st < pf; ++st)
    for (int kh = kh0; kh < kh1; ++kh) prefetch_step(kbase, kh, st);
  for (int st = 0; st < nstep; ++st) {
    for (int kh = kh0; kh < kh1; ++kh) {
      prefetch_step(kbase, kh, st + pf);
      const int xb = (kh - kh0) * nseg, xe = xb + nseg;
      for (int tb = st * tps; tb < std::min(ntile, (st + 1) * tps); ++tb) {
        const int j0 = tb * kTile;
        tile_rows(kbase, cache, table, kh, j0, std::min(kTile, pmax - j0 + 1), rows);
        int x = xb;
        while (x < xe && pos[x] < j0) ++x;  // query heads that see no key of this tile
        if (d % 16 == 0 && xe - x >= kTransposeMin) {  // transpose once, share across heads
          transpose_tile(rows, d, kt);
          for (; x < xe; ++x) _mm512_store_ps(sp[x] + j0, qk_tile_t(qp[x], d, kt, scale));
        } else {
          for (; x < xe; ++x) _mm512_store_ps(sp[x] + j0, qk(qp[x], d, rows, scale));
        }
      }
    }
  }
  for (int st = 0; st < pf; ++st)
    for (int kh = kh0; kh < kh1; ++kh) prefetch_step(vbase, kh, st);

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
      prefetch_step(vbase, kh, st + pf);
      const int xb = (kh - kh0) * nseg, xe = xb + nseg;
      for (int tb = st * tps; tb < std::min(ntile, (st + 1) * tps); ++tb) {
        const int j0 = tb * kTile;
        tile_rows(vbase, cache, table, kh, j0, std::min(kTile, pmax - j0 + 1), rows);
        for (int x = xb; x < xe; ++x) ep[x] = sp[x] + j0;
        int x = xb;
        while (x < xe && pos[x] < j0) ++x;
        // runs of query heads with the same key count in this tile
        while (x < xe) {
          const int nk = std::min(kTile, pos[x] - j0 + 1);
          int end = x + 1;
          while (end < xe && std::min(kTile, pos[end] - j0 + 1) == nk) ++end;
          pv_run(ep, op, rows, nk, d, x, end);
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
    for (int c = 0; c < d; c += 16) {
      const int w = std::min(16, d - c);
      const __mmask16 m = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
      _mm512_mask_storeu_ps(dst + c, m, _mm512_mul_ps(_mm512_load_ps(op[x] + c), inv));
    }
  }
}

#else  // portable path

/// Widens the K (or V) rows of positions 0..npos-1 of one KV head to F32: [npos, head_dim].
template <typename T>
void gather_rows(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                 int npos, std::vector<float>& dst) {
  const int d = c.head_dim;
  dst.resize(static_cast<std::size_t>(npos) * d);
  for (int j = 0; j < npos; ++j) {
    const long block = table[j / c.block_size];
    const T* r = base + ((block * c.num_kv_heads + kv_head) * c.block_size + j % c.block_size) *
                            static_cast<long>(d);
    for (int i = 0; i < d; ++i) {
      if constexpr (sizeof(T) == 2)
        dst[static_cast<std::size_t>(j) * d + i] = bf16_to_f32(r[i]);
      else
        dst[static_cast<std::size_t>(j) * d + i] = r[i];
    }
  }
}

/// Same three passes, scalar. k, v: [npos, head_dim].
void attend_scalar(const float* q, int head_dim, int group, float scale, const float* k,
                   const float* v, int npos, float* scores, float* out) {
  for (int g = 0; g < group; ++g) {
    const float* qg = q + g * head_dim;
    float* s = scores + static_cast<long>(g) * npos;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < npos; ++j) {
      const float* kj = k + static_cast<long>(j) * head_dim;
      float acc = 0.0f;
      for (int i = 0; i < head_dim; ++i) acc = std::fma(qg[i], kj[i], acc);
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < npos; ++j) sum += (s[j] = std::exp(s[j] - mx));
    float* o = out + g * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int j = 0; j < npos; ++j) {
      const float* vj = v + static_cast<long>(j) * head_dim;
      for (int i = 0; i < head_dim; ++i) o[i] = std::fma(s[j], vj[i], o[i]);
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < head_dim; ++i) o[i] *= inv;
  }
}

template <typename T>
void paged_attention_scalar(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                            const KvCacheLayer& cache, int group, float scale, float* out,
                            int out_stride) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim;
  // Work item w -> (sequence, query index, kv head) through a prefix sum.
  std::vector<long> first(seqs.size() + 1, 0);  // [num_seqs + 1]
  for (std::size_t s = 0; s < seqs.size(); ++s)
    first[s + 1] = first[s] + static_cast<long>(seqs[s].num_q) * hkv;
  const long items = first.back();
#pragma omp parallel if (items > 1)
  {
    std::vector<float> krows, vrows;  // [npos, d]
    std::vector<float> scores;        // [group, npos]
#pragma omp for schedule(dynamic, 1)
    for (long w = 0; w < items; ++w) {
      const auto s = static_cast<std::size_t>(
          std::upper_bound(first.begin(), first.end(), w) - first.begin() - 1);
      const AttentionSeq& seq = seqs[s];
      const long local = w - first[s];
      const int i = static_cast<int>(local / hkv), kh = static_cast<int>(local % hkv);
      const int npos = seq.context_len - seq.num_q + i + 1;  // causal: positions 0..p
      const long row = seq.q_start + i;
      gather_rows(static_cast<const T*>(cache.k), cache, seq.block_table, kh, npos, krows);
      gather_rows(static_cast<const T*>(cache.v), cache, seq.block_table, kh, npos, vrows);
      scores.resize(static_cast<std::size_t>(group) * npos);
      attend_scalar(q + row * q_stride + static_cast<long>(kh) * group * d, d, group, scale,
                    krows.data(), vrows.data(), npos, scores.data(),
                    out + row * out_stride + static_cast<long>(kh) * group * d);
    }
  }
}

#endif  // SHARDLINE_ATTENTION_AVX512

void check_dtype(const KvCacheLayer& cache) {
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    throw std::invalid_argument(std::string("attention: KV cache dtype must be F32 or BF16, not ") +
                                dtype_name(cache.dtype));
}

}  // namespace

void write_kv(const float* k, const float* v, int row_stride, int num_tokens,
              const std::int32_t* slot_mapping, const KvCacheLayer& cache) {
  check_dtype(cache);
  const int d = cache.head_dim;
  const long head_stride = static_cast<long>(cache.block_size) * d;
  const bool bf16 = cache.dtype == DType::bf16;
  for (int t = 0; t < num_tokens; ++t) {
    const std::int32_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const long block = slot / cache.block_size, off = slot % cache.block_size;
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      const long dst = (block * cache.num_kv_heads + h) * head_stride + off * d;
      const long src = static_cast<long>(t) * row_stride + static_cast<long>(h) * d;
      if (!bf16) {
        std::memcpy(static_cast<float*>(cache.k) + dst, k + src, sizeof(float) * d);
        std::memcpy(static_cast<float*>(cache.v) + dst, v + src, sizeof(float) * d);
        continue;
      }
      bf16_t* kd = static_cast<bf16_t*>(cache.k) + dst;
      bf16_t* vd = static_cast<bf16_t*>(cache.v) + dst;
#if defined(SHARDLINE_ATTENTION_AVX512)
      for (int c = 0; c < d; c += 16) {
        const int w = std::min(16, d - c);
        const __mmask16 m = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
        _mm256_mask_storeu_epi16(kd + c, m, to_bf16_16(_mm512_maskz_loadu_ps(m, k + src + c)));
        _mm256_mask_storeu_epi16(vd + c, m, to_bf16_16(_mm512_maskz_loadu_ps(m, v + src + c)));
      }
#else
      for (int c = 0; c < d; ++c) {
        kd[c] = f32_to_bf16(k[src + c]);
        vd[c] = f32_to_bf16(v[src + c]);
      }
#endif
    }
  }
}

void paged_attention(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                     const KvCacheLayer& cache, int num_heads, float scale, float* out,
                     int out_stride) {
  check_dtype(cache);
  const int hkv = cache.num_kv_heads;
  const int group = num_heads / hkv;
  const bool bf16 = cache.dtype == DType::bf16;
#if defined(SHARDLINE_ATTENTION_AVX512)
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
#else
  if (bf16)
    paged_attention_scalar<bf16_t>(q, q_stride, seqs, cache, group, scale, out, out_stride);
  else
    paged_attention_scalar<float>(q, q_stride, seqs, cache, group, scale, out, out_stride);
#endif
}

}  // namespace shardline::kernels::cpu
