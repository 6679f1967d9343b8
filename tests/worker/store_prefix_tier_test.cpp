// StorePrefixTier's own rules, over a store played in memory: a prefetch
// starts after the blocks host memory holds, asks in fetches of at most
// max_fetch_bytes and stops where the store's run ends; puts reach the store
// once per name, and not for a block the store handed out; a full queue
// keeps a block in host memory only; a store that refuses loses nothing a
// get needs.

#include "worker/store_prefix_tier.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace shardline::worker {
namespace worker_store_prefix_tier_test {

class MemoryBlockStore final : public PrefixBlockStore {
 public:
  Result<PrefixPutAck> put_blocks(std::uint64_t, std::span<const kvstore::PrefixBlockWrite> blocks) override {
    std::lock_guard lock(mu_);
    ++puts;
    if (refuse_puts) return make_error(ErrorCode::disk_full, "kv store: disk budget spent");
    PrefixPutAck ack;
    for (const auto& b : blocks) {
      sent.push_back(b.name);
      if (skip.count(b.name) != 0) continue;  // the store's budget skips it
      ack.stored += blocks_.count(b.name) == 0 ? 1 : 0;
      ack.kept.push_back(b.name);
      blocks_[b.name] = kvstore::StoredPrefixBlock{b.name, b.parent, {b.tokens.begin(), b.tokens.end()},
                                                   {b.chunk.begin(), b.chunk.end()}};
    }
    return ack;
  }
  Result<std::vector<kvstore::StoredPrefixBlock>> fetch_blocks(
      std::uint64_t, std::span<const kvstore::PrefixBlockQuery> queries) override {
    std::lock_guard lock(mu_);
    fetch_sizes.push_back(static_cast<int>(queries.size()));
    if (fail_fetches) return make_error(ErrorCode::io, "KV store: no answer in time");
    std::vector<kvstore::StoredPrefixBlock> out;
    for (const auto& q : queries) {
      const auto it = blocks_.find(q.name);
      if (it == blocks_.end() || it->second.parent != q.parent ||
          !std::equal(q.tokens.begin(), q.tokens.end(), it->second.tokens.begin(), it->second.tokens.end()))
        break;
      out.push_back(it->second);
    }
    return out;
  }
  void hold(std::uint64_t name, std::uint64_t parent, std::vector<std::int32_t> tokens, std::byte fill) {
    std::lock_guard lock(mu_);
    blocks_[name] = kvstore::StoredPrefixBlock{name, parent, std::move(tokens), std::vector<std::byte>(100, fill)};
  }
  bool refuse_puts = false;
  bool fail_fetches = false;
  std::set<std::uint64_t> skip;  ///< names a put does not keep (the store's budget)
  int puts = 0;
  std::vector<std::uint64_t> sent;
  std::vector<int> fetch_sizes;

 private:
  std::mutex mu_;
  std::map<std::uint64_t, kvstore::StoredPrefixBlock> blocks_;
};

/// A chain of `n` blocks named 1..n (block i's parent is i - 1), 4 tokens each.
std::vector<engine::NamedBlock> chain(int n) {
  std::vector<engine::NamedBlock> out;
  for (int i = 1; i <= n; ++i)
    out.push_back(engine::NamedBlock{-1, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i - 1),
                                     {i, i + 1, i + 2, i + 3}});
  return out;
}

StorePrefixTierOptions small() {
  StorePrefixTierOptions o;
  o.salt = 7;
  o.host_bytes = 1000;
  o.block_bytes = 100;
  o.max_fetch_bytes = 250;  // two blocks per fetch
  return o;
}

