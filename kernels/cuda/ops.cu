#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/dtype.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.hpp"

// Row-wise ops: one block of kRowThreads threads per row, whatever the number
// of rows or the dim; the reduction order is a function of (dim) only, so a
// row's result never depends on the batch. Element-wise ops use the explicit
// round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) so that nvcc does
// not contract them into FMAs: the same float ops as the CPU scalar formulas.

namespace shardline::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;  ///< threads per row block (power of two)
constexpr int kEltThreads = 256;  ///< threads per block of element-wise ops

using detail::launch_status;
using detail::bad_arg;

// ---- embedding ---------------------------------------------------------------

template <DType D>
__global__ void embedding_kernel(const std::int32_t* __restrict__ ids, const void* __restrict__ table,
                                 int hidden, float* __restrict__ out) {
  const int t = blockIdx.x;
  const long row = static_cast<long>(ids[t]) * hidden;
  float* o = out + static_cast<long>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    if constexpr (D == DType::f32) {
      o[i] = static_cast<const float*>(table)[row + i];
    } else if constexpr (D == DType::bf16) {
      o[i] = shardline::bf16_to_f32(static_cast<const std::uint16_t*>(table)[row + i]);
    } else {
      o[i] = shardline::f16_to_f32(static_cast<const std::uint16_t*>(table)[row + i]);
    }
  }
}

// ---- rms_norm --------------------------------------------------------------------

/// Sum over the block of `v` (one per thread) in a fixed tree; result in every thread.
__device__ __forceinline__ float block_sum(float v, float* shm /*[kRowThreads]*/) {
  shm[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shm[threadIdx.x] = __fadd_rn(shm[threadIdx.x], shm[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = shm[0];
  __syncthreads();  // shm may be reused by the caller
  return r;
}

__device__ __forceinline__ float inv_rms_of(float sum_sq, int dim, float eps) {
  return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(dim)), eps)));
}

/// Block b normalises one vector of `dim` floats: with row_ids, input row
/// row_ids[b] (output row b); otherwise vector b of `heads` per row (head
/// h = b % heads of row b / heads, at offset h * dim). The reduction is the
/// same in every case: a vector's result depends only on the vector.
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_kernel(const float* x, int x_stride, const float* __restrict__ w, float* y,
                    int y_stride, int dim, float eps, int heads,
                    const std::int32_t* __restrict__ row_ids) {
  __shared__ float shm[kRowThreads];
  const long b = blockIdx.x;
  const long in_row = row_ids != nullptr ? row_ids[b] : b / heads;
  const long out_row = row_ids != nullptr ? b : b / heads;
  const long head_off = row_ids != nullptr ? 0 : (b % heads) * dim;
  const float* xr = x + in_row * x_stride + head_off;
  float* yr = y + out_row * y_stride + head_off;
  float acc = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) acc = __fmaf_rn(xr[i], xr[i], acc);
  const float r = inv_rms_of(block_sum(acc, shm), dim, eps);  // syncs: x read before y written
  for (int i = threadIdx.x; i < dim; i += kRowThreads) yr[i] = __fmul_rn(__fmul_rn(xr[i], r), w[i]);
}

__global__ void __launch_bounds__(kRowThreads)
    add_rms_norm_kernel(float* residual, const float* x, const float* __restrict__ w, float* y,
                        int dim, float eps) {
  __shared__ float shm[kRowThreads];
  const long base = static_cast<long>(blockIdx.x) * dim;
  float* res = residual + base;
  float acc = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) {
    const float s = __fadd_rn(res[i], x[base + i]);
    res[i] = s;
    acc = __fmaf_rn(s, s, acc);
  }
  const float r = inv_rms_of(block_sum(acc, shm), dim, eps);
  // Each thread re-reads only the residual elements it wrote itself, and
  // writes y[i] only after reading x[i] / residual[i]: y may alias either.
  for (int i = threadIdx.x; i < dim; i += kRowThreads)
    y[base + i] = __fmul_rn(__fmul_rn(res[i], r), w[i]);
}

