#include "kernels/cpu/linear.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cfloat>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

// Accumulation order (the batch-invariance contract, shared by every path
// below and by linear_reference): for each output element
//   acc = +0.0f;  for kk in 0..k-1: acc = fma(x[i, kk], W[j, kk], acc);
//   y[i, j] = bias ? acc + bias[j] : acc;
// One FMA chain per element, strictly sequential in k. Tiling over m (row
// tiles of 1..kMr rows), over n (masked tail panel) and the thread split only
// decide *which* element a register holds, never the order of its chain.
//
// BF16 weights compute in BF16 (issue 17): x is rounded to BF16 (round to
// nearest even, denormals to signed zero: VCVTNEPS2BF16) and each element is
// reduced over k in pairs with the semantics of AVX512-BF16's VDPBF16PS:
//   acc = +0.0f;  for q in 0..ceil(k/2)-1:
//     acc = ftz(fma(xb[2q+1], W[j, 2q+1], acc));   // the odd element first
//     acc = ftz(fma(xb[2q],   W[j, 2q],   acc));
//   y[i, j] = bias ? acc + bias[j] : acc;
// (a BF16 x BF16 product is exact in F32, so the FMA is the instruction's
// "add the product, round"; BF16 inputs that are denormal count as zero and
// denormal sums flush to zero; an odd k reads a zero pair element). Checked
// against the instruction on this machine's AMD Zen 4: 32M random lanes, the
// denormal, overflow and signed-zero cases (tests/kernels/linear_test.cpp
// keeps the kernel bit-equal to the scalar definition). CPUs without
// AVX512-BF16 run the same chain with F32 FMAs under MXCSR DAZ+FTZ.
//
// Packed layout: W is cut into panels of kNr = 64 output columns (the last one
// zero-padded). Panel p holds, for each step of k, the 64 columns' weights:
//   F32:  per kk, 64 floats in column order c = 0..63 (4 zmm).
//   BF16: per pair q of k (k padded to even with zeros), 64 32-bit lanes in
//         column order, lane c = (W[p*64 + c, 2q], W[p*64 + c, 2q+1]) in its
//         (low, high) half: the operand layout of VDPBF16PS (4 zmm per q), and
//         for AVX2 two widenings per 8 columns (low: shift, high: AND).
// Either way one k step of a panel is 256 bytes (4 cache lines).
// The packing does not depend on the instruction set.

namespace shardline::kernels::cpu {
namespace {

constexpr int kNr = 64;              // output columns per packed panel
#if defined(__AVX512F__)
constexpr int kMr = 6;  // rows per register tile (6 x 4 zmm accumulators)
constexpr std::size_t kXBlockBytes = 384 * 1024;  // x rows kept hot in L2 per pass
#else
// AVX2: 4 x 2 ymm tiles (6-row tiles measured ~1.5x slower on Zen 3); the
// x block and a F32 panel (256 KiB at k = 1024) share a 512 KiB L2.
constexpr int kMr = 4;
constexpr std::size_t kXBlockBytes = 128 * 1024;
#endif

/// k padded to the packed step: pairs for BF16, single elements for F32.
[[nodiscard]] int k_padded(DType dt, int k) { return dt == DType::bf16 ? (k + 1) / 2 * 2 : k; }
/// Elements of one packed panel: 64 columns x the padded k.
[[nodiscard]] std::size_t panel_elems(DType dt, int k) {
  return static_cast<std::size_t>(k_padded(dt, k)) * kNr;
}
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
[[nodiscard, maybe_unused]] inline float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) return std::signbit(x) ? -0.0f : 0.0f;
  return bf16_to_f32(f32_to_bf16(x));
}

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define SHARDLINE_LINEAR_DPBF16 1
/// x as the native BF16 path reads it: BF16 bits, rows of the padded k.
using XBf16 = std::uint16_t;
#else
/// x as the emulated BF16 paths read it: BF16 values widened to F32.
using XBf16 = float;
#endif

/// x [m, k] (row stride xs) -> xb [m, kp] rounded to BF16 (kp = k padded to
/// even; the pad element is zero). Row-local, so batch-invariant.
void round_rows_bf16(const float* x, int m, long xs, int k, int kp, XBf16* xb) {
#pragma omp parallel for schedule(static) if (static_cast<long>(m) * k > (1 << 16))
  for (int i = 0; i < m; ++i) {
    const float* xi = x + i * xs;
    XBf16* out = xb + static_cast<long>(i) * kp;
#if defined(SHARDLINE_LINEAR_DPBF16)
    int kk = 0;
    for (; kk + 16 <= k; kk += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kk),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(xi + kk))));
    if (kk < k) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (k - kk)) - 1u);
      _mm256_mask_storeu_epi16(out + kk, mask,
                               reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, xi + kk))));
    }
