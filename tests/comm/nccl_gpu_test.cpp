// NCCL communicator on real GPUs: world 1 with one device, 2 ranks in threads
// (bootstrapped over an in-process group) with two or more. Skips itself when
// there is no CUDA device or driver, or when NCCL was not found at build time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "tests/comm/comm_test_util.hpp"

#if defined(SHARDLINE_HAVE_NCCL)
#include <cuda_runtime.h>

#include "comm/nccl.hpp"
#include "tests/comm/nccl_checks.hpp"
#endif

namespace shardline::comm {
namespace {

#if defined(SHARDLINE_HAVE_NCCL)

using namespace testing;
using namespace nccl_checks;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(NcclGpu, WorldOfOneRunsEveryCollective) {
  if (device_count() < 1) GTEST_SKIP() << "no CUDA device";
  run_nccl(1, [](NcclCommunicator& c, int r) { check_collectives(c, r, 1); });
}

TEST(NcclGpu, TwoRanksInThreads) {
  if (device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  run_nccl(2, [](NcclCommunicator& c, int r) {
    check_collectives(c, r, 2);
    ASSERT_EQ(cudaSetDevice(c.device()), cudaSuccess);
    // Point to point: rank 0 sends, rank 1 receives (NCCL p2p is a rendezvous).
    DeviceFloats buf(256);
    std::vector<float> h(256);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(r, i, 7);
    buf.put(h);
    if (r == 0) {
      ASSERT_TRUE(c.send(buf.get(), 256 * sizeof(float), 1, 0).ok());
    } else {
      ASSERT_TRUE(c.recv(buf.get(), 256 * sizeof(float), 0, 0).ok());
      const auto got = buf.fetch();
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], value(0, i, 7));
    }
    EXPECT_EQ(c.send(buf.get(), 4, r, 0).error().code, ErrorCode::unsupported);
    // Disagreeing counts: invalid_argument on both ranks, still usable.
    Status st = c.all_reduce_sum(buf.get(), r == 0 ? 4 : 5);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument) << st.error().to_string();
    ASSERT_TRUE(c.all_reduce_sum(buf.get(), 4).ok());
    ASSERT_TRUE(c.barrier().ok());
    // A rank that never joins: io within the timeout, then poisoned.
    if (r == 0) {
      c.set_timeout(milliseconds(1000));
      const auto t0 = Clock::now();
      st = c.all_reduce_sum(buf.get(), 16);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io) << st.error().to_string();
      EXPECT_LT(Clock::now() - t0, milliseconds(1000 + 2000));
      EXPECT_FALSE(c.poisoned().empty());
      EXPECT_EQ(c.barrier().error().code, ErrorCode::io);
    } else {
      std::this_thread::sleep_for(milliseconds(3000));  // leave after rank 0 gave up
    }
  });
}

#else

TEST(NcclGpu, NotBuilt) { GTEST_SKIP() << "NCCL was not found at build time"; }

#endif

}  // namespace
}  // namespace shardline::comm
