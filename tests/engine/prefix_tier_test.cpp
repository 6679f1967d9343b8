// HostPrefixTier (engine/prefix_tier.hpp): blocks kept under their name and
// fetched only with their parent and tokens (a name collision hands out
// nothing), the least recently used dropped for the byte budget, a block
// kept twice stored once.
#include "engine/prefix_tier.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace shardline::engine {
namespace engine_prefix_tier_test {

std::vector<std::byte> bytes(std::size_t n, int fill) { return std::vector<std::byte>(n, std::byte(fill)); }

TEST(HostPrefixTier, KeepsBlocksUnderTheirNameAndChecksParentAndTokensOnAFetch) {
  HostPrefixTier tier(1000);
  const std::vector<std::int32_t> t1 = {1, 2, 3, 4};
  const std::vector<std::int32_t> t2 = {5, 6, 7, 8};
  tier.put(11, 0, t1, bytes(100, 1));
  tier.put(12, 11, t2, bytes(100, 2));
  auto got = tier.get(12, 11, t2);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, bytes(100, 2));
  EXPECT_FALSE(tier.get(12, 99, t2).has_value()) << "same name, another parent: a collision";
  EXPECT_FALSE(tier.get(12, 11, t1).has_value()) << "same name, other tokens: a collision";
  EXPECT_FALSE(tier.get(13, 11, t2).has_value());
  EXPECT_TRUE(tier.touch(11));
  EXPECT_FALSE(tier.touch(13)) << "not kept: a spill copies it";
  tier.put(11, 0, t1, bytes(100, 9));  // kept already: not stored again
  EXPECT_EQ(*tier.get(11, 0, t1), bytes(100, 1));
  const PrefixTierStats s = tier.stats();
  EXPECT_EQ(s.puts, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.bytes, 200u);
  EXPECT_EQ(s.blocks, 2u);
}

TEST(HostPrefixTier, DropsTheLeastRecentlyUsedBlocksForItsBudget) {
  HostPrefixTier tier(300);
  const std::vector<std::int32_t> t = {1};
  tier.put(1, 0, t, bytes(100, 1));
  tier.put(2, 0, t, bytes(100, 2));
  tier.put(3, 0, t, bytes(100, 3));
  ASSERT_TRUE(tier.get(1, 0, t).has_value());  // 1 used: 2 is now the least recently used
  tier.put(4, 0, t, bytes(100, 4));
  EXPECT_FALSE(tier.get(2, 0, t).has_value()) << "dropped for the budget";
  EXPECT_TRUE(tier.get(1, 0, t).has_value());
  EXPECT_TRUE(tier.get(3, 0, t).has_value());
  EXPECT_TRUE(tier.get(4, 0, t).has_value());
  tier.put(5, 0, t, bytes(400, 5));  // larger than the whole budget: not kept, nothing dropped
  EXPECT_FALSE(tier.get(5, 0, t).has_value());
  const PrefixTierStats s = tier.stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.bytes, 300u);
  EXPECT_EQ(s.blocks, 3u);
}

}  // namespace engine_prefix_tier_test
}  // namespace shardline::engine
