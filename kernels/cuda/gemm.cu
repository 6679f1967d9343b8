#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/dtype.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/launch.cuh"

// Linear layers, see gemm.hpp.
//
//   cast_rows_kernel<D>         grid (ceil(k / 256) capped, min(m, 65535)), 256
//                               threads: x [m, k] (row stride x_stride) -> the
//                               16-bit scratch [m, k] (row stride
//                               cast_row_stride(k)).
//   invariant_mma_kernel<T, V>  grid (ceil(m / 64), ceil(n / 64)), 128 threads =
//                               4 warps in 2 x 2, warp (wm, wn) owns rows
//                               wm*32 .. +31 and columns wn*32 .. +31 of the
//                               block's 64 x 64 tile as 2 x 2 WMMA 16x16 FP32
//                               accumulators. K in stages of 64: A (scratch
//                               rows) and B (w rows) tiles of 64 x 64 16-bit
//                               values, each thread moving 4 + 4 chunks of 8
//                               values (16 bytes) global -> registers -> shared
//                               memory (two buffers: the next stage's global
//                               loads are in flight while the current one is
//                               multiplied). Out-of-range rows / k are zeros.
//   invariant_f32_kernel        grid (ceil(m / 64), ceil(n / 64)), 256 threads,
//                               thread (ty, tx) = (tid / 16, tid % 16) owns rows
//                               ty*4 .. +3 and columns tx*4 .. +3; K in stages
//                               of 16 stored k-major in shared memory (two
//                               buffers, register prefetch).
//
// Batch invariance: a block's tile shape and k loop never depend on m, each
// accumulator is updated once per k chunk (16 for mma, 1 for fmaf) in
// increasing k, and the rows of one mma / one fmaf chain never mix (an mma
// output element is a function of its own A row, B column and accumulator).
// The epilogue adds the old y (accumulate) once, after the k loop, with
// __fadd_rn. No atomics, no split-K.

namespace shardline::kernels::cuda {
namespace {

using detail::launch_status;

constexpr int kCastThreads = 256;

constexpr int kMmaThreads = 128;                  ///< 4 warps
constexpr int kMmaBK = 64;                        ///< k per shared-memory stage
constexpr int kMmaLds = kMmaBK + 8;               ///< smem row pitch (elements): 144 B
constexpr int kMmaStage = kInvariantTileM * kMmaLds;  ///< elements of one operand stage
constexpr int kMmaChunks = kInvariantTileM * kMmaBK / 8 / kMmaThreads;  ///< 16-byte chunks / thread
constexpr int kMmaCLds = kInvariantTileN + 4;     ///< F32 pitch of the epilogue tile
constexpr std::size_t kMmaSmemBytes =
    std::max<std::size_t>(2u * 2u * kMmaStage * sizeof(std::uint16_t),
                          sizeof(float) * kInvariantTileM * kMmaCLds);
static_assert(kInvariantTileM == 64 && kInvariantTileN == 64, "the kernels assume 64 x 64 tiles");
static_assert(kMmaChunks * kMmaThreads * 8 == kInvariantTileM * kMmaBK, "whole chunks");
static_assert(kMmaThreads / 8 * kMmaChunks == kInvariantTileM, "chunk rows cover the tile");

constexpr int kF32Threads = 256;
constexpr int kF32BK = 16;
constexpr int kF32Lds = kInvariantTileM + 4;  ///< 272 B: float4 reads stay 16-byte aligned

Status cublas_error(const char* what, cublasStatus_t st) {
  return make_error(ErrorCode::internal,
                    std::string("cuda linear: cublasLt ") + what + ": " + cublasLtGetStatusString(st));
}

/// A failed CUDA runtime call as a Status (clearing the sticky last error).
Status cuda_error(const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  return make_error(err == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::internal,
                    std::string("cuda linear: ") + what + ": " + cudaGetErrorString(err));
}

// ---- cast ------------------------------------------------------------------------

template <DType D>
__device__ __forceinline__ std::uint16_t to_16bit(float f) {
  if constexpr (D == DType::bf16) {
    return shardline::f32_to_bf16(f);
  } else {
    return __half_as_ushort(__float2half_rn(f));
  }
}

template <DType D>
__global__ void cast_kernel(const float* __restrict__ x, long n, void* __restrict__ out) {
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (D == DType::f32) {
      static_cast<float*>(out)[i] = x[i];
    } else {
      static_cast<std::uint16_t*>(out)[i] = to_16bit<D>(x[i]);
    }
  }
}

template <DType D>
__global__ void cast_rows_kernel(const float* __restrict__ x, int x_stride, int m, int k,
                                 std::uint16_t* __restrict__ out, long out_stride) {
  for (int r = blockIdx.y; r < m; r += gridDim.y) {
    const float* xr = x + static_cast<long>(r) * x_stride;
    std::uint16_t* o = out + static_cast<long>(r) * out_stride;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < k; c += gridDim.x * blockDim.x)
      o[c] = to_16bit<D>(xr[c]);
  }
}

