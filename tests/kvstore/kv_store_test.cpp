#include "kvstore/kv_store.hpp"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "tests/kvstore/kv_store_test_util.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_store_test {

using testing::chunk_key;
using testing::decode_range;
using testing::make_chunk;
using testing::small_shape;
using testing::TempDir;

std::unique_ptr<KvStore> open_store(const std::string& dir, KvStoreOptions o) {
  auto s = KvStore::open(dir, std::move(o));
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

KvStoreOptions options(KvModelShape shape = small_shape()) {
  KvStoreOptions o;
  o.shape = shape;
  return o;
}

/// Stores the chunk of `r` and returns the ack.
int put(KvStore& s, std::uint64_t job, std::uint64_t req, KvRange r) {
  const auto bytes = make_chunk(s.options().shape, job, req, r);
  auto ack = s.put(chunk_key(job, req, r), bytes);
  EXPECT_TRUE(ack.ok()) << ack.error().to_string();
  return ack.ok() ? *ack : -1;
}

TEST(KvSyncPolicy, NamesRoundTripAndBadNameListsTheChoices) {
  for (const KvSyncPolicy p : {KvSyncPolicy::none, KvSyncPolicy::wal, KvSyncPolicy::fsync}) {
    auto parsed = parse_kv_sync_policy(kv_sync_policy_name(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = parse_kv_sync_policy("sync");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("none, wal, fsync"), std::string::npos) << bad.error().message;
  EXPECT_EQ(KvStoreOptions{}.sync, KvSyncPolicy::wal);
}

TEST(KvKeyLayout, FixedWidthBigEndianFields) {
  const KvChunkKey key{0x0102030405060708ull, 0x1112131415161718ull, KvRange{0x2122, 0x2324, 0x31323334, 0x41424344}};
  const std::string k = encode_key(key);
  ASSERT_EQ(k.size(), kKvKeyBytes);
  const unsigned char want[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,   // job
                                0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,   // request
                                0x31, 0x32, 0x33, 0x34, 0x41, 0x42, 0x43, 0x44,   // tokens
                                0x21, 0x22, 0x23, 0x24};                          // layers
  EXPECT_EQ(k, std::string(reinterpret_cast<const char*>(want), sizeof want));
  EXPECT_EQ(k.substr(0, kKvRequestPrefixBytes), encode_request_prefix(key.job_id, key.request_id));
  auto back = decode_key(k);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, key);
}

TEST(KvKeyLayout, DecodeRejectsBadKeysAsCorrupt) {
  const std::string good = encode_key(chunk_key(1, 2, KvRange{0, 1, 0, 1}));
  for (const std::string& bad : {good.substr(0, 27), good + "x", std::string(),
                                 encode_key(chunk_key(1, 2, KvRange{0, 1, 5, 5})),     // no tokens
                                 encode_key(chunk_key(1, 2, KvRange{3, 2, 0, 1})),     // layers backwards
                                 good.substr(0, 20) + std::string("\xff\xff\xff\xff", 4) + good.substr(24)}) {
    auto k = decode_key(bad);
    ASSERT_FALSE(k.ok()) << bad.size();
    EXPECT_EQ(k.error().code, ErrorCode::corrupt);
  }
}

TEST(KvKeyLayout, BytewiseOrderIsJobRequestTokenOrder) {
  std::mt19937_64 rng(7);
  std::vector<KvChunkKey> keys;
  for (int i = 0; i < 2000; ++i) {
    const int tb = static_cast<int>(rng() % 70000), lb = static_cast<int>(rng() % 300);
    keys.push_back(KvChunkKey{rng() % 3 == 0 ? rng() : rng() % 4, rng() % 2 == 0 ? rng() : rng() % 5,
                              KvRange{lb, lb + 1 + static_cast<int>(rng() % 300), tb,
                                      tb + 1 + static_cast<int>(rng() % 70000)}});
  }
  auto tuple = [](const KvChunkKey& k) {
    return std::make_tuple(k.job_id, k.request_id, k.range.token_begin, k.range.token_end, k.range.layer_begin,
                           k.range.layer_end);
  };
  std::vector<KvChunkKey> by_fields = keys, by_bytes = keys;
  std::sort(by_fields.begin(), by_fields.end(), [&](const auto& a, const auto& b) { return tuple(a) < tuple(b); });
  std::sort(by_bytes.begin(), by_bytes.end(),
            [](const auto& a, const auto& b) { return encode_key(a) < encode_key(b); });
  for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(tuple(by_fields[i]), tuple(by_bytes[i])) << i;
  // A request's keys are exactly the keys with its 16-byte prefix.
  for (const auto& k : keys) {
    ASSERT_TRUE(encode_key(k).starts_with(encode_request_prefix(k.job_id, k.request_id)));
    auto back = decode_key(encode_key(k));
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, k);
  }
}

TEST(KvStore, PutFetchRoundTripAndReplace) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const KvRange r{1, 3, 5, 9};
  const auto bytes = make_chunk(s->options().shape, 1, 2, r);
  ASSERT_TRUE(s->flush(chunk_key(1, 2, r), bytes).ok());
  auto got = s->fetch(chunk_key(1, 2, r));
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(*got, bytes);
  auto other = s->fetch(chunk_key(1, 2, KvRange{1, 3, 5, 8}));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, ErrorCode::not_found);
  // An equal key is replaced, not counted twice.
  std::vector<std::byte> again = make_chunk(s->options().shape, 9, 9, r);
  ASSERT_TRUE(s->put(chunk_key(1, 2, r), again).ok());
  EXPECT_EQ(*s->fetch(chunk_key(1, 2, r)), again);
  const auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->chunks, 1u);
  EXPECT_EQ(st->chunk_bytes, bytes.size());
  EXPECT_EQ(st->requests, 1u);
}

