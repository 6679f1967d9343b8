// `--devices` and `--parallel` of a node (cli/devices.hpp): the device count
// must be the world size, defaults, and CUDA device lists.
#include <gtest/gtest.h>

#include <vector>

#include "cli/devices.hpp"

namespace shardline::cli {
namespace cli_devices_test {

using engine::ParallelConfig;

TEST(NodeDevices, WithoutParallelDevicesAreSingleDeviceWorkers) {
  auto one = resolve_node_devices("", "");
  ASSERT_TRUE(one.ok()) << one.error().to_string();
  EXPECT_EQ(one->num_cpu_devices, 1);
  EXPECT_EQ(one->parallel, ParallelConfig{});
  auto three = resolve_node_devices("cpu:3", "");
  ASSERT_TRUE(three.ok()) << three.error().to_string();
  EXPECT_EQ(three->num_cpu_devices, 3);
  EXPECT_EQ(three->parallel, (ParallelConfig{1, 1, 1, 3}));
}

TEST(NodeDevices, ParallelDefaultsDevicesToItsWorldSize) {
  auto r = resolve_node_devices("", "tp=2,pp=2,dp=2");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->num_cpu_devices, 8);
  EXPECT_EQ(r->parallel, (ParallelConfig{2, 2, 1, 2}));
  auto given = resolve_node_devices("cpu:2", "sp=2");
  ASSERT_TRUE(given.ok()) << given.error().to_string();
  EXPECT_EQ(given->num_cpu_devices, 2);
  auto single = resolve_node_devices("cpu:1", "single");
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  EXPECT_EQ(single->parallel, ParallelConfig{});
}

TEST(NodeDevices, DeviceCountOtherThanTheWorldSizeNamesBothNumbers) {
  auto r = resolve_node_devices("cpu:3", "tp=2");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(r.error().message,
            "--devices cpu:3 gives 3 devices but --parallel tp=2,pp=1,sp=1,dp=1 needs tp*pp*sp*dp = 2 "
            "(leave out --devices to use 2)");
  auto big = resolve_node_devices("", "tp=16,pp=8");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("needs 128 devices"), std::string::npos) << big.error().message;
  auto bad = resolve_node_devices("", "tp=2,tp=2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("given twice"), std::string::npos) << bad.error().message;
  // One GPU for a group of 2 ranks each on its own: the count, and how to share one.
  auto gpu = resolve_node_devices("cuda:2", "tp=2");
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(gpu.error().message,
            "--devices cuda:2 gives 1 GPUs but --parallel tp=2,pp=1,sp=1,dp=1 needs tp*pp*sp*dp = 2 (one per rank; "
            "for ranks sharing a GPU write cuda:0x2)");
}

TEST(NodeDevices, CudaGroupsWithAGpuPerRankTalkOverNccl) {
  auto pp = resolve_node_devices("cuda:0,1", "pp=2");
  ASSERT_TRUE(pp.ok()) << pp.error().to_string();
  EXPECT_EQ(pp->kind, model::DeviceKind::cuda);
  EXPECT_EQ(pp->cuda_devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(pp->cuda_ranks_per_gpu, 1);
  EXPECT_EQ(pp->parallel, (ParallelConfig{1, 2, 1, 1}));
  auto two_groups = resolve_node_devices("cuda:0-3", "tp=2,dp=2");
  ASSERT_TRUE(two_groups.ok()) << two_groups.error().to_string();
  EXPECT_EQ(two_groups->cuda_devices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(two_groups->parallel, (ParallelConfig{2, 1, 1, 2}));
  auto short_list = resolve_node_devices("cuda:0-2", "tp=2,dp=2");
  ASSERT_FALSE(short_list.ok());
  EXPECT_EQ(short_list.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(short_list.error().message.find("needs tp*pp*sp*dp = 4"), std::string::npos) << short_list.error().message;
}

// dp single-device workers sharing each GPU (SiDP's ranks on the one GPU
// of a lent machine): the list holds each GPU once per worker on it.
TEST(NodeDevices, CudaDpWorkersSharingAGpu) {
  auto two = resolve_node_devices("cuda:0x2", "dp=2");
  ASSERT_TRUE(two.ok()) << two.error().to_string();
  EXPECT_EQ(two->cuda_devices, (std::vector<int>{0, 0}));
  EXPECT_EQ(two->cuda_ranks_per_gpu, 2);
  EXPECT_EQ(two->parallel, (ParallelConfig{1, 1, 1, 2}));
  auto four = resolve_node_devices("cuda:1-2x2", "dp=4");
  ASSERT_TRUE(four.ok()) << four.error().to_string();
  EXPECT_EQ(four->cuda_devices, (std::vector<int>{1, 1, 2, 2}));
  auto wrong = resolve_node_devices("cuda:0x2", "dp=3");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(wrong.error().message, "--devices cuda:0x2 puts 2 workers on each of 1 GPUs but --parallel "
                                   "tp=1,pp=1,sp=1,dp=3 asks dp=3 (want 2)");
}

TEST(NodeDevices, CudaRanksSharingAGpuAreOneEngineGroup) {
  auto alone = resolve_node_devices("cuda:0x2", "");
  ASSERT_TRUE(alone.ok()) << alone.error().to_string();
  EXPECT_EQ(alone->kind, model::DeviceKind::cuda);
  EXPECT_EQ(alone->cuda_devices, std::vector<int>{0});
  EXPECT_EQ(alone->parallel, (ParallelConfig{2, 1, 1, 1}));
  auto asked = resolve_node_devices("cuda:3x4", "tp=4");
  ASSERT_TRUE(asked.ok()) << asked.error().to_string();
  EXPECT_EQ(asked->cuda_devices, std::vector<int>{3});
  EXPECT_EQ(asked->parallel, (ParallelConfig{4, 1, 1, 1}));
  auto two = resolve_node_devices("cuda:0-1x2", "tp=2,dp=2");
  ASSERT_TRUE(two.ok()) << two.error().to_string();
  EXPECT_EQ(two->cuda_devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(two->parallel, (ParallelConfig{2, 1, 1, 2}));

  auto other_tp = resolve_node_devices("cuda:0x2", "tp=4");
  ASSERT_FALSE(other_tp.ok());
  EXPECT_EQ(other_tp.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(other_tp.error().message,
            "--devices cuda:0x2 puts 2 ranks on each GPU but --parallel tp=4,pp=1,sp=1,dp=1 asks tp*pp*sp=4");
  // Pipeline stages and Ulysses ranks share the GPU too: K = tp * pp * sp.
  auto pp = resolve_node_devices("cuda:0x2", "pp=2");
  ASSERT_TRUE(pp.ok()) << pp.error().to_string();
  EXPECT_EQ(pp->parallel, (ParallelConfig{1, 2, 1, 1}));
  auto tp_pp = resolve_node_devices("cuda:1x4", "tp=2,pp=2");
  ASSERT_TRUE(tp_pp.ok()) << tp_pp.error().to_string();
  EXPECT_EQ(tp_pp->cuda_devices, std::vector<int>{1});
  EXPECT_EQ(tp_pp->parallel, (ParallelConfig{2, 2, 1, 1}));
  auto short_pp = resolve_node_devices("cuda:0x2", "tp=2,pp=2");
  ASSERT_FALSE(short_pp.ok());
  EXPECT_EQ(short_pp.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(short_pp.error().message.find("asks tp*pp*sp=4"), std::string::npos) << short_pp.error().message;
  auto sp = resolve_node_devices("cuda:0x2", "sp=2");
  ASSERT_TRUE(sp.ok()) << sp.error().to_string();
  EXPECT_EQ(sp->parallel, (ParallelConfig{1, 1, 2, 1}));
  auto all = resolve_node_devices("cuda:0x8", "tp=2,pp=2,sp=2");
  ASSERT_TRUE(all.ok()) << all.error().to_string();
  EXPECT_EQ(all->parallel, (ParallelConfig{2, 2, 2, 1}));
  auto mixed = resolve_node_devices("cuda:0x2,1", "");
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.error().message, "--devices cuda:0x2,1: every GPU of the list needs the same number of ranks (xK)");
  for (const char* bad : {"cuda:0x", "cuda:0x0", "cuda:0x9", "cuda:x2", "cuda:0x2x2"}) {
    auto r = resolve_node_devices(bad, "");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << bad;
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
}

TEST(NodeDevices, CudaDevicesAreOneSingleDeviceWorkerEach) {
  auto one = resolve_node_devices("cuda:0", "");
  ASSERT_TRUE(one.ok()) << one.error().to_string();
  EXPECT_EQ(one->kind, model::DeviceKind::cuda);
  EXPECT_EQ(one->cuda_devices, std::vector<int>{0});
  EXPECT_EQ(one->parallel, ParallelConfig{});
  auto list = resolve_node_devices("cuda:0-2,5", "dp=4");
  ASSERT_TRUE(list.ok()) << list.error().to_string();
  EXPECT_EQ(list->cuda_devices, (std::vector<int>{0, 1, 2, 5}));
  EXPECT_EQ(list->parallel, (ParallelConfig{1, 1, 1, 4}));
  auto count = resolve_node_devices("cuda:0,1", "dp=3");
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.error().code, ErrorCode::invalid_argument);
  for (const char* bad : {"cuda:", "cuda:x", "cuda:1-0", "cuda:0,0", "cuda:64", "cuda:-1", "cuda:0,", "gpu:0"}) {
    auto r = resolve_node_devices(bad, "");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << bad;
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace shardline::cli
