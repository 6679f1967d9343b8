#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/attention.hpp"

// Paged GQA attention, see attention.hpp. Two kernels chosen per sequence by
// its num_q (device-side, from the descriptors; the host only sizes the grids
// from max_num_q / max_context_len), plus the split-decode combine:
//
//   prefill_kernel<D, T>  grid (ceil(max_num_q * group / 64), kv heads, seqs),
//                         256 threads: warp w owns rows w*8 .. w*8+7 of the
//                         CTA's 64 (row = (token, head of the group)); lane =
//                         key of the 32-key tile for the scores and the
//                         softmax, lane = components lane + 32 k for P V.
//   decode_kernel<T>      grid (min(max_splits, ~1024 / (kv heads * seqs)), kv heads, seqs),
//                         128 threads, each CTA looping over its share of the splits.
//   combine_kernel        grid (num_heads, seqs), 128 threads.
//
// Every float op of a (token, head) is a function of its q, its position and
// the K / V of positions 0..p (and, for decode, of context_len through the
// split count): FMA chains in index order, xor-butterfly warp reductions
// (every lane ends with the same value: each level adds two equal-shaped
// partial trees commutatively), and no atomics. Rows beyond their position's
// tile skip it entirely, so the CTA a row shares does not matter.
// Keys past context_len are never read (their slots may hold garbage / NaN,
// their block-table entries may not exist): they are zeros in shared memory
// and masked to -inf before the softmax.

namespace shardline::kernels::cuda {
namespace {

constexpr int kPrefillWarps = 8;
constexpr int kRowsPerWarp = 8;
constexpr int kPrefillRows = kPrefillWarps * kRowsPerWarp;  ///< rows per prefill CTA
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kKeyTile = 32;  ///< keys per prefill tile (= lanes)
constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kGroupChunk = 4;          ///< query heads per register pass in decode
/// Decode CTAs to aim for (about 8 per SM of an H100): with fewer (KV head,
/// sequence) pairs than this, several CTAs share a sequence's splits.
constexpr int kDecodeTargetCtas = 1024;
constexpr int kMaxSharedBytes = 227 * 1024;  ///< sm_90 opt-in dynamic shared memory per CTA

using detail::launch_status;
Status bad_arg(const std::string& why) { return detail::bad_arg("paged_attention", why); }

__device__ __forceinline__ float load_kv(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float load_kv(const std::uint16_t* p, long i) {
  return __uint_as_float(static_cast<std::uint32_t>(p[i]) << 16);  // BF16 -> F32, exact
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, s));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, s));
  return x;
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- prefill (FlashAttention-2 style) -------------------------------------------------

std::size_t prefill_smem_bytes(int d) {
  return sizeof(float) * (static_cast<std::size_t>(kPrefillRows) * d + 2u * kKeyTile * d) +
         kKeyTile * (sizeof(long) + sizeof(int));
}

