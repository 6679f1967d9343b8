#pragma once
/// \file
/// Paged grouped-query attention on CPU, one kernel for prefill (causal, any
/// chunk of a prompt) and decode (one query token). PagedAttention (Kwon et
/// al., SOSP'23): the KV cache is split in fixed-size blocks addressed through
/// a per-sequence block table.
///
/// Batch invariance: each query token's output depends only on its own q, its
/// position and the cached K/V of its sequence, and keys are visited in the
/// same fixed tiling (per KV block, from position 0) whatever the chunking or
/// batch. So a token's output is bit-identical at any chunking.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/prefetch.hpp"

namespace shardline::kernels::cpu {

/// One layer's paged KV cache, per block and KV head a slab of
/// block_size * head_dim elements of `dtype`:
///   k: [num_blocks, num_kv_heads, head_dim, block_size]  (K transposed in the
///      block: row i holds component i of the block's keys, so the scores of
///      16 keys are the 16 lanes of FMAs of q[i] x row i, no horizontal sums);
///   v: [num_blocks, num_kv_heads, block_size, head_dim].
/// Both arrays have the same size; only write_kv and paged_attention know the
/// inside of a slab (whole blocks can be copied or swapped as bytes).
/// dtype: F32, or BF16 — vLLM's `--kv-cache-dtype` — rounded to nearest even
/// on write and widened exactly on read; attention math is F32 either way.
struct KvCacheLayer {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::f32;  ///< f32 or bf16
  int num_blocks = 0;
  int block_size = 0;  ///< tokens per block
  int num_kv_heads = 0;
  int head_dim = 0;
};

/// Writes the K and V rows of `num_tokens` tokens into their cache slots.
/// k, v: rows of num_kv_heads * head_dim floats with stride `row_stride`.
/// slot_mapping[t] = block_id * block_size + offset_in_block; a negative slot
/// skips the token.
void write_kv(const float* k, const float* v, int row_stride, int num_tokens,
              const std::int32_t* slot_mapping, const KvCacheLayer& cache);

/// A sequence's slice of the batch for attention.
struct AttentionSeq {
  int q_start = 0;       ///< first row of this sequence in q / out
  int num_q = 0;         ///< query tokens this step (prompt chunk, or 1 for decode)
  int context_len = 0;   ///< tokens in the cache after this step (incl. these num_q)
  const std::int32_t* block_table = nullptr;  ///< [ceil(context_len / block_size)]
};

/// paged_attention's instruction paths. `automatic` is the widest this CPU
/// has: avx512 (AVX-512 F/BW/VL + FMA), else avx2 (AVX2 + FMA), else
/// portable, unless the environment variable SHARDLINE_ATTENTION_KERNEL
/// names another one this CPU runs (read once). avx512 and avx2 give the same bits; portable keeps its own
/// order (close to them, not bit-identical). Each SIMD path is compiled for
/// its instructions whatever the build machine and chosen at run time.
enum class AttentionKernel { automatic, portable, avx2, avx512 };

/// Whether this CPU can run `kernel` (automatic and portable: always).
[[nodiscard]] bool attention_kernel_supported(AttentionKernel kernel);

/// "avx512", "avx2" or "portable": the path `kernel` names (automatic: the
/// one it runs on this CPU).
[[nodiscard]] const char* attention_kernel_name(AttentionKernel kernel = AttentionKernel::automatic);

/// out[t, h*d:(h+1)*d] = softmax(q_t,h . K^T * scale) V over the keys of
/// positions 0..p_t (causal; p_t = context_len - num_q + i for the i-th query
/// of its sequence). Query head h reads KV head h / (num_heads / num_kv_heads).
/// q: rows of num_heads * head_dim with stride q_stride; out: [rows, num_heads*head_dim]
/// with stride out_stride. K/V of this step's tokens must already be written.
/// Parallel over (sequence, query token, kv head) with OpenMP. `kernel`
/// picks the instruction path. Throws std::invalid_argument for a KV cache
/// dtype other than F32 / BF16 or a path this CPU lacks.
void paged_attention(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                     const KvCacheLayer& cache, int num_heads, float scale, float* out,
                     int out_stride, AttentionKernel kernel = AttentionKernel::automatic);

/// The cache lines paged_attention() will read for `seqs`, as runs for a
/// LinePrefetchQueue (prefetch.hpp), in per-thread slices for `num_threads`
/// threads. Per sequence and KV block: one run of the block's K slabs of all
/// KV heads (contiguous: [num_kv_heads, head_dim, block_size]) and one of its
/// V slabs. Sequences are taken in the order paged_attention hands out its
/// work (costliest, i.e. longest context, first) and dealt to the slices in
/// turn, so thread t prefetches roughly what it will attend; a line read by
/// the other core is still in the shared L3. Stops once `max_bytes` are
/// covered (0: no limit). Reads nothing of the cache.
[[nodiscard]] std::vector<std::vector<LineRun>> kv_line_runs(std::span<const AttentionSeq> seqs,
                                                             const KvCacheLayer& cache, int num_threads,
                                                             std::size_t max_bytes);

}  // namespace shardline::kernels::cpu
