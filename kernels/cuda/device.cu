#include <cuda_runtime.h>

#include "kernels/cuda/device.hpp"

namespace shardline::kernels::cuda {

DeviceQuery query_devices() {
  DeviceQuery q;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    q.error = cudaGetErrorString(err);
    (void)cudaGetLastError();  // clear the sticky error
    return q;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.total_memory_bytes = prop.totalGlobalMem;
    if (cudaSetDevice(i) == cudaSuccess) {
      std::size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_memory_bytes = free_b;
    }
    q.devices.push_back(d);
  }
  return q;
}

}  // namespace shardline::kernels::cuda
