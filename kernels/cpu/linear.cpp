#include "kernels/cpu/linear.hpp"

#include "kernels/cpu/vec_math.hpp"  // first: includes immintrin.h

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

// Accumulation order (the batch-invariance contract, shared by every path
// below and by linear_reference): for each output element
//   acc = +0.0f;  for kk in 0..k-1: acc = fma(x[i, kk], W[j, kk], acc);
//   y[i, j] = bias ? acc + bias[j] : acc;
// One FMA chain per element, strictly sequential in k. Tiling over m (row
// tiles of 1..kMr rows), over n (masked tail panel) and the thread split only
// decide *which* element a register holds, never the order of its chain.
//
// Packed layout: W is cut into panels of kNr = 64 output columns (the last one
// zero-padded). Panel p holds, for kk = 0..k-1, the 64 weights W[p*64 + c, kk]:
//   F32:  64 floats in column order c = 0..63 (4 zmm).
//   BF16: 64 bf16 as two 512-bit words; 32-bit lane l of word h holds column
//         32h + l in its low half and column 32h + 16 + l in its high half, so
//         widening to F32 is one shift (low) or one AND (high) per 16 columns.
//         The AVX2 path reads the same layout 32 bytes at a time: half s of
//         word h (lanes 8s..8s+7) widens to columns 32h + 8s + 0..7 (shift)
//         and 32h + 16 + 8s + 0..7 (AND), so no shuffle is needed either.
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

[[nodiscard]] std::size_t panel_elems(int k) { return static_cast<std::size_t>(k) * kNr; }

/// Weight W[j, kk] from the packed copy (any column j < padded n).
[[nodiscard, maybe_unused]] float packed_at(const void* data, DType dt, int k, int j, int kk) {
  const std::size_t base = (j / kNr) * panel_elems(k) + static_cast<std::size_t>(kk) * kNr;
  const int c = j % kNr;
  if (dt == DType::f32) return static_cast<const float*>(data)[base + c];
  const int h = c / 32, r = c % 32;  // word h, lane r % 16, half r / 16
  const int slot = h * 32 + (r % 16) * 2 + r / 16;
  return bf16_to_f32(static_cast<const std::uint16_t*>(data)[base + slot]);
}

#if defined(__AVX512F__)
#define SHARDLINE_LINEAR_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SHARDLINE_LINEAR_AVX2 1
#endif

#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)

/// Lines of the next panel to pull into L2 while a tile runs: `lines` cache
/// lines from `next`, `per_k` of them per k step (the tile sweeps k once).
struct Prefetch {
  const char* next = nullptr;
  int lines = 0;
  int per_k = 0;
};

[[gnu::always_inline]] inline void prefetch_step(const Prefetch& pf, int kk) {
  const int first = kk * pf.per_k;
  const int last = std::min(first + pf.per_k, pf.lines);
  for (int l = first; l < last; ++l) __builtin_prefetch(pf.next + static_cast<long>(l) * 64, 0, 2);
}

#endif

#if defined(SHARDLINE_LINEAR_AVX512)

/// Register tile: rows [0, M) x 64 columns of one panel over the full k.
/// `ncols` (1..64) valid columns are stored; padded ones are discarded.
/// Meanwhile a slice of the next panel is prefetched into L2, so the first
/// tile of that panel does not stall on DRAM (weights stream once per step).
template <int M, bool kBf16>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel,
                                              int k, const float* bias, float* y, long y_stride,
                                              int ncols, const Prefetch& pf) {
  __m512 acc[M][4];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;

  if constexpr (kBf16) {
    const __m512i* w = static_cast<const __m512i*>(panel);  // 2 words per kk
    const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int kk = 0; kk < k; ++kk, w += 2) {
      prefetch_step(pf, kk);
      const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 1);
      const __m512 b[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)),
                           _mm512_castsi512_ps(_mm512_and_si512(w0, hi_mask)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)),
                           _mm512_castsi512_ps(_mm512_and_si512(w1, hi_mask))};
      for (int r = 0; r < M; ++r) {
        const __m512 a = _mm512_set1_ps(xr[r][kk]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(a, b[c], acc[r][c]);
      }
    }
  } else {
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
  }

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

