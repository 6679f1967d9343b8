#pragma once
// Helpers shared by the CUDA kernel tests: host <-> device copies that fail
// the test on error, and the normalized error used against the CPU kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cuda/device_buffer.hpp"

namespace shardline::kernels::cuda::gpu_test {

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  Result<DeviceBuffer> b = DeviceBuffer::from_host(host);
  EXPECT_TRUE(b.ok()) << b.error().to_string();
  return b.ok() ? std::move(b).value() : DeviceBuffer();
}

template <class T>
std::vector<T> download(const DeviceBuffer& b) {
  Result<std::vector<T>> h = b.to_host<T>();
  EXPECT_TRUE(h.ok()) << h.error().to_string();
  return h.ok() ? std::move(h).value() : std::vector<T>();
}

/// max |gpu - cpu| / max |cpu| (absolute error when cpu is all zeros; inf
/// when NaN-ness differs anywhere).
inline double normalized_error(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  EXPECT_EQ(gpu.size(), cpu.size());
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    if (std::isnan(gpu[i]) != std::isnan(cpu[i])) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(gpu[i] - cpu[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(cpu[i])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

}  // namespace shardline::kernels::cuda::gpu_test
