#pragma once
/// \file
/// Private to linear(): the packed layout and the panel loop that every SIMD
/// path of kernels/cpu/linear.hpp shares. Each instruction path compiles in
/// its own file with its own flags (linear_avx2.cpp: AVX2+FMA and no
/// AVX-512; linear_avx512.cpp: AVX-512, with AVX512-BF16 for its native BF16
/// tile), and linear.cpp picks one at run time (LinearKernel). Everything
/// here has internal linkage, so that each file gets its own copy compiled
/// for its instructions and none leaks into another path.
///
/// Accumulation order (the batch-invariance contract, shared by every path
/// and by linear_reference): for each output element
///   acc = +0.0f;  for kk in 0..k-1: acc = fma(x[i, kk], W[j, kk], acc);
///   y[i, j] = bias ? acc + bias[j] : acc;
/// One FMA chain per element, strictly sequential in k. Tiling over m (row
/// tiles), over n (masked tail panel) and the thread split only decide
/// *which* element a register holds, never the order of its chain.
///
/// BF16 weights compute in BF16 (issue 17): x is rounded to BF16 (round to
/// nearest even, denormals to signed zero: VCVTNEPS2BF16) and each element is
/// reduced over k in pairs with the semantics of AVX512-BF16's VDPBF16PS:
///   acc = +0.0f;  for q in 0..ceil(k/2)-1:
///     acc = ftz(fma(xb[2q+1], W[j, 2q+1], acc));   // the odd element first
///     acc = ftz(fma(xb[2q],   W[j, 2q],   acc));
///   y[i, j] = bias ? acc + bias[j] : acc;
/// (a BF16 x BF16 product is exact in F32, so the FMA is the instruction's
/// "add the product, round"; BF16 inputs that are denormal count as zero and
/// denormal sums flush to zero; an odd k reads a zero pair element). Checked
/// against the instruction on an AMD Zen 4: 32M random lanes, the denormal,
/// overflow and signed-zero cases (tests/kernels/linear_test.cpp keeps every
/// path bit-equal to the scalar definition). Paths without AVX512-BF16 run
/// the same chain with F32 FMAs under MXCSR DAZ+FTZ.
///
/// Packed layout: W is cut into panels of kNr = 64 output columns (the last one
/// zero-padded). Panel p holds, for each step of k, the 64 columns' weights:
///   F32:  per kk, 64 floats in column order c = 0..63 (4 zmm).
///   BF16: per pair q of k (k padded to even with zeros), 64 32-bit lanes in
///         column order, lane c = (W[p*64 + c, 2q], W[p*64 + c, 2q+1]) in its
///         (low, high) half: the operand layout of VDPBF16PS (4 zmm per q), and
///         for AVX2 two widenings per 8 columns (low: shift, high: AND).
/// Either way one k step of a panel is 256 bytes (4 cache lines).
/// The packing does not depend on the instruction set.

#include <xmmintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/prefetch.hpp"

namespace shardline::kernels::cpu {
namespace {  // NOLINT(google-build-namespaces): one copy per instruction path, by design

constexpr int kNr = 64;  // output columns per packed panel

/// k padded to the packed step: pairs for BF16, single elements for F32.
[[nodiscard, maybe_unused]] inline int k_padded(DType dt, int k) { return dt == DType::bf16 ? (k + 1) / 2 * 2 : k; }
/// Elements of one packed panel: 64 columns x the padded k.
[[nodiscard, maybe_unused]] inline std::size_t panel_elems(DType dt, int k) {
  return static_cast<std::size_t>(k_padded(dt, k)) * kNr;
}

/// Sets MXCSR's DAZ and FTZ for its scope: F32 FMAs then read denormal BF16
/// weights as zero and flush denormal sums, as VDPBF16PS does (the emulating
/// SIMD paths; the portable path flushes explicitly).
class [[maybe_unused]] DazFtzScope {
 public:
  DazFtzScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~DazFtzScope() { _mm_setcsr(saved_); }
  DazFtzScope(const DazFtzScope&) = delete;
  DazFtzScope& operator=(const DazFtzScope&) = delete;

