// KvTargets (kvstore/kv_targets.hpp): MemoryKvTarget's map, budget and
// erasure; CommKvTarget against serve_kv_request over the in-process
// communicator, with the server on another thread.
#include "kvstore/kv_targets.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "tests/kvstore/kv_test_util.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_targets_test {

using namespace testing;  // NOLINT
using ::testing::HasSubstr;

std::vector<std::byte> bytes_of(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> b(n);
  fill_random(b, seed);
  return b;
}

KvChunkKey key(std::uint64_t job, std::uint64_t request, int t0, int t1) { return {job, request, {0, 2, t0, t1}}; }

// ---- MemoryKvTarget ---------------------------------------------------------------

TEST(MemoryKvTarget, FlushFetchReplaceAndStats) {
  MemoryKvTarget m;
  const auto a = bytes_of(100, 1), b = bytes_of(40, 2);
  ASSERT_TRUE(m.flush(key(1, 1, 0, 4), a).ok());
  ASSERT_TRUE(m.flush(key(1, 1, 4, 5), b).ok());
  EXPECT_EQ(m.stats().bytes, 140u);
  EXPECT_EQ(m.stats().chunks, 2u);
  EXPECT_TRUE(*m.fetch(key(1, 1, 0, 4)) == a);
  ASSERT_TRUE(m.flush(key(1, 1, 0, 4), b).ok());  // replaces
  EXPECT_TRUE(*m.fetch(key(1, 1, 0, 4)) == b);
  EXPECT_EQ(m.stats().bytes, 80u);
  EXPECT_EQ(m.stats().chunks, 2u);
  auto missing = m.fetch(key(1, 2, 0, 4));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_THAT(missing.error().message, HasSubstr("request 2"));
  EXPECT_TRUE(m.contains(key(1, 1, 4, 5)));
  EXPECT_TRUE(m.erase(key(1, 1, 4, 5)));
  EXPECT_FALSE(m.erase(key(1, 1, 4, 5)));
  EXPECT_EQ(m.stats().bytes, 40u);
}

TEST(MemoryKvTarget, BudgetGivesOutOfMemoryAndChangesNothing) {
  MemoryKvTarget m(100);
  ASSERT_TRUE(m.flush(key(1, 1, 0, 1), bytes_of(60, 1)).ok());
  Status st = m.flush(key(1, 1, 1, 2), bytes_of(41, 2));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(m.stats().bytes, 60u);
  EXPECT_EQ(m.stats().chunks, 1u);
  ASSERT_TRUE(m.flush(key(1, 1, 1, 2), bytes_of(40, 2)).ok());  // exactly full
  ASSERT_TRUE(m.flush(key(1, 1, 0, 1), bytes_of(50, 3)).ok());  // a replacement counts the old size once
  EXPECT_EQ(m.stats().bytes, 90u);
  EXPECT_EQ(m.stats().budget_bytes, 100u);

  // A batch is all or nothing.
  const auto buf = bytes_of(30, 4);
  const KvChunkRef refs[] = {{key(2, 1, 0, 1), 0, 5}, {key(2, 1, 1, 2), 5, 25}};
  st = m.flush_batch(refs, buf);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::out_of_memory);
  EXPECT_FALSE(m.contains(key(2, 1, 0, 1)));
  EXPECT_EQ(m.stats().bytes, 90u);
  const KvChunkRef outside[] = {{key(2, 1, 0, 1), 0, 5}, {key(2, 1, 1, 2), 26, 5}};
  st = m.flush_batch(outside, buf);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message, HasSubstr("chunks[1]"));
  const KvChunkRef fits[] = {{key(2, 1, 0, 1), 0, 5}, {key(1, 1, 0, 1), 5, 25}};  // 90 - 50 + 5 + 25
  ASSERT_TRUE(m.flush_batch(fits, buf).ok());
  EXPECT_EQ(m.stats().bytes, 70u);
  EXPECT_TRUE(*m.fetch(key(1, 1, 0, 1)) == std::vector<std::byte>(buf.begin() + 5, buf.end()));
}