template <bool kBf16>
void tile_dispatch(int rows, const float* x, long xs, const void* panel, int k, const float* bias,
                   float* y, long ys, int ncols, const Prefetch& pf) {
  switch (rows) {
    case 6: micro_tile<6, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 5: micro_tile<5, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 4: micro_tile<4, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 3: micro_tile<3, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 2: micro_tile<2, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    default: micro_tile<1, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
  }
}

#elif defined(SHARDLINE_LINEAR_AVX2)

// AVX2 + FMA (no AVX-512, e.g. AMD Zen 2/3): 16 ymm registers, 8 floats each.
// A 64-column panel is covered by sub-blocks of NV ymm columns (8 NV output
// columns) chosen by the row count: 1 x 64, 2 x 32, 3..6 x 16 columns, each
// sweeping the full k like the AVX-512 tile. Per element it is the same FMA
// chain in k; only which register holds it changes.

/// First output column (within the panel) of ymm accumulator v of the
/// sub-block at c0 (the sub-block's offset in F32 elements / BF16 elements of
/// a kk row of the panel). F32: columns are contiguous. BF16: the 32-byte
/// chunk q = c0 / 16 + v / 2 is half q % 2 of word q / 2 (see the layout).
template <bool kBf16>
[[nodiscard]] constexpr int ymm_col(int c0, int v) {
  if constexpr (!kBf16) {
    return c0 + 8 * v;
  } else {
    const int q = c0 / 16 + v / 2;
    return 32 * (q / 2) + 8 * (q % 2) + 16 * (v % 2);
  }
}

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
/// panel, over the full k. Columns >= ncols (panel padding) are not stored.
template <int M, int NV, bool kBf16>
[[gnu::always_inline]] inline void micro_tile(const float* x, long x_stride, const void* panel,
                                              int k, int c0, const float* bias, float* y,
                                              long y_stride, int ncols, const Prefetch& pf) {
  static_assert(!kBf16 || NV % 2 == 0, "a BF16 chunk widens to two ymm");
  __m256 acc[M][NV];
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* xr[M];
  for (int r = 0; r < M; ++r) xr[r] = x + r * x_stride;

  if constexpr (kBf16) {
    // 64 bf16 (4 chunks of 32 bytes) per kk; this sub-block's chunks from c0 / 16.
    const __m256i* w = reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(panel) + c0);
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    for (int kk = 0; kk < k; ++kk, w += kNr / 16) {
      prefetch_step(pf, kk);
      __m256 b[NV];
      for (int h = 0; h < NV / 2; ++h) {
        const __m256i wv = _mm256_load_si256(w + h);
        b[2 * h] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
        b[2 * h + 1] = _mm256_castsi256_ps(_mm256_and_si256(wv, hi_mask));
      }
      for (int r = 0; r < M; ++r) {
        const __m256 a = _mm256_broadcast_ss(xr[r] + kk);
        for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(a, b[c], acc[r][c]);
      }
    }
  } else {
    const float* w = static_cast<const float*>(panel) + c0;
    for (int kk = 0; kk < k; ++kk, w += kNr) {
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
    const int col = ymm_col<kBf16>(c0, c);
    const int valid = std::clamp(ncols - col, 0, 8);
    if (valid == 0) continue;
    for (int r = 0; r < M; ++r)
      store8(y + r * y_stride + col, bias ? bias + col : nullptr, acc[r][c], valid);
  }
}

