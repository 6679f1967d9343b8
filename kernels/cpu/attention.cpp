#include "kernels/cpu/attention.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// Work item = (sequence, a run of up to kQueryHeads/group consecutive query
// tokens, KV head); all query heads of the GQA group together. For each query
// head (token at position p, head h), two-pass softmax with a fixed order:
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
// the thread -- so a token's output is bit-identical at any chunking, batch
// composition, thread count, prefill or decode.

namespace shardline::kernels::cpu {
namespace {

#if defined(__AVX512F__)

constexpr int kTile = 16;        ///< key positions per score tile (= zmm lanes)
constexpr int kQueryHeads = 16;  ///< query heads per prefill work item (tokens x group)

/// Address of the K (or V) row of position j of one KV head.
inline const float* row_at(const float* base, const KvCacheLayer& c, const std::int32_t* table,
                           int kv_head, int j) {
  const long block = table[j / c.block_size];
  return base + ((block * c.num_kv_heads + kv_head) * c.block_size + j % c.block_size) *
                    static_cast<long>(c.head_dim);
}

/// Row pointers of tile positions j0..j0+n-1 (n <= 16), nullptr past n.
inline void tile_rows(const float* base, const KvCacheLayer& c, const std::int32_t* table,
                      int kv_head, int j0, int n, const float** rows) {
  if (c.block_size % kTile == 0) {  // the whole tile lies in one block
    const float* r = row_at(base, c, table, kv_head, j0);
    for (int l = 0; l < kTile; ++l) rows[l] = l < n ? r + static_cast<long>(l) * c.head_dim : nullptr;
  } else {
    for (int l = 0; l < kTile; ++l) rows[l] = l < n ? row_at(base, c, table, kv_head, j0 + l) : nullptr;
  }
}

/// prefetcht0 that the optimizer cannot drop (GCC 12 deletes loops of
/// _mm_prefetch whose trip count is not a constant).
inline void prefetch_line(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

inline void prefetch_rows(const float* const* rows, int head_dim) {
  for (int l = 0; l < kTile; ++l) {
    if (!rows[l]) break;
    const char* r = reinterpret_cast<const char*>(rows[l]);
    for (int b = 0; b < head_dim * 4; b += 64) prefetch_line(r + b);
  }
}

/// Prefetches the rows of tile tb (positions 16tb.., up to npos) if it exists.
inline void prefetch_tile(const float* base, const KvCacheLayer& c, const std::int32_t* table,
                          int kv_head, int tb, int npos) {
  const int j0 = tb * kTile;
  if (j0 >= npos) return;
  const int n = std::min(kTile, npos - j0);
  if (c.block_size % kTile == 0) {  // contiguous
    const char* r = reinterpret_cast<const char*>(row_at(base, c, table, kv_head, j0));
    const int bytes = n * c.head_dim * 4;
    for (int b = 0; b < bytes; b += 64) prefetch_line(r + b);
  } else {
    const float* rows[kTile];
    tile_rows(base, c, table, kv_head, j0, n, rows);
    prefetch_rows(rows, c.head_dim);
  }
}

constexpr int kTransposeMin = 4;  ///< query heads sharing a tile from which transposing pays
constexpr int kPrefetchTiles = 8;  ///< prefetch distance in tiles (KV blocks are scattered)

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
template <int NC>
inline __m512 qk_tile(const float* q, int head_dim, const float* const* rows, float scale) {
  constexpr int kMaxRegs = 8;
  const int nc = NC > 0 ? NC : (head_dim + 15) / 16;
  const __mmask16 last = head_dim % 16 == 0 ? __mmask16(0xffff) : __mmask16(0x00ff);
  __m512 qv[NC > 0 ? NC : kMaxRegs];
  const int nreg = NC > 0 ? NC : std::min(nc, kMaxRegs);
  for (int c = 0; c < nreg; ++c)
    qv[c] = _mm512_maskz_loadu_ps(c == nc - 1 ? last : __mmask16(0xffff), q + 16 * c);
  __m512 acc[kTile];
  for (int l = 0; l < kTile; ++l) {
    acc[l] = _mm512_setzero_ps();
    if (!rows[l]) continue;
    for (int c = 0; c < nc; ++c) {
      const __mmask16 m = c == nc - 1 ? last : __mmask16(0xffff);
      const __m512 qc = c < nreg ? qv[c] : _mm512_maskz_loadu_ps(m, q + 16 * c);
      acc[l] = _mm512_fmadd_ps(qc, _mm512_maskz_loadu_ps(m, rows[l] + 16 * c), acc[l]);
    }
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
inline void transpose_tile(const float* const* rows, int head_dim, float* kt) {
  for (int c0 = 0; c0 < head_dim; c0 += 16) {
    __m512 r[16];
    for (int l = 0; l < 16; ++l) r[l] = rows[l] ? _mm512_loadu_ps(rows[l] + c0) : _mm512_setzero_ps();
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

using QkFn = __m512 (*)(const float*, int, const float* const*, float);

[[nodiscard]] QkFn qk_for(int head_dim) {
  switch ((head_dim + 15) / 16) {
    case 1: return qk_tile<1>;
    case 2: return qk_tile<2>;
    case 3: return qk_tile<3>;
    case 4: return qk_tile<4>;
    case 5: return qk_tile<5>;
    case 6: return qk_tile<6>;
    case 7: return qk_tile<7>;
    case 8: return qk_tile<8>;
    default: return qk_tile<0>;
  }
}

/// acc[q][c] += sum_{j < nk} (in order) e[q][j] * v_j[c] for QB query heads and
/// CB 16-float chunks starting at chunk c0 (the last chunk of a head masked).
template <int QB, int CB>
inline void pv_tile(const float* const* e, float* const* o, const float* const* vrows, int nk,
                    int c0, int head_dim) {
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
    for (int c = 0; c < CB; ++c) v[c] = _mm512_maskz_loadu_ps(m[c], vrows[j] + 16 * (c0 + c));
    for (int q = 0; q < QB; ++q) {
      const __m512 p = _mm512_set1_ps(e[q][j]);
      for (int c = 0; c < CB; ++c) acc[q][c] = _mm512_fmadd_ps(p, v[c], acc[q][c]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < CB; ++c) _mm512_store_ps(o[q] + 16 * (c0 + c), acc[q][c]);
}

template <int QB>
inline void pv_tile_chunks(const float* const* e, float* const* o, const float* const* vrows, int nk,
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
inline void pv_run(float* const* eptr, float* const* optr, const float* const* vrows, int nk,
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
  int seq, i0, nq, kv_head;
  double cost;
};

/// One work item: query tokens i0..i0+nq-1 of `seq` (positions p0..p0+nq-1),
/// all `group` query heads of KV head `kh`.
void attend_item(const float* q, int q_stride, const AttentionSeq& seq, int i0, int nq, int kh,
                 const KvCacheLayer& cache, int group, float scale, float* out, int out_stride,
                 Scratch& scr) {
  const int d = cache.head_dim, dp = (d + 15) / 16 * 16;
  const int p0 = seq.context_len - seq.num_q + i0;  // position of the first query token
  const int pmax = p0 + nq - 1;
  const int ntile = pmax / kTile + 1, sstride = ntile * kTile;
  const int nqh = nq * group;  // query heads, ordered (token, head): p nondecreasing
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
    const int t = x / group, g = x % group;
    qp[x] = q + static_cast<long>(seq.q_start + i0 + t) * q_stride + static_cast<long>(kh * group + g) * d;
    sp[x] = S + static_cast<long>(x) * sstride;
    op[x] = O + static_cast<long>(x) * dp;
    pos[x] = p0 + t;
  }
  const float* rows[kTile];
  const std::int32_t* table = seq.block_table;

  // 1. scores
  const QkFn qk = qk_for(d);
  for (int tb = 0; tb < kPrefetchTiles; ++tb) prefetch_tile(static_cast<const float*>(cache.k), cache, table, kh, tb, pmax + 1);
  for (int tb = 0; tb < ntile; ++tb) {
    const int j0 = tb * kTile;
    prefetch_tile(static_cast<const float*>(cache.k), cache, table, kh, tb + kPrefetchTiles, pmax + 1);
    tile_rows(static_cast<const float*>(cache.k), cache, table, kh, j0, std::min(kTile, pmax - j0 + 1), rows);
    int x = 0;
    while (x < nqh && pos[x] < j0) ++x;  // query heads that see no key of this tile
    if (d % 16 == 0 && nqh - x >= kTransposeMin) {  // transpose once, share across heads
      transpose_tile(rows, d, kt);
      for (; x < nqh; ++x) _mm512_store_ps(sp[x] + j0, qk_tile_t(qp[x], d, kt, scale));
    } else {
      for (; x < nqh; ++x) _mm512_store_ps(sp[x] + j0, qk(qp[x], d, rows, scale));
    }
  }
  for (int tb = 0; tb < kPrefetchTiles; ++tb) prefetch_tile(static_cast<const float*>(cache.v), cache, table, kh, tb, pmax + 1);

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
  for (int tb = 0; tb < ntile; ++tb) {
    const int j0 = tb * kTile;
    prefetch_tile(static_cast<const float*>(cache.v), cache, table, kh, tb + kPrefetchTiles, pmax + 1);
    tile_rows(static_cast<const float*>(cache.v), cache, table, kh, j0, std::min(kTile, pmax - j0 + 1), rows);
    for (int x = 0; x < nqh; ++x) ep[x] = sp[x] + j0;
    int x = 0;
    while (x < nqh && pos[x] < j0) ++x;
    // runs of query heads with the same key count in this tile
    while (x < nqh) {
      const int nk = std::min(kTile, pos[x] - j0 + 1);
      int end = x + 1;
      while (end < nqh && std::min(kTile, pos[end] - j0 + 1) == nk) ++end;
      pv_run(ep, op, rows, nk, d, x, end);
      x = end;
    }
  }

  for (int x = 0; x < nqh; ++x) {
    const int t = x / group, g = x % group;
    float* dst = out + static_cast<long>(seq.q_start + i0 + t) * out_stride +
                 static_cast<long>(kh * group + g) * d;
    const __m512 inv = _mm512_set1_ps(inv_l[x]);
    for (int c = 0; c < d; c += 16) {
      const int w = std::min(16, d - c);
      const __mmask16 m = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1u);
      _mm512_mask_storeu_ps(dst + c, m, _mm512_mul_ps(_mm512_load_ps(op[x] + c), inv));
    }
  }
}

#endif  // __AVX512F__

/// Portable path (builds without AVX-512): same three passes, scalar.
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
      std::memcpy(static_cast<float*>(cache.k) + dst, k + src, row_bytes);
      std::memcpy(static_cast<float*>(cache.v) + dst, v + src, row_bytes);
    }
  }
}

void paged_attention(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                     const KvCacheLayer& cache, int num_heads, float scale, float* out,
                     int out_stride) {
  const int hkv = cache.num_kv_heads;
  const int group = num_heads / hkv;
#if defined(__AVX512F__)
  // Items: (sequence, run of query tokens, kv head), costliest first so that
  // dynamic scheduling balances the long tail of late prompt tokens.
  std::vector<Item> items;
  const int run = std::max(1, kQueryHeads / group);
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSeq& seq = seqs[s];
    for (int i0 = 0; i0 < seq.num_q; i0 += run) {
      const int nq = std::min(run, seq.num_q - i0);
      const int plast = seq.context_len - seq.num_q + i0 + nq - 1;
      const double cost = static_cast<double>(nq) * group * (plast + 1) + 64.0;
      for (int kh = 0; kh < hkv; ++kh) items.push_back({static_cast<int>(s), i0, nq, kh, cost});
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
      attend_item(q, q_stride, seqs[it.seq], it.i0, it.nq, it.kv_head, cache, group, scale, out,
                  out_stride, scr);
    }
  }
#else
  const int d = cache.head_dim;
  // Work item w -> (sequence, query index, kv head) through a prefix sum.
  std::vector<long> first(seqs.size() + 1, 0);  // [num_seqs + 1]
  for (std::size_t s = 0; s < seqs.size(); ++s)
    first[s + 1] = first[s] + static_cast<long>(seqs[s].num_q) * hkv;
  const long items = first.back();
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
      gather_rows(static_cast<const float*>(cache.k), cache, seq.block_table, kh, npos, krows);
      gather_rows(static_cast<const float*>(cache.v), cache, seq.block_table, kh, npos, vrows);
      scores.resize(static_cast<std::size_t>(group) * npos);
      attend_scalar(q + row * q_stride + static_cast<long>(kh) * group * d, d, group, scale,
                    krows.data(), vrows.data(), npos, scores.data(),
                    out + row * out_stride + static_cast<long>(kh) * group * d);
    }
  }
#endif
}

}  // namespace shardline::kernels::cpu
