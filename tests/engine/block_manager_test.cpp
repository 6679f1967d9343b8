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

// ---- prefix caching (issue 42) ----------------------------------------------

/// Tokens 0..n-1 of a sequence whose ids are `ids`.
BlockManager::Tokens view(const std::vector<std::int32_t>& ids) { return {ids, {}}; }

// A second sequence with the same leading full blocks shares them (the same
// block ids, counted twice), up to its last full block before max_tokens; a
// partial block or a different token ends the hit. Freed, the named blocks
// stay reusable (free, evictable) and a third sequence hits them again.
TEST(BlockManagerPrefix, LeadingFullBlocksAreSharedAndStayReusableAfterFree) {
  BlockManager bm(8, 4, PrefixCacheConfig{true, 7});
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full blocks + 2 tokens
  ASSERT_EQ(bm.acquire_cached_prefix(1, view(a), 9), 0) << "nothing cached yet";
  ASSERT_TRUE(bm.allocate_slots(1, 10).ok());
  bm.cache_full_blocks(1, view(a), 10);
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
  EXPECT_EQ(bm.prefix_cache()->num_named_blocks(), 2u) << "the partial third block is not named";

  std::vector<std::int32_t> b = a;
  b[9] = 99;  // same two full blocks, another tail
  EXPECT_EQ(bm.acquire_cached_prefix(2, view(b), 9), 8);
  EXPECT_EQ(bm.block_table(2), (std::vector<std::int32_t>{bm.block_table(1)[0], bm.block_table(1)[1]}));
  ASSERT_TRUE(bm.allocate_slots(2, 10).ok());
  EXPECT_NE(bm.block_table(2)[2], bm.block_table(1)[2]) << "the tail is its own block";
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;

  // max_tokens stops before a full block: the last token is always computed.
  const std::vector<std::int32_t> exact = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(bm.acquire_cached_prefix(3, view(exact), 7), 4);
  bm.free(3);
  // A token changed in the first block: no hit at all.
  std::vector<std::int32_t> c = a;
  c[0] = 42;
  EXPECT_EQ(bm.acquire_cached_prefix(4, view(c), 9), 0);
  EXPECT_FALSE(bm.has_seq(4));

  const int free_before = bm.num_free_blocks();
  bm.free(1);
  bm.free(2);
  EXPECT_EQ(bm.num_free_blocks(), 8) << "named blocks nobody holds count as free";
  EXPECT_GT(bm.num_free_blocks(), free_before);
  EXPECT_EQ(bm.prefix_cache()->num_evictable(), 2);
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
  EXPECT_EQ(bm.acquire_cached_prefix(5, view(a), 9), 8) << "reusable after every holder left";
  EXPECT_EQ(bm.prefix_cache()->num_evictable(), 0);
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
}

// Blocks run out: unnamed free blocks go first, then the named ones no
// sequence holds, least recently freed first (a freed sequence's tail before
// its head). An evicted block's name is gone: no hit on it.
TEST(BlockManagerPrefix, EvictsUnheldNamedBlocksLeastRecentlyFreedFirstOnlyWhenBlocksRunOut) {
  BlockManager bm(4, 2, PrefixCacheConfig{true, 0});
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5};
  ASSERT_TRUE(bm.allocate_slots(1, 5).ok());
  bm.cache_full_blocks(1, view(a), 5);
  const std::vector<std::int32_t> table = bm.block_table(1);
  bm.free(1);  // blocks table[1], table[0] evictable (tail first); table[2] unnamed, free
  ASSERT_TRUE(bm.allocate_slots(2, 2).ok());
  ASSERT_TRUE(bm.allocate_slots(2, 4).ok());  // two unnamed free blocks, no eviction
  EXPECT_EQ(bm.prefix_cache()->num_evictions(), 0u);
  ASSERT_TRUE(bm.allocate_slots(2, 6).ok());  // evicts the tail's block first
  EXPECT_EQ(bm.prefix_cache()->num_evictions(), 1u);
  EXPECT_EQ(bm.block_table(2).back(), table[1]);
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
  // The head is still named: a hit of one block; the tail's name is gone.
  EXPECT_EQ(bm.acquire_cached_prefix(3, view(a), 4), 2);
  EXPECT_EQ(bm.block_table(3), std::vector<std::int32_t>{table[0]});
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
}