/// All sub-blocks of one panel for M rows. Sub-blocks narrower than the
/// panel read only part of each kk row of it: the first one pulls the whole
/// rows into L2 for the others, the second one prefetches the next panel.
template <int M, int NV, bool kBf16>
void panel_tile(const float* x, long xs, const void* panel, int k, const float* bias, float* y,
                long ys, int ncols, const Prefetch& pf) {
  constexpr int kRowLines = kNr * (kBf16 ? 2 : 4) / 64;  // cache lines per kk row
  const Prefetch self{static_cast<const char*>(panel), kRowLines * k, kRowLines};
  for (int c0 = 0; c0 < kNr; c0 += 8 * NV) {
    if (ymm_col<kBf16>(c0, 0) >= ncols) continue;  // only padding columns
    const Prefetch& p = 8 * NV == kNr ? pf : c0 == 0 ? self : c0 == 8 * NV ? pf : Prefetch{};
    micro_tile<M, NV, kBf16>(x, xs, panel, k, c0, bias, y, ys, ncols, p);
  }
}

template <bool kBf16>
void tile_dispatch(int rows, const float* x, long xs, const void* panel, int k, const float* bias,
                   float* y, long ys, int ncols, const Prefetch& pf) {
  switch (rows) {
    case 6: panel_tile<6, 2, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 5: panel_tile<5, 2, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 4: panel_tile<4, 2, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 3: panel_tile<3, 2, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    case 2: panel_tile<2, 4, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
    default: panel_tile<1, 8, kBf16>(x, xs, panel, k, bias, y, ys, ncols, pf); break;
  }
}

#endif

#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)

/// One thread's share: panels [p0, p1) for all m rows, blocked over m so that
/// an x block (mc rows) stays in L2 while the panels stream past it, and each
/// panel stays in L2 while the row tiles of the block sweep it.
template <bool kBf16>
void linear_panels(const float* x, int m, long xs, const PackedLinear& w, const float* bias,
                   float* y, long ys, int p0, int p1) {
  const int k = w.in_features(), n = w.out_features();
  const std::size_t pbytes = panel_elems(k) * dtype_size(w.dtype());
  const auto* base = static_cast<const char*>(w.data());
  const int mc = std::max(kMr, static_cast<int>(kXBlockBytes / (4u * std::max(k, 1))) / kMr * kMr);
  const int panel_lines = static_cast<int>(pbytes / 64);
  for (int i0 = 0; i0 < m; i0 += mc) {
    const int i1 = std::min(m, i0 + mc);
    const int tiles = (i1 - i0 + kMr - 1) / kMr;
    // Each of the block's tiles prefetches its share of the next panel.
    const int lines_per_tile = (panel_lines + tiles - 1) / tiles;
    const int per_k = (lines_per_tile + k - 1) / std::max(k, 1);
    for (int p = p0; p < p1; ++p) {
      const int j0 = p * kNr, ncols = std::min(kNr, n - j0);
      const char* panel = base + p * pbytes;
      const float* b = bias ? bias + j0 : nullptr;
      for (int t = 0, i = i0; i < i1; ++t, i += kMr) {
        Prefetch pf;  // a lone tile streams the panel once: hardware prefetch does better
        if (p + 1 < p1 && tiles > 1) {
          const int first = t * lines_per_tile;
          pf = Prefetch{panel + pbytes + static_cast<long>(first) * 64,
                        std::max(0, std::min(lines_per_tile, panel_lines - first)), per_k};
        }
        tile_dispatch<kBf16>(std::min(kMr, i1 - i), x + i * xs, xs, panel, k, b, y + i * ys + j0,
                             ys, ncols, pf);
      }
    }
  }
}

#endif  // SHARDLINE_LINEAR_AVX512 || SHARDLINE_LINEAR_AVX2

}  // namespace