TEST(StorePrefixTier, APrefetchStartsAfterHostMemoryAndAsksInBoundedFetchesUntilTheStoresRunEnds) {
  auto store = std::make_shared<MemoryBlockStore>();
  const auto blocks = chain(7);
  for (int i = 0; i < 6; ++i)  // the store lacks block 7
    store->hold(blocks[i].name, blocks[i].parent, blocks[i].tokens, std::byte{static_cast<unsigned char>(i)});
  StorePrefixTier tier(store, small());
  tier.put(1, 0, blocks[0].tokens, std::vector<std::byte>(100, std::byte{0}));  // host memory holds block 1
  EXPECT_EQ(tier.prefetch(blocks), 5) << "blocks 2..6";
  EXPECT_EQ(store->fetch_sizes, (std::vector<int>{2, 2, 2})) << "{2,3} {4,5} {6,7}: the third run ends at 6";
  for (int i = 1; i < 6; ++i) {
    auto got = tier.get(blocks[i].name, blocks[i].parent, blocks[i].tokens);
    ASSERT_TRUE(got.has_value()) << "block " << i + 1;
    EXPECT_EQ(got->at(0), std::byte{static_cast<unsigned char>(i)});
  }
  EXPECT_FALSE(tier.get(7, 6, blocks[6].tokens).has_value());
  EXPECT_FALSE(tier.get(2, 1, std::vector<std::int32_t>{9, 9, 9, 9}).has_value()) << "other tokens: not handed out";
  const StorePrefixTierStats s = tier.stats();
  EXPECT_EQ(s.prefetches, 3u);
  EXPECT_EQ(s.fetched_blocks, 5u);
  EXPECT_EQ(s.fetched_tokens, 20u);
  // Nothing fetched is sent back: the store keeps it.
  tier.put(3, 2, blocks[2].tokens, std::vector<std::byte>(100));
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  EXPECT_EQ(store->puts, 1) << "block 1 only";
  EXPECT_EQ(store->sent, (std::vector<std::uint64_t>{1}));
}

TEST(StorePrefixTier, PutsReachTheStoreOncePerNameAndAFullQueueKeepsBlocksInHostMemoryOnly) {
  auto store = std::make_shared<MemoryBlockStore>();
  StorePrefixTierOptions o = small();
  o.max_queued_bytes = 0;  // nothing fits the queue
  {
    StorePrefixTier full(store, o);
    full.put(1, 0, chain(1)[0].tokens, std::vector<std::byte>(100));
    ASSERT_TRUE(full.drain(std::chrono::seconds(5)));
    EXPECT_EQ(full.stats().dropped_blocks, 1u);
    EXPECT_TRUE(full.get(1, 0, chain(1)[0].tokens).has_value()) << "kept in host memory";
    EXPECT_TRUE(store->sent.empty());
  }
  StorePrefixTier tier(store, small());
  const auto blocks = chain(3);
  for (int round = 0; round < 2; ++round)
    for (const auto& b : blocks) tier.put(b.name, b.parent, b.tokens, std::vector<std::byte>(100));
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  EXPECT_EQ(store->sent, (std::vector<std::uint64_t>{1, 2, 3})) << "each name once";
  EXPECT_EQ(tier.stats().store_kept_blocks, 3u);
}

TEST(StorePrefixTier, AStoreThatRefusesPutsLosesNothingAGetNeeds) {
  auto store = std::make_shared<MemoryBlockStore>();
  store->refuse_puts = true;
  StorePrefixTier tier(store, small());
  const auto blocks = chain(2);
  for (const auto& b : blocks) tier.put(b.name, b.parent, b.tokens, std::vector<std::byte>(100));
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  const StorePrefixTierStats s = tier.stats();
  EXPECT_GE(s.store_put_failures, 1u);
  EXPECT_EQ(s.store_kept_blocks, 0u);
  for (const auto& b : blocks) EXPECT_TRUE(tier.get(b.name, b.parent, b.tokens).has_value());
  // Refused blocks are not remembered as stored: a later put sends them again.
  store->refuse_puts = false;
  tier.put(1, 0, blocks[0].tokens, std::vector<std::byte>(100));
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  EXPECT_EQ(store->sent, (std::vector<std::uint64_t>{1}));
}