TEST(KvStore, AckCoversEveryLayerContiguouslyFromZero) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const int L = s->options().shape.num_layers;
  // Prefill [0, 6) streamed layer by layer, out of order: no ack until every layer has it.
  EXPECT_EQ(put(*s, 1, 1, KvRange{2, 4, 0, 6}), 0);
  EXPECT_EQ(put(*s, 1, 1, KvRange{0, 1, 0, 6}), 0);
  EXPECT_EQ(s->durable_tokens(1, 1), 0);
  EXPECT_EQ(put(*s, 1, 1, KvRange{1, 2, 0, 6}), 6);
  // Decode steps out of order: 8 before 6 and 7 leaves a gap at 6.
  EXPECT_EQ(put(*s, 1, 1, decode_range(s->options().shape, 8)), 6);
  EXPECT_EQ(put(*s, 1, 1, decode_range(s->options().shape, 6)), 7);
  // Position 7 on some layers only: the gap stays for the others.
  EXPECT_EQ(put(*s, 1, 1, KvRange{0, L - 1, 7, 8}), 7);
  EXPECT_EQ(put(*s, 1, 1, KvRange{L - 1, L, 7, 8}), 9);
  // A resend overlapping what is there (a recovered worker) changes nothing.
  EXPECT_EQ(put(*s, 1, 1, KvRange{0, L, 3, 9}), 9);
  EXPECT_EQ(put(*s, 1, 1, KvRange{1, 3, 0, 2}), 9);
  // A gap on one layer only, in the middle: the ack stops at it.
  EXPECT_EQ(put(*s, 1, 2, KvRange{0, L, 0, 4}), 4);
  EXPECT_EQ(put(*s, 1, 2, KvRange{0, 1, 4, 10}), 4);
  EXPECT_EQ(put(*s, 1, 2, KvRange{2, L, 4, 10}), 4);
  EXPECT_EQ(put(*s, 1, 2, KvRange{1, 2, 5, 10}), 4);  // layer 1 lacks position 4
  EXPECT_EQ(put(*s, 1, 2, KvRange{1, 2, 4, 5}), 10);
  EXPECT_EQ(s->durable_tokens(1, 1), 9);
  EXPECT_EQ(s->durable_tokens(1, 3), 0);
  const auto reqs = s->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].durable_tokens, 9);
  EXPECT_EQ(reqs[1].durable_tokens, 10);
}

