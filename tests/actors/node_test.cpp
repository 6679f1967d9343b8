// Names of a node's workers (actors/node.hpp): one per engine group,
// spanning the group's devices.
#include <gtest/gtest.h>

#include "actors/node.hpp"

namespace shardline::actors {
namespace actors_node_test {

using engine::ParallelConfig;

TEST(Node, WorkerNamesSpanTheirGroupDevices) {
  EXPECT_EQ(worker_name("node0", 0, ParallelConfig{}), "node0/cpu:0");
  EXPECT_EQ(worker_name("node0", 3, ParallelConfig{}), "node0/cpu:3");
  EXPECT_EQ(worker_name("node0", 0, ParallelConfig{2, 1, 1, 1}), "node0/cpu:0-1");
  EXPECT_EQ(worker_name("b", 1, ParallelConfig{2, 2, 1, 1}), "b/cpu:4-7");
}

}  // namespace
}  // namespace shardline::actors
