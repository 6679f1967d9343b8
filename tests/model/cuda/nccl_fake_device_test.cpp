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

// Bound to a rank's stream (a runner's), calls queue behind its work and
// return without waiting; wait_stream() waits, and a rank that never joins
// is io at the timeout there (the communicator aborted, its stream freed).
TEST_P(NcclFakeDevice, BoundToAStreamCallsQueueBehindItsWorkAndAMissingRankIsIoAtTheWait) {
  run_nccl(3, [](NcclCommunicator& c, int r) {
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(c.bind_stream(stream).ok());
    EXPECT_TRUE(c.collectives_in_stream_order());
    EXPECT_TRUE(c.point_to_point_in_stream_order());
    EXPECT_EQ(c.bind_stream(c.stream()).error().code, ErrorCode::invalid_argument);
    constexpr std::size_t n = 64;
    float* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 3 * n * 4), cudaSuccess);
    for (std::size_t i = 0; i < 3 * n; ++i) pinned[i] = static_cast<float>((r + 1) * 1000 + static_cast<int>(i));
    DeviceFloats buf(3 * n), gathered(3 * n);
    // The input lands on the stream; the collectives read it in stream order.
    ASSERT_EQ(cudaMemcpyAsync(buf.get(), pinned, 3 * n * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_TRUE(c.all_reduce_sum(buf.get(), n).ok());
    if (fc::execution() == fc::Execution::deferred)
      EXPECT_GT(fc::pending_ops(), 0) << "a bound call must not wait for the device";
    ASSERT_TRUE(c.all_gather(buf.get(), n, gathered.get()).ok());
    ASSERT_TRUE(c.wait_stream().ok());
    std::vector<float> sum(n), all(3 * n);
    ASSERT_EQ(cudaMemcpy(sum.data(), buf.get(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(all.data(), gathered.get(), 3 * n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (std::size_t i = 0; i < n; ++i) {
      const float want = (1000.0f + i) + (2000.0f + i) + (3000.0f + i);
      EXPECT_EQ(sum[i], want) << "rank " << r << " element " << i;
      for (int k = 0; k < 3; ++k) EXPECT_EQ(all[static_cast<std::size_t>(k) * n + i], want);
    }
    // Ranks 1 and 2 join one more all-reduce; rank 0 never does (and its
    // collective teardown gives up on the aborted ranks at its timeout).
    c.set_timeout(milliseconds(300));
    if (r > 0) {
      ASSERT_TRUE(c.all_reduce_sum(buf.get(), n).ok()) << "queued, not waited for";
      const Status waited = c.wait_stream();
      ASSERT_FALSE(waited.ok());
      EXPECT_EQ(waited.error().code, ErrorCode::io) << waited.error().to_string();
      EXPECT_NE(waited.error().message.find("timed out"), std::string::npos) << waited.error().message;
      EXPECT_FALSE(c.poisoned().empty());
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "the abort released the stream";
    }
    ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
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