TEST(StorePrefixTier, LinkableBlocksAreTheLeadingOnesQueuedOrKept) {
  auto store = std::make_shared<MemoryBlockStore>();
  store->skip = {3};  // the store's budget skips block 3
  StorePrefixTier tier(store, small());
  const auto blocks = chain(4);
  const std::vector<std::uint64_t> names{1, 2, 3, 4};
  EXPECT_EQ(tier.linkable_blocks(names), 0u);
  for (const auto& b : blocks) tier.put(b.name, b.parent, b.tokens, std::vector<std::byte>(100));
  // Queued or in flight counts already: the store links them when they come.
  EXPECT_EQ(tier.linkable_blocks(names), 4u);
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  // Kept: what the store said it keeps, not what was sent.
  EXPECT_EQ(tier.linkable_blocks(names), 2u);
  EXPECT_EQ(tier.linkable_blocks(std::vector<std::uint64_t>{2, 1}), 2u);
  EXPECT_EQ(tier.linkable_blocks(std::vector<std::uint64_t>{4}), 1u);
  const StorePrefixTierStats s = tier.stats();
  EXPECT_EQ(s.store_kept_blocks, 3u);
  EXPECT_EQ(s.store_skipped_blocks, 1u);
}

TEST(StorePrefixTier, AWaitForABlockKeptBeforeTheBatchWasSentMeansTheStoreLostIt) {
  auto store = std::make_shared<MemoryBlockStore>();
  StorePrefixTier tier(store, small());
  const auto blocks = chain(2);
  const auto before = std::chrono::steady_clock::now();
  for (const auto& b : blocks) tier.put(b.name, b.parent, b.tokens, std::vector<std::byte>(100));
  ASSERT_TRUE(tier.drain(std::chrono::seconds(5)));
  const std::vector<std::uint64_t> names{1, 2};
  EXPECT_EQ(tier.linkable_blocks(names), 2u);
  // A batch sent before the store acknowledged block 1: its wait may be
  // stale (the block landed after the answer), so nothing changes.
  EXPECT_TRUE(tier.on_its_way(1, before));
  EXPECT_EQ(tier.linkable_blocks(names), 2u);
  // A batch sent after: the store has lost block 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // strictly after the acknowledgement
  EXPECT_FALSE(tier.on_its_way(1, std::chrono::steady_clock::now()));
  EXPECT_EQ(tier.linkable_blocks(names), 0u);
  EXPECT_FALSE(tier.on_its_way(1, before)) << "no longer taken as kept";
}

TEST(StorePrefixTier, AfterAFailedFetchLinesDoNotAskForAWhile) {
  auto store = std::make_shared<MemoryBlockStore>();
  store->fail_fetches = true;
  const auto blocks = chain(2);
  StorePrefixTierOptions o = small();
  o.fetch_backoff = std::chrono::hours(1);
  StorePrefixTier tier(store, o);
  EXPECT_EQ(tier.prefetch(blocks), 0);
  EXPECT_EQ(tier.prefetch(blocks), 0);
  EXPECT_EQ(store->fetch_sizes.size(), 1u) << "the second line did not wait on a failing store";
  StorePrefixTierStats s = tier.stats();
  EXPECT_EQ(s.prefetch_failures, 1u);
  EXPECT_EQ(s.prefetches_skipped, 1u);
  o.fetch_backoff = std::chrono::milliseconds(0);
  StorePrefixTier eager(store, o);
  EXPECT_EQ(eager.prefetch(blocks), 0);
  EXPECT_EQ(eager.prefetch(blocks), 0);
  EXPECT_EQ(store->fetch_sizes.size(), 3u) << "no backoff: each line asks";
}

TEST(StorePrefixTier, ABlockOfAnotherSizeIsNotStaged) {
  auto store = std::make_shared<MemoryBlockStore>();
  const auto blocks = chain(2);
  for (const auto& b : blocks) store->hold(b.name, b.parent, b.tokens, std::byte{1});  // 100-byte chunks
  StorePrefixTierOptions o = small();
  o.block_bytes = 64;  // this engine's blocks are 64 bytes
  StorePrefixTier tier(store, o);
  EXPECT_EQ(tier.prefetch(blocks), 0);
  EXPECT_EQ(tier.stats().wrong_size_blocks, 1u);
  EXPECT_FALSE(tier.get(1, 0, blocks[0].tokens).has_value()) << "restoring it would fail the step";
}

}  // namespace worker_store_prefix_tier_test
}  // namespace shardline::worker