#else
    for (int kk = 0; kk < k; ++kk) out[kk] = round_bf16(xi[kk]);
#endif
    if (kp > k) out[k] = 0;
  }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/// Sets MXCSR's DAZ and FTZ for its scope: F32 FMAs then read denormal BF16
/// weights as zero and flush denormal sums, as VDPBF16PS does (the SIMD
/// emulation paths; the portable fallback flushes explicitly, dot_bf16).
class DazFtzScope {
 public:
  DazFtzScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~DazFtzScope() { _mm_setcsr(saved_); }
  DazFtzScope(const DazFtzScope&) = delete;
  DazFtzScope& operator=(const DazFtzScope&) = delete;

 private:
  unsigned saved_;
};
#endif

#if defined(__AVX512F__)
#define SHARDLINE_LINEAR_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SHARDLINE_LINEAR_AVX2 1
#endif

#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)

/// Lines of the next panel to pull into L2 while a tile runs: `lines` cache
/// lines from `next`, `per_k` of them per k step (the tile sweeps k once).
/// And the side stream: up to two runs of a later phase's lines
/// (LinePrefetchQueue), `side_per_k` per k step.
struct Prefetch {
  const char* next = nullptr;
  int lines = 0;
  int per_k = 0;
  const char* side0 = nullptr;  ///< first side run
  const char* side1 = nullptr;  ///< second side run (lines after side0_lines)
  int side0_lines = 0;
  int side_lines = 0;  ///< lines of both side runs
  int side_per_k = 0;
};

[[gnu::always_inline]] inline void prefetch_step(const Prefetch& pf, int kk) {
  const int first = kk * pf.per_k;
  const int last = std::min(first + pf.per_k, pf.lines);
  for (int l = first; l < last; ++l) __builtin_prefetch(pf.next + static_cast<long>(l) * 64, 0, 2);
  if (pf.side_per_k == 0) [[likely]] return;  // no side stream: one test a step
  const int side_first = kk * pf.side_per_k;
  const int side_last = std::min(side_first + pf.side_per_k, pf.side_lines);
  for (int l = side_first; l < side_last; ++l)
    __builtin_prefetch(l < pf.side0_lines ? pf.side0 + static_cast<long>(l) * 64
                                          : pf.side1 + static_cast<long>(l - pf.side0_lines) * 64,
                       0, 2);
}

/// Takes up to two of `thread`'s runs from `side` into pf's side stream,
/// spread over the tile's `ksteps`.
void take_side_runs(LinePrefetchQueue* side, int thread, int ksteps, Prefetch& pf) {
  LineRun run;
  if (side == nullptr || !side->pop(thread, run)) return;
  pf.side0 = static_cast<const char*>(run.begin);
  pf.side0_lines = pf.side_lines = run.lines;
  if (side->pop(thread, run)) {
    pf.side1 = static_cast<const char*>(run.begin);
    pf.side_lines += run.lines;
  }
  pf.side_per_k = (pf.side_lines + ksteps - 1) / std::max(ksteps, 1);
}

#endif

#if defined(SHARDLINE_LINEAR_AVX512)

/// Stores a 6 x 4 zmm register tile's first M rows (+ bias), `ncols`
/// (1..64) valid columns; padded ones are discarded.
template <int M>
[[gnu::always_inline]] inline void store_tile(__m512 (&acc)[M][4], const float* bias, float* y,
                                              long y_stride, int ncols) {
  for (int c = 0; c < 4; ++c) {
    const int valid = std::clamp(ncols - 16 * c, 0, 16);
    if (valid == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * c) : _mm512_setzero_ps();
    for (int r = 0; r < M; ++r) {
      const __m512 v = bias ? _mm512_add_ps(acc[r][c], b) : acc[r][c];
      _mm512_mask_storeu_ps(y + r * y_stride + 16 * c, mask, v);
    }
  }
}