/// D: head_dim rounded up to a multiple of 32 (the tile width); d: the real
/// head_dim <= D. Components d..D-1 are staged as zeros: they add exact
/// zeros to the score chains and are never written out.
template <int D, typename T>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(const float* __restrict__ q, int q_stride, const AttentionSeq* __restrict__ seqs,
                   int max_num_q, const T* __restrict__ kc, const T* __restrict__ vc,
                   int num_kv_heads, int block_size, int d, int group, float scale,
                   float* __restrict__ out, int out_stride) {
  static_assert(D % 32 == 0, "the padded head_dim must be a multiple of 32");
  constexpr int DC = D / 32;  // components per lane in P V
  const AttentionSeq seq = seqs[blockIdx.z];
  if (seq.num_q <= 1 || seq.num_q > max_num_q || seq.context_len < seq.num_q) return;
  const int rows = seq.num_q * group;
  const int r0 = blockIdx.x * kPrefillRows;
  if (r0 >= rows) return;
  const int kh = blockIdx.y;
  const int first_pos = seq.context_len - seq.num_q;  // position of query token 0

  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [kPrefillRows][D]
  float* ks = qs + kPrefillRows * D;            // [D][kKeyTile] (K transposed, like the cache)
  float* vs = ks + D * kKeyTile;                // [kKeyTile][D]
  long* slab = reinterpret_cast<long*>(vs + kKeyTile * D);  // [kKeyTile], -1: past context
  int* off = reinterpret_cast<int*>(slab + kKeyTile);       // [kKeyTile] offset in block

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int idx = tid; idx < kPrefillRows * D; idx += kPrefillThreads) {
    const int r = idx / D, c = idx % D, R = r0 + r;
    float x = 0.0f;
    if (R < rows && c < d) {
      const int i = R / group, h = kh * group + R % group;
      x = q[static_cast<long>(seq.q_start + i) * q_stride + static_cast<long>(h) * d + c];
    }
    qs[idx] = x;
  }

  int pos[kRowsPerWarp];  // position of each row of this warp, -1 past the rows
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DC];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int R = r0 + warp * kRowsPerWarp + rr;
    pos[rr] = R < rows ? first_pos + R / group : -1;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int k = 0; k < DC; ++k) acc[rr][k] = 0.0f;
  }
  const int last_row = min(rows, r0 + kPrefillRows) - 1;
  const int max_pos = first_pos + last_row / group;
  const long slab_elems = static_cast<long>(block_size) * d;

  for (int j0 = 0; j0 <= max_pos; j0 += kKeyTile) {
    if (tid < kKeyTile) {
      const int j = j0 + tid;
      if (j < seq.context_len) {
        const long blk = seq.block_table[j / block_size];
        slab[tid] = (blk * num_kv_heads + kh) * slab_elems;
        off[tid] = j % block_size;
      } else {
        slab[tid] = -1;
        off[tid] = 0;
      }
    }
    __syncthreads();  // slabs visible; every warp is done with the previous tile
    for (int idx = tid; idx < D * kKeyTile; idx += kPrefillThreads) {
      const int kk = idx % kKeyTile, i = idx / kKeyTile;
      const long s = slab[kk];
      ks[idx] = s >= 0 && i < d ? load_kv(kc, s + static_cast<long>(i) * block_size + off[kk]) : 0.0f;
    }
    for (int idx = tid; idx < kKeyTile * D; idx += kPrefillThreads) {
      const int c = idx % D, kk = idx / D;
      const long s = slab[kk];
      vs[idx] = s >= 0 && c < d ? load_kv(vc, s + static_cast<long>(off[kk]) * d + c) : 0.0f;
    }
    __syncthreads();  // tile staged (and, on the first tile, q)

    // Scores of this warp's rows, lane = key j0 + lane: FMA chain over i in order.
    float s[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) s[rr] = 0.0f;
    const float4* q4 = reinterpret_cast<const float4*>(qs + warp * kRowsPerWarp * D);
#pragma unroll 2
    for (int i = 0; i < D; i += 4) {
      const float k0 = ks[(i + 0) * kKeyTile + lane], k1 = ks[(i + 1) * kKeyTile + lane];
      const float k2 = ks[(i + 2) * kKeyTile + lane], k3 = ks[(i + 3) * kKeyTile + lane];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float4 qv = q4[(rr * D + i) / 4];
        float a = s[rr];
        a = __fmaf_rn(qv.x, k0, a);
        a = __fmaf_rn(qv.y, k1, a);
        a = __fmaf_rn(qv.z, k2, a);
        a = __fmaf_rn(qv.w, k3, a);
        s[rr] = a;
      }
    }

    // Online softmax per row (warp-uniform branches: pos[rr] is the same in all lanes).
    const int j = j0 + lane;
    bool active[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      active[rr] = j0 <= pos[rr];
      if (!active[rr]) continue;  // tile wholly past this row: untouched
      const bool valid = j <= pos[rr];
      const float x = valid ? __fmul_rn(s[rr], scale) : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(x));  // finite: key j0 <= pos is valid
      const float alpha = expf(m[rr] - m_new);        // 0 on the first tile (m = -inf)
      const float e = valid ? expf(x - m_new) : 0.0f;
      l[rr] = __fadd_rn(__fmul_rn(l[rr], alpha), warp_sum(e));
      m[rr] = m_new;
      s[rr] = e;
