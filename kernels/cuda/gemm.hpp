#pragma once
/// \file
/// Linear layers (GEMMs) of the CUDA backend: y[m, n] = x[m, k] · w[n, k]^T
/// with F32 activations and F32 / BF16 / F16 weights in the nn.Linear layout,
/// in one of two modes (GemmMode):
///
///  - `fast`: cuBLASLt. 16-bit weights: x is first cast to the weight dtype
///    into a scratch buffer of the context (cast_f32's rounding), then a
///    tensor-core GEMM with 16-bit A / B, FP32 accumulation and F32 output.
///    F32 weights: a true FP32 GEMM (CUBLAS_COMPUTE_32F, no TF32), for the
///    golden tests. The algorithm comes from cublasLtMatmulAlgoGetHeuristic
///    and is cached per problem (shape, dtype, strides, pointer alignment,
///    accumulate), so a repeated call costs one map lookup plus the launch(es).
///    Should cuBLASLt offer no algorithm for a problem (e.g. an unusually
///    aligned pointer), fast mode runs the batch-invariant kernel instead
///    (decided once per problem and cached with it).
///    cuBLASLt may pick split-K algorithms whose choice depends on m, so a
///    row's result can change with the batch size (not batch-invariant); run
///    to run it is deterministic for a given problem (cuBLASLt's in-place
///    split-K reduction is ordered by counters, not atomics).
///
///  - `batch_invariant`: our own kernels, one fixed tile shape
///    (kInvariantTileM x kInvariantTileN output tile per thread block) for
///    every m, no split-K, no atomics, and each output element's reduction
///    over k walks k = 0, 1, ... K-1 in one fixed order. Row i of y depends
///    only on row i of x and on w: it is bit-identical whatever m is and
///    wherever the row sits in the batch, and run to run (the "batch
///    invariance" of He et al., Thinking Machines, "Defeating nondeterminism in
///    LLM inference", 2025).
///      * 16-bit weights: x is cast exactly as in fast mode (same scratch, same
///        cast kernel, so both modes see the same inputs), then a WMMA
///        tensor-core kernel (mma m16n16k16, FP32 accumulators): 64x64 output
///        tile, 4 warps of 32x32, K in steps of 64 staged in shared memory with
///        a register-prefetch double buffer, 16-byte loads when k % 8 == 0 and
///        w is 16-byte aligned (2-byte loads otherwise). Each accumulator gets
///        one mma per 16-wide k chunk, chunks in increasing k (the tail
///        zero-padded), so the float operations producing an element depend on
///        k and on its own row and column only.
///        Expected speed (estimated, not yet measured on hardware): for large
///        prefill GEMMs on an H100 very roughly 100-200 TFLOPS, a quarter to a
///        third of cuBLAS. Decode (m <= 64) is bound by the weight stream,
///        and the grid is only ceil(n / 64) blocks with one 8 KiB weight stage
///        in flight each: narrow layers (n = 4096: 64 blocks on 132 SMs) should
///        reach only ~20-30 % of HBM bandwidth, wide ones (a fused gate_up,
///        the LM head) much more; cuBLAS's split-K GEMV kernels do better.
///      * F32 weights: an FFMA kernel, 64x64 output tile, 256 threads of 4x4
///        outputs, K in steps of 16 through shared memory (register-prefetch
///        double buffer); every element is one fmaf chain over k = 0..K-1.
///        Expected ~15-25 TFLOPS on an H100 (FP32 SIMT; for golden tests).
///
/// Plain C++ header (no cuda_runtime.h needed); same conventions as
/// kernels/cuda/ops.hpp: device pointers, work queued on `stream`, host-side
/// argument checks (check_linear_args) return an error before anything is
/// launched, cuBLAS failures come back as ErrorCode::internal with cuBLAS's
/// status string, kernel faults surface at `synchronize(stream)`.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "kernels/cuda/ops.hpp"