/// Register tile: rows [0, M) x 64 columns of one panel over the full k.
/// Meanwhile a slice of the next panel is prefetched into L2, so the first
/// tile of that panel does not stall on DRAM (weights stream once per step).
template <int M>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel,
                                              int k, const float* bias, float* y, long y_stride,
                                              int ncols, const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;
  const float* w = static_cast<const float*>(panel);
  for (int kk = 0; kk < k; ++kk, w += kNr) {
    prefetch_step(pf, kk);
    const __m512 b[4] = {_mm512_load_ps(w), _mm512_load_ps(w + 16), _mm512_load_ps(w + 32),
                         _mm512_load_ps(w + 48)};
    for (int r = 0; r < M; ++r) {
      const __m512 a = _mm512_set1_ps(xr[r][kk]);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(a, b[c], acc[r][c]);
    }
  }
  store_tile<M>(acc, bias, y, y_stride, ncols);
}

/// The BF16 register tile: rows [0, M) x 64 columns over the kp / 2 pairs.
/// Native: one VDPBF16PS per (row, 16 columns, pair). Without AVX512-BF16:
/// the odd and the even element's F32 FMA under DAZ+FTZ (same bits).
template <int M>
[[gnu::always_inline]] inline void micro_tile_bf16(const XBf16* x, long x_stride, const void* panel,
                                                   int kp, const float* bias, float* y,
                                                   long y_stride, int ncols, const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i* w = static_cast<const __m512i*>(panel);  // 4 zmm per pair
  const int pairs = kp / 2;
#if defined(SHARDLINE_LINEAR_DPBF16)
  const std::uint32_t* xr[M];  // a pair of BF16 per 32 bits
  for (int r = 0; r < M; ++r) xr[r] = reinterpret_cast<const std::uint32_t*>(x + r * x_stride);
  for (int q = 0; q < pairs; ++q, w += 4) {
    prefetch_step(pf, q);
    const __m512i b[4] = {_mm512_load_si512(w), _mm512_load_si512(w + 1), _mm512_load_si512(w + 2),
                          _mm512_load_si512(w + 3)};
    for (int r = 0; r < M; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(xr[r][q]));
      for (int c = 0; c < 4; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(a),
                                     reinterpret_cast<__m512bh>(b[c]));
    }
  }
#else
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  {
    const DazFtzScope daz_ftz;
    for (int q = 0; q < pairs; ++q, w += 4) {
      prefetch_step(pf, q);
      __m512 even[4], odd[4];
      for (int c = 0; c < 4; ++c) {
        const __m512i wc = _mm512_load_si512(w + c);
        even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(wc, 16));
        odd[c] = _mm512_castsi512_ps(_mm512_and_si512(wc, hi_mask));
      }
      for (int r = 0; r < M; ++r) {
        const __m512 ao = _mm512_set1_ps(xr[r][2 * q + 1]), ae = _mm512_set1_ps(xr[r][2 * q]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(ao, odd[c], acc[r][c]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(ae, even[c], acc[r][c]);
      }
    }
  }
#endif
  store_tile<M>(acc, bias, y, y_stride, ncols);
}

template <bool kBf16, class X>
void tile_dispatch(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias,
                   float* y, long ys, int ncols, const Prefetch& pf) {
#define SHARDLINE_TILE(M)                                                              \
  if constexpr (kBf16)                                                                 \
    micro_tile_bf16<M>(x, xs, panel, 2 * ksteps, bias, y, ys, ncols, pf);              \
  else                                                                                 \
    micro_tile<M>(x, xs, panel, ksteps, bias, y, ys, ncols, pf);                       \
  break
  switch (rows) {
    case 6: SHARDLINE_TILE(6);
    case 5: SHARDLINE_TILE(5);
    case 4: SHARDLINE_TILE(4);
    case 3: SHARDLINE_TILE(3);
    case 2: SHARDLINE_TILE(2);
    default: SHARDLINE_TILE(1);
  }
#undef SHARDLINE_TILE
}

#elif defined(SHARDLINE_LINEAR_AVX2)

// AVX2 + FMA (no AVX-512, e.g. AMD Zen 2/3): 16 ymm registers, 8 floats each.
// A 64-column panel is covered by sub-blocks of NV ymm columns (8 NV output
// columns) chosen by the row count, each sweeping the full k like the
// AVX-512 tile. Per element it is the same chain in k; only which register
// holds it changes. Accumulator v of the sub-block at c0 holds columns
// c0 + 8v .. c0 + 8v + 7 (F32: 8 floats; BF16: 8 lanes of pairs).

/// Stores acc (+ bias) into the first `valid` (0..8) of 8 columns.
[[gnu::always_inline]] inline void store8(float* y, const float* bias, __m256 acc, int valid) {
  if (valid >= 8) {
    _mm256_storeu_ps(y, bias ? _mm256_add_ps(acc, _mm256_loadu_ps(bias)) : acc);
    return;
  }
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 v = bias ? _mm256_add_ps(acc, _mm256_maskload_ps(bias, mask)) : acc;
  _mm256_maskstore_ps(y, mask, v);
}

