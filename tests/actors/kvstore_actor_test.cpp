// The KV-store actor in one actor system: two stores in a ring. A worker's
// putChunks is stored and replicated, and acknowledged only as far as both
// hold it; a replica that was down and restarted from its RocksDB is caught
// up; a fetch finds a request on a peer; drops reach the replica; bad
// messages are refused with a clear error and change nothing.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "actors/actors.hpp"
#include "actors/kv_client.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "tests/kvstore/kv_store_test_util.hpp"

namespace shardline::actors {
namespace actors_kvstore_actor_test {

using kvstore::KvRange;
using kvstore::testing::make_chunk;
using kvstore::testing::small_shape;
using kvstore::testing::TempDir;
using namespace std::chrono_literals;

class KvStoreActorTest : public ::testing::Test {
 protected:
  KvStoreActorTest() : system_(config_) {
    auto key = ClusterKey::generate();
    key_ = std::make_shared<const ClusterKey>(std::move(key).value());
  }

  KvStoreConfig config(const std::string& name, int replication = 2) {
    KvStoreConfig c;
    c.name = name;
    c.node_name = name.substr(0, name.find('/'));
    c.dir = (std::filesystem::path(dir_.path()) / c.node_name).string();
    c.shape = small_shape();
    c.capacity_bytes = 1 << 20;
    c.replication_factor = replication;
    c.key = key_;
    c.heartbeat_ms = 60'000;
    return c;
  }

  /// The orchestrator's ring message to every store of it.
  void set_ring(const std::vector<std::string>& names, const std::vector<caf::actor>& stores) {
    const Signed s = sign(*key_, messages::encode(messages::KvStoreMsg{messages::SetRing{names}}));
    for (const caf::actor& h : stores) caf::anon_send(h, ring_atom::value, s.tag, s.bytes, stores);
    std::this_thread::sleep_for(50ms);  // the ring message is one-way
  }

  Result<messages::KvStoreReply> ask(const caf::actor& store, const messages::KvStoreMsg& m) {
    return ask_kv_store(system_, store, *key_, m, 5s);
  }

  /// putChunks of positions [begin, end) of (job, request), as a worker sends it.
  std::vector<messages::KvAck> put(const caf::actor& store, std::uint64_t job, std::uint64_t request, int begin,
                                   int end) {
    const KvRange r{0, small_shape().num_layers, begin, end};
    messages::PutChunks p;
    p.chunks.push_back({{job, request, r}, make_chunk(small_shape(), job, request, r)});
    auto reply = ask(store, p);
    EXPECT_TRUE(reply.ok()) << (reply ? "" : reply.error().to_string());
    if (!reply) return {};
    auto* a = std::get_if<messages::ChunksAcked>(&*reply);
    EXPECT_NE(a, nullptr);
    return a ? a->acks : std::vector<messages::KvAck>{};
  }

  /// The one ack of a putChunks of one request (-1 when it failed).
  int single_ack(const caf::actor& store, const messages::PutChunks& p) {
    auto reply = ask(store, p);
    EXPECT_TRUE(reply.ok()) << (reply ? "" : reply.error().to_string());
    auto* acks = reply ? std::get_if<messages::ChunksAcked>(&*reply) : nullptr;
    EXPECT_NE(acks, nullptr);
    return acks != nullptr && acks->acks.size() == 1 ? acks->acks[0].tokens : -1;
  }

  messages::KvPrefixData fetch(const caf::actor& store, std::uint64_t job, std::uint64_t request, int max_tokens,
                               bool ask_peers) {
    auto reply = ask(store, messages::FetchPrefix{job, request, max_tokens, ask_peers});
    EXPECT_TRUE(reply.ok()) << (reply ? "" : reply.error().to_string());
    if (!reply) return {};
    auto* d = std::get_if<messages::KvPrefixData>(&*reply);
    EXPECT_NE(d, nullptr);
    return d ? *d : messages::KvPrefixData{};
  }

  void kill(const caf::actor& a) {
    caf::scoped_actor self{system_};
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {});
  }

