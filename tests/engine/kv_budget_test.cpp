#include "engine/kv_budget.hpp"

#include <gtest/gtest.h>

namespace shardline::engine {
namespace engine_kv_budget_test {

TEST(KvBudget, BytesPerBlockCountsKAndV) {
  // Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, bf16, 16-token blocks -> 2 MiB.
  EXPECT_EQ(kv_bytes_per_block(32, 8, 128, 16, 2), 2ull * 1024 * 1024);
  EXPECT_EQ(kv_bytes_per_block(1, 1, 1, 1, 4), 8u);
  EXPECT_EQ(kv_bytes_per_block(0, 8, 128, 16, 2), 0u);
}

TEST(KvBudget, BlocksForBudgetFloors) {
  EXPECT_EQ(num_kv_blocks_for_budget(1ull << 30, 32, 8, 128, 16, 2), 512);
  EXPECT_EQ(num_kv_blocks_for_budget((1ull << 30) - 1, 32, 8, 128, 16, 2), 511);
  EXPECT_EQ(num_kv_blocks_for_budget(100, 32, 8, 128, 16, 2), 0);
  EXPECT_EQ(num_kv_blocks_for_budget(100, 0, 8, 128, 16, 2), 0);
  // Large budgets do not overflow: 80 GiB of Qwen2-0.5B-ish blocks (24 layers, 2 kv heads, 64 dim, f32).
  EXPECT_EQ(num_kv_blocks_for_budget(80ull << 30, 24, 2, 64, 16, 4), (80ll << 30) / (2 * 24 * 2 * 64 * 16 * 4));
}

TEST(KvBudget, ParsesMemAvailable) {
  const char* text =
      "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   65536000 kB\nBuffers: 1 kB\n";
  const auto r = parse_mem_available_bytes(text);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r.value(), 65536000ull * 1024);
}

TEST(KvBudget, MissingOrBadMemAvailableIsCorrupt) {
  auto r = parse_mem_available_bytes("MemTotal: 10 kB\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  r = parse_mem_available_bytes("MemAvailable: lots\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  r = parse_mem_available_bytes("XMemAvailable: 5 kB\n");
  EXPECT_FALSE(r.ok());
}

TEST(KvBudget, ThisMachineHasAvailableMemory) {
  const auto r = available_memory_bytes();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_GT(r.value(), 1ull << 20);
}

}  // namespace
}  // namespace shardline::engine