/// x [m, k] (row stride x_stride) -> out [m, k] of dtype (row stride out_stride).
Status cast_rows(const float* x, int x_stride, int m, int k, DType dtype, std::uint16_t* out,
                 long out_stride, Stream stream) {
  const dim3 grid(static_cast<unsigned>(std::min((k + kCastThreads - 1) / kCastThreads, 1024)),
                  static_cast<unsigned>(std::min(m, 65535)));
  if (dtype == DType::bf16) {
    cast_rows_kernel<DType::bf16><<<grid, kCastThreads, 0, stream>>>(x, x_stride, m, k, out, out_stride);
  } else {
    cast_rows_kernel<DType::f16><<<grid, kCastThreads, 0, stream>>>(x, x_stride, m, k, out, out_stride);
  }
  return launch_status("linear (cast)");
}

// ---- batch-invariant kernels -------------------------------------------------------

/// 8 consecutive 16-bit values p[grow * ld + kc .. + 7] (zeros past `rows` / `k`).
/// kVec: k % 8 == 0 and p / ld 16-byte aligned, so a chunk is wholly in or out.
template <bool kVec>
__device__ __forceinline__ uint4 load_chunk(const std::uint16_t* __restrict__ p, long ld, int grow,
                                            int rows, int kc, int k) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (grow >= rows) return v;
  const std::uint16_t* src = p + static_cast<long>(grow) * ld + kc;
  if constexpr (kVec) {
    if (kc < k) v = *reinterpret_cast<const uint4*>(src);
  } else {
    std::uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = kc + e < k ? src[e] : 0u;
    v.x = h[0] | (h[1] << 16);
    v.y = h[2] | (h[3] << 16);
    v.z = h[4] | (h[5] << 16);
    v.w = h[6] | (h[7] << 16);
  }
  return v;
}

