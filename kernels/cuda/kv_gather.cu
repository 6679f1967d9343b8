#include "kernels/cuda/kv_gather.hpp"

#include <cuda_runtime.h>

#include "kernels/cuda/launch.cuh"

namespace shardline::kernels::cuda {

using detail::bad_arg;
using detail::launch_status;

namespace {

/// Block (piece p = blockIdx.x, row y = blockIdx.y = (layer * 2 + kv) *
/// heads + head); threads stride over the piece's num_tokens * head_dim
/// elements of that row.
template <class E>
__global__ void gather_kv_kernel(const E* __restrict__ cache, int num_blocks, int heads, int block_size,
                                 int head_dim, const KvGatherPiece* __restrict__ pieces,
                                 const std::int32_t* __restrict__ blocks, E* __restrict__ out) {
  const KvGatherPiece p = pieces[blockIdx.x];
  const int y = static_cast<int>(blockIdx.y);
  const int h = y % heads, kv = (y / heads) % 2, l = y / heads / 2;
  if (l >= p.num_layers) return;
  const long row = static_cast<long>(p.layer + l) * 2 + kv;  // the cache's (layer, K|V) row
  const long slab_elems = static_cast<long>(block_size) * head_dim;
  E* dst = out + p.out_offset + (static_cast<long>(l * 2 + kv) * heads + h) * p.num_tokens * head_dim;
  const int first_block = p.token_begin / block_size;
  const long n = static_cast<long>(p.num_tokens) * head_dim;
  for (long e = threadIdx.x; e < n; e += blockDim.x) {
    const int t = static_cast<int>(e / head_dim), d = static_cast<int>(e % head_dim);
    const int pos = p.token_begin + t;
    const std::int32_t b = blocks[p.blocks_offset + pos / block_size - first_block];
    if (b < 0 || b >= num_blocks) continue;
    const int off = pos % block_size;
    const long slab = ((row * num_blocks + b) * heads + h) * slab_elems;
    // K transposed: [d][offset]; V: [offset][d].
    dst[e] = cache[slab + (kv == 0 ? static_cast<long>(d) * block_size + off : static_cast<long>(off) * head_dim + d)];
  }
}

}  // namespace

Status gather_kv(const KvGatherCache& cache, const KvGatherPiece* pieces, int num_pieces, int max_piece_layers,
                 const std::int32_t* blocks, void* out, CUstream_st* stream) {
  if (num_pieces < 0 || max_piece_layers < 0 || cache.num_blocks < 0 || cache.num_kv_heads < 0 ||
      cache.block_size <= 0 || cache.head_dim < 0)
    return bad_arg("gather_kv", "bad size");
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16 && cache.dtype != DType::f16)
    return make_error(ErrorCode::unsupported, std::string("cuda gather_kv: dtype ") + dtype_name(cache.dtype));
  if (num_pieces == 0 || max_piece_layers == 0 || cache.num_kv_heads == 0 || cache.head_dim == 0)
    return Status::ok_status();
  if (cache.data == nullptr || pieces == nullptr || blocks == nullptr || out == nullptr)
    return bad_arg("gather_kv", "null pointer");
  const long rows = static_cast<long>(max_piece_layers) * 2 * cache.num_kv_heads;
  if (rows > 65535) return bad_arg("gather_kv", "more than 65535 layer x K|V x head rows");
  const dim3 grid(static_cast<unsigned>(num_pieces), static_cast<unsigned>(rows));
  constexpr int kThreads = 128;
  if (cache.dtype == DType::f32)
    gather_kv_kernel<std::uint32_t><<<grid, kThreads, 0, stream>>>(
        static_cast<const std::uint32_t*>(cache.data), cache.num_blocks, cache.num_kv_heads, cache.block_size,
        cache.head_dim, pieces, blocks, static_cast<std::uint32_t*>(out));
  else
    gather_kv_kernel<std::uint16_t><<<grid, kThreads, 0, stream>>>(
        static_cast<const std::uint16_t*>(cache.data), cache.num_blocks, cache.num_kv_heads, cache.block_size,
        cache.head_dim, pieces, blocks, static_cast<std::uint16_t*>(out));
  return launch_status("gather_kv");
}

}  // namespace shardline::kernels::cuda
