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
    DeviceFloats buf(256);
    check_point_to_point_and_disagreement(c, r, buf);
    // A rank that never joins: io within the timeout, then poisoned.
    if (r == 0) {
      c.set_timeout(milliseconds(1000));
      const auto t0 = Clock::now();
      const Status st = c.all_reduce_sum(buf.get(), 16);
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
