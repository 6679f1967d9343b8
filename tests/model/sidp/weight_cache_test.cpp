// WaS's weight cache (seed 002 §4.2): the slot ring and its housekeeper.
// No slot is refilled before the compute released it, fetched bytes are the
// owner's packed weights, a down owner is waited for and retried, an owner
// that stays down is an io error naming it, pause / reset behave.
#include "model/sidp/weight_cache.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/inproc.hpp"
#include "kernels/cpu/linear.hpp"
#include "model/weights.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::model::sidp {
namespace model_sidp_weight_cache_test {

using namespace std::chrono_literals;

std::shared_ptr<const ModelWeights> stories() { return testing_support::stories_weights(); }

/// Rank 0 owns layers 0, 2, 4 of stories260K; rank 1 (the cache under test)
/// owns 1 and 3 and fetches 0, 2, 4.
struct Fixture {
  OwnershipPlan plan;
  std::shared_ptr<comm::InProcGroup> group;
  std::unique_ptr<comm::Communicator> c0, c1;
  std::unique_ptr<LayerOwner> owner0;
  Fixture() {
    plan = *balanced_plan(5, 2);
    auto g = comm::InProcGroup::create(2);
    group = *g;
    c0 = std::move((*g)->communicator(0)).value();
    c1 = std::move((*g)->communicator(1)).value();
    owner0 = std::move(LayerOwner::create(stories(), plan, 0)).value();
  }
  ~Fixture() { owner0->unload(c0.get()); }
  std::unique_ptr<WeightCache> cache(WeightCacheOptions o) {
    auto c = WeightCache::create(plan, 1, prefetch_order(plan, 1, false), owner0->region_bytes(), c1.get(), o);
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
};

template <class Pred>
bool eventually(Pred p, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// The packed FFN region of `layer` as the owner lays it out, built here
/// independently from the weights.
std::vector<std::byte> expected_region(const FfnLayout& l, int layer) {
  const LayerWeights& lw = stories()->layers[static_cast<std::size_t>(layer)];
  std::vector<std::byte> out(l.bytes);
  auto gu = kernels::cpu::PackedLinear::pack(lw.gate_up.data, lw.gate_up.dtype, lw.gate_up.rows, lw.gate_up.cols);
  auto dn = kernels::cpu::PackedLinear::pack(lw.down_proj.data, lw.down_proj.dtype, lw.down_proj.rows,
                                             lw.down_proj.cols);
  std::memcpy(out.data(), gu.data(), gu.bytes());
  std::memcpy(out.data() + l.down_offset, dn.data(), dn.bytes());
  return out;
}

TEST(SidpWeightCache, NoSlotIsRefilledBeforeItsGemmIsDone) {
  Fixture f;
  ASSERT_TRUE(f.owner0->load(f.c0.get()).ok());
  WeightCacheOptions o;
  o.cache_slots = 2;
  auto cache = f.cache(o);
  ASSERT_TRUE(cache);
  EXPECT_EQ(cache->slots(), 2);
  ASSERT_TRUE(eventually([&] { return cache->stats().fetches == 2; }));
  auto r0 = cache->acquire(0);
  ASSERT_TRUE(r0.ok()) << r0.error().to_string();
  const auto want0 = expected_region(f.owner0->layout(0), 0);
  EXPECT_EQ(0, std::memcmp(*r0, want0.data(), want0.size()));
  // Slot of layer 0 is in use, slot of layer 2 ready: the ring is full, so
  // layer 4 must not be fetched, however long we wait, even with the
  // housekeeper woken up (resume() on a running cache only wakes it).
  cache->resume();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cache->stats().fetches, 2u);
  auto resident = cache->resident_layers();
  std::sort(resident.begin(), resident.end());
  EXPECT_EQ(resident, std::vector<int>({0, 2}));
  // The bytes in use are untouched while the slot is held.
  EXPECT_EQ(0, std::memcmp(*r0, want0.data(), want0.size()));
  cache->release(0);
  ASSERT_TRUE(eventually([&] { return cache->stats().fetches == 3; }));
  resident = cache->resident_layers();
  std::sort(resident.begin(), resident.end());
  EXPECT_EQ(resident, std::vector<int>({2, 4}));
  for (int layer : {2, 4, 0, 2}) {  // the order cycles step after step
    auto r = cache->acquire(layer);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    const auto want = expected_region(f.owner0->layout(layer), layer);
    EXPECT_EQ(0, std::memcmp(*r, want.data(), want.size())) << "layer " << layer;
    cache->release(layer);
  }
  EXPECT_EQ(cache->stats().fetched_bytes, cache->stats().fetches * f.owner0->layout(0).bytes);
}

TEST(SidpWeightCache, WaitsForADownOwnerAndRetriesUntilItIsRespawned) {
  Fixture f;  // owner 0 not loaded: its regions do not exist yet
  WeightCacheOptions o;
  o.owner_wait = 10s;
  auto cache = f.cache(o);
  ASSERT_TRUE(cache);
  std::thread respawn([&] {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(f.owner0->load(f.c0.get()).ok());
  });
  auto r = cache->acquire(0);
  respawn.join();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const auto want = expected_region(f.owner0->layout(0), 0);
  EXPECT_EQ(0, std::memcmp(*r, want.data(), want.size()));
  EXPECT_GT(cache->stats().fetch_retries, 0u);
  cache->release(0);
}

// A dead owner rank (a process that exited) is not waited for: io at once,
// not after owner_wait (not_found, a withdrawn region, is what is waited for).
TEST(SidpWeightCache, ADeadOwnerRankFailsAtOnceInsteadOfAfterTheOwnerWait) {
  Fixture f;
  ASSERT_TRUE(f.owner0->load(f.c0.get()).ok());
  ASSERT_TRUE(f.group->mark_dead(0).ok());  // before the housekeeper's first get
  WeightCacheOptions o;
  o.owner_wait = 30s;
  auto cache = f.cache(o);
  ASSERT_TRUE(cache);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = cache->acquire(0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::io) << r.error().to_string();
  EXPECT_LT(s, 5.0) << "waited for a dead owner";
  EXPECT_EQ(cache->stats().fetch_retries, 0u);
}

TEST(SidpWeightCache, AnOwnerThatStaysDownIsAnIoErrorNamingIt) {
  Fixture f;
  WeightCacheOptions o;
  o.owner_wait = 200ms;
  auto cache = f.cache(o);
  ASSERT_TRUE(cache);
  auto r = cache->acquire(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::io);
  EXPECT_NE(r.error().message.find("owner 0 of layer 0"), std::string::npos) << r.error().message;
  // Nothing else is lost: once the owner is back, the layer comes through.
  ASSERT_TRUE(f.owner0->load(f.c0.get()).ok());
  cache->reset();
  auto again = cache->acquire(0);
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  cache->release(0);
}

TEST(SidpWeightCache, PausedFetchesNothingAndResetRestartsTheOrder) {
  Fixture f;
  ASSERT_TRUE(f.owner0->load(f.c0.get()).ok());
  WeightCacheOptions o;
  o.cache_slots = 2;
  o.start_paused = true;
  auto cache = f.cache(o);
  ASSERT_TRUE(cache);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cache->stats().fetches, 0u);
  auto paused = cache->acquire(0);
  ASSERT_FALSE(paused.ok());
  EXPECT_EQ(paused.error().code, ErrorCode::internal);
  cache->resume();
  ASSERT_TRUE(eventually([&] { return cache->stats().fetches == 2; }));
  // A step that failed after layer 0: reset drops layer 2 and starts over at 0.
  ASSERT_TRUE(cache->acquire(0).ok());
  cache->release(0);
  cache->reset();
  ASSERT_TRUE(eventually([&] {
    auto r = cache->resident_layers();
    std::sort(r.begin(), r.end());
    return r == std::vector<int>({0, 2});
  }));
  ASSERT_TRUE(cache->acquire(0).ok());
  cache->release(0);
}

}  // namespace
}  // namespace shardline::model::sidp
