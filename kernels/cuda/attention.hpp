#pragma once
/// \file
/// Paged grouped-query attention on CUDA: the counterpart of
/// cpu::paged_attention (kernels/cpu/attention.hpp) -- same KV cache layout,
/// causal semantics, GQA head mapping and scale -- with every pointer a
/// *device* pointer and the work queued on `stream`.
///
/// Sources: PagedAttention (Kwon et al., SOSP'23) for the block-table cache;
/// FlashAttention-2 (Dao, 2023) for the prefill kernel's tiling and online
/// softmax; Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023) for the split-KV
/// decode kernel and its log-sum-exp combine.
///
/// Plain C++ header (no cuda_runtime.h needed), like kernels/cuda/ops.hpp.

#include <cstddef>
#include <cstdint>

#include "common/result.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/ops.hpp"

namespace shardline::kernels::cuda {

/// A sequence's slice of the batch, exactly cpu::AttentionSeq (POD: three
/// ints and a pointer, the same layout on host and device): q_start (first
/// row in q / out), num_q (query tokens this step), context_len (tokens in
/// the cache after this step, incl. these num_q), block_table (int32
/// [ceil(context_len / block_size)] block ids, a *device* pointer).
/// paged_attention takes a *device array* of these: build it on the host
/// with the device block-table pointers and copy it over (e.g.
/// DeviceBuffer::from_host).
using AttentionSeq = cpu::AttentionSeq;

/// Tokens per split of the decode kernel (Flash-Decoding): a decode sequence
/// of context_len L is cut into ceil(L / kDecodeSplitTokens) splits of
/// consecutive positions from 0. A function of L only -- never of the batch
/// -- so a token's output is independent of the batch it runs in.
inline constexpr int kDecodeSplitTokens = 512;

/// Head dims the kernels handle: any 1..256. The prefill kernel is built for
/// tiles of 32, 64, 128 and 256 components and zero-pads a head_dim in
/// between (e.g. stories260K's 8, or 80 / 96), which adds exact zeros to its
/// dot products; the decode kernel loops over head_dim itself.
[[nodiscard]] constexpr bool attention_head_dim_supported(int head_dim) {
  return head_dim >= 1 && head_dim <= 256;
}

/// Bytes of F32 workspace paged_attention needs for the decode partials:
/// num_seqs * num_heads * S * (head_dim + 2) * 4 with
/// S = ceil(max_context_len / kDecodeSplitTokens), or 0 when S <= 1 (no
/// context needs more than one split: decode writes `out` directly).
[[nodiscard]] constexpr std::size_t paged_attention_workspace_bytes(int num_seqs, int num_heads,
                                                                    int head_dim,
                                                                    int max_context_len) {
  if (num_seqs <= 0 || num_heads <= 0 || head_dim <= 0 || max_context_len <= 0) return 0;
  const std::size_t splits =
      (static_cast<std::size_t>(max_context_len) + kDecodeSplitTokens - 1) / kDecodeSplitTokens;
  if (splits <= 1) return 0;
  return static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(num_heads) * splits *
         (static_cast<std::size_t>(head_dim) + 2) * sizeof(float);
}

/// out[t, h*d:(h+1)*d] = softmax(q_t,h . K^T * scale) V over the keys of
/// positions 0..p_t (causal; p_t = context_len - num_q + i for the i-th query
/// of its sequence); query head h reads KV head h / (num_heads / num_kv_heads).
/// Same semantics as cpu::paged_attention; K/V of this step's tokens must
/// already be written (cuda::write_kv).
///
/// Arguments (all pointers on the device):
///   q: rows of num_heads * head_dim F32 with stride q_stride (elements);
///   seqs: [num_seqs] AttentionSeq (device array, device block tables);
///   max_num_q / max_context_len: host-side upper bounds of seqs[*].num_q and
///     seqs[*].context_len (they size the grids and the workspace, like
///     FlashAttention's max_seqlen_q / max_seqlen_k). They must bound every
///     sequence: one with num_q > max_num_q, or a decode with more splits
///     than max_context_len gives, is skipped (its rows of out are left
///     unwritten) -- never read or written out of bounds;
///   cache: cpu::KvCacheLayer with device k / v, F32 or BF16
///     (k: [num_blocks, num_kv_heads, head_dim, block_size], K transposed in
///     the block; v: [num_blocks, num_kv_heads, block_size, head_dim]);
///     head_dim in 1..256; any block_size >= 1;
///   out: rows of num_heads * head_dim F32 with stride out_stride (must not
///     overlap q);
///   workspace: >= paged_attention_workspace_bytes(num_seqs, num_heads,
///     head_dim, max_context_len) bytes (may be null when that is 0), F32
///     partials of the split decode, 4-byte aligned.
///
/// Kernels, chosen per sequence:
///   * num_q > 1 (prefill / chunked prefill): FlashAttention-2 style. One
///     CTA of 8 warps per (64 rows, KV head, sequence), a row being a
///     (query token, query head of the GQA group) pair, so that the K/V tiles
///     of a KV head are shared by its whole group. Keys are visited in tiles
///     of 32 positions from 0 (a lane per key), staged in shared memory as
///     F32 (BF16 widened exactly); per row an online softmax (running max m,
///     sum l, accumulator acc in registers). A row skips the tiles past its
///     own position, so its float ops depend only on its q, its position and
///     the K/V of positions 0..p (not on the chunk, the batch or its CTA).
///   * num_q == 1 (decode): Flash-Decoding. Each split of
///     kDecodeSplitTokens positions of a (KV head, sequence) is computed by
///     one CTA -- up to one CTA per split, fewer when the batch alone fills
///     the GPU (a CTA then loops over several splits, so a grid sized for a
///     long max_context_len launches no idle CTAs) -- with all query heads of
///     the group together: scores of the split in shared memory, exact
///     softmax of the split (max, exp, sum), P V. A context of a single split
///     writes out = acc / l directly; otherwise the partials (m, l, acc) go to
///     the workspace and a combine kernel merges them per (head, sequence) in
///     split order 0, 1, ... (fixed: deterministic, batch-invariant).
///
/// Numerics: F32 math, FMA chains in a fixed order per (token, head, key /
/// component), warp reductions in a fixed butterfly; expf (not the fast
/// intrinsic). Deterministic run to run and batch-invariant (a token's output
/// is bit-identical whatever the other sequences of the batch), but not bit
/// identical to the CPU (different summation order; within ~1e-6 relative),
/// nor between the prefill and decode paths.
///
/// Errors: host-side checks before any launch -- negative sizes, num_heads
/// not a multiple of num_kv_heads, strides < num_heads * head_dim, null
/// pointers with work to do, max_context_len < max_num_q, num_seqs or
/// num_kv_heads > 65535, workspace too small -> invalid_argument; KV dtype
/// other than F32 / BF16, head_dim not supported -> unsupported. num_seqs == 0
/// (or max_num_q == 0) launches nothing and returns ok. Then the launch status
/// (ErrorCode::internal with the CUDA message); faults surface at
/// synchronize(stream).
[[nodiscard]] Status paged_attention(const float* q, int q_stride, const AttentionSeq* seqs,
                                     int num_seqs, int max_num_q, int max_context_len,
                                     const cpu::KvCacheLayer& cache, int num_heads, float scale,
                                     float* out, int out_stride, void* workspace,
                                     std::size_t workspace_bytes, Stream stream);

}  // namespace shardline::kernels::cuda
