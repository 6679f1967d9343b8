#include "kvstore/replication.hpp"

#include <gtest/gtest.h>

namespace shardline::kvstore {
namespace kvstore_replication_test {

using Names = std::vector<std::string>;

TEST(ReplicationRing, SuccessorIsTheNextNodeInSortedOrderAndWraps) {
  const Names nodes{"node-c", "node-a", "node-b", "node-a"};
  EXPECT_EQ(ring_order(nodes), (Names{"node-a", "node-b", "node-c"}));
  EXPECT_EQ(**ring_successor(nodes, "node-a"), "node-b");
  EXPECT_EQ(**ring_successor(nodes, "node-b"), "node-c");
  EXPECT_EQ(**ring_successor(nodes, "node-c"), "node-a");  // (x + 1) mod N
  auto single = ring_successor(Names{"solo"}, "solo");
  ASSERT_TRUE(single.ok());
  EXPECT_FALSE(single->has_value());
  auto missing = ring_successor(nodes, "node-d");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::invalid_argument);
}

TEST(ReplicationRing, ReplicaPeersAreTheNextFMinusOneNodes) {
  const Names nodes{"d", "b", "a", "c"};
  EXPECT_EQ(*replica_peers(nodes, "c", 1), Names{});
  EXPECT_EQ(*replica_peers(nodes, "c", 2), (Names{"d"}));
  EXPECT_EQ(*replica_peers(nodes, "c", 3), (Names{"d", "a"}));
  EXPECT_EQ(*replica_peers(nodes, "c", 9), (Names{"d", "a", "b"}));  // never self
  EXPECT_EQ(*replica_sources(nodes, "c", 3), (Names{"b", "a"}));
  EXPECT_EQ(*replica_sources(nodes, "a", 2), (Names{"d"}));
  EXPECT_EQ(*replica_peers(Names{"solo"}, "solo", 2), Names{});
  EXPECT_EQ(*replica_peers(Names{"x", "y"}, "y", 3), (Names{"x"}));
  EXPECT_FALSE(replica_peers(nodes, "c", 0).ok());
  EXPECT_FALSE(replica_peers(nodes, "e", 2).ok());
  // Every node's replica is held by exactly f - 1 others (a ring, no hot spot).
  for (const int f : {2, 3}) {
    std::map<std::string, int> holds;
    for (const auto& n : nodes) {
      const auto peers = replica_peers(nodes, n, f);
      ASSERT_TRUE(peers.ok());
      for (const auto& p : *peers) ++holds[p];
    }
    for (const auto& n : nodes) EXPECT_EQ(holds[n], f - 1) << n;
  }
}

TEST(AckTracker, AckIsTheMinimumOfTheLocalStoreAndEveryReplica) {
  AckTracker t(3, {"b", "c", "d"});  // only the first f - 1 = 2 count
  EXPECT_EQ(t.replicas(), (Names{"b", "c"}));
  t.on_local(1, 7, 10);
  EXPECT_EQ(t.acked_tokens(1, 7), 0);
  ASSERT_TRUE(t.on_replica("b", 1, 7, 8).ok());
  EXPECT_EQ(t.acked_tokens(1, 7), 0) << "replica c has nothing yet";
  ASSERT_TRUE(t.on_replica("c", 1, 7, 12).ok());
  EXPECT_EQ(t.acked_tokens(1, 7), 8);
  ASSERT_TRUE(t.on_replica("b", 1, 7, 11).ok());
  EXPECT_EQ(t.acked_tokens(1, 7), 10) << "the local store holds only 10";
  t.on_local(1, 7, 13);
  EXPECT_EQ(t.acked_tokens(1, 7), 11);
  EXPECT_EQ(t.local_tokens(1, 7), 13);
  EXPECT_EQ(t.replica_tokens("c", 1, 7), 12);
  // A stale peer's late ack does not count.
  auto stale = t.on_replica("d", 1, 7, 100);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(t.acked_tokens(1, 7), 11);
  // Reports out of order never move anything back.
  ASSERT_TRUE(t.on_replica("b", 1, 7, 9).ok());
  t.on_local(1, 7, 5);
  EXPECT_EQ(t.acked_tokens(1, 7), 11);
  EXPECT_EQ(t.acked_tokens(1, 8), 0);
}

TEST(AckTracker, FactorOneAndASingleNodeNeedOnlyTheLocalStore) {
  AckTracker one(1, {"b"});
  EXPECT_TRUE(one.replicas().empty());
  one.on_local(1, 1, 4);
  EXPECT_EQ(one.acked_tokens(1, 1), 4);
  AckTracker solo(2, {});  // replica_peers of a single-node cluster
  solo.on_local(1, 1, 6);
  EXPECT_EQ(solo.acked_tokens(1, 1), 6);
  EXPECT_TRUE(solo.lag().empty());
}

TEST(AckTracker, ReplacedReplicaResetsItsEntriesAndReportsLagUntilCaughtUp) {
  AckTracker t(2, {"b"});
  for (std::uint64_t r = 0; r < 3; ++r) {
    t.on_local(1, r, 10);
    ASSERT_TRUE(t.on_replica("b", 1, r, 10).ok());
  }
  ASSERT_EQ(t.lag().size(), 1u);
  EXPECT_EQ(t.lag()[0].tokens_behind, 0u);
  EXPECT_FALSE(t.lag()[0].catching_up);
  t.on_local(1, 0, 14);  // ordinary streaming lag
  EXPECT_EQ(t.lag()[0].tokens_behind, 4u);
  EXPECT_FALSE(t.lag()[0].catching_up);

  t.replica_replaced("b");
  EXPECT_EQ(t.replica_tokens("b", 1, 1), 0);
  EXPECT_EQ(t.acked_tokens(1, 1), 10) << "acks never go back";
  auto lag = t.lag()[0];
  EXPECT_EQ(lag.replica, "b");
  EXPECT_EQ(lag.tokens_behind, 34u);
  EXPECT_EQ(lag.requests_behind, 3u);
  EXPECT_EQ(lag.max_tokens_behind, 14);
  EXPECT_TRUE(lag.catching_up);
  // Catch-up: the replica re-receives the chunks and acks them.
  t.on_local(1, 1, 12);
  ASSERT_TRUE(t.on_replica("b", 1, 0, 14).ok());
  ASSERT_TRUE(t.on_replica("b", 1, 1, 11).ok());
  EXPECT_EQ(t.acked_tokens(1, 1), 11);
  EXPECT_TRUE(t.lag()[0].catching_up);
  t.forget(1, 2);  // finished meanwhile: no catch-up needed
  EXPECT_TRUE(t.lag()[0].catching_up);
  ASSERT_TRUE(t.on_replica("b", 1, 1, 12).ok());
  EXPECT_FALSE(t.lag()[0].catching_up);
  EXPECT_EQ(t.lag()[0].tokens_behind, 0u);
  EXPECT_EQ(t.tracked(), 2u);
  t.replica_replaced("zzz");  // unknown: ignored
  EXPECT_EQ(t.replica_tokens("b", 1, 1), 12);
}

TEST(AckTracker, MembershipChangeKeepsReplicasByName) {
  AckTracker t(3, {"b", "c"});
  t.on_local(1, 1, 9);
  ASSERT_TRUE(t.on_replica("b", 1, 1, 9).ok());
  ASSERT_TRUE(t.on_replica("c", 1, 1, 7).ok());
  EXPECT_EQ(t.acked_tokens(1, 1), 7);
  t.set_replicas({"c", "e"});  // b left the ring; e is new
  EXPECT_EQ(t.replica_tokens("c", 1, 1), 7);
  EXPECT_EQ(t.replica_tokens("e", 1, 1), 0);
  EXPECT_EQ(t.acked_tokens(1, 1), 7);
  const auto lag = t.lag();
  ASSERT_EQ(lag.size(), 2u);
  EXPECT_FALSE(lag[0].catching_up);
  EXPECT_TRUE(lag[1].catching_up);
  EXPECT_FALSE(t.on_replica("b", 1, 1, 9).ok());
  ASSERT_TRUE(t.on_replica("e", 1, 1, 9).ok());
  ASSERT_TRUE(t.on_replica("c", 1, 1, 9).ok());
  EXPECT_EQ(t.acked_tokens(1, 1), 9);
  EXPECT_FALSE(t.lag()[1].catching_up);
}

TEST(AckTracker, ForgetDropsFinishedRequestsAndJobs) {
  AckTracker t(2, {"b"});
  for (const std::uint64_t job : {1ull, 2ull, ~0ull})
    for (std::uint64_t r = 0; r < 3; ++r) {
      t.on_local(job, r, 5);
      ASSERT_TRUE(t.on_replica("b", job, r, 5).ok());
    }
  t.forget(1, 1);
  EXPECT_EQ(t.acked_tokens(1, 1), 0);
  EXPECT_EQ(t.acked_tokens(1, 2), 5);
  t.forget_job(2);
  EXPECT_EQ(t.acked_tokens(2, 0), 0);
  EXPECT_EQ(t.acked_tokens(~0ull, 0), 5);
  t.forget_job(~0ull);
  EXPECT_EQ(t.acked_tokens(~0ull, 2), 0);
  EXPECT_EQ(t.tracked(), 2u);
}

}  // namespace
}  // namespace shardline::kvstore
