// CUDA device discovery (label gpu). Without a GPU or driver the query must
// report zero devices plus the runtime's reason, never crash; with one, the
// reported properties must be sane.
#include <gtest/gtest.h>

#include "kernels/cuda/device.hpp"

namespace shardline::kernels::cuda {
namespace {

TEST(CudaDevice, QueryNeverFailsHard) {
  const DeviceQuery q = query_devices();
  if (q.devices.empty()) {
    EXPECT_FALSE(q.error.empty()) << "no devices must come with the CUDA runtime's reason";
    GTEST_SKIP() << "no CUDA device: " << q.error;
  }
  for (const DeviceInfo& d : q.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.sm_major, 7) << d.name;
    EXPECT_GT(d.total_memory_bytes, 1ull << 30) << d.name;
    EXPECT_LE(d.free_memory_bytes, d.total_memory_bytes) << d.name;
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