#pragma unroll
      for (int k = 0; k < DC; ++k) acc[rr][k] = __fmul_rn(acc[rr][k], alpha);
    }
    // acc[rr][k] += sum over the tile's keys, in order, of p * v[key][lane + 32 k].
#pragma unroll 4
    for (int kk = 0; kk < kKeyTile; ++kk) {
      float v[DC];
#pragma unroll
      for (int k = 0; k < DC; ++k) v[k] = vs[kk * D + lane + 32 * k];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float p = __shfl_sync(0xffffffffu, s[rr], kk);
        if (!active[rr]) continue;
#pragma unroll
        for (int k = 0; k < DC; ++k) acc[rr][k] = __fmaf_rn(p, v[k], acc[rr][k]);
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (pos[rr] < 0) continue;
    const int R = r0 + warp * kRowsPerWarp + rr;
    const int i = R / group, h = kh * group + R % group;
    float* o = out + static_cast<long>(seq.q_start + i) * out_stride + static_cast<long>(h) * d;
#pragma unroll
    for (int k = 0; k < DC; ++k)
      if (lane + 32 * k < d) o[lane + 32 * k] = __fdiv_rn(acc[rr][k], l[rr]);
  }
}

// ---- decode (Flash-Decoding) ------------------------------------------------------------

/// Bytes of the F32 part of the decode shared memory, rounded up to 8 (the
/// long slab offsets follow it).
__host__ __device__ constexpr std::size_t decode_float_bytes(int d, int group) {
  return (sizeof(float) * (static_cast<std::size_t>(group) * d +
                           static_cast<std::size_t>(group) * kDecodeSplitTokens + 2u * group) +
          7) &
         ~std::size_t{7};
}

std::size_t decode_smem_bytes(int d, int group) {
  return decode_float_bytes(d, group) + kDecodeSplitTokens * (sizeof(long) + sizeof(int));
}