// A new epoch (Seesaw's switch of parallel config re-lays the KV memory out):
// blocks named before are no hit, blocks named after are.
TEST(BlockManagerPrefix, ANewEpochEndsEveryEarlierHit) {
  BlockManager bm(8, 2, PrefixCacheConfig{true, 0});
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5};
  ASSERT_TRUE(bm.allocate_slots(1, 5).ok());
  bm.cache_full_blocks(1, view(a), 5);
  bm.free(1);
  bm.new_prefix_epoch();
  EXPECT_EQ(bm.acquire_cached_prefix(2, view(a), 4), 0);
  ASSERT_TRUE(bm.allocate_slots(2, 5).ok());
  bm.cache_full_blocks(2, view(a), 5);
  bm.free(2);
  EXPECT_EQ(bm.acquire_cached_prefix(3, view(a), 4), 4);
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
}

// A name another block already has is not taken again (the first stays);
// a hash that matches but with other tokens (a forged collision) is no hit.
TEST(BlockManagerPrefix, DuplicateBlocksAndCollisionsNeverShareTheWrongKv) {
  BlockManager bm(6, 2, PrefixCacheConfig{true, 0});
  const std::vector<std::int32_t> a = {1, 2, 3};
  ASSERT_TRUE(bm.allocate_slots(1, 3).ok());
  ASSERT_TRUE(bm.allocate_slots(2, 3).ok());  // the same tokens computed twice (admitted together)
  bm.cache_full_blocks(1, view(a), 3);
  bm.cache_full_blocks(2, view(a), 3);
  EXPECT_EQ(bm.prefix_cache()->num_named_blocks(), 1u);
  EXPECT_TRUE(bm.prefix_cache()->is_named(bm.block_table(1)[0]));
  EXPECT_FALSE(bm.prefix_cache()->is_named(bm.block_table(2)[0]));
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;

  PrefixCache index(4);
  const std::uint64_t root = prefix_root_hash(0);
  const std::vector<std::int32_t> t = {5, 6};
  const std::uint64_t name = prefix_block_hash(root, t);
  ASSERT_TRUE(index.insert(0, name, root, t));
  EXPECT_EQ(index.find(name, root, t), 0);
  EXPECT_EQ(index.find(name, root, std::vector<std::int32_t>{5, 7}), -1) << "same name, other tokens";
  EXPECT_EQ(index.find(name, root + 1, t), -1) << "same name, other parent";
  EXPECT_NE(prefix_block_hash(root, t), prefix_block_hash(prefix_root_hash(1), t)) << "the salt names blocks";
}