/// T: __nv_bfloat16 or __half (the type of a's and w's bits).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kMmaThreads)
    invariant_mma_kernel(const std::uint16_t* __restrict__ a, long lda, int m, int k,
                         const std::uint16_t* __restrict__ w, int n, float* __restrict__ y,
                         int y_stride, bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // BF16 WMMA needs sm_80+ (the build targets sm_90a)
#else
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(128) unsigned char smem[kMmaSmemBytes];
  std::uint16_t* sa = reinterpret_cast<std::uint16_t*>(smem);  // [2][64][kMmaLds]
  std::uint16_t* sb = sa + 2 * kMmaStage;                      // [2][64][kMmaLds]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int row0 = static_cast<int>(blockIdx.x) * kInvariantTileM;
  const int col0 = static_cast<int>(blockIdx.y) * kInvariantTileN;
  const int ktiles = (k + kMmaBK - 1) / kMmaBK;
  // Chunk i of this thread: tile row tid / 8 + 16 i, columns (tid % 8) * 8 .. + 7.
  const int crow = tid / 8, ccol = (tid % 8) * 8;

  uint4 ra[kMmaChunks], rb[kMmaChunks];
  auto load = [&](int kt) {
    const int kc = kt * kMmaBK + ccol;
#pragma unroll
    for (int i = 0; i < kMmaChunks; ++i) {
      const int r = crow + 16 * i;
      ra[i] = load_chunk<kVec>(a, lda, row0 + r, m, kc, k);
      rb[i] = load_chunk<kVec>(w, k, col0 + r, n, kc, k);
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kMmaChunks; ++i) {
      const int off = buf * kMmaStage + (crow + 16 * i) * kMmaLds + ccol;
      *reinterpret_cast<uint4*>(sa + off) = ra[i];
      *reinterpret_cast<uint4*>(sb + off) = rb[i];
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < ktiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < ktiles;
    if (more) load(kt + 1);  // in flight during the multiplies below
    const T* as = reinterpret_cast<const T*>(sa + cur * kMmaStage);
    const T* bs = reinterpret_cast<const T*>(sb + cur * kMmaStage);
#pragma unroll
    for (int kk = 0; kk < kMmaBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], as + (wm * 32 + i * 16) * kMmaLds + kk, kMmaLds);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], bs + (wn * 32 + j * 16) * kMmaLds + kk, kMmaLds);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    // Buffer cur ^ 1 was last read in iteration kt - 1, before the barrier
    // that ended it; the barrier below publishes it for iteration kt + 1.
    if (more) store(cur ^ 1);
    __syncthreads();
  }

  // Epilogue through shared memory (the stages are dead after the last barrier).
  float* cs = reinterpret_cast<float*>(smem);  // [64][kMmaCLds]
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wm * 32 + i * 16) * kMmaCLds + wn * 32 + j * 16, acc[i][j],
                              kMmaCLds, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kInvariantTileM * kInvariantTileN; idx += kMmaThreads) {
    const int r = idx / kInvariantTileN, c = idx % kInvariantTileN;
    const int gr = row0 + r, gc = col0 + c;
    if (gr < m && gc < n) {
      float* p = y + static_cast<long>(gr) * y_stride + gc;
      const float v = cs[r * kMmaCLds + c];
      *p = accumulate ? __fadd_rn(v, *p) : v;
    }
  }
#endif
}

__global__ void __launch_bounds__(kF32Threads)
    invariant_f32_kernel(const float* __restrict__ x, int x_stride, int m, int k,
                         const float* __restrict__ w, int n, float* __restrict__ y, int y_stride,
                         bool accumulate) {
  __shared__ __align__(16) float sa[2][kF32BK][kF32Lds];  // x tile, k-major: sa[.][kk][row]
  __shared__ __align__(16) float sb[2][kF32BK][kF32Lds];  // w tile, k-major: sb[.][kk][col]

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;  // compute: columns tx*4.., rows ty*4..
  const int lk = tid % 16, lr = tid / 16;  // loads: k lk, rows lr + 16 i
  const int row0 = static_cast<int>(blockIdx.x) * kInvariantTileM;
  const int col0 = static_cast<int>(blockIdx.y) * kInvariantTileN;
  const int ktiles = (k + kF32BK - 1) / kF32BK;

  float ra[4], rb[4];
  auto load = [&](int kt) {
    const int kc = kt * kF32BK + lk;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int gr = row0 + lr + 16 * i, gc = col0 + lr + 16 * i;
      ra[i] = gr < m && kc < k ? x[static_cast<long>(gr) * x_stride + kc] : 0.0f;
      rb[i] = gc < n && kc < k ? w[static_cast<long>(gc) * k + kc] : 0.0f;
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sa[buf][lk][lr + 16 * i] = ra[i];
      sb[buf][lk][lr + 16 * i] = rb[i];
    }
  };

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < ktiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < ktiles;
    if (more) load(kt + 1);
#pragma unroll
    for (int kk = 0; kk < kF32BK; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&sa[cur][kk][ty * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&sb[cur][kk][tx * 4]);
      const float a4[4] = {av.x, av.y, av.z, av.w};
      const float b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(a4[i], b4[j], acc[i][j]);
    }
    if (more) store(cur ^ 1);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int gr = row0 + ty * 4 + i;
    if (gr >= m) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gc = col0 + tx * 4 + j;
      if (gc < n) {
        float* p = y + static_cast<long>(gr) * y_stride + gc;
        *p = accumulate ? __fadd_rn(acc[i][j], *p) : acc[i][j];
      }
    }
  }
}

