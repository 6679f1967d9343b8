#pragma once
/// \file
/// Element-wise and row-wise CUDA ops of the Llama / Qwen forward pass: the
/// exact counterparts of kernels/cpu/ops.hpp and of cpu::write_kv
/// (kernels/cpu/attention.hpp) -- same arguments, shapes, strides and
/// semantics, but every pointer is a *device* pointer and the work is queued
/// on `stream` (nullptr = the legacy default stream).
///
/// Plain C++ header (no cuda_runtime.h needed): a stream is a `CUstream_st*`,
/// the same type as `cudaStream_t`.
///
/// Errors: each function checks its arguments on the host (negative sizes,
/// unsupported dtype -> invalid_argument / unsupported, nothing launched) and
/// then returns the launch status from cudaGetLastError (ErrorCode::internal
/// with the CUDA message). Kernel faults surface asynchronously: call
/// `synchronize(stream)` to collect them. Zero rows / tokens / elements launch
/// nothing and return ok.
///
/// Numerics: all compute in F32. Every row is computed by one thread block of
/// a fixed size with a reduction in a fixed order, so a row's result depends
/// only on that row (batch-invariant, deterministic run to run), though not
/// bit-identical to the CPU kernels (different summation order; expf / sincosf
/// within a few ulp of the CPU libm). Element-wise ops use no FMA contraction,
/// mirroring the CPU's scalar formulas. write_kv and embedding are exact (bit
/// for bit equal to the CPU).

#include <cstdint>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "kernels/cpu/attention.hpp"

struct CUstream_st;  // = cudaStream_t's pointee (driver_types.h)

namespace shardline::kernels::cuda {

/// A CUDA stream (`cudaStream_t`); nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// Waits for all work queued on `stream`; returns the first asynchronous
/// error (e.g. an illegal address in a kernel) as ErrorCode::internal.
[[nodiscard]] Status synchronize(Stream stream);

/// out[t, :] = table[token_ids[t], :] widened to F32 (exact).
/// token_ids: [num_tokens] int32 on the device, each in [0, vocab) (not
/// checked, as on the CPU); table: [vocab, hidden] of `dtype` (F32, BF16 or
/// F16); out: [num_tokens, hidden] F32, contiguous.
[[nodiscard]] Status embedding(const std::int32_t* token_ids, int num_tokens, const void* table,
                               DType dtype, int hidden, float* out, Stream stream);

/// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row.
/// x, y: `rows` rows of `dim` F32 with strides x_stride / y_stride in
/// elements (in-place allowed: x == y with equal strides); weight: [dim] F32.
/// Also used per head for the Qwen3 q / k norm (rows = tokens * heads,
/// dim = head_dim, stride = head_dim). One block of 256 threads per row; the
/// sum of squares is a per-thread FMA chain over i = tid, tid + 256, ...
/// followed by a fixed shared-memory tree: independent of `rows`.
[[nodiscard]] Status rms_norm(const float* x, int x_stride, const float* weight, float* y,
                              int y_stride, int rows, int dim, float eps, Stream stream);

/// Per-head RMSNorm in place (the Qwen3 q / k norm): for each of num_tokens
/// rows of stride row_stride (F32 elements), the first num_heads vectors of
/// head_dim floats (head h at offset h * head_dim) are each normalised with
/// weight [head_dim]. One block per (token, head), the reduction of rms_norm:
/// the same floats as rms_norm over that vector. Errors: invalid_argument
/// (negative sizes, row_stride < num_heads * head_dim).
[[nodiscard]] Status rms_norm_heads(float* x, int num_tokens, int row_stride, int num_heads,
                                    int head_dim, const float* weight, float eps, Stream stream);

/// RMSNorm of selected rows: y[i, :] = rms_norm(x[row_ids[i], :]) for
/// i < num_rows (the final norm of the rows whose logits are needed).
/// row_ids: [num_rows] int32 on the device, each a valid row of x (not
/// checked); y: [num_rows] rows of stride y_stride. Same floats as rms_norm.
[[nodiscard]] Status rms_norm_rows(const float* x, int x_stride, const std::int32_t* row_ids,
                                   int num_rows, const float* weight, float* y, int y_stride,
                                   int dim, float eps, Stream stream);

/// y[r, j] += bias[j] for r < rows, j < n (the QKV bias of Qwen2; the CPU
/// linear adds it to the finished dot product the same way). y: rows of
/// stride y_stride F32; bias: [n] F32.
[[nodiscard]] Status add_bias(float* y, int y_stride, const float* bias, int rows, int n,
                              Stream stream);

/// Fused residual add + RMSNorm: residual += x; y = rms_norm(residual).
/// residual, x, y: [rows, dim] F32 contiguous; weight: [dim]. y may alias x
/// or residual (element-wise in place). Same reduction as rms_norm.
[[nodiscard]] Status add_rms_norm(float* residual, const float* x, const float* weight, float* y,
                                  int rows, int dim, float eps, Stream stream);

/// residual[i] += x[i] for i < n (F32).
[[nodiscard]] Status add_inplace(float* residual, const float* x, long n, Stream stream);

/// SwiGLU: out[t, j] = silu(gate_up[t, j]) * gate_up[t, inter + j],
/// silu(g) = g / (1 + exp(-g)). gate_up: [rows, 2 * inter] F32; out: [rows, inter].
[[nodiscard]] Status silu_and_mul(const float* gate_up, float* out, int rows, int inter,
                                  Stream stream);

/// Rotate-half (GPT-NeoX / HF) RoPE in place on the first `num_heads` heads
/// of each row: for each head, pairs (x[i], x[i + head_dim/2]) rotated by the
/// angle positions[t] * inv_freq[i] (radians, computed in F32 like HF).
/// x: num_tokens rows of stride `row_stride` F32, heads contiguous (head_dim
/// each) from the row start; positions: [num_tokens] int32; inv_freq:
/// [head_dim / 2] F32 on the device, from cpu::rope_inv_freq. head_dim even.
[[nodiscard]] Status rope(float* x, int num_tokens, int row_stride, int num_heads, int head_dim,
                          const std::int32_t* positions, const float* inv_freq, Stream stream);

/// Writes the K and V rows of `num_tokens` tokens into their paged cache
/// slots, in exactly the layout of cpu::KvCacheLayer (whose k / v must be
/// device pointers here):
///   k cache: [num_blocks, num_kv_heads, head_dim, block_size] (K transposed);
///   v cache: [num_blocks, num_kv_heads, block_size, head_dim];
/// F32, or BF16 rounded to nearest even (NaN stays NaN, as f32_to_bf16).
/// k, v: rows of num_kv_heads * head_dim F32 with stride `row_stride`.
/// slot_mapping: [num_tokens] int32 on the device, slot = block_id *
/// block_size + offset; a negative slot skips the token (so does a slot
/// >= num_blocks * block_size, which on the CPU would be out of bounds).
/// Two tokens with the same slot: which one wins is unspecified.
[[nodiscard]] Status write_kv(const float* k, const float* v, int row_stride, int num_tokens,
                              const std::int32_t* slot_mapping, const cpu::KvCacheLayer& cache,
                              Stream stream);

}  // namespace shardline::kernels::cuda