TEST(KvStore, PutManyAcksEachWriteAfterTheBatch) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const auto shape = s->options().shape;
  const auto a = make_chunk(shape, 1, 1, KvRange{0, 4, 1, 2});
  const auto b = make_chunk(shape, 1, 1, KvRange{0, 4, 0, 1});
  const auto c = make_chunk(shape, 1, 2, KvRange{0, 4, 0, 3});
  const std::vector<KvChunkWrite> writes{{chunk_key(1, 1, KvRange{0, 4, 1, 2}), a},
                                         {chunk_key(1, 1, KvRange{0, 4, 0, 1}), b},
                                         {chunk_key(1, 2, KvRange{0, 4, 0, 3}), c}};
  auto acks = s->put_many(writes);
  ASSERT_TRUE(acks.ok()) << acks.error().to_string();
  EXPECT_EQ(*acks, (std::vector<int>{2, 2, 3}));
}

TEST(KvStore, HostTierKeepsTheMostRecentChunksWithinItsBudget) {
  TempDir tmp;
  KvStoreOptions o = options();
  const std::size_t one = testing::chunk_size(o.shape, decode_range(o.shape, 0));
  o.host_bytes = 3 * one + one / 2;  // room for 3 decode chunks
  auto s = open_store(tmp.file("kv"), o);
  for (int t = 0; t < 5; ++t) put(*s, 1, 1, decode_range(o.shape, t));
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->memory_chunks, 3u);
  EXPECT_EQ(st->memory_bytes, 3 * one);
  EXPECT_LE(st->memory_bytes, st->memory_budget);
  // 4, 3, 2 in memory (most recent first); reading 2 makes it the most recent.
  ASSERT_TRUE(s->fetch(chunk_key(1, 1, decode_range(o.shape, 2))).ok());
  EXPECT_EQ(s->stats()->memory_hits, 1u);
  EXPECT_EQ(s->stats()->disk_reads, 0u);
  // 0 was evicted: read from disk, same bytes, and now in memory (3 leaves).
  auto old = s->fetch(chunk_key(1, 1, decode_range(o.shape, 0)));
  ASSERT_TRUE(old.ok()) << old.error().to_string();
  EXPECT_EQ(*old, make_chunk(o.shape, 1, 1, decode_range(o.shape, 0)));
  EXPECT_EQ(s->stats()->disk_reads, 1u);
  for (const int t : {0, 2, 4}) ASSERT_TRUE(s->fetch(chunk_key(1, 1, decode_range(o.shape, t))).ok());
  EXPECT_EQ(s->stats()->memory_hits, 4u);
  EXPECT_EQ(s->stats()->disk_reads, 1u);
  ASSERT_TRUE(s->fetch(chunk_key(1, 1, decode_range(o.shape, 3))).ok());
  EXPECT_EQ(s->stats()->disk_reads, 2u) << "3 should have been the least recently used";
  // A chunk larger than the whole budget is stored, on disk only.
  const KvRange big{0, 4, 10, 20};
  put(*s, 1, 1, big);
  EXPECT_EQ(s->stats()->memory_chunks, 3u);
  auto got = s->fetch(chunk_key(1, 1, big));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, make_chunk(o.shape, 1, 1, big));
}

TEST(KvStore, NoHostTierReadsEverythingFromDisk) {
  TempDir tmp;
  KvStoreOptions o = options();
  o.host_bytes = 0;
  auto s = open_store(tmp.file("kv"), o);
  put(*s, 1, 1, KvRange{0, 4, 0, 3});
  auto p = s->fetch_prefix(1, 1, 100);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->chunk, make_chunk(o.shape, 1, 1, KvRange{0, 4, 0, 3}));
  EXPECT_EQ(s->stats()->memory_chunks, 0u);
  EXPECT_EQ(s->stats()->disk_reads, 1u);
}