// ---- element-wise ---------------------------------------------------------------

__global__ void add_inplace_kernel(float* __restrict__ residual, const float* __restrict__ x,
                                   long n) {
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    residual[i] = __fadd_rn(residual[i], x[i]);
}

__global__ void add_bias_kernel(float* __restrict__ y, int y_stride, const float* __restrict__ bias,
                                int n) {
  float* yr = y + static_cast<long>(blockIdx.y) * y_stride;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
    yr[j] = __fadd_rn(yr[j], bias[j]);
}

__global__ void silu_and_mul_kernel(const float* __restrict__ gate_up, float* __restrict__ out,
                                    int inter) {
  const long r = blockIdx.y;
  const float* g = gate_up + r * 2 * inter;
  const float* u = g + inter;
  float* o = out + r * inter;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < inter; j += gridDim.x * blockDim.x) {
    const float gv = g[j];
    o[j] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u[j]);
  }
}

/// One block per token; thread k handles pair i = k % half of head k / half.
__global__ void rope_kernel(float* x, int row_stride, int num_heads, int head_dim,
                            const std::int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq) {
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  float* row = x + static_cast<long>(t) * row_stride;
  const int pairs = num_heads * half;
  for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
    const int h = k / half, i = k % half;
    const float ang = __fmul_rn(pos, inv_freq[i]);
    float sn, cs;
    sincosf(ang, &sn, &cs);
    float* x1 = row + h * head_dim + i;
    float* x2 = x1 + half;
    const float a = *x1, b = *x2;
    *x1 = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    *x2 = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
  }
}

// ---- write_kv ---------------------------------------------------------------------

/// Block (token t, kv head h); thread c copies component c of K and V.
template <bool BF16>
__global__ void write_kv_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                int row_stride, const std::int32_t* __restrict__ slots,
                                void* __restrict__ kc, void* __restrict__ vc, int num_kv_heads,
                                int block_size, int head_dim, long num_slots) {
  const int t = blockIdx.x, h = blockIdx.y;
  const std::int32_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const long block = slot / block_size, off = slot % block_size;
  const long slab = (block * num_kv_heads + h) * static_cast<long>(block_size) * head_dim;
  const long kdst = slab + off;             // K transposed: [i][offset], stride block_size
  const long vdst = slab + off * head_dim;  // V: [offset][i]
  const long src = static_cast<long>(t) * row_stride + static_cast<long>(h) * head_dim;
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
    const long kd = kdst + static_cast<long>(c) * block_size;
    if constexpr (BF16) {
      static_cast<std::uint16_t*>(kc)[kd] = shardline::f32_to_bf16(k[src + c]);
      static_cast<std::uint16_t*>(vc)[vdst + c] = shardline::f32_to_bf16(v[src + c]);
    } else {
      static_cast<float*>(kc)[kd] = k[src + c];
      static_cast<float*>(vc)[vdst + c] = v[src + c];
    }
  }
}

int threads_for(int n) {  // a multiple of 32 covering n, at most 256
  const int w = (n + 31) / 32 * 32;
  return w < 32 ? 32 : (w > 256 ? 256 : w);
}

}  // namespace

Status synchronize(Stream stream) {
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) return Status::ok_status();
  return make_error(ErrorCode::internal,
                    std::string("cuda synchronize: ") + cudaGetErrorString(err));
}

Status embedding(const std::int32_t* token_ids, int num_tokens, const void* table, DType dtype,
                 int hidden, float* out, Stream stream) {
  if (num_tokens < 0 || hidden < 0) return bad_arg("embedding", "negative size");
  if (num_tokens == 0 || hidden == 0) return Status::ok_status();
  const dim3 grid(static_cast<unsigned>(num_tokens));
  const int th = threads_for(hidden);
  switch (dtype) {
    case DType::f32:
      embedding_kernel<DType::f32><<<grid, th, 0, stream>>>(token_ids, table, hidden, out);
      break;
    case DType::bf16:
      embedding_kernel<DType::bf16><<<grid, th, 0, stream>>>(token_ids, table, hidden, out);
      break;
    case DType::f16:
      embedding_kernel<DType::f16><<<grid, th, 0, stream>>>(token_ids, table, hidden, out);
      break;
  }
  return launch_status("embedding");
}