/// A target with only flush / fetch: flush_batch is KvTarget's default.
struct FlushOnlyTarget final : KvTarget {
  MemoryKvTarget inner;
  Status flush(const KvChunkKey& k, std::span<const std::byte> chunk) override { return inner.flush(k, chunk); }
  Result<std::vector<std::byte>> fetch(const KvChunkKey& k) override { return inner.fetch(k); }
};

TEST(MemoryKvTarget, FlushBatchRefusesAChunkOutsideTheBufferAndStoresNothing) {
  // The same check in MemoryKvTarget and KvTarget's default flush_batch: a
  // chunk past the end (or an offset past it) names the chunk, and no chunk
  // of the batch is stored, not even the good one before it.
  const auto buf = bytes_of(100, 9);
  const KvChunkRef bad_end[] = {{key(1, 1, 0, 1), 0, 10}, {key(1, 2, 0, 1), 95, 6}};
  const KvChunkRef bad_offset[] = {{key(1, 1, 0, 1), 0, 10}, {key(1, 2, 0, 1), 101, 0}};
  MemoryKvTarget memory;
  FlushOnlyTarget flush_only;
  for (KvTarget* t : {static_cast<KvTarget*>(&memory), static_cast<KvTarget*>(&flush_only)}) {
    for (auto refs : {std::span<const KvChunkRef>(bad_end), std::span<const KvChunkRef>(bad_offset)}) {
      const Status st = t->flush_batch(refs, buf);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
      EXPECT_THAT(st.error().message, HasSubstr("chunks[1]"));
      EXPECT_THAT(st.error().message, HasSubstr("outside the buffer of 100 bytes"));
    }
  }
  EXPECT_EQ(memory.stats().chunks, 0u);
  EXPECT_EQ(flush_only.inner.stats().chunks, 0u);
}

TEST(MemoryKvTarget, EraseRequestRemovesOnlyThatRequest) {
  MemoryKvTarget m;
  for (std::uint64_t job : {1, 2})
    for (std::uint64_t req : {6, 7, 8})
      for (int t = 0; t < 3; ++t) ASSERT_TRUE(m.flush({job, req, {t % 2, 2, t, t + 1}}, bytes_of(10, t)).ok());
  EXPECT_EQ(m.stats().chunks, 18u);
  EXPECT_EQ(m.erase_request(1, 7), 3u);
  EXPECT_EQ(m.erase_request(1, 7), 0u);
  EXPECT_EQ(m.stats().chunks, 15u);
  EXPECT_EQ(m.stats().bytes, 150u);
  EXPECT_TRUE(m.contains({1, 6, {0, 2, 0, 1}}));
  EXPECT_TRUE(m.contains({1, 8, {0, 2, 2, 3}}));
  EXPECT_TRUE(m.contains({2, 7, {1, 2, 1, 2}}));
  EXPECT_FALSE(m.contains({1, 7, {1, 2, 1, 2}}));
}

// ---- CommKvTarget over the in-process communicator ------------------------------------

/// Rank 0 is the client, rank 1 the server, answering `requests` requests on its own thread.
struct Pair {
  std::shared_ptr<comm::InProcGroup> group;
  std::unique_ptr<comm::Communicator> client, server;
  MemoryKvTarget store;
  std::vector<Status> served;
  std::thread thread;

  explicit Pair(std::uint64_t budget = 0) : store(budget) {
    group = comm::InProcGroup::create(2).value();
    client = group->communicator(0).value();
    server = group->communicator(1).value();
    client->set_timeout(std::chrono::milliseconds(5000));
    server->set_timeout(std::chrono::milliseconds(5000));
  }
  void serve(int requests) {
    thread = std::thread([this, requests] {
      for (int i = 0; i < requests; ++i) served.push_back(serve_kv_request(*server, 0, store));
    });
  }
  void join() {
    if (thread.joinable()) thread.join();
  }
  ~Pair() { join(); }
};

