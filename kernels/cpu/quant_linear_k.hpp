#pragma once
/// \file
/// The K-quant half of kernels/cpu/quant_linear.hpp (issue 40, step 2):
/// linear layers on Q4_K and Q6_K weights (llama.cpp's "k-quants", the
/// types of a Q4_K_M file) with x quantized per 256-element super-block to
/// Q8_K (quantize_row_q8_k), computed as integer dot products. Used by
/// quant_linear.cpp only; callers use quant_linear.hpp.
///
/// The arithmetic (the scalar definition, reference_row(), and every
/// kernel, bit for bit), per output element, super-block by super-block in
/// order, with d_w, dmin_w the block's F16 fields widened and d_x the Q8_K
/// block's F32 scale:
///   Q4_K: 8 sub-blocks g of 32 with 6-bit scale sc_g and minimum m_g
///         (get_scale_min_k4), nibbles q in 0..15:
///           isum = sum_g sc_g * sum_{e in g} q_e x_e        (int32, exact)
///           imin = sum_g m_g * sum_{e in g} x_e             (int32, exact)
///           acc  = acc + ((d_w * d_x) * (float)isum - (dmin_w * d_x) * (float)imin)
///   Q6_K: 16 sub-blocks j of 16 with int8 scale sc_j, values q in 0..63:
///           isum = sum_j sc_j * sum_{e in j} (q_e - 32) x_e  (int32, exact)
///           acc  = acc + (d_w * d_x) * (float)isum
/// The integers are exactly llama.cpp's (ggml_vec_dot_q4_K_q8_K /
/// ggml_vec_dot_q6_K_q8_K form the same sums); its float step differs:
/// ggml's scalar loop keeps 8 lanes of partial sums per row and adds them at
/// the end, so results agree to F32 rounding, not bit for bit.
///
/// Packed layout, per panel of 8 output columns and per super-block:
///   Q4_K (1,216 bytes for 8 x 256 weights; the file's 1,152):
///     8 F32 d_w, 8 F32 dmin_w; scales and minimums as u8 pairs, [4 p][8 c]
///     [2] = (sc_{2p}, sc_{2p+1}) of column c, then the same for m; then
///     8 sub-blocks of 128 bytes laid out as Q4_0's values (quant_linear.cpp).
///   Q6_K (1,696 bytes; the file's 1,680):
///     8 F32 d_w; scales as i8 pairs [8 g][8 c][2] = (sc_{2g}, sc_{2g+1});
///     then per 32-element group g: 128 bytes of the values' low 4 bits laid
///     out as Q4_0's, then 2 x 32 bytes of their high 2 bits: byte 4c + j of
///     the first holds, in bits 2h..2h+1, the high bits of element 8h + j of
///     column c; the second of element 8h + 4 + j.

// The SIMD kernels of quant_linear.cpp and quant_linear_k.cpp carry their
// instructions as target attributes: those files are compiled for the build
// machine's (-march=native, maybe AVX2 only), and quant_linear picks a kernel
// at run time (kernels/cpu/kernel_paths.hpp). A lambda inside such a function
// does not inherit its target (GCC), so it carries the same one.
#define SHARDLINE_TARGET_AVX2 __attribute__((target("avx2")))
#define SHARDLINE_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ggml_quants.hpp"
#include "kernels/cpu/quant_linear.hpp"

namespace shardline::kernels::cpu::kquant {

/// Elements per K-quant super-block (QK_K).
inline constexpr int kSuperBlock = 256;

/// Q4_K or Q6_K.
[[nodiscard]] bool is_k_quant(GgmlType t);

/// Packed bytes per panel (8 columns) per super-block: 1,216 or 1,696.
[[nodiscard]] std::size_t packed_block_bytes(GgmlType t);

/// Writes column `c` (0..7) of a panel's packed super-block from that
/// column's GGUF super-block `block` (144 or 210 bytes, any alignment).
void pack_column_block(GgmlType t, const std::uint8_t* block, int c, std::uint8_t* packed);

/// Rows of x quantized to Q8_K.
struct Rows {
  std::vector<std::int8_t> q;     ///< [m, k] values
  std::vector<float> d;           ///< [m, k / 256] the blocks' F32 scales
  /// [m, k / 256, pairs] pairs of x sums as (low 16 bits, high 16 bits):
  /// Q4_K: 4 words (sum over sub-block 2p, over 2p + 1), sub-blocks of 32;
  /// Q6_K: 8 words, sub-blocks of 16.
  std::vector<std::int32_t> pairs;
  int pairs_per_block = 0;
};

/// Quantizes rows [m, k] (stride `x_stride`; k a multiple of 256) for
/// weights of type `t`.
[[nodiscard]] Rows quantize_rows(GgmlType t, const float* x, int m, int x_stride, int k);

/// y[i, 0 .. cols) for every row i < m from one packed panel of `nb`
/// super-blocks; `avx2` chooses the AVX2 kernel (the caller checked the
/// CPU) over the scalar one (the same bits).
void panel(GgmlType t, bool avx2, const std::byte* panel, int nb, const Rows& xq, int k, int m, float* y,
           int y_stride, int cols);

/// The AVX512-VNNI kernel (the caller checked the CPU; the same bits): y[i,
/// 0 .. cols) for every row i < m from two packed panels side by side
/// (columns [0, 8) from `panel0`, [8, 16) from `panel1`; pass the same panel
/// twice for an odd last one, with cols <= 8).
void panel_pair_avx512(GgmlType t, const std::byte* panel0, const std::byte* panel1, int nb, const Rows& xq, int k,
                       int m, float* y, int y_stride, int cols);

/// The scalar definition on GGUF bytes: the dot product of one weight row
/// (`k` / 256 blocks of `t`) with one row of x as Q8_K blocks.
[[nodiscard]] float reference_row(GgmlType t, const std::uint8_t* w_row, const BlockQ8_K* x, int k);

}  // namespace shardline::kernels::cpu::kquant