  TempDir dir_;
  caf::actor_system_config config_;
  caf::actor_system system_;
  std::shared_ptr<const ClusterKey> key_;
};

TEST_F(KvStoreActorTest, AcksOnlyWhatTheReplicaHoldsAndCatchesARestartedReplicaUp) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, config("b/kvstore"));
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});

  auto acks = put(a, 1, 5, 0, 3);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 3);
  // The replica holds the same bytes.
  auto on_b = fetch(b, 1, 5, 100, false);
  EXPECT_EQ(on_b.tokens, 3);
  EXPECT_EQ(on_b.chunk, make_chunk(small_shape(), 1, 5, KvRange{0, small_shape().num_layers, 0, 3}));
  EXPECT_EQ(on_b.source, "b/kvstore");

  // The replica dies: a stores the next positions but does not acknowledge them.
  kill(b);
  acks = put(a, 1, 5, 3, 5);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 3) << "acknowledged positions the replica does not hold";
  EXPECT_EQ(fetch(a, 1, 5, 100, false).tokens, 5);  // a has them

  // It restarts from its RocksDB (without what it missed) and rejoins the
  // ring: the next batch carries the whole prefix, and acks catch up.
  b = spawn_kvstore(system_, config("b/kvstore"));
  EXPECT_EQ(fetch(b, 1, 5, 100, false).tokens, 3);  // survived the kill
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  acks = put(a, 1, 5, 5, 6);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 6);
  on_b = fetch(b, 1, 5, 100, false);
  EXPECT_EQ(on_b.tokens, 6);
  EXPECT_EQ(on_b.chunk, make_chunk(small_shape(), 1, 5, KvRange{0, small_shape().num_layers, 0, 6}));

  // Stats as `actor list` shows them.
  auto stats = ask(a, messages::StatsQuery{});
  ASSERT_TRUE(stats.ok());
  const auto& s = std::get<messages::KvStoreStats>(*stats);
  EXPECT_EQ(s.store_name, "a/kvstore");
  EXPECT_EQ(s.replica, "b/kvstore");
  EXPECT_EQ(s.lag_tokens, 0u);
  EXPECT_EQ(s.requests, 1u);
  EXPECT_GT(s.disk_bytes, 0u);
  EXPECT_EQ(s.replicated_tokens, 6u);
  kill(a);
  kill(b);
}

/// A prompt head of three blocks of four positions whose KV is the one of a
/// request numbered (77, 7) (make_chunk), as a worker's prefix tier puts it
/// and as requests of job 1 link it.
struct LinkedHead {
  static constexpr std::uint64_t kSalt = 0x5a17, kRoot = 0x2007;
  kvstore::KvModelShape shape = small_shape();
  std::vector<std::uint64_t> names{500, 501, 502};
  std::vector<std::int32_t> tokens;

  LinkedHead() {
    for (int t = 0; t < 12; ++t) tokens.push_back(1000 + t);
  }
  /// The source's KV of positions [begin, end).
  [[nodiscard]] std::vector<std::byte> source(int begin, int end) const {
    return make_chunk(shape, 77, 7, KvRange{0, shape.num_layers, begin, end});
  }
  /// The head's blocks named name0.. (with other KV unless `real`).
  [[nodiscard]] messages::PutPrefixBlocks blocks(std::uint64_t name0 = 500, bool real = true) const {
    messages::PutPrefixBlocks m;
    m.salt = kSalt;
    for (int i = 0; i < 3; ++i) {
      messages::PrefixBlockData b;
      b.name = name0 + static_cast<std::uint64_t>(i);
      b.parent = i == 0 ? kRoot : b.name - 1;
      b.tokens.assign(tokens.begin() + 4 * i, tokens.begin() + 4 * i + 4);
      b.chunk = real ? source(4 * i, 4 * i + 4) : make_chunk(shape, 1, 1, KvRange{0, shape.num_layers, 0, 4});
      m.blocks.push_back(std::move(b));
    }
    return m;
  }
  /// (1, request)'s positions [tail_begin, tail_end), and the head's link.
  [[nodiscard]] messages::PutChunks put(std::uint64_t request, int tail_begin, int tail_end, bool with_link) const {
    messages::PutChunks p;
    const KvRange r{0, shape.num_layers, tail_begin, tail_end};
    p.chunks.push_back({{1, request, r}, source(tail_begin, tail_end)});
    if (with_link) p.links.push_back(messages::PrefixLinkData{1, request, kSalt, kRoot, names, tokens});
    return p;
  }
};