template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_kernel(const float* __restrict__ q, int q_stride, const AttentionSeq* __restrict__ seqs,
                  int max_splits, const T* __restrict__ kc, const T* __restrict__ vc,
                  int num_kv_heads, int block_size, int d, int group, int num_heads, float scale,
                  float* __restrict__ out, int out_stride, float* __restrict__ ws) {
  const AttentionSeq seq = seqs[blockIdx.z];
  if (seq.num_q != 1 || seq.context_len < 1) return;
  const int nsplit = ceil_div(seq.context_len, kDecodeSplitTokens);
  if (nsplit > max_splits || static_cast<int>(blockIdx.x) >= nsplit) return;
  const int kh = blockIdx.y;

  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [group][d]
  float* sc = qs + group * d;                   // [group][kDecodeSplitTokens] scores, then e
  float* ms = sc + group * kDecodeSplitTokens;  // [group] split max
  float* ls = ms + group;                       // [group] split sum
  long* slab = reinterpret_cast<long*>(reinterpret_cast<char*>(smem4) + decode_float_bytes(d, group));
  int* off = reinterpret_cast<int*>(slab + kDecodeSplitTokens);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* qrow = q + static_cast<long>(seq.q_start) * q_stride + static_cast<long>(kh) * group * d;
  for (int idx = tid; idx < group * d; idx += kDecodeThreads) qs[idx] = qrow[idx];
  const long slab_elems = static_cast<long>(block_size) * d;
  // The CTA computes splits blockIdx.x, blockIdx.x + gridDim.x, ...: a
  // split's floats depend only on the split, not on which CTA computes it.
  for (int sp = blockIdx.x; sp < nsplit; sp += gridDim.x) {
    const int k0 = sp * kDecodeSplitTokens;
    const int n = min(kDecodeSplitTokens, seq.context_len - k0);  // keys k0 .. k0+n-1, all <= p
    for (int t = tid; t < n; t += kDecodeThreads) {
      const int j = k0 + t;
      slab[t] = (static_cast<long>(seq.block_table[j / block_size]) * num_kv_heads + kh) * slab_elems;
      off[t] = j % block_size;
    }
    __syncthreads();

    // Scores: thread per key, FMA chain over i in order, kGroupChunk heads per pass.
    for (int t = tid; t < n; t += kDecodeThreads) {
      const T* kp = kc + slab[t] + off[t];
      for (int g0 = 0; g0 < group; g0 += kGroupChunk) {
        float a[kGroupChunk] = {};
        for (int i = 0; i < d; ++i) {
          const float kv = load_kv(kp, static_cast<long>(i) * block_size);
#pragma unroll
          for (int u = 0; u < kGroupChunk; ++u)
            if (g0 + u < group) a[u] = __fmaf_rn(qs[(g0 + u) * d + i], kv, a[u]);
        }
#pragma unroll
        for (int u = 0; u < kGroupChunk; ++u)
          if (g0 + u < group) sc[(g0 + u) * kDecodeSplitTokens + t] = __fmul_rn(a[u], scale);
      }
    }
    __syncthreads();

    // Softmax of the split per head: warp per head; lane-strided partials, then butterfly.
    for (int g = warp; g < group; g += kDecodeWarps) {
      float* sg = sc + g * kDecodeSplitTokens;
      float mx = -INFINITY;
      for (int t = lane; t < n; t += 32) mx = fmaxf(mx, sg[t]);
      mx = warp_max(mx);
      float sum = 0.0f;
      for (int t = lane; t < n; t += 32) {
        const float e = expf(sg[t] - mx);
        sg[t] = e;
        sum = __fadd_rn(sum, e);
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        ms[g] = mx;
        ls[g] = sum;
      }
    }
    __syncthreads();

    // P V: thread per component, keys in order.
    for (int c = tid; c < d; c += kDecodeThreads) {
      for (int g0 = 0; g0 < group; g0 += kGroupChunk) {
        float a[kGroupChunk] = {};
        for (int t = 0; t < n; ++t) {
          const float v = load_kv(vc, slab[t] + static_cast<long>(off[t]) * d + c);
#pragma unroll
          for (int u = 0; u < kGroupChunk; ++u)
            if (g0 + u < group) a[u] = __fmaf_rn(sc[(g0 + u) * kDecodeSplitTokens + t], v, a[u]);
        }
#pragma unroll
        for (int u = 0; u < kGroupChunk; ++u) {
          const int g = g0 + u;
          if (g >= group) break;
          const int h = kh * group + g;
          if (nsplit == 1) {
            out[static_cast<long>(seq.q_start) * out_stride + static_cast<long>(h) * d + c] =
                __fdiv_rn(a[u], ls[g]);
          } else {
            float* p = ws + ((static_cast<long>(blockIdx.z) * num_heads + h) * max_splits + sp) * (d + 2);
            p[2 + c] = a[u];
            if (c == 0) {
              p[0] = ms[g];
              p[1] = ls[g];
            }
          }
        }
      }
    }
    __syncthreads();  // the next split reuses sc, ms, ls, slab and off
  }
}

/// Merges the splits of one (head, decode sequence) in split order:
/// M = max m_s, w_s = exp(m_s - M), out = (sum w_s acc_s) / (sum w_s l_s).
__global__ void __launch_bounds__(kDecodeThreads)
    combine_kernel(const AttentionSeq* __restrict__ seqs, int max_splits, int d, int num_heads,
                   const float* __restrict__ ws, float* __restrict__ out, int out_stride) {
  const AttentionSeq seq = seqs[blockIdx.y];
  if (seq.num_q != 1 || seq.context_len < 1) return;
  const int nsplit = ceil_div(seq.context_len, kDecodeSplitTokens);
  if (nsplit <= 1 || nsplit > max_splits) return;
  const int h = blockIdx.x;
  const long stride = d + 2;
  const float* base = ws + (static_cast<long>(blockIdx.y) * num_heads + h) * max_splits * stride;
  float mx = -INFINITY;
  for (int s = 0; s < nsplit; ++s) mx = fmaxf(mx, base[s * stride]);
  float total = 0.0f;
  for (int s = 0; s < nsplit; ++s)
    total = __fmaf_rn(base[s * stride + 1], expf(base[s * stride] - mx), total);
  float* o = out + static_cast<long>(seq.q_start) * out_stride + static_cast<long>(h) * d;
  for (int c = threadIdx.x; c < d; c += kDecodeThreads) {
    float a = 0.0f;
    for (int s = 0; s < nsplit; ++s)
      a = __fmaf_rn(base[s * stride + 2 + c], expf(base[s * stride] - mx), a);
    o[c] = __fdiv_rn(a, total);
  }
}

