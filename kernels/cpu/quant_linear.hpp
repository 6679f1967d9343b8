#pragma once
/// \file
/// Linear layers on weights kept quantized (issue 40, step 2 in part):
/// y = x W^T with W [n, k] in llama.cpp's Q8_0, Q4_0 or Q4_1 blocks (the
/// GGUF bytes, kernels/cpu/ggml_quants.hpp), computed with integer dot
/// products as llama.cpp's CPU backend computes them:
///
///  - each row of x is quantized per 32-element block to Q8_0 (Q4_1: Q8_1,
///    the same values plus s) (quantize_row_q8_0: ggml's
///    quantize_row_q8_0_ref, bit-identical to the `gguf` package's
///    quants.quantize);
///  - each output element is, block by block in order, the exact integer
///    dot product of the block's values, scaled and added in F32 with the
///    operations of ggml-quants.c's scalar ggml_vec_dot_q8_0_q8_0 /
///    ggml_vec_dot_q4_0_q8_0 / ggml_vec_dot_q4_1_q8_1:
///      Q8_0: sumf += (float)sumi * (d_w * d_x)
///      Q4_0: sumf += ((float)sumi * d_w) * d_x      (sumi over nibble - 8)
///      Q4_1: sumf += (d_w * d_x) * (float)sumi + m_w * s_x   (sumi over nibble)
///    with d_w, m_w, d_x, s_x the blocks' F16 fields widened to F32, no FMA.
///
/// So a result is bit-identical to llama.cpp's scalar reference for that
/// pair of types, and to quant_linear_reference() here. The AVX2 kernel
/// computes the block integers with vpmaddubsw / vpmaddwd over 8 output
/// columns at once; the AVX512-VNNI kernel with vpdpbusd (u8 x s8 summed
/// into int32, no saturation) over 16 columns. Both keep each element's F32
/// chain in block order, so every kernel gives the same bits; the fastest
/// the CPU has is chosen at run time.
/// llama.cpp's own AVX2 path does not: it sums 8 lanes of partial sums and
/// reduces them at the end (another order). Batch-invariant: a row's
/// quantization and each element's chain depend on nothing else in the
/// batch, the tiling or the thread count.
///
/// Q4_K and Q6_K (the K-quants of Q4_K_M files) multiply x quantized per
/// 256 elements to Q8_K with their own scalar definition and kernels:
/// kernels/cpu/quant_linear_k.hpp.
///
/// Memory: a packed matrix keeps the blocks' quantized values (Q4_0, Q4_1:
/// 4 bits each) and their scales (and Q4_1's minimums) as F32, in panels of
/// 8 output columns (20 bytes per 32 Q4_0 weights, 24 per 32 Q4_1, 36 per
/// 32 Q8_0; the file's are 18, 20 and 34).

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/memory.hpp"
#include "common/result.hpp"
#include "kernels/cpu/ggml_quants.hpp"