Status rms_norm(const float* x, int x_stride, const float* weight, float* y, int y_stride,
                int rows, int dim, float eps, Stream stream) {
  if (rows < 0 || dim < 0) return bad_arg("rms_norm", "negative size");
  if (rows == 0 || dim == 0) return Status::ok_status();
  if (x_stride < dim || y_stride < dim) return bad_arg("rms_norm", "stride < dim");
  rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, x_stride, weight, y,
                                                                           y_stride, dim, eps, 1, nullptr);
  return launch_status("rms_norm");
}

Status rms_norm_heads(float* x, int num_tokens, int row_stride, int num_heads, int head_dim,
                      const float* weight, float eps, Stream stream) {
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0) return bad_arg("rms_norm_heads", "negative size");
  if (num_tokens == 0 || num_heads == 0 || head_dim == 0) return Status::ok_status();
  if (row_stride < num_heads * head_dim) return bad_arg("rms_norm_heads", "row_stride < num_heads * head_dim");
  const long blocks = static_cast<long>(num_tokens) * num_heads;
  if (blocks > 0x7fffffffL) return bad_arg("rms_norm_heads", "too many heads");
  rms_norm_kernel<<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
      x, row_stride, weight, x, row_stride, head_dim, eps, num_heads, nullptr);
  return launch_status("rms_norm_heads");
}

Status rms_norm_rows(const float* x, int x_stride, const std::int32_t* row_ids, int num_rows,
                     const float* weight, float* y, int y_stride, int dim, float eps, Stream stream) {
  if (num_rows < 0 || dim < 0) return bad_arg("rms_norm_rows", "negative size");
  if (num_rows == 0 || dim == 0) return Status::ok_status();
  if (x_stride < dim || y_stride < dim) return bad_arg("rms_norm_rows", "stride < dim");
  if (row_ids == nullptr) return bad_arg("rms_norm_rows", "null row_ids");
  rms_norm_kernel<<<static_cast<unsigned>(num_rows), kRowThreads, 0, stream>>>(
      x, x_stride, weight, y, y_stride, dim, eps, 1, row_ids);
  return launch_status("rms_norm_rows");
}

Status add_rms_norm(float* residual, const float* x, const float* weight, float* y, int rows,
                    int dim, float eps, Stream stream) {
  if (rows < 0 || dim < 0) return bad_arg("add_rms_norm", "negative size");
  if (rows == 0 || dim == 0) return Status::ok_status();
  add_rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(residual, x, weight,
                                                                               y, dim, eps);
  return launch_status("add_rms_norm");
}

Status add_inplace(float* residual, const float* x, long n, Stream stream) {
  if (n < 0) return bad_arg("add_inplace", "negative size");
  if (n == 0) return Status::ok_status();
  const long want = (n + kEltThreads - 1) / kEltThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);
  add_inplace_kernel<<<blocks, kEltThreads, 0, stream>>>(residual, x, n);
  return launch_status("add_inplace");
}

Status add_bias(float* y, int y_stride, const float* bias, int rows, int n, Stream stream) {
  if (rows < 0 || n < 0) return bad_arg("add_bias", "negative size");
  if (rows == 0 || n == 0) return Status::ok_status();
  if (y_stride < n) return bad_arg("add_bias", "stride < n");
  const int xblocks = (n + kEltThreads - 1) / kEltThreads;
  for (int r0 = 0; r0 < rows; r0 += 65535) {  // gridDim.y limit
    const int chunk = rows - r0 < 65535 ? rows - r0 : 65535;
    add_bias_kernel<<<dim3(static_cast<unsigned>(xblocks), static_cast<unsigned>(chunk)), kEltThreads, 0,
                      stream>>>(y + static_cast<long>(r0) * y_stride, y_stride, bias, n);
    if (Status s = launch_status("add_bias"); !s.ok()) return s;
  }
  return Status::ok_status();
}

