#pragma once
/// \file
/// DéjàVu's buffered copies on a CUDA device (seed 003 §4.1.1 (1), Fig. 6a
/// and 7): many sequences' KV ranges, scattered over the blocks of one paged
/// KV cache, gathered into one contiguous device buffer by ONE launch, so
/// that a step's increments leave the device in one copy instead of one per
/// sequence and block. model/cuda/cuda_kv_copier.cpp drives it.
///
/// Plain C++ header (no cuda_runtime.h needed); see kernels/cuda/ops.hpp for
/// streams and the error conventions. The copy is exact (bits are moved,
/// never converted).

#include <cstdint>

#include "common/dtype.hpp"
#include "common/result.hpp"

struct CUstream_st;

namespace shardline::kernels::cuda {

/// One paged KV cache on the device (a rank's; kvstore::KvRankLayout):
///   data: [num_layers, 2 (K, V), num_blocks, num_kv_heads, block_size, head_dim]
/// elements of `dtype`, where a (layer, K|V, block, head) slab stores K
/// transposed, [head_dim][block_size], and V row-major, [block_size][head_dim]
/// (kernels/cpu/attention.hpp's layout).
struct KvGatherCache {
  const void* data = nullptr;
  DType dtype = DType::f32;  ///< f32, bf16 or f16 (2 or 4 bytes moved per element)
  int num_layers = 0;        ///< layers this cache holds
  int num_blocks = 0;
  int num_kv_heads = 0;      ///< head slots of this cache
  int block_size = 0;        ///< tokens per block
  int head_dim = 0;
};

/// One sequence's range in the cache: layers [layer, layer + num_layers) of
/// the cache (counted from its first layer), token positions
/// [token_begin, token_begin + num_tokens). Written to `out` at element
/// out_offset as
///   [num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim]
/// (kvstore::gather's layout for this cache). 8-byte aligned, 32 bytes:
/// an array of them is uploaded as is.
struct KvGatherPiece {
  std::int64_t out_offset = 0;     ///< elements into `out`
  std::int32_t blocks_offset = 0;  ///< index into `blocks` of the physical block of logical block token_begin / block_size
  std::int32_t layer = 0;          ///< first layer, local to the cache
  std::int32_t num_layers = 0;
  std::int32_t token_begin = 0;    ///< first position of the sequence
  std::int32_t num_tokens = 0;
  std::int32_t reserved = 0;
};
static_assert(sizeof(KvGatherPiece) == 32, "uploaded as is: the host and device layouts must agree");

/// Gathers `num_pieces` pieces (device array) out of `cache` into `out`
/// (device), on `stream`. `blocks` (device): for piece p, the physical
/// blocks of its logical blocks token_begin / block_size .. (token_begin +
/// num_tokens - 1) / block_size, from blocks[p.blocks_offset] on. A block id
/// outside [0, num_blocks) skips its tokens (they are left unwritten).
/// `max_piece_layers`: the largest num_layers of the pieces (the launch's
/// grid). Errors: invalid_argument (negative sizes, a null pointer with
/// pieces to gather, more than 65535 layer x K|V x head rows), unsupported
/// (another dtype), internal (the launch). No pieces: nothing launched.
[[nodiscard]] Status gather_kv(const KvGatherCache& cache, const KvGatherPiece* pieces, int num_pieces,
                               int max_piece_layers, const std::int32_t* blocks, void* out, CUstream_st* stream);

}  // namespace shardline::kernels::cuda