Status launch_invariant_f32(const float* x, int x_stride, int m, int k, const float* w, int n,
                            float* y, int y_stride, bool accumulate, Stream stream) {
  const GemmGrid g = batch_invariant_grid(m, n);
  const dim3 grid(static_cast<unsigned>(g.tiles_m), static_cast<unsigned>(g.tiles_n));
  invariant_f32_kernel<<<grid, kF32Threads, 0, stream>>>(x, x_stride, m, k, w, n, y, y_stride,
                                                         accumulate);
  return launch_status("linear (batch-invariant f32)");
}

/// a: [m, k] of dtype (row stride lda), w: [n, k] of dtype.
Status launch_invariant_lowp(const void* a, long lda, int m, int k, const void* w, DType dtype,
                             int n, float* y, int y_stride, bool accumulate, Stream stream) {
  const GemmGrid g = batch_invariant_grid(m, n);
  const dim3 grid(static_cast<unsigned>(g.tiles_m), static_cast<unsigned>(g.tiles_n));
  const auto* ab = static_cast<const std::uint16_t*>(a);
  const auto* wb = static_cast<const std::uint16_t*>(w);
  const auto aligned16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool vec = k % 8 == 0 && lda % 8 == 0 && aligned16(a) && aligned16(w);
  if (dtype == DType::bf16) {
    if (vec)
      invariant_mma_kernel<__nv_bfloat16, true>
          <<<grid, kMmaThreads, 0, stream>>>(ab, lda, m, k, wb, n, y, y_stride, accumulate);
    else
      invariant_mma_kernel<__nv_bfloat16, false>
          <<<grid, kMmaThreads, 0, stream>>>(ab, lda, m, k, wb, n, y, y_stride, accumulate);
  } else {
    if (vec)
      invariant_mma_kernel<__half, true>
          <<<grid, kMmaThreads, 0, stream>>>(ab, lda, m, k, wb, n, y, y_stride, accumulate);
    else
      invariant_mma_kernel<__half, false>
          <<<grid, kMmaThreads, 0, stream>>>(ab, lda, m, k, wb, n, y, y_stride, accumulate);
  }
  return launch_status("linear (batch-invariant mma)");
}

// ---- cuBLASLt plans -------------------------------------------------------------------

/// Largest power of two (<= 256) dividing the address.
std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

struct PlanKey {
  int m = 0, n = 0, k = 0;
  DType dtype = DType::f32;
  bool accumulate = false;
  long ldb = 0;  ///< row stride of the activations
  int ldc = 0;   ///< row stride of y
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const noexcept {
    std::size_t h = 0;
    const auto mix = [&h](std::uint64_t v) {
      h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix(static_cast<std::uint64_t>(key.dtype) * 2u + (key.accumulate ? 1u : 0u));
    mix(static_cast<std::uint64_t>(key.ldb));
    mix(static_cast<std::uint64_t>(key.ldc));
    mix((static_cast<std::uint64_t>(key.align_a) << 32) ^ (static_cast<std::uint64_t>(key.align_b) << 16) ^
        key.align_c);
    return h;
  }
};

/// One problem's matmul descriptor, layouts and chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  ///< w: k x n column-major (ld k), used transposed
  cublasLtMatrixLayout_t b = nullptr;  ///< x: k x m column-major (ld = x row stride)
  cublasLtMatrixLayout_t c = nullptr;  ///< y: n x m column-major (ld = y row stride), C and D
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;  ///< false: cuBLASLt offered none, run our kernel instead
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f32: break;
  }
  return CUDA_R_32F;
}

}  // namespace