TEST(CommKvTarget, FlushFetchAndErrorsAcrossRanks) {
  Pair p(1000);
  p.serve(6);
  CommKvTarget target(*p.client, 1);
  const auto a = bytes_of(300, 1);
  ASSERT_TRUE(target.flush(key(4, 2, 0, 3), a).ok());           // 1
  auto got = target.fetch(key(4, 2, 0, 3));                      // 2
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_TRUE(*got == a);
  auto missing = target.fetch(key(4, 3, 0, 3));                  // 3
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_THAT(missing.error().message, HasSubstr("request 3"));
  Status oom = target.flush(key(4, 2, 3, 4), bytes_of(701, 2));  // 4
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.error().code, ErrorCode::out_of_memory);
  ASSERT_TRUE(target.flush(key(4, 2, 5, 6), {}).ok());           // 5: an empty chunk
  got = target.fetch(key(4, 2, 5, 6));                           // 6
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  p.join();
  for (const Status& st : p.served) EXPECT_TRUE(st.ok()) << st.error().to_string();
  EXPECT_EQ(p.store.stats().chunks, 2u);
  EXPECT_EQ(p.store.stats().bytes, 300u);
}

TEST(CommKvTarget, FlushBatchIsOneRequest) {
  Pair p;
  p.serve(2);
  CommKvTarget target(*p.client, 1);
  const auto buf = bytes_of(100, 3);
  const KvChunkRef packed[] = {{key(1, 1, 0, 1), 0, 10}, {key(1, 2, 0, 1), 10, 60}, {key(1, 3, 0, 1), 70, 30}};
  ASSERT_TRUE(target.flush_batch(packed, buf).ok());
  const KvChunkRef scattered[] = {{key(2, 1, 0, 1), 50, 20}, {key(2, 2, 0, 1), 0, 5}};  // not back to back
  ASSERT_TRUE(target.flush_batch(scattered, buf).ok());
  p.join();
  ASSERT_EQ(p.served.size(), 2u);  // two requests served, for five chunks
  for (const Status& st : p.served) EXPECT_TRUE(st.ok()) << st.error().to_string();
  EXPECT_EQ(p.store.stats().chunks, 5u);
  EXPECT_TRUE(*p.store.fetch(key(1, 2, 0, 1)) == std::vector<std::byte>(buf.begin() + 10, buf.begin() + 70));
  EXPECT_TRUE(*p.store.fetch(key(2, 1, 0, 1)) == std::vector<std::byte>(buf.begin() + 50, buf.begin() + 70));
  EXPECT_TRUE(*p.store.fetch(key(2, 2, 0, 1)) == std::vector<std::byte>(buf.begin(), buf.begin() + 5));
  const KvChunkRef outside[] = {{key(3, 1, 0, 1), 95, 6}};
  EXPECT_EQ(target.flush_batch(outside, buf).error().code, ErrorCode::invalid_argument);  // nothing sent
}