Status silu_and_mul(const float* gate_up, float* out, int rows, int inter, Stream stream) {
  if (rows < 0 || inter < 0) return bad_arg("silu_and_mul", "negative size");
  if (rows == 0 || inter == 0) return Status::ok_status();
  if (rows > 65535) {  // gridDim.y limit: split into launches of <= 65535 rows
    for (int r0 = 0; r0 < rows; r0 += 65535) {
      const int n = rows - r0 < 65535 ? rows - r0 : 65535;
      Status s = silu_and_mul(gate_up + static_cast<long>(r0) * 2 * inter,
                              out + static_cast<long>(r0) * inter, n, inter, stream);
      if (!s.ok()) return s;
    }
    return Status::ok_status();
  }
  const int xb = (inter + kEltThreads - 1) / kEltThreads;
  const dim3 grid(static_cast<unsigned>(xb < 64 ? xb : 64), static_cast<unsigned>(rows));
  silu_and_mul_kernel<<<grid, kEltThreads, 0, stream>>>(gate_up, out, inter);
  return launch_status("silu_and_mul");
}

Status rope(float* x, int num_tokens, int row_stride, int num_heads, int head_dim,
            const std::int32_t* positions, const float* inv_freq, Stream stream) {
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0) return bad_arg("rope", "negative size");
  if (head_dim % 2 != 0) return bad_arg("rope", "odd head_dim " + std::to_string(head_dim));
  if (num_tokens == 0 || num_heads == 0 || head_dim == 0) return Status::ok_status();
  if (row_stride < num_heads * head_dim) return bad_arg("rope", "row_stride < num_heads * head_dim");
  rope_kernel<<<static_cast<unsigned>(num_tokens), threads_for(num_heads * head_dim / 2), 0,
                stream>>>(x, row_stride, num_heads, head_dim, positions, inv_freq);
  return launch_status("rope");
}

Status write_kv(const float* k, const float* v, int row_stride, int num_tokens,
                const std::int32_t* slot_mapping, const cpu::KvCacheLayer& cache, Stream stream) {
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    return make_error(ErrorCode::unsupported,
                      std::string("cuda write_kv: KV cache dtype must be F32 or BF16, not ") +
                          dtype_name(cache.dtype));
  if (num_tokens < 0 || cache.num_blocks < 0 || cache.block_size <= 0 || cache.num_kv_heads < 0 ||
      cache.head_dim < 0)
    return bad_arg("write_kv", "bad size");
  if (num_tokens == 0 || cache.num_kv_heads == 0 || cache.head_dim == 0)
    return Status::ok_status();
  if (cache.num_kv_heads > 65535) return bad_arg("write_kv", "num_kv_heads > 65535");
  if (row_stride < cache.num_kv_heads * cache.head_dim)
    return bad_arg("write_kv", "row_stride < num_kv_heads * head_dim");
  const long num_slots = static_cast<long>(cache.num_blocks) * cache.block_size;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(cache.num_kv_heads));
  const int th = threads_for(cache.head_dim);
  if (cache.dtype == DType::bf16)
    write_kv_kernel<true><<<grid, th, 0, stream>>>(k, v, row_stride, slot_mapping, cache.k, cache.v,
                                                   cache.num_kv_heads, cache.block_size,
                                                   cache.head_dim, num_slots);
  else
    write_kv_kernel<false><<<grid, th, 0, stream>>>(k, v, row_stride, slot_mapping, cache.k,
                                                    cache.v, cache.num_kv_heads, cache.block_size,
                                                    cache.head_dim, num_slots);
  return launch_status("write_kv");
}

}  // namespace shardline::kernels::cuda