// Copy-on-write of a shared block's head: a sequence whose next tokens
// begin a named block (another's block k, after the same k blocks) gets that
// block and how many of its leading tokens match, the longest match among
// the siblings, within max_tokens; the block is pinned (not evictable, not
// handed out) until release_pins(). No match, a different parent or a
// sequence with blocks of its own: nothing.
TEST(BlockManagerPrefix, APartialBlockHitPinsTheSiblingWithTheLongestMatchUntilReleased) {
  BlockManager bm(8, 4, PrefixCacheConfig{true, 0});
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};    // block 1: 5 6 7 8
  const std::vector<std::int32_t> b = {1, 2, 3, 4, 5, 6, 9, 9};    // block 1: 5 6 9 9
  ASSERT_TRUE(bm.allocate_slots(1, 8).ok());
  bm.cache_full_blocks(1, view(a), 8);
  ASSERT_EQ(bm.acquire_cached_prefix(2, view(b), 7), 4);
  ASSERT_TRUE(bm.allocate_slots(2, 8).ok());
  bm.cache_full_blocks(2, view(b), 8);  // its own block 1, named: a sibling of a's
  bm.free(1);
  bm.free(2);

  const std::vector<std::int32_t> c = {1, 2, 3, 4, 5, 6, 7, 0, 0};  // matches a's block 1 for 3 tokens
  ASSERT_EQ(bm.acquire_cached_prefix(3, view(c), 8), 4);
  const int evictable = bm.prefix_cache()->num_evictable();
  const auto hit = bm.acquire_partial_block(3, view(c), 8);
  EXPECT_EQ(hit.num_tokens, 3);
  ASSERT_GE(hit.src_block, 0);
  EXPECT_EQ(bm.prefix_cache()->num_evictable(), evictable - 1) << "the source is pinned";
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
  // Every other block is taken: the pinned source is not among them.
  ASSERT_TRUE(bm.allocate_slots(3, 9).ok());
  for (std::uint64_t id = 10; bm.num_free_blocks() > 0; ++id) ASSERT_TRUE(bm.allocate_slots(id, 4).ok());
  for (std::uint64_t id = 10; bm.has_seq(id); ++id) EXPECT_NE(bm.block_table(id)[0], hit.src_block);
  EXPECT_TRUE(bm.prefix_cache()->is_named(hit.src_block));
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;
  bm.release_pins();
  EXPECT_EQ(bm.num_free_blocks(), 1) << "unpinned and held by nobody: evictable again";
  ASSERT_TRUE(bm.check_integrity().ok()) << bm.check_integrity().error().message;

  // max_tokens caps the match (the last token is always computed).
  BlockManager bm2(8, 4, PrefixCacheConfig{true, 0});
  ASSERT_TRUE(bm2.allocate_slots(1, 8).ok());
  bm2.cache_full_blocks(1, view(a), 8);
  ASSERT_EQ(bm2.acquire_cached_prefix(2, view(a), 7), 4);
  const auto capped = bm2.acquire_partial_block(2, view(a), 7);
  EXPECT_EQ(capped.num_tokens, 3) << "tokens 4..6 of 8, the last one computed";
  EXPECT_EQ(capped.src_block, bm2.block_table(1)[1]);
  // From the root: a sequence with no full hit matches the first blocks.
  const std::vector<std::int32_t> d = {1, 2, 7, 7, 7};
  const auto root = bm2.acquire_partial_block(3, view(d), 4);
  EXPECT_EQ(root.num_tokens, 2);
  EXPECT_EQ(root.src_block, bm2.block_table(1)[0]);
  // Another parent, or no common first token: nothing.
  const std::vector<std::int32_t> e = {9, 2, 3, 4, 5};
  EXPECT_EQ(bm2.acquire_partial_block(4, view(e), 4).src_block, -1);
  // A sequence that computed a block of its own is past its shared head.
  ASSERT_TRUE(bm2.allocate_slots(5, 2).ok());
  EXPECT_EQ(bm2.acquire_partial_block(5, view(a), 7).src_block, -1);
  ASSERT_TRUE(bm2.check_integrity().ok()) << bm2.check_integrity().error().message;
  bm2.release_pins();
  ASSERT_TRUE(bm2.check_integrity().ok()) << bm2.check_integrity().error().message;
}

// Random sharing, growth, frees and evictions: the counts, the sharing and
// the index stay consistent (check_integrity after every operation).
TEST(BlockManagerPrefix, IntegrityHoldsAfterRandomSharingAndEviction) {
  std::mt19937 rng(99);
  BlockManager bm(40, 4, PrefixCacheConfig{true, 3});
  std::vector<std::vector<std::int32_t>> prompts;
  for (int p = 0; p < 6; ++p) {
    std::vector<std::int32_t> ids;
    for (int t = 0; t < 30; ++t) ids.push_back(t < 12 ? t : 100 * p + t);  // a 12-token shared head
    prompts.push_back(ids);
  }
  std::map<std::uint64_t, int> computed;
  for (int op = 0; op < 4000; ++op) {
    const std::uint64_t id = rng() % 10;
    const auto& ids = prompts[id % prompts.size()];
    if (rng() % 3 == 0) {
      bm.free(id);
      computed.erase(id);
    } else if (!bm.has_seq(id)) {
      const int hit = bm.acquire_cached_prefix(id, view(ids), 29);
      ASSERT_EQ(hit % 4, 0);
      if (rng() % 2 == 0) (void)bm.acquire_partial_block(id, view(ids), 29);
      if (rng() % 4 == 0) bm.release_pins();
      const int want = hit + 1 + static_cast<int>(rng() % 8);
      if (!bm.can_grow(id, want)) {
        bm.free(id);
      } else {
        ASSERT_TRUE(bm.allocate_slots(id, want).ok());
        computed[id] = want;
        bm.cache_full_blocks(id, view(ids), want);
      }
    } else {
      const int want = std::min(30, computed[id] + 1 + static_cast<int>(rng() % 6));
      if (bm.can_grow(id, want)) {
        ASSERT_TRUE(bm.allocate_slots(id, want).ok());
        computed[id] = want;
        bm.cache_full_blocks(id, view(ids), want);
      }
    }
    ASSERT_TRUE(bm.check_integrity().ok()) << op << ": " << bm.check_integrity().error().message;
  }
  EXPECT_GT(bm.prefix_cache()->num_evictions(), 0u) << "the run exercised eviction";
}

}  // namespace
}  // namespace shardline::engine
