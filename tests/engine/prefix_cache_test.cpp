// Prefix caching's ComputingPrefixes (engine/prefix_cache.hpp): which block
// names running sequences are computing, as they start, progress and stop;
// and the scheduler's partial-block hits (copy-on-write of a shared block's
// head): given up when their pinned source is the block the request needs,
// made only for matches of min_partial_tokens() or more.
#include "engine/prefix_cache.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/scheduler.hpp"

namespace shardline::engine {
namespace engine_prefix_cache_test {

TEST(ComputingPrefixes, NamesArePendingUntilComputedOrStopped) {
  ComputingPrefixes c;
  c.start(1, {11, 12, 13}, 2);  // sequence 1 computes its blocks 2, 3, 4
  c.start(2, {12, 20}, 3);      // sequence 2 computes a block named 12 too
  EXPECT_TRUE(c.computing(11));
  EXPECT_TRUE(c.computing(12));
  EXPECT_EQ(c.num_pending(), 5u);
  c.progress(1, 3);  // blocks 0..2 computed: 11 named
  EXPECT_FALSE(c.computing(11));
  EXPECT_TRUE(c.computing(12));
  c.progress(1, 4);
  EXPECT_TRUE(c.computing(12)) << "sequence 2 still computes a block of that name";
  c.stop(2);
  EXPECT_FALSE(c.computing(12));
  EXPECT_FALSE(c.computing(20));
  EXPECT_TRUE(c.computing(13));
  c.progress(1, 10);
  EXPECT_FALSE(c.computing(13));
  EXPECT_EQ(c.num_pending(), 0u);
  // A restart replaces what the sequence computed before.
  c.start(3, {30, 31}, 0);
  c.start(3, {31}, 1);
  EXPECT_FALSE(c.computing(30));
  EXPECT_TRUE(c.computing(31));
  c.stop(3);
  c.stop(3);  // twice is harmless
  c.progress(4, 5);  // unknown: harmless
  EXPECT_EQ(c.num_pending(), 0u);
}

}  // namespace engine_prefix_cache_test
}  // namespace shardline::engine

namespace shardline::engine {
namespace engine_prefix_cache_test {

std::unique_ptr<Sequence> seq_of(std::uint64_t id, std::vector<std::int32_t> prompt) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->prompt_ids = std::move(prompt);
  s->params.max_tokens = 1;
  return s;
}

// A partial-block hit pins its source, which is a block the admission could
// have been given by eviction. When the request fits only with that block,
// the hit is given up, not the admission: a 5-block cache, A's 3 named
// blocks evictable, B shares 2 of them and 8 tokens of the third and needs
// all 5 blocks (before the fix the schedule stayed empty forever). A copy
// of at least min_partial_tokens() is made when there is room.
TEST(PrefixCacheScheduler, APartialHitIsGivenUpWhenItsPinnedSourceIsTheBlockTheRequestNeeds) {
  SchedulerConfig config;
  config.max_model_len = 80;
  config.prefix_cache = {true, 0};
  Scheduler sched(config, 5, 16);
  sched.set_partial_block_copies(true);
  std::vector<std::int32_t> a(48);
  for (int i = 0; i < 48; ++i) a[static_cast<std::size_t>(i)] = i;
  ASSERT_TRUE(sched.add(seq_of(1, a)).ok());
  SchedulerOutput first = sched.schedule();
  ASSERT_EQ(first.scheduled.size(), 1u);
  const std::int32_t sampled[] = {7};
  sched.update(first, sampled);
  ASSERT_NE(sched.finish(1, FinishReason::length), nullptr);
  ASSERT_EQ(sched.block_manager().prefix_cache()->num_evictable(), 3);

  std::vector<std::int32_t> b(a.begin(), a.begin() + 40);
  for (int i = 40; i < 79; ++i) b.push_back(1000 + i);
  ASSERT_TRUE(sched.add(seq_of(2, b)).ok());
  SchedulerOutput second = sched.schedule();
  ASSERT_EQ(second.scheduled.size(), 1u) << "B fits the cache: it must be admitted";
  EXPECT_TRUE(second.prefix_copies.empty());
  EXPECT_EQ(second.scheduled[0].num_new_tokens, 79 - 32) << "from its 2 shared blocks on";
  EXPECT_EQ(sched.find(2)->num_cached_tokens, 32);
  ASSERT_TRUE(sched.check_integrity().ok()) << sched.check_integrity().error().message;

  // With room, the same 8 tokens are copied; a 2-token match is not.
  Scheduler roomy(config, 12, 16);
  roomy.set_partial_block_copies(true);
  ASSERT_TRUE(roomy.add(seq_of(1, a)).ok());
  SchedulerOutput r1 = roomy.schedule();
  roomy.update(r1, sampled);
  ASSERT_NE(roomy.finish(1, FinishReason::length), nullptr);
  ASSERT_TRUE(roomy.add(seq_of(2, b)).ok());
  SchedulerOutput r2 = roomy.schedule();
  ASSERT_EQ(r2.prefix_copies.size(), 1u);
  EXPECT_EQ(r2.prefix_copies[0].token_begin, 32);
  EXPECT_EQ(r2.prefix_copies[0].num_tokens, 8);
  EXPECT_EQ(roomy.find(2)->num_cached_tokens, 40);
  std::vector<std::int32_t> c(a.begin(), a.begin() + 34);
  for (int i = 34; i < 60; ++i) c.push_back(2000 + i);
  ASSERT_TRUE(roomy.add(seq_of(3, c)).ok());
  SchedulerOutput r3 = roomy.schedule();
  EXPECT_TRUE(r3.prefix_copies.empty()) << "2 tokens < min_partial_tokens() = 4";
  EXPECT_EQ(roomy.find(3)->num_cached_tokens, 32);
  ASSERT_TRUE(roomy.check_integrity().ok()) << roomy.check_integrity().error().message;
}

}  // namespace engine_prefix_cache_test
}  // namespace shardline::engine