/// Prefix links through the ring (issue 42): a worker's prefix blocks are
/// forwarded to the replica, so a request whose head is a link to them is
/// acknowledged as far as both stores hold it; a replica that missed a
/// linked request gets the link and the positions after it (catch-up), not
/// the head's KV.
TEST_F(KvStoreActorTest, PrefixLinksAndTheirBlocksReachTheReplicaAndCatchUpSendsTheLink) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, config("b/kvstore"));
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  const LinkedHead head;
  const auto source = [&](int begin, int end) { return head.source(begin, end); };
  auto kept = ask(a, head.blocks());
  ASSERT_TRUE(kept.ok()) << kept.error().to_string();
  EXPECT_EQ(std::get<messages::PrefixBlocksData>(*kept).kept, head.names);
  EXPECT_EQ(std::get<messages::PrefixBlocksData>(*kept).stored, 3);
  const auto put_linked = [&](std::uint64_t request, int tail_begin, int tail_end, bool with_link) {
    return single_ack(a, head.put(request, tail_begin, tail_end, with_link));
  };
  EXPECT_EQ(put_linked(5, 12, 14, true), 14) << "the replica links the blocks a forwarded";
  auto on_b = fetch(b, 1, 5, 100, false);
  EXPECT_EQ(on_b.tokens, 14);
  EXPECT_EQ(on_b.chunk, source(0, 14));

  // b comes back as a new incarnation (its disk wiped first when asked)
  // and rejoins the ring.
  const auto restart_b = [&](bool empty_disk) {
    if (empty_disk) std::filesystem::remove_all(std::filesystem::path(dir_.path()) / "b");
    b = spawn_kvstore(system_, config("b/kvstore"));
    set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  };

  // The replica is down while request 6 links its head: a holds it, no ack.
  kill(b);
  EXPECT_EQ(put_linked(6, 12, 13, true), 0);
  restart_b(false);
  // Back (with the blocks in its RocksDB): the next batch catches it up
  // with the link and positions [12, 13), then the batch's own [13, 14).
  EXPECT_EQ(put_linked(6, 13, 14, false), 14);
  on_b = fetch(b, 1, 6, 100, false);
  EXPECT_EQ(on_b.tokens, 14);
  EXPECT_EQ(on_b.chunk, source(0, 14));
  auto stats = ask(b, messages::StatsQuery{});
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(std::get<messages::KvStoreStats>(*stats).prefix_links, 2u);
  EXPECT_EQ(std::get<messages::KvStoreStats>(*stats).linked_tokens, 12u) << "request 6's link, since b reopened";

  // The replica's node is replaced by one with an empty disk: the catch-up
  // sends the linked blocks it lacks, then the link and what follows.
  kill(b);
  restart_b(true);
  EXPECT_EQ(put_linked(5, 14, 15, false), 15);
  on_b = fetch(b, 1, 5, 100, false);
  EXPECT_EQ(on_b.tokens, 15);
  EXPECT_EQ(on_b.chunk, source(0, 15));
  stats = ask(b, messages::StatsQuery{});
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(std::get<messages::KvStoreStats>(*stats).prefix_blocks, 3u);
  EXPECT_EQ(std::get<messages::KvStoreStats>(*stats).linked_tokens, 12u);
  kill(a);
  kill(b);
}

/// A replica that dropped a linked block it was sent (its budget made room
/// for others once nothing linked it) names it in its answer, and the
/// primary sends it again: the next batch is acknowledged in full.
TEST_F(KvStoreActorTest, AReplicaThatLostALinkedBlockGetsItAgain) {
  const kvstore::KvModelShape shape = small_shape();
  const std::uint64_t block_bytes =
      kvstore::chunk_bytes(shape, KvRange{0, shape.num_layers, 0, 4}) + 16 + 4 * 4;
  KvStoreConfig bc = config("b/kvstore");
  bc.prefix_budget_bytes = 3 * block_bytes;  // b keeps three blocks
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, bc);
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  const LinkedHead head;
  const auto source = [&](int begin, int end) { return head.source(begin, end); };
  ASSERT_TRUE(ask(a, head.blocks()).ok());
  const auto put_linked = [&](std::uint64_t request, int tail_begin, int tail_end, bool with_link) {
    return single_ack(a, head.put(request, tail_begin, tail_end, with_link));
  };
  EXPECT_EQ(put_linked(5, 12, 14, true), 14);
  // Request 5 is dropped (on both stores): the blocks are unpinned, and
  // three other blocks put straight to b take its budget.
  ASSERT_TRUE(ask(a, messages::DropRequests{1, {5}, ""}).ok());
  // The forwarded drop is one-way: wait until b has dropped the request.
  for (const auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    auto st = ask(b, messages::StatsQuery{});
    if (st.ok() && std::get<messages::KvStoreStats>(*st).prefix_links == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  messages::PutPrefixBlocks others = head.blocks(900, false);
  others.from_peer = "a/kvstore";  // as a peer's forward: b keeps them, forwards nothing
  ASSERT_TRUE(ask(b, others).ok());
  auto bs = ask(b, messages::StatsQuery{});
  ASSERT_TRUE(bs.ok());
  ASSERT_EQ(std::get<messages::KvStoreStats>(*bs).prefix_blocks, 3u);
  // Request 6 links the head: a holds it, b waits for block 500 and says
  // so; a sends the blocks again, and the next batch is acknowledged.
  EXPECT_EQ(put_linked(6, 12, 14, true), 0) << "b does not hold the head yet";
  EXPECT_EQ(put_linked(6, 14, 15, false), 15);
  const auto on_b = fetch(b, 1, 6, 100, false);
  EXPECT_EQ(on_b.tokens, 15);
  EXPECT_EQ(on_b.chunk, source(0, 15));
  kill(a);
  kill(b);
}

TEST_F(KvStoreActorTest, ASingleStoreAcknowledgesItsOwnRocksDb) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  set_ring({"a/kvstore"}, {a});
  auto acks = put(a, 2, 1, 0, 4);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 4);
  kill(a);
}

