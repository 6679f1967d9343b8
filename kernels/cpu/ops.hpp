#pragma once
/// \file
/// Element-wise and row-wise CPU ops of the Llama / Qwen forward pass.
/// All F32 compute; every row is computed independently of the others
/// (batch-invariant).

#include <cstdint>
#include <vector>

#include "common/dtype.hpp"

namespace shardline::kernels::cpu {

/// out[t, :] = table[token_ids[t], :] widened to F32.
/// table: [vocab, hidden] of `dtype` (f32 or bf16); out: [num_tokens, hidden].
void embedding(const std::int32_t* token_ids, int num_tokens, const void* table, DType dtype,
               int hidden, float* out);

/// The instruction paths of rms_norm, add_rms_norm and silu_and_mul.
/// `automatic` is the widest this CPU has: avx512 (AVX-512 F/BW/VL + FMA),
/// else avx2 (AVX2 + FMA), else portable, unless the environment variable
/// SHARDLINE_OPS_KERNEL names another one this CPU runs (read once). avx512
/// and avx2 give the same bits (16 lane chains over the full 16-blocks,
/// reduced like _mm512_reduce_add_ps; SiLU's exp16 polynomial); portable
/// keeps its own order (one FMA chain, std::exp): close, not bit-identical. Each SIMD path is compiled for its
/// instructions whatever the build machine (ops_avx2.cpp, ops_avx512.cpp).
enum class OpsKernel { automatic, portable, avx2, avx512 };

/// Whether this CPU can run `kernel` (automatic and portable: always).
[[nodiscard]] bool ops_kernel_supported(OpsKernel kernel);

/// "avx512", "avx2" or "portable": the path `kernel` names (automatic: the
/// one it runs on this CPU).
[[nodiscard]] const char* ops_kernel_name(OpsKernel kernel = OpsKernel::automatic);

/// RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * weight.
/// x, y: `rows` rows of `dim` floats with strides x_stride / y_stride
/// (in-place allowed: x == y). weight: [dim]. Throws std::invalid_argument
/// for a `kernel` this CPU lacks.
void rms_norm(const float* x, int x_stride, const float* weight, float* y, int y_stride,
              int rows, int dim, float eps, OpsKernel kernel = OpsKernel::automatic);

/// Fused residual add + RMSNorm: residual += x; y = rms_norm(residual).
/// residual, x, y: [rows, dim] contiguous.
void add_rms_norm(float* residual, const float* x, const float* weight, float* y, int rows,
                  int dim, float eps, OpsKernel kernel = OpsKernel::automatic);

/// residual[i] += x[i] for i < n.
void add_inplace(float* residual, const float* x, long n);

/// SwiGLU: out[t, j] = silu(gate_up[t, j]) * gate_up[t, inter + j].
/// gate_up: [rows, 2 * inter]; out: [rows, inter].
void silu_and_mul(const float* gate_up, float* out, int rows, int inter, OpsKernel kernel = OpsKernel::automatic);

/// Rotary position embedding frequencies (RoFormer, Su et al. 2021) with
/// optional Llama 3 scaling (Meta llama3 `apply_scaling`).
struct RopeParams {
  int head_dim = 0;
  float theta = 10000.0f;
  bool llama3_scaling = false;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
  /// [head_dim / 2] or empty: inv_freq[i] is divided by freq_factors[i]
  /// (llama.cpp's rope_freqs: theta = pos * base^(-2i/d) / factor).
  std::vector<float> freq_factors;
};

/// inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim / 2, rescaled per
/// llama3 when enabled, then divided by `freq_factors` when given.
[[nodiscard]] std::vector<float> rope_inv_freq(const RopeParams& p);

/// Applies rotate-half (GPT-NeoX / Hugging Face) RoPE in place to the first
/// `num_heads` heads of each row: for each head, pairs (x[i], x[i + d/2]).
/// x: [num_tokens rows of stride `row_stride`], heads contiguous (head_dim
/// each) from the row start. positions: [num_tokens].
void rope(float* x, int num_tokens, int row_stride, int num_heads, int head_dim,
          const std::int32_t* positions, const float* inv_freq);

}  // namespace shardline::kernels::cpu
