// The persistent prefix tier (worker/store_prefix_tier.hpp) over a real
// KvStore (RocksDB in a temporary folder), on stories260K: a worker runtime
// computes lines behind one shared head, and its prefix blocks reach the
// store; the store is closed and opened again (a node restart) and a new
// runtime fetches the head from it instead of computing it, with outputs
// byte-identical to a runtime without prefix caching. Weights of another
// dtype (a different salt) fetch nothing; a store that fails costs nothing but
// the fetch.

#include "worker/store_prefix_tier.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/kv_store.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/stories_reference.hpp"
#include "tests/worker/shared_head_job.hpp"
#include "worker/worker_runtime.hpp"

namespace shardline::worker {
namespace worker_store_prefix_tier_golden_test {

using testing_support::kStoriesDir;

/// The node's KV store as the worker's PrefixBlockStore, without actors:
/// calls go straight to a KvStore (the actor does only this).
class DirectBlockStore final : public PrefixBlockStore {
 public:
  explicit DirectBlockStore(kvstore::KvStore* store) : store_(store) {}
  Result<PrefixPutAck> put_blocks(std::uint64_t salt, std::span<const kvstore::PrefixBlockWrite> blocks) override {
    std::lock_guard lock(mu_);
    ++puts;
    for (const auto& b : blocks)
      if ((b.salt & ~kvstore::kPrefixBlockJobBit) != (salt & ~kvstore::kPrefixBlockJobBit))
        return make_error(ErrorCode::internal, "a block of another salt in the batch");
    return testing::put_prefix_blocks_acked(*store_, salt, blocks);
  }
  Result<std::vector<kvstore::StoredPrefixBlock>> fetch_blocks(
      std::uint64_t salt, std::span<const kvstore::PrefixBlockQuery> queries) override {
    std::lock_guard lock(mu_);
    ++fetches;
    if (failing) return make_error(ErrorCode::io, "no KV store now (it is restarting)");
    return store_->fetch_prefix_blocks(salt, queries);
  }
  int puts = 0;
  int fetches = 0;
  bool failing = false;

 private:
  std::mutex mu_;
  kvstore::KvStore* store_;
};

WorkerRuntimeOptions options(bool caching, DType kv_dtype = DType::f32) {
  WorkerRuntimeOptions o = testing::shared_head_options("prefix-store", caching);
  o.engine.kv_cache_dtype = kv_dtype;
  return o;
}

using testing::make_runtime;

std::vector<BatchRequest> lines(std::uint64_t job, int num_lines = 3) {
  return testing::shared_head_lines(job, num_lines, 12, 700);
}

/// Accepts the lines and steps until idle; the choices' token ids by line.
testing::LineOutputs run(WorkerRuntime& rt, std::vector<BatchRequest> job) {
  for (BatchRequest& l : job) (void)rt.accept(std::move(l));
  return testing::run_to_end(rt);
}

kvstore::KvStoreOptions store_options(const WorkerRuntime& rt) {
  kvstore::KvStoreOptions o;
  o.shape = rt.batch_worker().engine().kv_io().shape();
  o.disk_reserve_bytes = 0;
  return o;
}

TEST(StorePrefixTierGolden, ARestartedStoreHandsTheSharedHeadToANewRuntimeAndTheOutputsStayTheSame) {
  auto plain = make_runtime(options(false));
  ASSERT_NE(plain, nullptr);
  const auto want = run(*plain, lines(1));
  ASSERT_EQ(want.size(), 3u);

  orchestrator::testing::TempDir dir;
  const kvstore::KvStoreOptions so = store_options(*plain);
  plain.reset();
  {
    auto store = kvstore::KvStore::open(dir.path(), so);
    ASSERT_TRUE(store.ok()) << store.error().to_string();
    auto blocks = std::make_shared<DirectBlockStore>(store->get());
    auto first = make_runtime(options(true));
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->connect_prefix_store(blocks, 8u << 20));
    EXPECT_EQ(run(*first, lines(2)), want);
    ASSERT_TRUE(first->drain_kv(std::chrono::seconds(10)));
    const StorePrefixTierStats s = *first->prefix_store_stats();
    EXPECT_EQ(s.fetched_blocks, 0u) << "an empty store";
    EXPECT_EQ(s.store_kept_blocks, 4u) << "the head's 4 full blocks, sent when first shared";
    auto held = (*store)->stats();
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->prefix_blocks, 4u);
    EXPECT_EQ(held->requests, 0u) << "prefix blocks are no request's chunks";
  }
  // The node restarts: a new store object over the same folder, a new
  // runtime (its device cache empty).
  auto store = kvstore::KvStore::open(dir.path(), so);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto blocks = std::make_shared<DirectBlockStore>(store->get());
  auto second = make_runtime(options(true));
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->connect_prefix_store(blocks, 8u << 20));
  EXPECT_EQ(run(*second, lines(3)), want) << "byte-identical to no prefix caching";
  const StorePrefixTierStats s = *second->prefix_store_stats();
  EXPECT_EQ(s.fetched_blocks, 4u) << "the head came from the store";
  EXPECT_EQ(s.fetched_tokens, 64u);
  const KvCounterGrowth g = second->take_kv_counter_growth();
  EXPECT_EQ(g.prefix_store_fetched_tokens, 64u);
  EXPECT_EQ(g.prefix_tier_restored_tokens, 64u) << "restored once; the other requests hit it on the device";
  EXPECT_EQ(s.prefetch_failures, 0u);
}