TEST(KvStore, FetchPrefixMergesPiecesBitIdentically) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    TempDir tmp;
    auto s = open_store(tmp.file("kv"), options(small_shape(dtype)));
    const auto shape = s->options().shape;
    // Prefill of 7 positions in layer pairs, decode steps, a resend overlapping both.
    put(*s, 3, 9, KvRange{2, 4, 0, 7});
    put(*s, 3, 9, KvRange{0, 2, 0, 7});
    for (int t = 7; t < 12; ++t) put(*s, 3, 9, decode_range(shape, t));
    put(*s, 3, 9, KvRange{0, 4, 5, 10});
    put(*s, 3, 9, KvRange{1, 3, 14, 16});  // beyond a gap: not part of the prefix
    ASSERT_EQ(s->durable_tokens(3, 9), 12);
    for (const int max : {100, 12, 8, 1}) {
      auto p = s->fetch_prefix(3, 9, max);
      ASSERT_TRUE(p.ok()) << p.error().to_string();
      const int t = std::min(12, max);
      EXPECT_EQ(p->tokens, t);
      EXPECT_TRUE(p->chunk == make_chunk(shape, 3, 9, KvRange{0, shape.num_layers, 0, t})) << "max " << max;
    }
    auto none = s->fetch_prefix(3, 9, 0);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->tokens, 0);
    EXPECT_TRUE(none->chunk.empty());
    auto unknown = s->fetch_prefix(3, 8, 10);
    ASSERT_TRUE(unknown.ok());
    EXPECT_EQ(unknown->tokens, 0);
    EXPECT_FALSE(s->fetch_prefix(3, 9, -1).ok());
  }
}

TEST(KvStore, ReopenKeepsChunksAndAcks) {
  TempDir tmp;
  for (const KvSyncPolicy sync : {KvSyncPolicy::none, KvSyncPolicy::wal, KvSyncPolicy::fsync}) {
    SCOPED_TRACE(kv_sync_policy_name(sync));
    const std::string dir = tmp.file(std::string("kv-") + kv_sync_policy_name(sync));
    KvStoreOptions o = options();
    o.sync = sync;
    {
      auto s = open_store(dir, o);
      put(*s, 1, 1, KvRange{0, 4, 0, 5});
      put(*s, 1, 1, KvRange{0, 2, 5, 6});  // half a step: not acked
      put(*s, 2, 7, KvRange{0, 4, 0, 3});
      put(*s, 2, 7, KvRange{0, 4, 4, 6});  // after a gap
      ASSERT_EQ(s->durable_tokens(1, 1), 5);
      ASSERT_EQ(s->durable_tokens(2, 7), 3);
    }
    auto s = open_store(dir, o);
    EXPECT_EQ(s->durable_tokens(1, 1), 5);
    EXPECT_EQ(s->durable_tokens(2, 7), 3);
    EXPECT_EQ(s->requests().size(), 2u);
    auto got = s->fetch(chunk_key(1, 1, KvRange{0, 2, 5, 6}));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, make_chunk(o.shape, 1, 1, KvRange{0, 2, 5, 6}));
    auto p = s->fetch_prefix(2, 7, 10);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->chunk, make_chunk(o.shape, 2, 7, KvRange{0, 4, 0, 3}));
    // The rest arrives after the restart: the coverage rebuilt from disk completes.
    EXPECT_EQ(put(*s, 1, 1, KvRange{2, 4, 5, 6}), 6);
    EXPECT_EQ(put(*s, 2, 7, KvRange{0, 4, 3, 4}), 6);
  }
}

TEST(KvStore, BadInputsAreRejectedAndLoseNothing) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const auto shape = s->options().shape;
  put(*s, 1, 1, KvRange{0, 4, 0, 4});
  const auto good = make_chunk(shape, 1, 1, KvRange{0, 4, 4, 5});
  struct Case {
    KvRange range;
    std::size_t bytes;
    const char* says;
  };
  const std::vector<Case> cases{
      {KvRange{0, 4, 4, 5}, good.size() - 1, "bytes, the range needs"},
      {KvRange{0, 4, 4, 5}, good.size() * 2, "bytes, the range needs"},
      {KvRange{0, 5, 4, 5}, good.size() / 4 * 5, "layers outside [0, 4)"},
      {KvRange{-1, 3, 4, 5}, good.size(), "layers outside"},
      {KvRange{2, 2, 4, 5}, 0, "layers outside"},
      {KvRange{0, 4, 5, 5}, 0, "token range negative or empty"},
      {KvRange{0, 4, -1, 0}, good.size(), "token range negative or empty"},
  };
  for (const Case& c : cases) {
    std::vector<std::byte> bytes(c.bytes);
    auto r = s->put(chunk_key(1, 1, c.range), bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(c.says), std::string::npos) << r.error().message;
  }
  // One bad write rejects its whole batch.
  std::vector<std::byte> short_chunk(8);
  const std::vector<KvChunkWrite> batch{{chunk_key(1, 1, KvRange{0, 4, 4, 5}), good},
                                        {chunk_key(1, 2, KvRange{0, 4, 0, 1}), short_chunk}};
  ASSERT_FALSE(s->put_many(batch).ok());
  EXPECT_FALSE(s->fetch(chunk_key(1, 1, KvRange{0, 4, 4, 5})).ok());
  EXPECT_EQ(s->durable_tokens(1, 1), 4);
  EXPECT_EQ(s->durable_tokens(1, 2), 0);
  EXPECT_FALSE(s->fetch(chunk_key(1, 1, KvRange{0, 9, 0, 4})).ok());
  auto p = s->fetch_prefix(1, 1, 100);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->chunk, make_chunk(shape, 1, 1, KvRange{0, 4, 0, 4}));
  EXPECT_EQ(s->stats()->chunks, 1u);
}