// ---- launch ----------------------------------------------------------------------------

template <int D, typename T>
Status launch_prefill(const float* q, int q_stride, const AttentionSeq* seqs, int num_seqs,
                      int max_num_q, const cpu::KvCacheLayer& cache, int group, float scale,
                      float* out, int out_stride, Stream stream) {
  const std::size_t smem = prefill_smem_bytes(D);
  auto* kernel = prefill_kernel<D, T>;
  if (const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: reported here
    return make_error(ErrorCode::internal, std::string("cuda paged_attention (prefill shared memory): ") +
                                               cudaGetErrorString(err));
  }
  const long rows = static_cast<long>(max_num_q) * group;
  const dim3 grid(static_cast<unsigned>((rows + kPrefillRows - 1) / kPrefillRows),
                  static_cast<unsigned>(cache.num_kv_heads), static_cast<unsigned>(num_seqs));
  kernel<<<grid, kPrefillThreads, smem, stream>>>(
      q, q_stride, seqs, max_num_q, static_cast<const T*>(cache.k), static_cast<const T*>(cache.v),
      cache.num_kv_heads, cache.block_size, cache.head_dim, group, scale, out, out_stride);
  return launch_status("paged_attention (prefill)");
}

template <typename T>
Status launch_decode(const float* q, int q_stride, const AttentionSeq* seqs, int num_seqs,
                     int max_splits, const cpu::KvCacheLayer& cache, int num_heads, int group,
                     float scale, float* out, int out_stride, float* ws, Stream stream) {
  const std::size_t smem = decode_smem_bytes(cache.head_dim, group);
  auto* kernel = decode_kernel<T>;
  if (const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: reported here
    return make_error(ErrorCode::internal, std::string("cuda paged_attention (decode shared memory): ") +
                                               cudaGetErrorString(err));
  }
  // At most max_splits CTAs per (KV head, sequence), fewer when the batch
  // alone fills the GPU: a grid sized for max_context_len (e.g. a CUDA graph
  // captured for max_model_len) must not launch mostly-idle CTAs.
  const int ctas_per_split = cache.num_kv_heads * num_seqs;
  const int grid_x = std::max(1, std::min(max_splits, (kDecodeTargetCtas + ctas_per_split - 1) / ctas_per_split));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(cache.num_kv_heads),
                  static_cast<unsigned>(num_seqs));
  kernel<<<grid, kDecodeThreads, smem, stream>>>(
      q, q_stride, seqs, max_splits, static_cast<const T*>(cache.k), static_cast<const T*>(cache.v),
      cache.num_kv_heads, cache.block_size, cache.head_dim, group, num_heads, scale, out,
      out_stride, ws);
  if (Status s = launch_status("paged_attention (decode)"); !s.ok()) return s;
  if (max_splits <= 1) return Status::ok_status();
  combine_kernel<<<dim3(static_cast<unsigned>(num_heads), static_cast<unsigned>(num_seqs)),
                   kDecodeThreads, 0, stream>>>(seqs, max_splits, cache.head_dim, num_heads, ws,
                                                out, out_stride);
  return launch_status("paged_attention (combine)");
}