TEST(CommKvTarget, StreamOutToARemoteStoreAndBackIntoAnotherLayout) {
  const KvModelShape s{4, 2, 8, DType::bf16};
  Group src = make_group(s, 4, 2, 1, 1, 10, 4);
  Group dst = make_group(s, 4, 1, 1, 2, 6, 8);
  fill_random(src, 61);
  fill_random(dst, 62);
  const auto stable = random_table(5, 10, 63), dtable = random_table(3, 6, 64);
  Pair p;
  p.serve(3);
  CommKvTarget target(*p.client, 1);
  const KvStreamItem items[] = {{stable, {0, 4, 0, 19}, {9, 1, {0, 4, 0, 19}}},
                                {stable, {0, 4, 19, 20}, {9, 1, {0, 4, 19, 20}}}};
  ASSERT_TRUE(stream_out_batch(s, src.views, items, target).ok());
  ASSERT_TRUE(stream_in(s, dst.views, dtable, items[0].range, target, items[0].key).ok());
  ASSERT_TRUE(stream_in(s, dst.views, dtable, items[1].range, target, items[1].key).ok());
  p.join();
  int bad = 0;
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      const auto from = holders(src, l, h)[0];
      const auto to = holders(dst, l, h)[0];
      for (int kv = 0; kv < 2; ++kv)
        for (int t = 0; t < 20; ++t)
          for (int i = 0; i < 8; ++i)
            bad += cache_elem(dst, to.first, dtable, l, kv, to.second, t, i) !=
                   cache_elem(src, from.first, stable, l, kv, from.second, t, i);
    }
  EXPECT_EQ(bad, 0);
}

TEST(CommKvTarget, DeadOrSilentPeerIsAnIoErrorNotAHang) {
  Pair p;
  p.client->set_timeout(std::chrono::milliseconds(100));
  CommKvTarget target(*p.client, 1);
  auto r = target.fetch(key(1, 1, 0, 1));  // nobody serves
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::io);
  p.server->set_timeout(std::chrono::milliseconds(100));
  Status idle = serve_kv_request(*p.server, 0, p.store);  // stale fetch request is served...
  EXPECT_TRUE(idle.ok()) << idle.error().to_string();
  idle = serve_kv_request(*p.server, 0, p.store);  // ... then nothing arrives
  ASSERT_FALSE(idle.ok());
  EXPECT_EQ(idle.error().code, ErrorCode::io);
  ASSERT_TRUE(p.group->mark_dead(1).ok());
  Status st = target.flush(key(1, 1, 0, 1), bytes_of(8, 1));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::io);
}

TEST(CommKvTarget, MalformedRequestIsCorruptOnBothSides) {
  Pair p;
  std::array<std::byte, kKvRequestHeaderBytes> junk{};
  std::memset(junk.data(), 0x5a, junk.size());
  ASSERT_TRUE(p.client->send(junk.data(), junk.size(), 1, KvWireTags{}.request).ok());
  Status st = serve_kv_request(*p.server, 0, p.store);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::corrupt);
  std::array<std::byte, kKvReplyHeaderBytes> reply{};
  ASSERT_TRUE(p.client->recv(reply.data(), reply.size(), 1, KvWireTags{}.reply).ok());
  std::int32_t code = 0;
  std::memcpy(&code, reply.data() + 4, 4);
  EXPECT_EQ(code, static_cast<int>(ErrorCode::corrupt));

  // A flush_batch whose table promises more bytes than its payload carries.
  std::array<std::byte, kKvRequestHeaderBytes> header{};
  const std::uint32_t magic = 0x3153564bu, op = 3;
  const std::uint64_t count = 1, bytes = 10;
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 4, &op, 4);
  std::memcpy(header.data() + 40, &count, 8);
  std::memcpy(header.data() + 48, &bytes, 8);
  std::array<std::byte, kKvTableEntryBytes> table{};
  const std::uint64_t chunk = 20;
  std::memcpy(table.data() + 32, &chunk, 8);
  const auto payload = bytes_of(10, 5);
  ASSERT_TRUE(p.client->send(header.data(), header.size(), 1, KvWireTags{}.request).ok());
  ASSERT_TRUE(p.client->send(table.data(), table.size(), 1, KvWireTags{}.request).ok());
  ASSERT_TRUE(p.client->send(payload.data(), payload.size(), 1, KvWireTags{}.request).ok());
  st = serve_kv_request(*p.server, 0, p.store);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::corrupt);
  EXPECT_THAT(st.error().message, HasSubstr("do not add up"));
  EXPECT_EQ(p.store.stats().chunks, 0u);
}

}  // namespace
}  // namespace shardline::kvstore
