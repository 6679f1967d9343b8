// SiDP layer ownership (seed 002 §4.1) and the WaS prefetch order with peak
// shifting (§4.2): the plans, their errors, the paper's two properties of
// peak shifting, and the exact cache-slot minimum.
#include "model/sidp/ownership.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace shardline::model::sidp {
namespace model_sidp_ownership_test {

TEST(SidpOwnership, BalancedPlanIsLayerModDp) {
  auto p = balanced_plan(10, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->to_string(), "0,1,2,3,0,1,2,3,0,1");
  EXPECT_EQ(p->owned_layers(1), std::vector<int>({1, 5, 9}));
  EXPECT_EQ(p->owned_layers(3), std::vector<int>({3, 7}));
  EXPECT_EQ(p->remote_layers(3), std::vector<int>({0, 1, 2, 4, 5, 6, 8, 9}));
}

TEST(SidpOwnership, StatedPlanParsesAndRoundTrips) {
  auto p = parse_plan("0,0,1,1,1", 5, 2);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->owned_layers(0), std::vector<int>({0, 1}));
  EXPECT_EQ(p->to_string(), "0,0,1,1,1");
  auto b = parse_plan("balanced", 5, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->to_string(), "0,1,0,1,0");
  auto none = parse_plan("0,0,0", 3, 2);  // rank 1 owns nothing: allowed
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->owned_layers(1).empty());
}

TEST(SidpOwnership, BadPlansAreClearErrors) {
  struct Case {
    const char* text;
    int layers, dp;
    const char* says;
  };
  for (const Case& c : {Case{"0,1", 3, 2, "names 2 owners but the model has 3"},
                        Case{"0,2,1", 3, 2, "owned by rank 2, outside [0, 2)"},
                        Case{"0,x,1", 3, 2, "'x' of layer 1 is not a number"},
                        Case{"0,,1", 3, 2, "'' of layer 1 is not a number"},
                        Case{"0,-1,1", 3, 2, "outside [0, 2)"},
                        Case{"0,0,0", 3, 1, "at least 2 ranks"},
                        Case{"balanced", 3, 1, "at least 2 ranks"}}) {
    auto p = parse_plan(c.text, c.layers, c.dp);
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(p.error().message.find(c.says), std::string::npos) << c.text << ": " << p.error().message;
  }
  EXPECT_FALSE(balanced_plan(0, 2).ok());
}

TEST(SidpOwnership, WithoutPeakShiftingRanksFetchInLayerOrder) {
  auto p = balanced_plan(8, 4);
  ASSERT_TRUE(p.ok());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(prefetch_order(*p, r, false), p->remote_layers(r));
  // Every non-owner of layer 0 starts with it: the incast peak shifting avoids.
  for (int r = 1; r < 4; ++r) EXPECT_EQ(prefetch_order(*p, r, false).front(), 0);
}

TEST(SidpOwnership, PeakShiftingOrderMatchesThePaper) {
  auto p = balanced_plan(8, 4);
  ASSERT_TRUE(p.ok());
  // Cycle [0, 4): rank r starts at layer r (its own, skipped) and wraps.
  EXPECT_EQ(prefetch_order(*p, 0, true), std::vector<int>({1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(prefetch_order(*p, 1, true), std::vector<int>({2, 3, 0, 6, 7, 4}));
  EXPECT_EQ(prefetch_order(*p, 2, true), std::vector<int>({3, 0, 1, 7, 4, 5}));
  EXPECT_EQ(prefetch_order(*p, 3, true), std::vector<int>({0, 1, 2, 4, 5, 6}));
}

// Property (i): within each cycle every rank fetches each of its non-owned
// layers exactly once, after at most dp - 1 prefetches (no starvation);
// property (ii): at the t-th prefetch of a cycle the ranks read from
// pairwise different owners (no incast), and they start at different layers.
TEST(SidpOwnership, PeakShiftingPropertiesHoldForManyShapes) {
  for (int dp : {2, 3, 4, 8})
    for (int layers : {dp, 2 * dp, 5, 28, 36}) {
      if (layers < 1) continue;
      auto p = balanced_plan(layers, dp);
      ASSERT_TRUE(p.ok());
      std::vector<std::vector<int>> orders;
      for (int r = 0; r < dp; ++r) orders.push_back(prefetch_order(*p, r, true));
      for (int c = 0; c < layers; c += dp) {
        const int len = std::min(dp, layers - c);
        for (int r = 0; r < dp; ++r) {
          std::vector<int> in_cycle;
          for (int l : orders[static_cast<std::size_t>(r)])
            if (l >= c && l < c + len) in_cycle.push_back(l);
          std::vector<int> want;
          for (int l = c; l < c + len; ++l)
            if (p->owner(l) != r) want.push_back(l);
          std::vector<int> sorted = in_cycle;
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(sorted, want) << "dp " << dp << " layers " << layers << " rank " << r << " cycle " << c;
          EXPECT_LE(in_cycle.size(), static_cast<std::size_t>(dp - 1));
        }
        if (len < dp) continue;  // a short last cycle has fewer owners than readers
        for (int t = 0; t < dp - 1; ++t) {
          std::set<int> owners;
          for (int r = 0; r < dp; ++r) {
            std::vector<int> in_cycle;
            for (int l : orders[static_cast<std::size_t>(r)])
              if (l >= c && l < c + len) in_cycle.push_back(l);
            owners.insert(p->owner(in_cycle[static_cast<std::size_t>(t)]));
          }
          EXPECT_EQ(owners.size(), static_cast<std::size_t>(dp))
              << "dp " << dp << " layers " << layers << " cycle " << c << " prefetch " << t << ": incast";
        }
      }
      if (layers < dp) continue;  // fewer layers than ranks: some ranks own none
      std::set<int> first;
      for (const auto& o : orders) first.insert(o.front());
      EXPECT_EQ(first.size(), static_cast<std::size_t>(dp)) << "ranks must start at different layers";
    }
}

TEST(SidpOwnership, MinCacheSlotsIsExact) {
  auto p = balanced_plan(8, 4);
  ASSERT_TRUE(p.ok());
  // Layer order: one slot suffices (fetch i, compute i, free, fetch i+1).
  EXPECT_EQ(min_cache_slots(*p, 1, prefetch_order(*p, 1, false)), 1);
  // Peak shifting: rank 1 fetches 2, 3, 0 but computes 0, 2, 3: it must hold
  // all three (the paper's "enough cache to hold dp - 1 remote layers").
  EXPECT_EQ(min_cache_slots(*p, 1, prefetch_order(*p, 1, true)), 3);
  // Rank 0's shifted order is its layer order.
  EXPECT_EQ(min_cache_slots(*p, 0, prefetch_order(*p, 0, true)), 1);
  auto all = parse_plan("0,0,0,0", 4, 2);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(min_cache_slots(*all, 0, prefetch_order(*all, 0, true)), 0);
}

}  // namespace
}  // namespace shardline::model::sidp