template <typename T>
Status launch_all(const float* q, int q_stride, const AttentionSeq* seqs, int num_seqs,
                  int max_num_q, int max_splits, const cpu::KvCacheLayer& cache, int num_heads,
                  int group, float scale, float* out, int out_stride, float* ws, Stream stream) {
  if (max_num_q > 1) {
    const int d = cache.head_dim;
    const Status s =
        d <= 32    ? launch_prefill<32, T>(q, q_stride, seqs, num_seqs, max_num_q, cache, group,
                                           scale, out, out_stride, stream)
        : d <= 64  ? launch_prefill<64, T>(q, q_stride, seqs, num_seqs, max_num_q, cache, group,
                                           scale, out, out_stride, stream)
        : d <= 128 ? launch_prefill<128, T>(q, q_stride, seqs, num_seqs, max_num_q, cache, group,
                                            scale, out, out_stride, stream)
                   : launch_prefill<256, T>(q, q_stride, seqs, num_seqs, max_num_q, cache, group,
                                            scale, out, out_stride, stream);
    if (!s.ok()) return s;
  }
  return launch_decode<T>(q, q_stride, seqs, num_seqs, max_splits, cache, num_heads, group, scale,
                          out, out_stride, ws, stream);
}

}  // namespace

Status paged_attention(const float* q, int q_stride, const AttentionSeq* seqs, int num_seqs,
                       int max_num_q, int max_context_len, const cpu::KvCacheLayer& cache,
                       int num_heads, float scale, float* out, int out_stride, void* workspace,
                       std::size_t workspace_bytes, Stream stream) {
  if (num_seqs < 0 || max_num_q < 0 || max_context_len < 0 || num_heads < 0 ||
      cache.num_kv_heads < 0 || cache.head_dim < 0 || cache.num_blocks < 0)
    return bad_arg("negative size");
  if (num_seqs == 0 || max_num_q == 0) return Status::ok_status();
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    return make_error(ErrorCode::unsupported,
                      std::string("cuda paged_attention: KV cache dtype must be F32 or BF16, not ") +
                          dtype_name(cache.dtype));
  if (!attention_head_dim_supported(cache.head_dim))
    return make_error(ErrorCode::unsupported, "cuda paged_attention: head_dim " +
                                                  std::to_string(cache.head_dim) +
                                                  " not supported (1 to 256)");
  if (cache.block_size <= 0) return bad_arg("block_size must be positive");
  if (num_heads == 0 || cache.num_kv_heads == 0 || num_heads % cache.num_kv_heads != 0)
    return bad_arg("num_heads " + std::to_string(num_heads) + " is not a positive multiple of " +
                   "num_kv_heads " + std::to_string(cache.num_kv_heads));
  const long row = static_cast<long>(num_heads) * cache.head_dim;
  if (q_stride < row || out_stride < row) return bad_arg("q_stride / out_stride < num_heads * head_dim");
  if (max_context_len < max_num_q) return bad_arg("max_context_len < max_num_q");
  if (num_seqs > 65535 || cache.num_kv_heads > 65535 || num_heads > 65535)
    return bad_arg("num_seqs / num_heads > 65535");
  if (q == nullptr || seqs == nullptr || out == nullptr || cache.k == nullptr || cache.v == nullptr)
    return bad_arg("null pointer");
  const int group = num_heads / cache.num_kv_heads;
  if (decode_smem_bytes(cache.head_dim, group) > static_cast<std::size_t>(kMaxSharedBytes))
    return make_error(ErrorCode::unsupported, "cuda paged_attention: GQA group " +
                                                  std::to_string(group) + " too large for head_dim " +
                                                  std::to_string(cache.head_dim));
  const std::size_t need =
      paged_attention_workspace_bytes(num_seqs, num_heads, cache.head_dim, max_context_len);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr))
    return bad_arg("workspace of " + std::to_string(workspace_bytes) + " bytes, need " +
                   std::to_string(need));
  const int max_splits = (max_context_len + kDecodeSplitTokens - 1) / kDecodeSplitTokens;
  float* ws = static_cast<float*>(workspace);
  if (cache.dtype == DType::bf16)
    return launch_all<std::uint16_t>(q, q_stride, seqs, num_seqs, max_num_q, max_splits, cache,
                                     num_heads, group, scale, out, out_stride, ws, stream);
  return launch_all<float>(q, q_stride, seqs, num_seqs, max_num_q, max_splits, cache, num_heads,
                           group, scale, out, out_stride, ws, stream);
}

}  // namespace shardline::kernels::cuda
