#include "kvstore/host_kv_store.hpp"

#include <gtest/gtest.h>

namespace shardline::kvstore {
namespace {

TEST(HostKvStore, PutGetReplaceDropWithinCapacity) {
  HostKvStore s(10);
  ASSERT_TRUE(s.put("a", "12345").ok());
  ASSERT_TRUE(s.put("b", "123").ok());
  EXPECT_EQ(*s.get("a"), "12345");
  EXPECT_EQ(s.stats().bytes_used, 8u);
  const Status full = s.put("c", "123");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(s.get("c"), nullptr);          // nothing changed
  ASSERT_TRUE(s.put("a", "1234567").ok());  // replacing frees the old bytes first
  EXPECT_EQ(s.stats().bytes_used, 10u);
  EXPECT_TRUE(s.drop("a"));
  EXPECT_FALSE(s.drop("a"));
  EXPECT_EQ(s.stats().num_entries, 1u);
  EXPECT_EQ(s.stats().bytes_used, 3u);
  EXPECT_FALSE(s.put("", "x").ok());
}

}  // namespace
}  // namespace shardline::kvstore
