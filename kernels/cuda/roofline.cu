#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/roofline.hpp"

// Roofline probes, see roofline.hpp.

namespace shardline::kernels::cuda {
namespace {

Status cuda_fail(const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  return make_error(ErrorCode::internal, std::string("cuda roofline: ") + what + ": " +
                                             cudaGetErrorString(err));
}

/// A private non-blocking stream and two events, destroyed on scope exit.
struct Timer {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  Timer() = default;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
    if (stop != nullptr) (void)cudaEventDestroy(stop);
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  Status init() {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      stream = nullptr;
      return cuda_fail("stream", e);
    }
    if (cudaError_t e = cudaEventCreate(&start); e != cudaSuccess) {
      start = nullptr;
      return cuda_fail("event", e);
    }
    if (cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
      stop = nullptr;
      return cuda_fail("event", e);
    }
    return Status::ok_status();
  }

  /// Runs `run(stream)` once untimed, then `iters` times between the two
  /// events; the median of the elapsed milliseconds.
  template <class Run>
  Result<double> median_ms(int iters, Run&& run) {
    if (Status s = run(stream); !s.ok()) return s.error();
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return cuda_fail("warm-up", e).error();
    std::vector<double> ms;
    ms.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      if (cudaError_t e = cudaEventRecord(start, stream); e != cudaSuccess) return cuda_fail("event record", e).error();
      if (Status s = run(stream); !s.ok()) return s.error();
      if (cudaError_t e = cudaEventRecord(stop, stream); e != cudaSuccess) return cuda_fail("event record", e).error();
      if (cudaError_t e = cudaEventSynchronize(stop); e != cudaSuccess) return cuda_fail("run", e).error();
      float t = 0.0f;
      if (cudaError_t e = cudaEventElapsedTime(&t, start, stop); e != cudaSuccess) return cuda_fail("elapsed time", e).error();
      ms.push_back(static_cast<double>(t));
    }
    std::sort(ms.begin(), ms.end());
    const std::size_t h = ms.size() / 2;
    const double med = ms.size() % 2 == 1 ? ms[h] : 0.5 * (ms[h - 1] + ms[h]);
    if (!(med > 0.0)) return make_error(ErrorCode::internal, "cuda roofline: zero elapsed time");
    return med;
  }
};

/// p[i] = a pseudo-random value in [-1, 1) from a hash of (i, seed).
__global__ void fill_kernel(float* __restrict__ p, long n, std::uint32_t seed) {
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9e3779b9u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    p[i] = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

/// A device buffer of `count` pseudo-random values of `dtype` (via an F32 staging buffer for 16-bit).
Result<DeviceBuffer> random_buffer(DType dtype, long count, std::uint32_t seed, cudaStream_t stream) {
  Result<DeviceBuffer> f = DeviceBuffer::allocate(static_cast<std::size_t>(count) * sizeof(float));
  if (!f.ok()) return f;
  const unsigned blocks = static_cast<unsigned>(std::min<long>((count + 255) / 256, 4096));
  fill_kernel<<<blocks, 256, 0, stream>>>(f->as<float>(), count, seed);
  if (Status s = detail::launch_status("roofline fill"); !s.ok()) return s.error();
  if (dtype == DType::f32) return f;
  Result<DeviceBuffer> out = DeviceBuffer::allocate(static_cast<std::size_t>(count) * dtype_size(dtype));
  if (!out.ok()) return out;
  if (Status s = cast_f32(f->as<float>(), count, dtype, out->data(), stream); !s.ok()) return s.error();
  // The staging buffer is freed on return: wait for the cast to read it.
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return cuda_fail("cast", e).error();
  return out;
}

}  // namespace

Result<double> measure_d2d_bandwidth_gbs(std::size_t bytes, int iters) {
  if (bytes == 0 || iters < 1)
    return detail::bad_arg("measure_d2d_bandwidth_gbs",
                           "bytes " + std::to_string(bytes) + ", iters " + std::to_string(iters))
        .error();
  Timer timer;
  if (Status s = timer.init(); !s.ok()) return s.error();
  Result<DeviceBuffer> src = DeviceBuffer::allocate(bytes);
  if (!src.ok()) return src.error();
  Result<DeviceBuffer> dst = DeviceBuffer::allocate(bytes);
  if (!dst.ok()) return dst.error();
  if (Status s = src->fill_bytes(1); !s.ok()) return s.error();
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_fail("memset", e).error();
  Result<double> ms = timer.median_ms(iters, [&](cudaStream_t stream) -> Status {
    if (cudaError_t e = cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess)
      return cuda_fail("memcpy", e);
    return Status::ok_status();
  });
  if (!ms.ok()) return ms.error();
  return 2.0 * static_cast<double>(bytes) / (*ms * 1e6);
}

Result<double> measure_gemm_tflops(DType dtype, int m, int n, int k, int iters) {
  if (m < 1 || n < 1 || k < 1 || iters < 1)
    return detail::bad_arg("measure_gemm_tflops", "m " + std::to_string(m) + ", n " + std::to_string(n) +
                                                      ", k " + std::to_string(k) + ", iters " +
                                                      std::to_string(iters))
        .error();
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return make_error(ErrorCode::unsupported,
                      "cuda measure_gemm_tflops: dtype " + std::to_string(static_cast<int>(dtype)));
  Timer timer;
  if (Status s = timer.init(); !s.ok()) return s.error();
  Result<std::unique_ptr<GemmContext>> ctx = GemmContext::create(0, 0);
  if (!ctx.ok()) return ctx.error();
  Result<DeviceBuffer> a = random_buffer(dtype, static_cast<long>(m) * k, 1u, timer.stream);
  if (!a.ok()) return a.error();
  Result<DeviceBuffer> w = random_buffer(dtype, static_cast<long>(n) * k, 2u, timer.stream);
  if (!w.ok()) return w.error();
  Result<DeviceBuffer> y = DeviceBuffer::allocate(static_cast<std::size_t>(m) * n * sizeof(float));
  if (!y.ok()) return y.error();
  GemmContext& g = **ctx;
  Result<double> ms = timer.median_ms(iters, [&](cudaStream_t stream) -> Status {
    if (dtype == DType::f32)
      return g.linear(a->as<float>(), k, m, k, w->data(), dtype, n, y->as<float>(), n, false,
                      GemmMode::fast, stream);
    return g.linear_lowp(a->data(), k, m, k, w->data(), dtype, n, y->as<float>(), n, false, stream);
  });
  if (!ms.ok()) return ms.error();
  return 2.0 * static_cast<double>(m) * n * k / (*ms * 1e9);
}

}  // namespace shardline::kernels::cuda