TEST_F(KvStoreActorTest, FetchFindsARequestOnAPeerAndDropsReachTheReplica) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, config("b/kvstore"));
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  // b's worker streamed request 9: b holds it and replicates it to a.
  ASSERT_EQ(put(b, 3, 9, 0, 4).at(0).tokens, 4);
  // A request only b holds (stored as a replica write: not forwarded).
  messages::PutChunks only_b;
  const KvRange r{0, small_shape().num_layers, 0, 2};
  only_b.chunks.push_back({{3, 10, r}, make_chunk(small_shape(), 3, 10, r)});
  only_b.from_peer = "x/kvstore";
  ASSERT_TRUE(ask(b, only_b).ok());
  EXPECT_EQ(fetch(a, 3, 10, 2, false).tokens, 0);
  auto found = fetch(a, 3, 10, 2, true);
  EXPECT_EQ(found.tokens, 2);
  EXPECT_EQ(found.source, "b/kvstore");
  EXPECT_EQ(found.chunk, make_chunk(small_shape(), 3, 10, r));
  // At most max_tokens positions.
  EXPECT_EQ(fetch(a, 3, 9, 3, true).tokens, 3);

  // A worker of b drops request 9: gone on both.
  auto dropped = ask(b, messages::DropRequests{3, {9}, ""});
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(std::holds_alternative<messages::Ack>(*dropped));
  std::this_thread::sleep_for(100ms);  // the forward to a is one-way
  EXPECT_EQ(fetch(b, 3, 9, 4, false).tokens, 0);
  EXPECT_EQ(fetch(a, 3, 9, 4, false).tokens, 0);
  // The whole job.
  ASSERT_TRUE(ask(b, messages::DropRequests{3, {}, ""}).ok());
  EXPECT_EQ(fetch(b, 3, 10, 2, false).tokens, 0);
  kill(a);
  kill(b);
}

TEST_F(KvStoreActorTest, NothingIsAcknowledgedBeforeTheRingAndFetchesWaitForIt) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, config("b/kvstore"));
  // b knows its ring and holds request 2 (as a replica write).
  set_ring({"a/kvstore", "b/kvstore"}, {caf::actor(), b});
  messages::PutChunks on_b;
  const KvRange r{0, small_shape().num_layers, 0, 3};
  on_b.chunks.push_back({{5, 2, r}, make_chunk(small_shape(), 5, 2, r)});
  on_b.from_peer = "x/kvstore";
  ASSERT_TRUE(ask(b, on_b).ok());
  // a does not know its replica yet: it stores, acknowledges nothing.
  auto acks = put(a, 5, 1, 0, 2);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 0);
  EXPECT_EQ(fetch(a, 5, 1, 10, false).tokens, 2);
  // A fetch that may ask the ring waits for it, then finds b's copy.
  auto waiting = std::async(std::launch::async, [&] { return fetch(a, 5, 2, 3, true); });
  EXPECT_EQ(waiting.wait_for(300ms), std::future_status::timeout) << "answered before the ring came";
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  const auto found = waiting.get();
  EXPECT_EQ(found.tokens, 3);
  EXPECT_EQ(found.source, "b/kvstore");
  // With the ring, what a holds is acknowledged once b holds it too.
  acks = put(a, 5, 1, 2, 4);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].tokens, 4);
  EXPECT_EQ(fetch(b, 5, 1, 10, false).tokens, 4);  // caught up from 0
  kill(a);
  kill(b);
}

