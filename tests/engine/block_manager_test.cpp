#include "engine/block_manager.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace shardline::engine {
namespace engine_block_manager_test {

TEST(BlockManager, AllocatesGrowsAcrossBoundariesAndFrees) {
  BlockManager bm(8, 4);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_TRUE(bm.can_allocate(32));
  EXPECT_FALSE(bm.can_allocate(33));
  ASSERT_TRUE(bm.allocate_slots(1, 3).ok());
  EXPECT_EQ(bm.block_table(1).size(), 1u);
  ASSERT_TRUE(bm.allocate_slots(1, 4).ok());  // still one block
  EXPECT_EQ(bm.block_table(1).size(), 1u);
  ASSERT_TRUE(bm.allocate_slots(1, 5).ok());  // crosses the boundary
  EXPECT_EQ(bm.block_table(1).size(), 2u);
  ASSERT_TRUE(bm.allocate_slots(1, 2).ok());  // never shrinks
  EXPECT_EQ(bm.block_table(1).size(), 2u);
  ASSERT_TRUE(bm.allocate_slots(2, 9).ok());
  EXPECT_EQ(bm.block_table(2).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 3);
  std::set<int> all(bm.block_table(1).begin(), bm.block_table(1).end());
  all.insert(bm.block_table(2).begin(), bm.block_table(2).end());
  EXPECT_EQ(all.size(), 5u);  // distinct
  EXPECT_TRUE(bm.check_integrity().ok());
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_TRUE(bm.block_table(1).empty());
  EXPECT_FALSE(bm.has_seq(1));
  bm.free(1);  // idempotent
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_TRUE(bm.check_integrity().ok());
}

TEST(BlockManager, ExhaustionLeavesStateUnchanged) {
  BlockManager bm(4, 16);
  ASSERT_TRUE(bm.allocate_slots(7, 40).ok());  // 3 blocks
  const auto table = bm.block_table(7);
  EXPECT_FALSE(bm.can_grow(7, 65));
  const Status s = bm.allocate_slots(7, 65);  // needs 5 blocks, has 3 + 1 free
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(bm.block_table(7), table);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_EQ(bm.num_tokens_covered(7), 40);
  const Status s2 = bm.allocate_slots(8, 17);  // new seq needing 2 blocks
  ASSERT_FALSE(s2.ok());
  EXPECT_FALSE(bm.has_seq(8));
  EXPECT_TRUE(bm.check_integrity().ok());
  EXPECT_TRUE(bm.allocate_slots(7, 64).ok());
  EXPECT_EQ(bm.num_free_blocks(), 0);
}

TEST(BlockManager, ZeroTokensAndMissingBlocks) {
  BlockManager bm(2, 4);
  EXPECT_EQ(bm.blocks_for_tokens(0), 0);
  EXPECT_EQ(bm.blocks_for_tokens(4), 1);
  EXPECT_EQ(bm.blocks_for_tokens(5), 2);
  EXPECT_EQ(bm.num_missing_blocks(1, 5), 2);
  EXPECT_FALSE(bm.allocate_slots(1, -1).ok());
}

TEST(BlockManager, IntegrityHoldsAfterRandomOperations) {
  std::mt19937 rng(1234);
  BlockManager bm(64, 8);
  std::map<std::uint64_t, int> tokens;  // model of what each sequence asked for
  for (int op = 0; op < 5000; ++op) {
    const std::uint64_t id = rng() % 12;
    if (rng() % 4 == 0) {
      bm.free(id);
      tokens.erase(id);
    } else {
      const int want = static_cast<int>(rng() % 200);
      const int before_free = bm.num_free_blocks();
      const bool could = bm.can_grow(id, want);
      const Status s = bm.allocate_slots(id, want);
      ASSERT_EQ(s.ok(), could);
      if (s.ok()) {
        tokens[id] = std::max(tokens[id], want);
      } else {
        ASSERT_EQ(bm.num_free_blocks(), before_free);
      }
    }
    ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
    int owned = 0;
    for (const auto& [sid, n] : tokens) {
      ASSERT_EQ(static_cast<int>(bm.block_table(sid).size()), bm.blocks_for_tokens(n));
      owned += bm.blocks_for_tokens(n);
    }
    ASSERT_EQ(owned + bm.num_free_blocks(), 64);
  }
}

}  // namespace
}  // namespace shardline::engine