std::size_t PackedLinear::packed_bytes(DType dtype, int n, int k) {
  const int panels = (n + kNr - 1) / kNr;
  return static_cast<std::size_t>(panels) * panel_elems(k) * dtype_size(dtype);
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
  const int panels = (n + kNr - 1) / kNr;
  const std::size_t elems = static_cast<std::size_t>(panels) * panel_elems(k);
  out.bytes_ = elems * dtype_size(dtype);
  out.data_ = allocate_aligned(out.bytes_);
  if (!out.data_) throw std::bad_alloc();
  void* mem = out.data_.get();
  std::memset(mem, 0, out.bytes_);  // zero padding of the last panel

  if (dtype == DType::f32) {
    const auto* src = static_cast<const float*>(w);  // [n, k]
    auto* dst = static_cast<float*>(mem);
    for (int j = 0; j < n; ++j)
      for (int kk = 0; kk < k; ++kk)
        dst[(j / kNr) * panel_elems(k) + static_cast<std::size_t>(kk) * kNr + j % kNr] =
            src[static_cast<std::size_t>(j) * k + kk];
  } else {
    const auto* src = static_cast<const std::uint16_t*>(w);  // [n, k] bf16 bits
    auto* dst = static_cast<std::uint16_t*>(mem);
    for (int j = 0; j < n; ++j) {
      const int c = j % kNr, h = c / 32, r = c % 32;
      const int slot = h * 32 + (r % 16) * 2 + r / 16;  // see layout comment
      for (int kk = 0; kk < k; ++kk)
        dst[(j / kNr) * panel_elems(k) + static_cast<std::size_t>(kk) * kNr + slot] =
            src[static_cast<std::size_t>(j) * k + kk];
    }
  }
  return out;
}

void linear(const float* x, int m, int x_stride, const PackedLinear& w, const float* bias,
            float* y, int y_stride) {
  if (m <= 0 || w.out_features() <= 0) return;
  const int n = w.out_features();
  const int panels = (n + kNr - 1) / kNr;
#if defined(SHARDLINE_LINEAR_AVX512) || defined(SHARDLINE_LINEAR_AVX2)
  const bool bf16 = w.dtype() == DType::bf16;
  // Contiguous panel ranges per thread: each thread streams its own slice of W.
#pragma omp parallel num_threads(std::min(omp_get_max_threads(), panels))
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int p0 = static_cast<int>(static_cast<long>(panels) * t / nt);
    const int p1 = static_cast<int>(static_cast<long>(panels) * (t + 1) / nt);
    if (bf16)
      linear_panels<true>(x, m, x_stride, w, bias, y, y_stride, p0, p1);
    else
      linear_panels<false>(x, m, x_stride, w, bias, y, y_stride, p0, p1);
  }
#else
  // Portable fallback: same per-element chain, read from the packed copy.
  (void)panels;
  const int k = w.in_features();
#pragma omp parallel for schedule(static)
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const float* xi = x + static_cast<long>(i) * x_stride;
      float acc = 0.0f;
      for (int kk = 0; kk < k; ++kk) acc = std::fma(xi[kk], packed_at(w.data(), w.dtype(), k, j, kk), acc);
      y[static_cast<long>(i) * y_stride + j] = bias ? acc + bias[j] : acc;
    }
#endif
}

void linear_reference(const float* x, int m, int x_stride, const void* w, DType dtype, int n,
                      int k, const float* bias, float* y, int y_stride) {
  for (int i = 0; i < m; ++i) {
    const float* xi = x + static_cast<long>(i) * x_stride;  // [k]
    for (int j = 0; j < n; ++j) {
      const std::size_t row = static_cast<std::size_t>(j) * k;
      float acc = 0.0f;
      for (int kk = 0; kk < k; ++kk) {
        const float wv = dtype == DType::f32
                             ? static_cast<const float*>(w)[row + kk]
                             : bf16_to_f32(static_cast<const std::uint16_t*>(w)[row + kk]);
        acc = std::fma(xi[kk], wv, acc);
      }
      y[static_cast<long>(i) * y_stride + j] = bias ? acc + bias[j] : acc;
    }
  }
}

}  // namespace shardline::kernels::cpu