/// Register tile: rows [0, M) x NV ymm columns of the sub-block at c0 of one
/// panel, over the full k (F32) or its ksteps pairs (BF16, under DAZ+FTZ:
/// the odd element's FMA, then the even one's). Columns >= ncols (panel
/// padding) are not stored.
template <int M, int NV, bool kBf16>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel,
                                              int ksteps, int c0, const float* bias, float* y,
                                              long y_stride, int ncols, const Prefetch& pf) {
  __m256 acc[M][NV];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;

  if constexpr (kBf16) {
    // 64 lanes (8 ymm) per pair; this sub-block's from lane c0.
    const __m256i* w = reinterpret_cast<const __m256i*>(static_cast<const std::uint32_t*>(panel) + c0);
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const DazFtzScope daz_ftz;
    for (int q = 0; q < ksteps; ++q, w += kNr / 8) {
      prefetch_step(pf, q);
      __m256 even[NV], odd[NV];
      for (int v = 0; v < NV; ++v) {
        const __m256i wv = _mm256_load_si256(w + v);
        even[v] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
        odd[v] = _mm256_castsi256_ps(_mm256_and_si256(wv, hi_mask));
      }
      for (int r = 0; r < M; ++r) {
        const __m256 ao = _mm256_broadcast_ss(xr[r] + 2 * q + 1);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ao, odd[v], acc[r][v]);
        const __m256 ae = _mm256_broadcast_ss(xr[r] + 2 * q);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ae, even[v], acc[r][v]);
      }
    }
  } else {
    const float* w = static_cast<const float*>(panel) + c0;
    for (int kk = 0; kk < ksteps; ++kk, w += kNr) {
      prefetch_step(pf, kk);
      __m256 b[NV];
      for (int c = 0; c < NV; ++c) {
        b[c] = _mm256_load_ps(w + 8 * c);
        // Pin b in a register: GCC would fold the load into each row's FMA,
        // M loads per vector instead of one (load-port bound on Zen 3).
        if constexpr (M > 1) asm("" : "+x"(b[c]));
      }
      for (int r = 0; r < M; ++r) {
        const __m256 a = _mm256_broadcast_ss(xr[r] + kk);
        for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(a, b[c], acc[r][c]);
      }
    }
  }

  for (int c = 0; c < NV; ++c) {
    const int col = c0 + 8 * c;
    const int valid = std::clamp(ncols - col, 0, 8);
    if (valid == 0) continue;
    for (int r = 0; r < M; ++r)
      store8(y + r * y_stride + col, bias ? bias + col : nullptr, acc[r][c], valid);
  }
}

/// All sub-blocks of one panel for M rows. Sub-blocks narrower than the
/// panel read only part of each k step of it: the first one pulls the whole
/// steps into L2 for the others, the second one prefetches the next panel.
template <int M, int NV, bool kBf16>
void panel_tile(const float* x, long xs, const void* panel, int ksteps, const float* bias, float* y,
                long ys, int ncols, const Prefetch& pf) {
  constexpr int kRowLines = kNr * 4 / 64;  // cache lines per k step (256 bytes either way)
  const Prefetch self{static_cast<const char*>(panel), kRowLines * ksteps, kRowLines};
  for (int c0 = 0; c0 < kNr; c0 += 8 * NV) {
    if (c0 >= ncols) continue;  // only padding columns
    const Prefetch& p = 8 * NV == kNr ? pf : c0 == 0 ? self : c0 == 8 * NV ? pf : Prefetch{};
    micro_tile<M, NV, kBf16>(x, xs, panel, ksteps, c0, bias, y, ys, ncols, p);
  }
}

template <bool kBf16, class X>
void tile_dispatch(int rows, const X* x, long xs, const void* panel, int ksteps, const float* bias,
                   float* y, long ys, int ncols, const Prefetch& pf) {
  // BF16 widens each weight vector to two registers: narrower sub-blocks.
  constexpr int kNv2 = kBf16 ? 2 : 4, kNv1 = kBf16 ? 4 : 8;
  switch (rows) {
    case 4: panel_tile<4, 2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
    case 3: panel_tile<3, 2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
    case 2: panel_tile<2, kNv2, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
    default: panel_tile<1, kNv1, kBf16>(x, xs, panel, ksteps, bias, y, ys, ncols, pf); break;
  }
}

