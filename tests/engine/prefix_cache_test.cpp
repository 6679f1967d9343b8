// Prefix caching's ComputingPrefixes (engine/prefix_cache.hpp): which block
// names running sequences are computing, as they start, progress and stop.
#include "engine/prefix_cache.hpp"

#include <gtest/gtest.h>

#include <vector>

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