TEST(KvStore, OpenRejectsABadShapeAndCorruptRecords) {
  TempDir tmp;
  KvStoreOptions o = options();
  o.shape.num_layers = 0;
  auto bad = KvStore::open(tmp.file("kv"), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);

  const std::vector<std::pair<std::string, std::string>> records{
      {"short key", "x"},
      {encode_key(chunk_key(1, 1, KvRange{0, 4, 0, 1})), "wrong size"},
      {encode_key(chunk_key(1, 1, KvRange{0, 6, 0, 1})), std::string(6 * 2 * 2 * 8 * 4, 'x')},  // 6 layers
  };
  for (std::size_t i = 0; i < records.size(); ++i) {
    const std::string dir = tmp.file("bad" + std::to_string(i));
    { ASSERT_TRUE(open_store(dir, options()) != nullptr); }
    {
      rocksdb::DB* raw = nullptr;
      ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
      std::unique_ptr<rocksdb::DB> db(raw);
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), records[i].first, records[i].second).ok());
    }
    auto s = KvStore::open(dir, options());
    ASSERT_FALSE(s.ok()) << i;
    EXPECT_EQ(s.error().code, ErrorCode::corrupt) << s.error().to_string();
  }
}

/// Overwrites `n` bytes at `offset` of every file of `dir` whose name
/// starts with `prefix` or ends with `suffix`; returns how many it garbled.
int garble(const std::string& dir, const std::string& prefix, const std::string& suffix, std::size_t offset,
           std::size_t n) {
  int count = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!(name.starts_with(prefix) && !prefix.empty()) && !(name.ends_with(suffix) && !suffix.empty())) continue;
    std::FILE* f = std::fopen(e.path().c_str(), "r+b");
    if (f == nullptr) continue;
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    const std::string junk(n, '\xA5');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
    ++count;
  }
  return count;
}

// Issue 46, item 11: a garbled .sst or MANIFEST was an io error, so the
// store actor died and restarted 76-149 times. It is `corrupt` now, which
// the actor answers by moving the store aside (kvstore_actor_test).
TEST(KvStore, GarbledFilesAreCorruptNotIo) {
  TempDir tmp;
  for (const auto& [prefix, suffix] : std::vector<std::pair<std::string, std::string>>{{"MANIFEST-", ""}, {"", ".sst"}}) {
    const std::string dir = tmp.file("kv-" + prefix + suffix);
    {
      auto s = open_store(dir, options());
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(put(*s, 1, 1, KvRange{0, small_shape().num_layers, 0, 8}), 8);
    }
    { ASSERT_NE(open_store(dir, options()), nullptr); }  // reopening flushes the WAL into an .sst
    ASSERT_GE(garble(dir, prefix, suffix, 0, 64), 1) << prefix << suffix;
    auto s = KvStore::open(dir, options());
    ASSERT_FALSE(s.ok()) << prefix << suffix;
    EXPECT_EQ(s.error().code, ErrorCode::corrupt) << s.error().to_string();
    EXPECT_NE(s.error().message.find(dir), std::string::npos) << s.error().to_string();
  }
}

