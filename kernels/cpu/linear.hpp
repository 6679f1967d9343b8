#pragma once
/// \file
/// Batch-invariant linear layer y = x W^T (+ bias) on CPU (AVX-512 with or
/// without AVX512-BF16, AVX2+FMA, or a portable scalar path, chosen at run
/// time; the same bits on each).
///
/// Why not plain OpenBLAS sgemm: OpenBLAS picks different kernels by problem
/// size (small-matrix kernels, GEMV for M=1, different threading splits), so a
/// row's result can change with the number of rows in the batch. Here every
/// output element y[i, n] is accumulated over k = 0..K-1 in one fixed order
/// that does not depend on M, on the row's position in the batch, or on the
/// thread count: a request's logits are bit-identical alone or batched.
/// Weights are packed once into column panels for the register-blocked
/// micro-kernel.
///
/// Two computes, chosen by the weights' dtype:
///  * F32 weights: F32 compute, one FMA chain per element over k.
///  * BF16 weights: BF16 compute (issue 17), the field's practice for 16-bit
///    weights (llama.cpp's F16 path does the same): each row of x is rounded
///    to BF16 (nearest even) and the products are BF16 x BF16 dot products
///    with F32 accumulation, AVX512-BF16's VDPBF16PS: per element, k in
///    pairs, the odd element's product added before the even one's, each sum
///    rounded to F32, denormal inputs read as zero and denormal sums flushed.
///    Twice the F32 FMA rate on CPUs with the instruction; elsewhere the same
///    chain runs as F32 FMAs under DAZ+FTZ, bit for bit (linear.cpp says how
///    this was checked against the instruction).
/// Both stay batch-invariant: the rounding of x is per row, and each
/// element's chain is fixed whatever M, the row's place or the threads.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/dtype.hpp"
#include "common/memory.hpp"
#include "kernels/cpu/prefetch.hpp"

namespace shardline::kernels::cpu {

/// A weight matrix W [n, k] (row-major, nn.Linear layout) repacked for
/// `linear()`. Owns its memory. Movable, not copyable.
class PackedLinear {
 public:
  PackedLinear() = default;
  /// Packs `w` (row-major [n, k], element type `dtype`: f32 or bf16).
  /// The packed copy keeps `dtype` (BF16 stays BF16 in memory; k padded to
  /// even with zeros, as VDPBF16PS reads pairs). Throws invalid_argument for
  /// another dtype.
  [[nodiscard]] static PackedLinear pack(const void* w, DType dtype, int n, int k);
  /// Bytes pack() produces for an [n, k] matrix of `dtype` (column panels,
  /// the last one zero-padded): a peer can size a buffer for another rank's
  /// packed matrix without packing it (SiDP's weight cache slots).
  [[nodiscard]] static std::size_t packed_bytes(DType dtype, int n, int k);
  /// A non-owning view of packed bytes laid out as pack() lays them out
  /// (e.g. a copy of another rank's packed matrix). `data` must hold
  /// packed_bytes(dtype, n, k) bytes, be 64-byte aligned, and outlive the view.
  [[nodiscard]] static PackedLinear view(const void* data, DType dtype, int n, int k);

  [[nodiscard]] int out_features() const { return n_; }  ///< n
  [[nodiscard]] int in_features() const { return k_; }   ///< k
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }  ///< packed size
  [[nodiscard]] const void* data() const { return view_ != nullptr ? view_ : data_.get(); }
  [[nodiscard]] bool empty() const { return data() == nullptr; }

 private:
  AlignedBuffer data_;  // huge-page backed when large; empty for a view
  const void* view_ = nullptr;  ///< view(): memory owned elsewhere
  std::size_t bytes_ = 0;
  int n_ = 0;
  int k_ = 0;
  DType dtype_ = DType::f32;
};

/// The instruction paths of linear(), each in its own file compiled for its
/// instructions (linear_avx2.cpp without AVX-512 even on an AVX-512 build
/// machine; linear_avx512.cpp) and chosen at run time. Every path computes
/// the same bits (tests/kernels/linear_test.cpp runs each this CPU has
/// against linear_reference).
enum class LinearKernel {
  automatic,    ///< the best this CPU has: avx512_bf16, avx512, avx2, portable
  portable,     ///< scalar std::fma chains (no SIMD; slow, for any CPU)
  avx2,         ///< AVX2 + FMA: 4-row x 2..8-ymm register tiles, BF16 widened to F32 under DAZ+FTZ
  avx512,       ///< AVX-512F/BW/VL: 6-row x 4-zmm tiles, BF16 widened to F32 under DAZ+FTZ
  avx512_bf16,  ///< avx512 with VDPBF16PS for BF16 weights (F32 weights as avx512)
};

/// True when this CPU runs `kernel` (automatic and portable: always).
[[nodiscard]] bool linear_kernel_supported(LinearKernel kernel);
/// "portable", "avx2", "avx512", "avx512_bf16"; automatic: the name of the
/// path it resolves to here. `automatic` takes the best path unless the
/// environment variable SHARDLINE_LINEAR_KERNEL names another one this CPU
/// runs (read once per process; to measure a narrower path, e.g. avx2 on an
/// AVX-512 machine).
[[nodiscard]] const char* linear_kernel_name(LinearKernel kernel);

/// y[m, n] = x[m, k] * W^T (+ bias[n] if non-null). `x` rows are contiguous
/// with stride `x_stride` (>= k) floats, `y` with stride `y_stride` (>= n).
/// With BF16 weights x is rounded to BF16 first (into a per-thread scratch of
/// m * k padded to even, 2 or 4 bytes each), see above. Parallel over output
/// columns with OpenMP (num threads = omp_get_max_threads()). m may be 0 (no-op).
/// `side` (optional): while it computes, OpenMP thread t pops runs of its
/// slice of the queue, up to two per register tile, and prefetches their
/// lines into L2 spread over the tile's sweep of k (prefetch.hpp). The
/// result is the same bits with or without it. The portable path ignores
/// it. `kernel`: the instruction path (see LinearKernel); one this CPU
/// cannot run throws std::invalid_argument (a programming error: check
/// linear_kernel_supported).
void linear(const float* x, int m, int x_stride, const PackedLinear& w, const float* bias,
            float* y, int y_stride, LinePrefetchQueue* side = nullptr,
            LinearKernel kernel = LinearKernel::automatic);

/// True when linear()'s automatic path prefetches a `side` queue (every
/// SIMD path); the portable one ignores it.
[[nodiscard]] bool linear_uses_side_prefetch();

/// Reference (naive, same per-element accumulation order and, for BF16, the
/// same rounding of x and VDPBF16PS chain, in scalar code) for tests.
void linear_reference(const float* x, int m, int x_stride, const void* w, DType dtype, int n,
                      int k, const float* bias, float* y, int y_stride);

}  // namespace shardline::kernels::cpu