namespace shardline::kernels::cuda {

/// How a linear layer is computed.
enum class GemmMode {
  fast,             ///< cuBLASLt with tensor cores (BF16/F16 weights: inputs cast to the weight
                    ///< dtype, FP32 accumulate, F32 out); F32 weights: pure FP32 (no TF32:
                    ///< CUBLAS_COMPUTE_32F), for golden tests
  batch_invariant,  ///< our own kernel: fixed tile shape, no split-K, K visited in one fixed
                    ///< order, so row i of y depends only on row i of x and w (bit-identical
                    ///< whatever m is) -- the deterministic mode (He et al. / Thinking
                    ///< Machines "Defeating nondeterminism in LLM inference" 2025 idea)
};

[[nodiscard]] constexpr const char* gemm_mode_name(GemmMode mode) noexcept {
  switch (mode) {
    case GemmMode::fast: return "fast";
    case GemmMode::batch_invariant: return "batch_invariant";
  }
  return "?";
}

/// Bytes of the cuBLASLt workspace a GemmContext allocates.
inline constexpr std::size_t kGemmWorkspaceBytes = std::size_t{32} << 20;

/// Output tile of one thread block of the batch-invariant kernels (rows of y
/// x columns of y), the same for every m and every weight dtype.
inline constexpr int kInvariantTileM = 64;
inline constexpr int kInvariantTileN = 64;
/// Largest grid y dimension (CUDA limit); the n tiles of the batch-invariant
/// kernels go there (the m tiles on x, whose limit is 2^31 - 1).
inline constexpr int kMaxGridY = 65535;

/// Grid of the batch-invariant kernels: tiles_m = ceil(m / 64) blocks along
/// x, tiles_n = ceil(n / 64) along y. Pure host arithmetic (m, n >= 0).
struct GemmGrid {
  int tiles_m = 0;
  int tiles_n = 0;
};
[[nodiscard]] constexpr GemmGrid batch_invariant_grid(int m, int n) noexcept {
  return GemmGrid{m <= 0 ? 0 : (m - 1) / kInvariantTileM + 1,
                  n <= 0 ? 0 : (n - 1) / kInvariantTileN + 1};
}

/// Row stride (elements) of the 16-bit copy of x that 16-bit-weight linears
/// cast into the context's scratch: k rounded up to a multiple of 8, so that
/// every row starts 16-byte aligned.
[[nodiscard]] constexpr long cast_row_stride(int k) noexcept {
  return (static_cast<long>(k) + 7) / 8 * 8;
}

/// The host-side checks of GemmContext::linear, with no CUDA call (also what
/// linear runs first). `max_rows` / `max_k` are the context's limits, which
/// only apply to 16-bit weights (they bound the cast scratch). Returns, in
/// this order:
///  - invalid_argument if m < 0; then ok if m == 0 (nothing to do: pointers
///    and the other sizes are not looked at);
///  - invalid_argument for n < 1, k < 1, x_stride < k, y_stride < n, a null
///    x / w / y, an unknown mode, or n > 65535 * 64 (grid limit);
///  - unsupported for a w_dtype other than F32 / BF16 / F16;
///  - invalid_argument for 16-bit weights with m > max_rows or k > max_k.
[[nodiscard]] inline Status check_linear_args(const void* x, int x_stride, int m, int k,
                                              const void* w, DType w_dtype, int n, const void* y,
                                              int y_stride, GemmMode mode, int max_rows,
                                              int max_k) {
  const auto bad = [](const std::string& why) {
    return make_error(ErrorCode::invalid_argument, "cuda linear: " + why);
  };
  if (m < 0) return bad("negative m " + std::to_string(m));
  if (m == 0) return Status::ok_status();
  if (n < 1 || k < 1)
    return bad("n and k must be >= 1 (n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  if (x_stride < k)
    return bad("x_stride " + std::to_string(x_stride) + " < k " + std::to_string(k));
  if (y_stride < n)
    return bad("y_stride " + std::to_string(y_stride) + " < n " + std::to_string(n));
  if (x == nullptr || w == nullptr || y == nullptr) return bad("null x, w or y");
  if (mode != GemmMode::fast && mode != GemmMode::batch_invariant)
    return bad("unknown GemmMode " + std::to_string(static_cast<int>(mode)));
  if (batch_invariant_grid(m, n).tiles_n > kMaxGridY)
    return bad("n " + std::to_string(n) + " exceeds the grid limit");
  if (w_dtype != DType::f32 && w_dtype != DType::bf16 && w_dtype != DType::f16)
    return make_error(ErrorCode::unsupported, "cuda linear: weight dtype " +
                                                  std::to_string(static_cast<int>(w_dtype)));
  if (w_dtype != DType::f32 && (m > max_rows || k > max_k))
    return bad("m " + std::to_string(m) + " x k " + std::to_string(k) +
               " exceeds the context's cast scratch (max_rows " + std::to_string(max_rows) +
               ", max_k " + std::to_string(max_k) + ")");
  return Status::ok_status();
}

/// cuBLASLt handle, workspace, cast scratch and algorithm cache for the
/// linear layers of one device (the current device at create()).
///
/// Not thread-safe, and one stream at a time: the workspace and the cast
/// scratch are shared by every call, so two calls must not run concurrently
/// on different streams (calls queued on one stream are fine). Move-free:
/// held by unique_ptr.
class GemmContext {
 public:
  /// Creates the cuBLASLt handle and a workspace (32 MiB) and a scratch for
  /// the activation cast sized for max_rows x max_k elements (2 bytes each;
  /// rows padded to cast_row_stride(max_k)). max_rows or max_k == 0: no
  /// scratch (only F32 weights and linear_lowp can be used).
  /// Errors: invalid_argument (negative limits), internal (cuBLAS),
  /// out_of_memory.
  [[nodiscard]] static Result<std::unique_ptr<GemmContext>> create(int max_rows, int max_k);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  /// y[m, n] = x[m, k] · w[n, k]^T (+ y[m, n] when accumulate).
  /// x: F32 row-major, row stride x_stride (elements, >= k); w: [n, k]
  /// row-major of w_dtype (F32, BF16 or F16) on the device -- the nn.Linear
  /// layout; y: F32 row-major, row stride y_stride (>= n), not overlapping x
  /// or w. m == 0 does nothing. Must be capturable in a CUDA graph (no
  /// allocation, no sync inside once m <= max_rows and k <= max_k; the first
  /// call of a new problem in fast mode also runs the cuBLASLt heuristic, a
  /// host-only call).
  /// Errors: invalid_argument (sizes, m > max_rows or k > max_k for 16-bit
  /// weights, null pointers; see check_linear_args), unsupported (dtype),
  /// internal (cuBLAS status string, launch failure).
  [[nodiscard]] Status linear(const float* x, int x_stride, int m, int k, const void* w,
                              DType w_dtype, int n, float* y, int y_stride, bool accumulate,
                              GemmMode mode, Stream stream);

  /// The fast-mode GEMM alone, on activations already in the weight dtype:
  /// y[m, n] = x16[m, k] · w[n, k]^T (+ y when accumulate), x16 and w both of
  /// `dtype` (BF16 or F16), row-major with row strides x_stride (>= k) and k;
  /// FP32 accumulate, F32 y (row stride y_stride >= n). Uses no scratch (any
  /// m, k). What linear(fast) runs after its cast; also the roofline probe.
  /// Errors: as linear (unsupported for F32 `dtype`).
  [[nodiscard]] Status linear_lowp(const void* x16, int x_stride, int m, int k, const void* w,
                                   DType dtype, int n, float* y, int y_stride, bool accumulate,
                                   Stream stream);

  [[nodiscard]] int max_rows() const noexcept { return max_rows_; }
  [[nodiscard]] int max_k() const noexcept { return max_k_; }
  /// Number of cached cuBLASLt plans (one per distinct fast-mode problem).
  [[nodiscard]] std::size_t cached_plans() const noexcept;

  struct Impl;  ///< cuBLASLt state (gemm.cu)

 private:
  GemmContext() = default;
  std::unique_ptr<Impl> impl_;
  int max_rows_ = 0;
  int max_k_ = 0;
};

/// x F32 -> dtype (BF16 round-to-nearest-even exactly like common/dtype.hpp
/// f32_to_bf16, NaN stays NaN; F16 like __float2half_rn; F32: a copy),
/// n elements, `out` of dtype_size(dtype) bytes each, not overlapping x.
/// n == 0 does nothing. Errors: invalid_argument (n < 0, null pointer),
/// unsupported (dtype), internal (launch).
[[nodiscard]] Status cast_f32(const float* x, long n, DType dtype, void* out, Stream stream);

}  // namespace shardline::kernels::cuda