TEST(KvStore, DropRequestAndJobForgetTheirChunksOnly) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const auto shape = s->options().shape;
  for (const std::uint64_t job : {1u, 2u})
    for (const std::uint64_t req : {0ull, 5ull, ~0ull}) put(*s, job, req, KvRange{0, 4, 0, 3});
  constexpr std::uint64_t kLastJob = kPrefixBlockJobBit - 1;  // the largest job id (the top bit: prefix blocks)
  put(*s, kLastJob, ~0ull, KvRange{0, 4, 0, 2});
  ASSERT_TRUE(s->drop_request(1, 5).ok());
  ASSERT_TRUE(s->drop_request(1, 42).ok());  // unknown: nothing to do
  EXPECT_EQ(s->durable_tokens(1, 5), 0);
  EXPECT_FALSE(s->fetch(chunk_key(1, 5, KvRange{0, 4, 0, 3})).ok());
  EXPECT_EQ(s->durable_tokens(1, 0), 3);
  EXPECT_EQ(s->durable_tokens(1, ~0ull), 3);
  ASSERT_TRUE(s->drop_request(1, ~0ull).ok());
  EXPECT_FALSE(s->fetch(chunk_key(1, ~0ull, KvRange{0, 4, 0, 3})).ok());
  ASSERT_TRUE(s->drop_job(2).ok());
  for (const std::uint64_t req : {0ull, 5ull, ~0ull}) {
    EXPECT_EQ(s->durable_tokens(2, req), 0);
    EXPECT_FALSE(s->fetch(chunk_key(2, req, KvRange{0, 4, 0, 3})).ok());
  }
  EXPECT_EQ(s->durable_tokens(1, 0), 3);
  EXPECT_EQ(s->durable_tokens(kLastJob, ~0ull), 2);
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->requests, 2u);
  EXPECT_EQ(st->memory_chunks, 2u);  // the dropped ones left the host tier too
  EXPECT_EQ(st->deleted_bytes, 5 * testing::chunk_size(shape, KvRange{0, 4, 0, 3}));
  ASSERT_TRUE(s->drop_job(kLastJob).ok());
  EXPECT_EQ(s->durable_tokens(kLastJob, ~0ull), 0);
  EXPECT_FALSE(s->fetch(chunk_key(kLastJob, ~0ull, KvRange{0, 4, 0, 2})).ok());
  // And the drops are durable: a reopened store does not bring them back.
  s.reset();
  s = open_store(tmp.file("kv"), options());
  EXPECT_EQ(s->requests().size(), 1u);
  EXPECT_EQ(s->durable_tokens(1, 0), 3);
}

/// A long job: `requests` requests of a prefill and `steps` decode chunks,
/// 8 in flight at a time, each dropped when done. Disk use must stay bounded
/// by what is live plus the memtable and the GC threshold, not grow with the
/// job.
TEST(KvStore, GcKeepsDiskUseBoundedOverALongJob) {
  TempDir tmp;
  KvStoreOptions o;
  o.shape = KvModelShape{4, 2, 16, DType::f32};  // a decode chunk: 1 KiB
  o.memtable_bytes = 2 << 20;
  o.compact_after_bytes = 4 << 20;
  o.host_bytes = 1 << 20;
  auto s = open_store(tmp.file("kv"), o);
  constexpr int kRequests = 2000, kSteps = 64, kInFlight = 8, kPrompt = 16;
  std::vector<std::byte> prefill = make_chunk(o.shape, 0, 0, KvRange{0, 4, 0, kPrompt});
  // Neighbouring chunks differ, so SST block compression does not hide bytes.
  std::vector<std::vector<std::byte>> steps;
  for (std::uint64_t i = 0; i < 97; ++i) steps.push_back(make_chunk(o.shape, 0, i, decode_range(o.shape, 0)));
  std::uint64_t written = 0, max_disk = 0;
  for (int first = 0; first < kRequests; first += kInFlight) {
    for (int req = first; req < first + kInFlight; ++req) {
      ASSERT_TRUE(s->put(chunk_key(1, static_cast<std::uint64_t>(req), KvRange{0, 4, 0, kPrompt}), prefill).ok());
      written += prefill.size();
    }
    for (int t = kPrompt; t < kPrompt + kSteps; ++t)
      for (int req = first; req < first + kInFlight; ++req) {
        const auto& step = steps[static_cast<std::size_t>(req * kSteps + t) % steps.size()];
        auto ack = s->put(chunk_key(1, static_cast<std::uint64_t>(req), decode_range(o.shape, t)), step);
        ASSERT_TRUE(ack.ok()) << ack.error().to_string();
        ASSERT_EQ(*ack, t + 1);
        written += step.size();
      }
    for (int req = first; req < first + kInFlight; ++req)
      ASSERT_TRUE(s->drop_request(1, static_cast<std::uint64_t>(req)).ok());
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    max_disk = std::max(max_disk, st->disk_bytes);
  }
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  std::printf("gc: %d requests x %d steps, %.1f MiB written, %.1f MiB deleted, %llu compactions; "
              "disk max %.2f MiB, at the end %.2f MiB (sst %.2f, wal %.2f MiB)\n",
              kRequests, kSteps, written / 1048576.0, st->deleted_bytes / 1048576.0,
              static_cast<unsigned long long>(st->compactions), max_disk / 1048576.0, st->disk_bytes / 1048576.0,
              st->sst_bytes / 1048576.0, st->wal_bytes / 1048576.0);
  EXPECT_EQ(st->requests, 0u);
  EXPECT_EQ(st->deleted_bytes, written);
  EXPECT_GE(written, 150ull << 20);
  // Live data is at most 8 requests (~0.6 MiB); the WAL and memtable hold up
  // to 2 MiB, the deleted-but-not-compacted span up to 4 MiB (plus the 2 MiB
  // memtable flushed before it), logs and MANIFEST little.
  EXPECT_LT(max_disk, 12ull << 20) << "disk use grew with the job: deleted KV does not come back";
  EXPECT_LT(st->sst_bytes, 8ull << 20);
}