struct GemmContext::Impl {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::uint16_t* scratch = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    plans.clear();
    if (scratch != nullptr) cudaFree(scratch);
    if (workspace != nullptr) cudaFree(workspace);
    if (lt != nullptr) cublasLtDestroy(lt);
  }

  /// The cached plan of `key`, built (heuristic query: host only) on first use.
  Result<const Plan*> plan(const PlanKey& key) {
    if (auto it = plans.find(key); it != plans.end()) return static_cast<const Plan*>(it->second.get());
    auto p = std::make_unique<Plan>();
    const cudaDataType_t ab = cuda_type(key.dtype);
    cublasStatus_t st = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("matmul desc", st).error();
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n));
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("matmul desc attribute", st).error();
    st = cublasLtMatrixLayoutCreate(&p->a, ab, static_cast<std::uint64_t>(key.k),
                                    static_cast<std::uint64_t>(key.n), key.k);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutCreate(&p->b, ab, static_cast<std::uint64_t>(key.k),
                                      static_cast<std::uint64_t>(key.m), key.ldb);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, static_cast<std::uint64_t>(key.n),
                                      static_cast<std::uint64_t>(key.m), key.ldc);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("matrix layout", st).error();

    cublasLtMatmulPreference_t pref = nullptr;
    st = cublasLtMatmulPreferenceCreate(&pref);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("preference", st).error();
    const std::uint64_t ws = kGemmWorkspaceBytes;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attr, value] : aligns)
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result,
                                          &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED: no algorithm for this configuration, like found == 0.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    else if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("algorithm heuristic", st).error();
    p->has_algo = found >= 1 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p->has_algo) p->algo = result.algo;
    const Plan* raw = p.get();
    plans.emplace(key, std::move(p));
    return raw;
  }

  /// y^T (n x m, column-major) = w^T-as-stored (k x n, transposed) * act (k x m):
  /// the row-major y[m, n] = act[m, k] · w[n, k]^T.
  /// true: queued; false: cuBLASLt has no algorithm for this problem (cached).
  Result<bool> lt_linear(const void* act, long ld_act, int m, int k, const void* w, DType dtype,
                         int n, float* y, int y_stride, bool accumulate, Stream stream) {
    PlanKey key;
    key.m = m;
    key.n = n;
    key.k = k;
    key.dtype = dtype;
    key.accumulate = accumulate;
    key.ldb = ld_act;
    key.ldc = y_stride;
    key.align_a = alignment_of(w);
    key.align_b = alignment_of(act);
    key.align_c = alignment_of(y);
    Result<const Plan*> p = plan(key);
    if (!p.ok()) return p.error();
    const Plan& pl = **p;
    if (!pl.has_algo) return false;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const cublasStatus_t st = cublasLtMatmul(lt, pl.desc, &alpha, w, pl.a, act, pl.b, &beta, y, pl.c,
                                             y, pl.c, &pl.algo, workspace, kGemmWorkspaceBytes, stream);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("matmul", st).error();
    return true;
  }
};

Result<std::unique_ptr<GemmContext>> GemmContext::create(int max_rows, int max_k) {
  if (max_rows < 0 || max_k < 0)
    return detail::bad_arg("linear", "negative max_rows " + std::to_string(max_rows) + " / max_k " +
                                         std::to_string(max_k))
        .error();
  std::unique_ptr<GemmContext> ctx(new GemmContext());
  ctx->impl_ = std::make_unique<Impl>();
  ctx->max_rows_ = max_rows;
  ctx->max_k_ = max_k;
  Impl& im = *ctx->impl_;
  if (const cublasStatus_t st = cublasLtCreate(&im.lt); st != CUBLAS_STATUS_SUCCESS) {
    im.lt = nullptr;
    (void)cudaGetLastError();
    return cublas_error("create", st).error();
  }
  if (cudaError_t err = cudaMalloc(&im.workspace, kGemmWorkspaceBytes); err != cudaSuccess) {
    im.workspace = nullptr;
    return cuda_error("workspace", err).error();
  }
  const std::size_t scratch_bytes = static_cast<std::size_t>(max_rows) *
                                    static_cast<std::size_t>(cast_row_stride(max_k)) *
                                    sizeof(std::uint16_t);
  if (scratch_bytes > 0) {
    void* s = nullptr;
    if (cudaError_t err = cudaMalloc(&s, scratch_bytes); err != cudaSuccess)
      return cuda_error("cast scratch", err).error();
    im.scratch = static_cast<std::uint16_t*>(s);
  }
  return Result<std::unique_ptr<GemmContext>>(std::move(ctx));
}