namespace shardline::kernels::cpu {

/// Elements per Q8_0 / Q4_0 block.
inline constexpr int kQuantBlock = 32;

/// One Q8_0 block as ggml lays it out: F16 scale, 32 int8 values (34 bytes).
struct BlockQ8_0 {
  std::uint16_t d = 0;  ///< IEEE half bits of the scale
  std::int8_t qs[kQuantBlock] = {};
};
static_assert(sizeof(BlockQ8_0) == 34);

/// One Q8_1 block as ggml lays it out: F16 scale, F16 s (the values' sum
/// times the scale), 32 int8 values (36 bytes).
struct BlockQ8_1 {
  std::uint16_t d = 0;
  std::uint16_t s = 0;
  std::int8_t qs[kQuantBlock] = {};
};
static_assert(sizeof(BlockQ8_1) == 36);

/// Which kernel quant_linear runs. All give the same bits.
enum class QuantKernel {
  automatic,    ///< the fastest this CPU has: avx512_vnni, else avx2, else
                ///< scalar, unless the environment variable
                ///< SHARDLINE_QUANT_KERNEL names another one it runs (read once)
  scalar,       ///< the portable loop (tests compare the others with it)
  avx2,         ///< vpmaddubsw / vpmaddwd, 8 columns per register; requires AVX2 + FMA
  avx512_vnni,  ///< 16 columns per register (two panels): vpdpbusd (Q8_0,
                ///< Q4_0, Q4_1), vpdpwssd (Q4_K, Q6_K); requires AVX-512
                ///< F/BW/VL, FMA and AVX512-VNNI
};

/// Elements per Q8_K block (QK_K): what Q4_K and Q6_K weights multiply.
inline constexpr int kQuantSuperBlock = 256;

/// One Q8_K block as ggml lays it out: F32 scale, 256 int8 values, the
/// sums of each 16 values (292 bytes).
struct BlockQ8_K {
  float d = 0.0f;
  std::int8_t qs[kQuantSuperBlock] = {};
  std::int16_t bsums[kQuantSuperBlock / 16] = {};
};
static_assert(sizeof(BlockQ8_K) == 292);

/// Quantizes x [k] (k a multiple of 256) into Q8_K blocks exactly as ggml's
/// quantize_row_q8_K_ref: per block, max = the first value of largest
/// magnitude, iscale = -127 / max, values MIN(127, nearest_int(iscale x))
/// (round half to even), d = 1 / iscale (F32), bsums the sums of each 16
/// values; an all-zero block is d = 0 and zeros. A NaN value becomes 0.
/// `kernel`: scalar, or AVX2 (the same bits; what quant_linear uses where
/// the CPU has it; avx512_vnni means AVX2 here). Precondition: the CPU
/// runs `kernel` (quant_kernel_supported).
void quantize_row_q8_k(const float* x, int k, BlockQ8_K* y, QuantKernel kernel = QuantKernel::automatic);

/// Quantizes x [k] (k a multiple of 32) into k / 32 Q8_0 blocks exactly as
/// ggml's quantize_row_q8_0_ref: per block d = amax / 127, values
/// roundf(x / d) (round half away from zero, with 1 / d computed first), d
/// stored as F16 (nearest even). A NaN becomes 0 and an infinity the
/// nearest end of the int8 range (ggml leaves both undefined).
void quantize_row_q8_0(const float* x, int k, BlockQ8_0* y);

/// Quantizes x [k] into Q8_1 blocks as ggml's quantize_row_q8_1_ref: d and
/// the values as quantize_row_q8_0, s = F16(sum of the values x the F32 d).
/// What Q4_1 weights multiply.
void quantize_row_q8_1(const float* x, int k, BlockQ8_1* y);

/// Quantizes x [k] (k a multiple of 32) into k / 32 GGUF blocks of `type`
/// at `blocks` (any alignment) as llama.cpp's quantize_row_*_ref (what
/// llama-quantize writes for a pure file, bit-identical to the `gguf`
/// package's quants.quantize):
///   Q8_0: d = amax / 127, values roundf(x / d) (quantize_row_q8_0);
///   Q4_0: d = (the first value of largest magnitude) / -8, nibbles
///         MIN(15, (int8)(x / d + 8.5));
///   Q4_1: d = (max - min) / 15, m = min, nibbles
///         MIN(15, (int8)((x - min) / d + 0.5));
/// d and m stored as F16 (nearest even), 1 / d computed first. A NaN
/// becomes the zero nibble / value (ggml leaves it undefined). Errors:
/// invalid_argument (k not whole blocks), unsupported (another type).
[[nodiscard]] Status quantize_row(GgmlType type, const float* x, int k, void* blocks);

/// The kernel `automatic` runs for weights of `type` on this CPU:
/// "avx512_vnni", "avx2" or "scalar" (today the same for every type).
[[nodiscard]] const char* quant_kernel_name(GgmlType type);

/// Whether this CPU can run `kernel` (automatic and scalar: always).
[[nodiscard]] bool quant_kernel_supported(QuantKernel kernel);

/// A quantized weight matrix W [n, k] packed for quant_linear. Owns its
/// memory. Movable, not copyable.
class PackedQuantLinear {
 public:
  PackedQuantLinear() = default;
  /// Packs `blocks` (row-major: n rows of k / 32 blocks of `type`, or k /
  /// 256 for Q4_K and Q6_K; the GGUF tensor's bytes, any alignment).
  /// Errors: unsupported (a type other than Q8_0, Q4_0, Q4_1, Q4_K and Q6_K,
  /// named), invalid_argument (n < 1, k < 1 or not whole blocks, fewer bytes
  /// than n rows need).
  [[nodiscard]] static Result<PackedQuantLinear> pack(GgmlType type, std::span<const std::uint8_t> blocks, int n,
                                                      int k);
  /// The packed size of W [n, k] of `type`, as pack() lays it out. Errors:
  /// as pack() (without the byte count).
  [[nodiscard]] static Result<std::size_t> packed_bytes(GgmlType type, int n, int k);
  /// A matrix over `data`, packed_bytes(type, n, k) bytes that pack() laid
  /// out (a copy of data() elsewhere: a SiDP region fetched from its owner),
  /// not owned; `data` must outlive the view and be 64-byte aligned. Errors:
  /// as packed_bytes; invalid_argument for misaligned data.
  [[nodiscard]] static Result<PackedQuantLinear> view(const void* data, GgmlType type, int n, int k);

  [[nodiscard]] GgmlType type() const { return type_; }
  [[nodiscard]] int out_features() const { return n_; }  ///< n
  [[nodiscard]] int in_features() const { return k_; }   ///< k
  [[nodiscard]] std::size_t bytes() const { return bytes_; }  ///< packed size
  [[nodiscard]] const std::byte* data() const {
    return view_ != nullptr ? view_ : static_cast<const std::byte*>(data_.get());
  }
  [[nodiscard]] bool empty() const { return bytes_ == 0; }

 private:
  AlignedBuffer data_;
  const std::byte* view_ = nullptr;  ///< view(): memory owned elsewhere
  std::size_t bytes_ = 0;
  GgmlType type_ = GgmlType::q8_0;
  int n_ = 0;
  int k_ = 0;
};

/// y[m, n] = x[m, k] W^T (see the file comment). `x` rows have stride
/// `x_stride` floats (>= k), `y` rows `y_stride` (>= n); m may be 0.
/// Parallel over panels of output columns with OpenMP. Errors:
/// invalid_argument (m < 0, strides below k or n), unsupported (`kernel`
/// avx2 or avx512_vnni on a CPU without it).
[[nodiscard]] Status quant_linear(const float* x, int m, int x_stride, const PackedQuantLinear& w, float* y,
                                  int y_stride, QuantKernel kernel = QuantKernel::automatic);

/// The scalar definition on the unpacked GGUF blocks (llama.cpp's
/// quantize_row_q8_{0,1}_ref, then ggml_vec_dot_{q8_0_q8_0, q4_0_q8_0,
/// q4_1_q8_1}'s scalar loop per element), for tests. Errors: as
/// PackedQuantLinear::pack.
[[nodiscard]] Status quant_linear_reference(const float* x, int m, int x_stride, GgmlType type,
                                            std::span<const std::uint8_t> blocks, int n, int k, float* y,
                                            int y_stride);

}  // namespace shardline::kernels::cpu