/// Requests that lived long enough to reach SST files: once they are
/// dropped, GC compacts their key span and the SST bytes come back (RocksDB's
/// own compactions would only get to them after more writes).
TEST(KvStore, GcCompactsDroppedRequestsOutOfTheSstFiles) {
  TempDir tmp;
  KvStoreOptions o;
  o.shape = KvModelShape{4, 2, 16, DType::f32};  // a decode chunk: 1 KiB
  o.memtable_bytes = 1 << 20;
  o.compact_after_bytes = 2 << 20;
  auto s = open_store(tmp.file("kv"), o);
  constexpr int kRequests = 96, kPrompt = 16, kSteps = 48;
  for (std::uint64_t req = 0; req < kRequests; ++req) {  // distinct bytes: SST compression does not hide them
    const KvRange prompt{0, 4, 0, kPrompt};
    ASSERT_TRUE(s->put(chunk_key(5, req, prompt), make_chunk(o.shape, 5, req, prompt)).ok());
    for (int t = kPrompt; t < kPrompt + kSteps; ++t) {
      const KvRange r = decode_range(o.shape, t);
      ASSERT_TRUE(s->put(chunk_key(5, req, r), make_chunk(o.shape, 5, req, r)).ok());
    }
  }
  const auto before = s->stats();
  ASSERT_TRUE(before.ok());
  for (std::uint64_t req = 0; req < kRequests; ++req) ASSERT_TRUE(s->drop_request(5, req).ok());
  const auto after = s->stats();
  ASSERT_TRUE(after.ok());
  std::printf("gc: %.2f MiB of chunks; before the drops sst %.2f MiB, disk %.2f MiB; after sst %.2f MiB, disk %.2f MiB, "
              "%llu compactions\n",
              before->chunk_bytes / 1048576.0, before->sst_bytes / 1048576.0, before->disk_bytes / 1048576.0,
              after->sst_bytes / 1048576.0, after->disk_bytes / 1048576.0,
              static_cast<unsigned long long>(after->compactions));
  EXPECT_EQ(after->deleted_bytes, before->chunk_bytes);
  EXPECT_GE(before->sst_bytes, 4ull << 20);
  EXPECT_GE(after->compactions, 2u);
  // What is left: at most the deletions below the compaction threshold.
  EXPECT_LE(after->sst_bytes, o.compact_after_bytes) << "dropped requests still take SST space";
  EXPECT_LT(after->disk_bytes, before->disk_bytes / 2);
  ASSERT_TRUE(s->compact().ok());
  EXPECT_LT(s->stats()->sst_bytes, 64u << 10);
}

}  // namespace
}  // namespace shardline::kvstore