#endif

#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)

/// One thread's share: panels [p0, p1) for all m rows, blocked over m so that
/// an x block (mc rows) stays in L2 while the panels stream past it, and each
/// panel stays in L2 while the row tiles of the block sweep it. `x` holds
/// rows of `xs` elements: F32 activations, or BF16-rounded ones (XBf16).
template <bool kBf16, class X>
void linear_panels(const X* x, int m, long xs, const PackedLinear& w, const float* bias, float* y,
                   long ys, int p0, int p1, LinePrefetchQueue* side, int thread) {
  const int k = w.in_features(), n = w.out_features();
  const int ksteps = kBf16 ? k_padded(DType::bf16, k) / 2 : k;  // 256-byte steps of a panel
  const std::size_t pbytes = panel_elems(w.dtype(), k) * dtype_size(w.dtype());
  const auto* base = static_cast<const char*>(w.data());
  const long row_bytes = static_cast<long>(sizeof(X)) * std::max<long>(xs, 1);
  const int mc = std::max(kMr, static_cast<int>(static_cast<long>(kXBlockBytes) / row_bytes) / kMr * kMr);
  const int panel_lines = static_cast<int>(pbytes / 64);
  for (int i0 = 0; i0 < m; i0 += mc) {
    const int i1 = std::min(m, i0 + mc);
    const int tiles = (i1 - i0 + kMr - 1) / kMr;
    // Each of the block's tiles prefetches its share of the next panel.
    const int lines_per_tile = (panel_lines + tiles - 1) / tiles;
    const int per_k = (lines_per_tile + ksteps - 1) / std::max(ksteps, 1);
    for (int p = p0; p < p1; ++p) {
      const int j0 = p * kNr, ncols = std::min(kNr, n - j0);
      const char* panel = base + p * pbytes;
      const float* b = bias ? bias + j0 : nullptr;
      for (int t = 0, i = i0; i < i1; ++t, i += kMr) {
        Prefetch pf;  // a lone tile streams the panel once: hardware prefetch does better
        if (p + 1 < p1 && tiles > 1) {
          const int first = t * lines_per_tile;
          pf.next = panel + pbytes + static_cast<long>(first) * 64;
          pf.lines = std::max(0, std::min(lines_per_tile, panel_lines - first));
          pf.per_k = per_k;
        }
        take_side_runs(side, thread, ksteps, pf);
        tile_dispatch<kBf16>(std::min(kMr, i1 - i), x + i * xs, xs, panel, ksteps, b,
                             y + i * ys + j0, ys, ncols, pf);
      }
    }
  }
}

#endif  // SHARDLINE_LINEAR_AVX512 || SHARDLINE_LINEAR_AVX2

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

void linear(const float* x, int m, int x_stride, const PackedLinear& w, const float* bias,
            float* y, int y_stride, LinePrefetchQueue* side) {
  if (m <= 0 || w.out_features() <= 0) return;
  const int n = w.out_features(), k = w.in_features();
  const int panels = (n + kNr - 1) / kNr;
  const bool bf16 = w.dtype() == DType::bf16;
  const int kp = k_padded(w.dtype(), k);
#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)
  XBf16* xb = nullptr;  // [m, kp]
  if (bf16) {
    xb = scratch<XBf16>(static_cast<std::size_t>(m) * kp);
    round_rows_bf16(x, m, x_stride, k, kp, xb);
  }
  // Contiguous panel ranges per thread: each thread streams its own slice of W.
#pragma omp parallel num_threads(std::min(omp_get_max_threads(), panels))
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int p0 = static_cast<int>(static_cast<long>(panels) * t / nt);
    const int p1 = static_cast<int>(static_cast<long>(panels) * (t + 1) / nt);
    if (bf16)
      linear_panels<true>(xb, m, kp, w, bias, y, y_stride, p0, p1, side, t);
    else
      linear_panels<false>(x, m, x_stride, w, bias, y, y_stride, p0, p1, side, t);
  }
#else
  // Portable fallback: the same per-element chains, read from the packed copy.
  (void)panels, (void)side;
  std::vector<XBf16> xb;  // [m, kp] BF16-rounded x (widened: XBf16 is float here)
  if (bf16) {
    xb.resize(static_cast<std::size_t>(m) * kp);
    round_rows_bf16(x, m, x_stride, k, kp, xb.data());
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
#endif
}

bool linear_uses_side_prefetch() {
#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)
  return true;
#else
  return false;
#endif
}

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