TEST_F(KvStoreActorTest, ADownReplicaStaysInTheRingAndNothingIsAcknowledgedPastIt) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore"));
  caf::actor b = spawn_kvstore(system_, config("b/kvstore"));
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  ASSERT_EQ(put(a, 6, 1, 0, 2).at(0).tokens, 2);
  kill(b);
  // The orchestrator's ring after b died: b is in it, without a handle.
  set_ring({"a/kvstore", "b/kvstore"}, {a, caf::actor()});
  EXPECT_EQ(put(a, 6, 1, 2, 5).at(0).tokens, 2);
  b = spawn_kvstore(system_, config("b/kvstore"));
  set_ring({"a/kvstore", "b/kvstore"}, {a, b});
  EXPECT_EQ(put(a, 6, 1, 5, 6).at(0).tokens, 6);
  kill(a);
  kill(b);
}

// Issue 46, item 11: a store whose MANIFEST is garbled is moved aside (the
// path logged) and the actor serves from an empty store, instead of dying
// and restarting in a loop.
TEST_F(KvStoreActorTest, ACorruptStoreIsQuarantinedAndStartsEmpty) {
  const KvStoreConfig c = config("a/kvstore");
  caf::actor a = spawn_kvstore(system_, c);
  set_ring({"a/kvstore"}, {a});
  ASSERT_EQ(put(a, 3, 1, 0, 4).at(0).tokens, 4);
  kill(a);
  int garbled = 0;
  for (const auto& e : std::filesystem::directory_iterator(c.dir))
    if (e.path().filename().string().starts_with("MANIFEST-")) {
      std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << std::string(256, '\xA5');
      ++garbled;
    }
  ASSERT_EQ(garbled, 1);

  a = spawn_kvstore(system_, c);
  set_ring({"a/kvstore"}, {a});
  EXPECT_EQ(fetch(a, 3, 1, 100, false).tokens, 0);  // empty: the lines recompute
  EXPECT_EQ(put(a, 3, 1, 0, 2).at(0).tokens, 2);    // and it stores again
  std::vector<std::string> aside;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path()))
    if (e.path().filename().string().starts_with("a.corrupt-")) aside.push_back(e.path().string());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(aside[0]) / "CURRENT"));  // kept, not deleted
  kill(a);
}

TEST_F(KvStoreActorTest, BadMessagesAreRefusedAndChangeNothing) {
  caf::actor a = spawn_kvstore(system_, config("a/kvstore", 1));
  set_ring({"a/kvstore"}, {a});
  ASSERT_EQ(put(a, 4, 1, 0, 2).at(0).tokens, 2);
  // A chunk of the wrong size: the whole batch is refused.
  messages::PutChunks bad;
  const KvRange r{0, small_shape().num_layers, 2, 4};
  bad.chunks.push_back({{4, 1, r}, make_chunk(small_shape(), 4, 1, r)});
  bad.chunks.push_back({{4, 2, r}, std::vector<std::byte>(3)});
  auto reply = ask(a, bad);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.error().code, ErrorCode::invalid_argument) << reply.error().to_string();
  EXPECT_EQ(fetch(a, 4, 1, 10, false).tokens, 2);  // nothing of the batch was stored
  // Layers outside the model.
  messages::PutChunks layers;
  const KvRange past{0, small_shape().num_layers + 1, 2, 3};
  layers.chunks.push_back({{4, 1, past}, make_chunk(small_shape(), 4, 1, KvRange{0, small_shape().num_layers, 2, 3})});
  EXPECT_FALSE(ask(a, layers).ok());
  // The retired blob messages.
  auto retired = ask(a, messages::PutBlocks{"k", "v"});
  ASSERT_FALSE(retired.ok());
  EXPECT_EQ(retired.error().code, ErrorCode::unsupported);
  EXPECT_NE(retired.error().message.find("putBlocks"), std::string::npos);
  // A message signed with another key.
  auto other = ClusterKey::generate();
  auto wrong = ask_kv_store(system_, a, *other, messages::FetchPrefix{4, 1, 2, false}, 5s);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("unauthenticated"), std::string::npos) << wrong.error().to_string();
  EXPECT_EQ(fetch(a, 4, 1, 10, false).tokens, 2);
  kill(a);
}

}  // namespace
}  // namespace shardline::actors
