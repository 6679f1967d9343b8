// The REAL NCCL communicator (comm/nccl.cpp) over the FAKE NCCL and fake
// CUDA devices (tests/model/cuda/fake_nccl.cpp, fake_device.hpp): a rank per
// fake GPU on threads, as a CUDA group on distinct GPUs runs it. The checks
// the real-GPU test makes (tests/comm/nccl_checks.hpp): every collective
// against the rank-order reference at 2 and 3 ranks, point to point, ranks
// that disagree, a rank that never comes (io at the timeout, then
// poisoned); and NCCL's refusal of two ranks on one GPU. Both timings of
// the fake; no anomaly (a buffer on another device, a stream of another
// device, a deadlock) and nothing leaked.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"

#if SHARDLINE_HAVE_NCCL
#include "tests/comm/nccl_checks.hpp"
#endif

namespace shardline::comm {
namespace model_cuda_nccl_fake_device_test {

namespace fc = testing_support::fake_cuda;

class NcclFakeDevice : public testing_support::FakeDeviceTimingTest {
 protected:
  void SetUp() override {
    FakeDeviceTimingTest::SetUp();
    fc::set_device_count(3);
  }
};

INSTANTIATE_TEST_SUITE_P(Timing, NcclFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

#if SHARDLINE_HAVE_NCCL

using namespace nccl_checks;
using std::chrono::milliseconds;

TEST_P(NcclFakeDevice, EveryCollectiveOnOneTwoAndThreeGpus) {
  for (int world : {1, 2, 3}) run_nccl(world, [world](NcclCommunicator& c, int r) { check_collectives(c, r, world); });
}

TEST_P(NcclFakeDevice, PointToPointDisagreementAndAMissingRank) {
  run_nccl(2, [](NcclCommunicator& c, int r) {
    DeviceFloats buf(256);
    check_point_to_point_and_disagreement(c, r, buf);
    // A rank that never joins the collective: io at the timeout, then poisoned.
    if (r == 0) {
      c.set_timeout(milliseconds(300));
      const Status st = c.all_reduce_sum(buf.get(), 16);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io) << st.error().to_string();
      EXPECT_NE(st.error().message.find("timed out"), std::string::npos) << st.error().message;
      EXPECT_FALSE(c.poisoned().empty());
      EXPECT_EQ(c.barrier().error().code, ErrorCode::io);
    }
  });
}

// NCCL refuses two ranks of one communicator on one GPU ("duplicate GPU"):
// every rank's create fails; nothing is left behind.
TEST_P(NcclFakeDevice, TwoRanksOnOneGpuAreRefused) {
  auto boot = InProcGroup::create(2).value();
  std::vector<std::optional<Error>> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto host = boot->communicator(r).value();
      host->set_timeout(milliseconds(20000));
      auto c = NcclCommunicator::create(*host, NcclOptions{0, true});
      if (!c.ok()) errors[static_cast<std::size_t>(r)] = c.error();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)].has_value()) << "rank " << r;
    EXPECT_EQ(errors[static_cast<std::size_t>(r)]->code, ErrorCode::io);
  }
  const std::string both = errors[0]->message + " | " + errors[1]->message;
  EXPECT_NE(both.find("Duplicate GPU"), std::string::npos) << both;
}

#else

// The CUDA toolkit here ships nccl.h: a build without it lost the GPU-per-rank groups.
TEST_P(NcclFakeDevice, NcclHeaderWasFound) { FAIL() << "nccl.h was not found at configure time (NCCL_INCLUDE_DIR)"; }

#endif

}  // namespace model_cuda_nccl_fake_device_test
}  // namespace shardline::comm
