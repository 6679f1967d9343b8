#pragma once
/// \file
/// CUDA device discovery that never fails hard: on a machine without a GPU or
/// driver, `cudaGetDeviceCount` returns an error, which is reported as zero
/// devices plus the driver's message.

#include <string>
#include <vector>

namespace shardline::kernels::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  std::size_t total_memory_bytes = 0;
  std::size_t free_memory_bytes = 0;
};

struct DeviceQuery {
  std::vector<DeviceInfo> devices;  ///< empty when no usable device
  std::string error;                ///< why none, from the CUDA runtime ("" if fine)
};

/// Lists visible CUDA devices. Never throws; no device -> empty list + error text.
[[nodiscard]] DeviceQuery query_devices();

}  // namespace shardline::kernels::cuda