 private:
  unsigned saved_;
};

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

/// The lines of k steps [kk, kk + n): per_k of the next panel's and
/// side_per_k of the side stream's per step. A loop unrolled by n pays the
/// bookkeeping once per n steps (the same lines, a little earlier).
[[gnu::always_inline]] inline void prefetch_steps(const Prefetch& pf, int kk, int n) {
  const int first = kk * pf.per_k;
  const int last = std::min(first + n * pf.per_k, pf.lines);
  for (int l = first; l < last; ++l) __builtin_prefetch(pf.next + static_cast<long>(l) * 64, 0, 2);
  if (pf.side_per_k == 0) [[likely]] return;  // no side stream: one test
  const int side_first = kk * pf.side_per_k;
  const int side_last = std::min(side_first + n * pf.side_per_k, pf.side_lines);
  for (int l = side_first; l < side_last; ++l)
    __builtin_prefetch(l < pf.side0_lines ? pf.side0 + static_cast<long>(l) * 64
                                          : pf.side1 + static_cast<long>(l - pf.side0_lines) * 64,
                       0, 2);
}

/// The lines of k step kk alone.
[[gnu::always_inline]] inline void prefetch_step(const Prefetch& pf, int kk) { prefetch_steps(pf, kk, 1); }

/// Takes up to two of `thread`'s runs from `side` into pf's side stream,
/// spread over the tile's `ksteps`.
inline void take_side_runs(LinePrefetchQueue* side, int thread, int ksteps, Prefetch& pf) {
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

/// One thread's share: panels [p0, p1) for all m rows, blocked over m so that
/// an x block (mc rows) stays in L2 while the panels stream past it, and each
/// panel stays in L2 while the row tiles of the block sweep it. `x` holds
/// rows of `xs` elements of X: F32 activations, or BF16-rounded ones (F32
/// values, or BF16 bits for the native path). `Path` is the instruction
/// path: its kMr (rows per register tile), kXBlockBytes (x rows kept hot in
/// L2 per pass) and tile<kBf16>(rows, x, xs, panel, ksteps, bias, y, ys,
/// ncols, pf) (rows <= kMr of one panel over all k steps).
template <class Path, bool kBf16, class X>
void linear_panels(const X* x, int m, long xs, const PackedLinear& w, const float* bias, float* y, long ys, int p0,
                   int p1, LinePrefetchQueue* side, int thread) {
  constexpr int kMr = Path::kMr;
  const int k = w.in_features(), n = w.out_features();
  const int ksteps = kBf16 ? k_padded(DType::bf16, k) / 2 : k;  // 256-byte steps of a panel
  const std::size_t pbytes = panel_elems(w.dtype(), k) * dtype_size(w.dtype());
  const auto* base = static_cast<const char*>(w.data());
  const long row_bytes = static_cast<long>(sizeof(X)) * std::max<long>(xs, 1);
  const int mc = std::max(kMr, static_cast<int>(static_cast<long>(Path::kXBlockBytes) / row_bytes) / kMr * kMr);
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
        Path::template tile<kBf16>(std::min(kMr, i1 - i), x + i * xs, xs, panel, ksteps, b, y + i * ys + j0, ys,
                                   ncols, pf);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu

namespace shardline::kernels::cpu::detail {

/// One OpenMP thread's share of linear() on one instruction path: panels
/// [p0, p1) of `w` for all m rows. `x` [m, xs]: F32 weights read the F32
/// activations; BF16 weights read x rounded to BF16 (rows of k padded to
/// even), as F32 values (`x_bits` false: the emulating paths) or BF16 bits
/// (`x_bits` true: linear_panels_avx512 with native_bf16 only). y [m, ys].
void linear_panels_avx2(const void* x, int m, long xs, const PackedLinear& w, const float* bias, float* y, long ys,
                        int p0, int p1, LinePrefetchQueue* side, int thread);
/// As linear_panels_avx2 on AVX-512; `native_bf16`: BF16 weights use
/// VDPBF16PS on BF16 bits of x (AVX512-BF16), else the F32 emulation.
void linear_panels_avx512(const void* x, int m, long xs, const PackedLinear& w, const float* bias, float* y,
                          long ys, int p0, int p1, LinePrefetchQueue* side, int thread, bool native_bf16);
/// One row of x [k] -> xb [kp] BF16 bits, rounded as VCVTNEPS2BF16 rounds
/// (AVX512-BF16 only); the pad element (kp > k) is zero.
void round_row_bf16_avx512(const float* x, int k, int kp, std::uint16_t* xb);

}  // namespace shardline::kernels::cpu::detail