TEST(StorePrefixTierGolden, OtherWeightsHaveAnotherSaltAndFetchNothing) {
  orchestrator::testing::TempDir dir;
  kvstore::KvStoreOptions so;
  std::map<std::uint64_t, std::vector<std::vector<std::int32_t>>> want_bf16;
  {
    auto plain = make_runtime(options(false, DType::bf16));
    ASSERT_NE(plain, nullptr);
    want_bf16 = run(*plain, lines(1));
    so = store_options(*plain);
  }
  // The store's shape is the bf16 one; an f32 engine's blocks would not
  // fit it, so both runs use bf16 KV and differ in the weights' dtype.
  auto store = kvstore::KvStore::open(dir.path(), so);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto blocks = std::make_shared<DirectBlockStore>(store->get());
  {
    auto first = make_runtime(options(true, DType::bf16));
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->connect_prefix_store(blocks, 8u << 20));
    EXPECT_EQ(run(*first, lines(2)), want_bf16);
    ASSERT_TRUE(first->drain_kv(std::chrono::seconds(10)));
    EXPECT_EQ(first->prefix_store_stats()->store_kept_blocks, 4u);
  }
  WorkerRuntimeOptions other = options(true, DType::bf16);
  other.engine.dtype = DType::bf16;  // bf16 weights: other KV bits, another salt
  auto second = make_runtime(other);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->connect_prefix_store(blocks, 8u << 20));
  (void)run(*second, lines(3));
  const StorePrefixTierStats s = *second->prefix_store_stats();
  EXPECT_GT(blocks->fetches, 0);
  EXPECT_EQ(s.fetched_blocks, 0u) << "a block of another salt is not this engine's KV";
  EXPECT_EQ(second->take_kv_counter_growth().prefix_tier_restored_tokens, 0u);
}

TEST(StorePrefixTierGolden, AStoreThatFailsCostsOnlyTheFetch) {
  auto plain = make_runtime(options(false));
  ASSERT_NE(plain, nullptr);
  const auto want = run(*plain, lines(1));
  orchestrator::testing::TempDir dir;
  auto store = kvstore::KvStore::open(dir.path(), store_options(*plain));
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto blocks = std::make_shared<DirectBlockStore>(store->get());
  blocks->failing = true;
  auto rt = make_runtime(options(true));
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->connect_prefix_store(blocks, 8u << 20));
  EXPECT_EQ(run(*rt, lines(2)), want);
  const StorePrefixTierStats s = *rt->prefix_store_stats();
  EXPECT_GT(s.prefetch_failures, 0u);
  EXPECT_EQ(s.fetched_blocks, 0u);
}

TEST(StorePrefixTierGolden, WithoutPrefixCachingThereIsNoTier) {
  auto rt = make_runtime(options(false));
  ASSERT_NE(rt, nullptr);
  orchestrator::testing::TempDir dir;
  auto store = kvstore::KvStore::open(dir.path(), store_options(*rt));
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE(rt->connect_prefix_store(std::make_shared<DirectBlockStore>(store->get()), 8u << 20));
  EXPECT_FALSE(rt->prefix_store_stats().has_value());
}

}  // namespace worker_store_prefix_tier_golden_test
}  // namespace shardline::worker