GemmContext::~GemmContext() = default;

std::size_t GemmContext::cached_plans() const noexcept { return impl_ ? impl_->plans.size() : 0; }

Status GemmContext::linear(const float* x, int x_stride, int m, int k, const void* w, DType w_dtype,
                           int n, float* y, int y_stride, bool accumulate, GemmMode mode,
                           Stream stream) {
  if (Status s = check_linear_args(x, x_stride, m, k, w, w_dtype, n, y, y_stride, mode, max_rows_,
                                   max_k_);
      !s.ok() || m == 0)
    return s;
  if (w_dtype == DType::f32) {
    if (mode == GemmMode::fast) {
      Result<bool> ran =
          impl_->lt_linear(x, x_stride, m, k, w, DType::f32, n, y, y_stride, accumulate, stream);
      if (!ran.ok() || *ran) return ran.ok() ? Status::ok_status() : Status(ran.error());
    }
    return launch_invariant_f32(x, x_stride, m, k, static_cast<const float*>(w), n, y, y_stride,
                                accumulate, stream);
  }
  // 16-bit weights: cast x to the weight dtype, then the GEMM on the copy.
  const long ldh = cast_row_stride(k);
  if (Status s = cast_rows(x, x_stride, m, k, w_dtype, impl_->scratch, ldh, stream); !s.ok()) return s;
  if (mode == GemmMode::fast) {
    Result<bool> ran =
        impl_->lt_linear(impl_->scratch, ldh, m, k, w, w_dtype, n, y, y_stride, accumulate, stream);
    if (!ran.ok() || *ran) return ran.ok() ? Status::ok_status() : Status(ran.error());
  }
  return launch_invariant_lowp(impl_->scratch, ldh, m, k, w, w_dtype, n, y, y_stride, accumulate,
                               stream);
}

Status GemmContext::linear_lowp(const void* x16, int x_stride, int m, int k, const void* w,
                                DType dtype, int n, float* y, int y_stride, bool accumulate,
                                Stream stream) {
  if (Status s = check_linear_args(x16, x_stride, m, k, w, dtype, n, y, y_stride, GemmMode::fast,
                                   INT_MAX, INT_MAX);
      !s.ok() || m == 0)
    return s;
  if (dtype == DType::f32)
    return make_error(ErrorCode::unsupported, "cuda linear_lowp: F32 activations (use linear)");
  Result<bool> ran = impl_->lt_linear(x16, x_stride, m, k, w, dtype, n, y, y_stride, accumulate, stream);
  if (!ran.ok() || *ran) return ran.ok() ? Status::ok_status() : Status(ran.error());
  return launch_invariant_lowp(x16, x_stride, m, k, w, dtype, n, y, y_stride, accumulate, stream);
}

Status cast_f32(const float* x, long n, DType dtype, void* out, Stream stream) {
  if (n < 0) return detail::bad_arg("cast_f32", "negative n " + std::to_string(n));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return make_error(ErrorCode::unsupported,
                      "cuda cast_f32: dtype " + std::to_string(static_cast<int>(dtype)));
  if (n == 0) return Status::ok_status();
  if (x == nullptr || out == nullptr) return detail::bad_arg("cast_f32", "null x or out");
  const unsigned blocks =
      static_cast<unsigned>(std::min<long>((n + kCastThreads - 1) / kCastThreads, 8192));
  switch (dtype) {
    case DType::f32: cast_kernel<DType::f32><<<blocks, kCastThreads, 0, stream>>>(x, n, out); break;
    case DType::bf16: cast_kernel<DType::bf16><<<blocks, kCastThreads, 0, stream>>>(x, n, out); break;
    case DType::f16: cast_kernel<DType::f16><<<blocks, kCastThreads, 0, stream>>>(x, n, out); break;
  }
  return launch_status("cast_f32");
}

}  // namespace shardline::kernels::cuda
