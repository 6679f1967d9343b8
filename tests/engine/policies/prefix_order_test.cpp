// engine/policies/prefix_order.hpp: the prefix-aware order of an offline
// batch and its prefix tree's size. The order puts prompts sharing a prefix
// next to each other (a depth-first walk of the tree), keeps equal prompts
// in input order, and tree_tokens equals the number of distinct prefixes,
// counted here independently by brute force.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "engine/policies/prefix_order.hpp"

namespace shardline::engine {
namespace engine_policies_prefix_order_test {

using Prompts = std::vector<std::vector<std::int32_t>>;

/// Distinct non-empty prefixes of the prompts: the nodes of their trie.
std::uint64_t distinct_prefixes(const Prompts& prompts) {
  std::set<std::vector<std::int32_t>> seen;
  for (const auto& p : prompts)
    for (std::size_t k = 1; k <= p.size(); ++k) seen.emplace(p.begin(), p.begin() + static_cast<long>(k));
  return seen.size();
}

TEST(PrefixOrder, SharedPrefixesRunTogetherAndTheTreeCountsEachOnce) {
  // Two system prompts (A: 1 2 3 4, B: 9 9), interleaved in the input.
  const Prompts prompts = {{1, 2, 3, 4, 7}, {9, 9, 5}, {1, 2, 3, 4, 8}, {9, 9, 6}, {1, 2, 3, 4, 7}, {}};
  const PrefixOrder o = prefix_order(prompts);
  EXPECT_EQ(o.order, (std::vector<std::size_t>{5, 0, 4, 2, 1, 3}));  // the empty one first; copies in input order
  EXPECT_EQ(o.prompt_tokens, 21u);
  // Nodes: 1,12,123,1234,12347,12348 (6) and 9,99,995,996 (4).
  EXPECT_EQ(o.tree_tokens, 10u);
  EXPECT_EQ(o.shared_tokens(), 11u);
}

TEST(PrefixOrder, RandomBatchesMatchABruteForceTrie) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    // Few-shot style: a head drawn from a small pool, then a random tail.
    const int pool = 1 + static_cast<int>(rng() % 4);
    Prompts heads(static_cast<std::size_t>(pool));
    for (auto& h : heads)
      for (int t = 0, n = static_cast<int>(rng() % 6); t < n; ++t) h.push_back(static_cast<std::int32_t>(rng() % 3));
    Prompts prompts(1 + rng() % 30);
    for (auto& p : prompts) {
      p = heads[rng() % heads.size()];
      for (int t = 0, n = static_cast<int>(rng() % 5); t < n; ++t) p.push_back(static_cast<std::int32_t>(rng() % 3));
    }
    const PrefixOrder o = prefix_order(prompts);
    ASSERT_EQ(o.order.size(), prompts.size());
    EXPECT_EQ(std::set<std::size_t>(o.order.begin(), o.order.end()).size(), prompts.size()) << "a permutation";
    EXPECT_EQ(o.tree_tokens, distinct_prefixes(prompts)) << "trial " << trial;
    // Sorted: every neighbour shares at least as much with its predecessor
    // as any earlier prompt does (a depth-first walk never comes back).
    for (std::size_t i = 1; i < o.order.size(); ++i)
      EXPECT_FALSE(prompts[o.order[i]] < prompts[o.order[i - 1]]) << "trial " << trial << " position " << i;
  }
}

}  // namespace engine_policies_prefix_order_test
}  // namespace shardline::engine
