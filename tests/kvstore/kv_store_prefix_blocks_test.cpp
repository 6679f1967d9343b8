// The KV store's prefix blocks (issue 42, step 5: the persistent prefix
// tier): full KV blocks of shared prompt prefixes kept beside requests'
// chunks, keyed by (salt, name), fetched as the leading run of a chain,
// bounded by their own LRU budget and the disk budget, and kept across a
// reopen.

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/kv_store.hpp"
#include "tests/kvstore/kv_store_test_util.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_store_prefix_blocks_test {

using testing::chunk_key;
using testing::decode_range;
using testing::make_chunk;
using testing::small_shape;
using testing::TempDir;

constexpr std::uint64_t kSalt = 0x5a17;
constexpr int kBlockTokens = 4;

/// A prefix block: its name, parent, tokens and canonical chunk (all layers).
struct Block {
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::byte> chunk;

  [[nodiscard]] PrefixBlockWrite write(std::uint64_t salt = kSalt) const {
    return PrefixBlockWrite{salt, name, parent, tokens, chunk};
  }
  [[nodiscard]] PrefixBlockQuery query() const { return PrefixBlockQuery{name, parent, tokens}; }
};

/// A block of `n` tokens whose chunk's bytes name it (make_chunk of a
/// request numbered by the name).
Block make_block(const KvModelShape& s, std::uint64_t name, std::uint64_t parent, int n = kBlockTokens) {
  Block b;
  b.name = name;
  b.parent = parent;
  for (int i = 0; i < n; ++i) b.tokens.push_back(static_cast<std::int32_t>(name * 10 + static_cast<std::uint64_t>(i)) - 7);
  b.chunk = make_chunk(s, 0xb10c, name, KvRange{0, s.num_layers, 0, n});
  return b;
}

/// `count` blocks of one prompt: names first, first + 1, ..., each the
/// previous one's child (the first a root: parent 0).
std::vector<Block> make_chain(const KvModelShape& s, std::uint64_t first, int count) {
  std::vector<Block> out;
  for (int i = 0; i < count; ++i)
    out.push_back(make_block(s, first + static_cast<std::uint64_t>(i), i == 0 ? 0 : out.back().name));
  return out;
}

/// Value bytes of a stored block of `n` tokens: chunk, parent, seq, tokens.
std::uint64_t value_bytes(const KvModelShape& s, int n = kBlockTokens) {
  return testing::chunk_size(s, KvRange{0, s.num_layers, 0, n}) + 16 + 4 * static_cast<std::uint64_t>(n);
}

/// The RocksDB key of a block (the header's layout).
std::string block_key(const KvModelShape& s, std::uint64_t salt, const Block& b) {
  return encode_key(KvChunkKey{kPrefixBlockJobBit | salt, b.name,
                               KvRange{0, s.num_layers, 0, static_cast<int>(b.tokens.size())}});
}

KvStoreOptions options(std::uint64_t prefix_budget_bytes = 1ull << 30) {
  return testing::prefix_store_options(prefix_budget_bytes);
}
using testing::open_store;

/// put_prefix_blocks of `blocks` in one call; -1 on an error.
int put(KvStore& s, const std::vector<Block>& blocks, std::uint64_t salt = kSalt) {
  std::vector<PrefixBlockWrite> writes;
  for (const Block& b : blocks) writes.push_back(b.write(salt));
  auto n = s.put_prefix_blocks(writes);
  EXPECT_TRUE(n.ok()) << n.error().to_string();
  return n.ok() ? *n : -1;
}

/// The names of the leading run fetch_prefix_blocks returns for `blocks`;
/// each returned block is checked against the one asked for.
std::vector<std::uint64_t> fetch(KvStore& s, const std::vector<Block>& blocks, std::uint64_t salt = kSalt) {
  std::vector<PrefixBlockQuery> queries;
  for (const Block& b : blocks) queries.push_back(b.query());
  auto got = s.fetch_prefix_blocks(salt, queries);
  EXPECT_TRUE(got.ok()) << got.error().to_string();
  std::vector<std::uint64_t> names;
  if (!got.ok()) return names;
  for (std::size_t i = 0; i < got->size(); ++i) {
    const StoredPrefixBlock& g = (*got)[i];
    EXPECT_EQ(g.name, blocks[i].name);
    EXPECT_EQ(g.parent, blocks[i].parent);
    EXPECT_EQ(g.tokens, blocks[i].tokens);
    EXPECT_EQ(g.chunk, blocks[i].chunk) << "block " << g.name;
    names.push_back(g.name);
  }
  return names;
}

/// Whether the store keeps `b` (a fetch of it alone: marks it used).
bool kept(KvStore& s, const Block& b, std::uint64_t salt = kSalt) { return fetch(s, {b}, salt).size() == 1; }

KvStoreStats stats(const KvStore& s) {
  auto st = s.stats();
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return st.ok() ? *st : KvStoreStats{};
}

std::uint64_t get_le(const std::string& v, std::size_t at, int bytes) {
  std::uint64_t x = 0;
  for (int i = bytes - 1; i >= 0; --i) x = (x << 8) | static_cast<unsigned char>(v[at + static_cast<std::size_t>(i)]);
  return x;
}

using Names = std::vector<std::uint64_t>;

TEST(KvStorePrefixBlocks, PutThenFetchReturnsTheExactBlocks) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const auto chain = make_chain(small_shape(), 100, 3);
  EXPECT_EQ(put(*s, chain), 3);
  EXPECT_EQ(fetch(*s, chain), (Names{100, 101, 102}));
  const std::vector<Block> two(chain.begin(), chain.begin() + 2);
  EXPECT_EQ(fetch(*s, two), (Names{100, 101}));  // a shorter prompt: its own leading run
  // Kept already: only marked used, nothing new.
  EXPECT_EQ(put(*s, chain), 0);
  const KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_blocks, 3u);
  EXPECT_EQ(st.prefix_bytes, 3 * value_bytes(small_shape()));
  EXPECT_EQ(st.prefix_budget, 1ull << 30);
  EXPECT_EQ(st.prefix_hits, 5u);
  EXPECT_EQ(st.prefix_evictions, 0u);
  EXPECT_EQ(st.requests, 0u);  // not requests' chunks
  EXPECT_EQ(st.chunks, 0u);
  EXPECT_EQ(st.chunk_bytes, 0u);
  EXPECT_TRUE(s->requests().empty());
  EXPECT_TRUE(fetch(*s, {}).empty());
}

TEST(KvStorePrefixBlocks, TheRunStopsAtAMissingBlockOrACollision) {
  TempDir tmp;
  auto s = open_store(tmp.file("kv"), options());
  const auto chain = make_chain(small_shape(), 200, 4);
  EXPECT_EQ(put(*s, {chain[0], chain[2], chain[3]}), 3);
  EXPECT_EQ(fetch(*s, chain), (Names{200}));  // 201 missing: 202 and 203 are no use
  EXPECT_TRUE(fetch(*s, {chain[1], chain[2]}).empty());
  EXPECT_EQ(put(*s, {chain[1]}), 1);
  EXPECT_EQ(fetch(*s, chain), (Names{200, 201, 202, 203}));

  // Another prompt whose block hashes to a kept name (a 64-bit collision):
  // a stored block whose tokens or parent differ is never handed out.
  Block other_tokens = chain[1];
  other_tokens.tokens.back() += 1;
  EXPECT_EQ(fetch(*s, {chain[0], other_tokens, chain[2]}), (Names{200}));
  Block first_token = chain[1];
  first_token.tokens.front() -= 1;
  EXPECT_EQ(fetch(*s, {chain[0], first_token, chain[2]}), (Names{200}));
  Block other_parent = chain[1];
  other_parent.parent = 999;
  EXPECT_EQ(fetch(*s, {chain[0], other_parent, chain[2]}), (Names{200}));
  Block fewer_tokens = chain[1];
  fewer_tokens.tokens.pop_back();
  EXPECT_EQ(fetch(*s, {chain[0], fewer_tokens}), (Names{200}));
  Block no_tokens = chain[1];
  no_tokens.tokens.clear();
  EXPECT_EQ(fetch(*s, {chain[0], no_tokens}), (Names{200}));
  // Nothing was lost: the real chain is still there.
  EXPECT_EQ(fetch(*s, chain), (Names{200, 201, 202, 203}));
  EXPECT_EQ(stats(*s).prefix_hits, 1u + 4 + 5 + 4);
}

TEST(KvStorePrefixBlocks, BlocksSurviveAReopenAndOtherSaltsFindNothing) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const auto chain = make_chain(shape, 300, 3);
  const auto longer = make_block(shape, 400, 0, 2 * kBlockTokens);
  {
    auto s = open_store(tmp.file("kv"), options());
    EXPECT_EQ(put(*s, {chain[0]}), 1);
    EXPECT_EQ(put(*s, {chain[1], chain[2], longer}), 3);
    EXPECT_TRUE(fetch(*s, chain, kSalt + 1).empty());
    EXPECT_EQ(fetch(*s, chain, kSalt | kPrefixBlockJobBit), (Names{300, 301, 302}));  // the low 63 bits
  }
  {
    auto s = open_store(tmp.file("kv"), options());
    const KvStoreStats st = stats(*s);
    EXPECT_EQ(st.prefix_blocks, 4u);
    EXPECT_EQ(st.prefix_bytes, 3 * value_bytes(shape) + value_bytes(shape, 2 * kBlockTokens));
    EXPECT_EQ(st.prefix_hits, 0u);
    EXPECT_EQ(st.requests, 0u);
    EXPECT_EQ(st.chunk_bytes, 0u);
    EXPECT_EQ(fetch(*s, chain), (Names{300, 301, 302}));
    EXPECT_EQ(fetch(*s, {longer}), (Names{400}));
    EXPECT_TRUE(fetch(*s, chain, kSalt + 1).empty());
    EXPECT_TRUE(fetch(*s, chain, 0).empty());
    EXPECT_EQ(put(*s, chain), 0);  // kept across the reopen
  }
  // The stored value, as the header lays it out: chunk, parent u64, seq u64,
  // tokens i32, little-endian; the seq grows with every write.
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), tmp.file("kv"), &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::uint64_t last_seq = 0;
  for (const Block& b : {chain[0], chain[1], longer}) {
    std::string v;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), block_key(shape, kSalt, b), &v).ok()) << b.name;
    const std::size_t n = b.tokens.size(), c = b.chunk.size();
    ASSERT_EQ(v.size(), value_bytes(shape, static_cast<int>(n)));
    EXPECT_EQ(0, std::memcmp(v.data(), b.chunk.data(), c));
    EXPECT_EQ(get_le(v, c, 8), b.parent);
    const std::uint64_t seq = get_le(v, c + 8, 8);
    if (b.name != chain[0].name) {
      EXPECT_GT(seq, last_seq) << b.name;
    }
    last_seq = seq;
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(v, c + 16 + 4 * i, 4))), b.tokens[i]);
  }
}

// Budget of 3 blocks: A, B, C kept; A used (fetched), then B re-put (used);
// D and E drop the least recently used first.
TEST(KvStorePrefixBlocks, TheBudgetDropsTheLeastRecentlyUsedBlock) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const std::uint64_t vb = value_bytes(shape);
  auto s = open_store(tmp.file("kv"), options(3 * vb));
  const Block a = make_block(shape, 1, 0), b = make_block(shape, 2, 0), c = make_block(shape, 3, 0),
              d = make_block(shape, 4, 0), e = make_block(shape, 5, 0);
  for (const Block& x : {a, b, c}) EXPECT_EQ(put(*s, {x}), 1);
  EXPECT_EQ(fetch(*s, {a}), (Names{1}));
  EXPECT_EQ(put(*s, {d}), 1);  // B is the least recently used
  KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_blocks, 3u);
  EXPECT_EQ(st.prefix_bytes, 3 * vb);
  EXPECT_EQ(st.prefix_evictions, 1u);
  EXPECT_EQ(st.deleted_bytes, vb);
  EXPECT_FALSE(kept(*s, b));
  // Order now (most recent first): D, A, C. Putting C again marks it used.
  EXPECT_EQ(put(*s, {c}), 0);
  EXPECT_EQ(put(*s, {e}), 1);  // drops A
  EXPECT_FALSE(kept(*s, a));
  for (const Block& x : {c, d, e}) EXPECT_TRUE(kept(*s, x)) << x.name;
  st = stats(*s);
  EXPECT_EQ(st.prefix_evictions, 2u);
  EXPECT_EQ(st.prefix_blocks, 3u);
  EXPECT_LE(st.prefix_bytes, st.prefix_budget);
}

// Across a reopen, the order is the last write's: a fetch before the close
// is not remembered. Names in the opposite order of the writes, so key
// order is not it either.
TEST(KvStorePrefixBlocks, AfterAReopenTheLruIsByLastWrite) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const std::uint64_t vb = value_bytes(shape);
  const Block a = make_block(shape, 30, 0), b = make_block(shape, 20, 0), c = make_block(shape, 10, 0),
              d = make_block(shape, 5, 0);
  {
    auto s = open_store(tmp.file("kv"), options(3 * vb));
    for (const Block& x : {a, b, c}) EXPECT_EQ(put(*s, {x}), 1);
    EXPECT_EQ(fetch(*s, {a}), (Names{30}));  // in memory only
  }
  auto s = open_store(tmp.file("kv"), options(3 * vb));
  EXPECT_EQ(put(*s, {d}), 1);  // drops A: the oldest write
  EXPECT_FALSE(kept(*s, a));
  for (const Block& x : {b, c, d}) EXPECT_TRUE(kept(*s, x)) << x.name;
  // The seq goes on past the stored ones: the block written last is the
  // most recent after another reopen too.
  s.reset();
  s = open_store(tmp.file("kv"), options(3 * vb));
  EXPECT_EQ(put(*s, {a}), 1);  // drops B, the oldest write left
  EXPECT_FALSE(kept(*s, b));
  for (const Block& x : {c, d, a}) EXPECT_TRUE(kept(*s, x)) << x.name;
}

TEST(KvStorePrefixBlocks, ABlockOverTheBudgetIsSkippedAndZeroStoresNothing) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const std::uint64_t vb = value_bytes(shape);
  {
    auto s = open_store(tmp.file("kv"), options(2 * vb));
    const Block big = make_block(shape, 7, 0, 3 * kBlockTokens), small = make_block(shape, 8, 0);
    EXPECT_EQ(put(*s, {big}), 0);
    EXPECT_EQ(put(*s, {big, small}), 1);
    EXPECT_FALSE(kept(*s, big));
    EXPECT_TRUE(kept(*s, small));
    EXPECT_EQ(stats(*s).prefix_evictions, 0u);
    // New blocks of one call past the budget: the leading ones are kept
    // (the older block makes room), the one that would drop its own
    // call's blocks is skipped.
    const auto chain = make_chain(shape, 50, 3);
    EXPECT_EQ(put(*s, chain), 2);
    EXPECT_EQ(fetch(*s, chain), (Names{50, 51}));
    EXPECT_FALSE(kept(*s, small));
    KvStoreStats st = stats(*s);
    EXPECT_EQ(st.prefix_blocks, 2u);
    EXPECT_EQ(st.prefix_bytes, 2 * vb);
    EXPECT_EQ(st.prefix_evictions, 1u);
    // The blocks a call names are not dropped for it: 50 and 51 are used
    // by this call, so 52 has no room.
    EXPECT_EQ(put(*s, chain), 0);
    EXPECT_EQ(fetch(*s, chain), (Names{50, 51}));
    st = stats(*s);
    EXPECT_EQ(st.prefix_blocks, 2u);
    EXPECT_EQ(st.prefix_evictions, 1u);
  }
  {
    auto s = open_store(tmp.file("zero"), options(0));
    EXPECT_EQ(put(*s, make_chain(shape, 60, 2)), 0);
    EXPECT_TRUE(fetch(*s, make_chain(shape, 60, 2)).empty());
    const KvStoreStats st = stats(*s);
    EXPECT_EQ(st.prefix_blocks, 0u);
    EXPECT_EQ(st.prefix_bytes, 0u);
    EXPECT_EQ(st.prefix_budget, 0u);
  }
  auto s = open_store(tmp.file("zero"), options(0));
  EXPECT_EQ(stats(*s).prefix_blocks, 0u);
}

TEST(KvStorePrefixBlocks, RequestsChunksAndPrefixBlocksCoexist) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const auto chain = make_chain(shape, 700, 2);
  const KvRange r{0, shape.num_layers, 0, kBlockTokens};
  {
    auto s = open_store(tmp.file("kv"), options());
    ASSERT_TRUE(s->put(chunk_key(1, 1, r), make_chunk(shape, 1, 1, r)).ok());
    ASSERT_TRUE(s->put(chunk_key(2, 1, r), make_chunk(shape, 2, 1, r)).ok());
    EXPECT_EQ(put(*s, chain), 2);
    ASSERT_EQ(s->requests().size(), 2u);
    KvStoreStats st = stats(*s);
    EXPECT_EQ(st.requests, 2u);
    EXPECT_EQ(st.chunks, 2u);
    EXPECT_EQ(st.chunk_bytes, 2 * testing::chunk_size(shape, r));
    EXPECT_EQ(st.prefix_blocks, 2u);

    // A chunk put under a prefix block's job id (here: exactly a block's
    // key) is refused and writes nothing, alone or in a batch.
    const std::uint64_t job = kPrefixBlockJobBit | kSalt;
    auto refused = s->put(chunk_key(job, chain[0].name, r), make_chunk(shape, job, chain[0].name, r));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument) << refused.error().to_string();
    const auto good = make_chunk(shape, 3, 1, r), bad = make_chunk(shape, 1ull << 63, 1, r);
    const std::vector<KvChunkWrite> batch{{chunk_key(3, 1, r), good}, {chunk_key(1ull << 63, 1, r), bad}};
    auto refused_batch = s->put_many(batch);
    ASSERT_FALSE(refused_batch.ok());
    EXPECT_EQ(refused_batch.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(s->durable_tokens(3, 1), 0);
    EXPECT_FALSE(s->fetch(chunk_key(1ull << 63, 1, r)).ok());
    st = stats(*s);
    EXPECT_EQ(st.requests, 2u);
    EXPECT_EQ(st.chunks, 2u);
    EXPECT_EQ(st.prefix_blocks, 2u);
    EXPECT_EQ(fetch(*s, chain), (Names{700, 701}));  // the block's bytes are intact

    // A job's GC never reaches prefix blocks; they are no job's.
    ASSERT_TRUE(s->drop_job(1).ok());
    auto no_job = s->drop_job(job);
    ASSERT_FALSE(no_job.ok());
    EXPECT_EQ(no_job.error().code, ErrorCode::invalid_argument);
    ASSERT_TRUE(s->drop_request(job, chain[0].name).ok());  // no such request: a no-op
    ASSERT_TRUE(s->compact().ok());
    EXPECT_EQ(fetch(*s, chain), (Names{700, 701}));
    EXPECT_EQ(s->durable_tokens(2, 1), kBlockTokens);
    st = stats(*s);
    EXPECT_EQ(st.requests, 1u);
    EXPECT_EQ(st.prefix_blocks, 2u);
    EXPECT_EQ(st.deleted_bytes, testing::chunk_size(shape, r));
  }
  auto s = open_store(tmp.file("kv"), options());
  ASSERT_EQ(s->requests().size(), 1u);
  EXPECT_EQ(s->requests()[0].job_id, 2u);
  EXPECT_EQ(s->durable_tokens(2, 1), kBlockTokens);
  EXPECT_EQ(fetch(*s, chain), (Names{700, 701}));
  EXPECT_EQ(stats(*s).prefix_blocks, 2u);
}

// disk_budget_bytes counts prefix blocks like chunks; a chunk put that
// would pass it drops the least recently used prefix blocks first (a cache
// of a cache), but only when that makes room.
TEST(KvStorePrefixBlocks, AChunkPutOverTheDiskBudgetDropsPrefixBlocksFirst) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const std::uint64_t vb = value_bytes(shape);
  const std::uint64_t step = testing::chunk_size(shape, decode_range(shape, 0));
  KvStoreOptions o = options();
  o.disk_budget_bytes = 3 * vb + 2 * step;
  auto s = open_store(tmp.file("kv"), o);
  const Block a = make_block(shape, 1, 0), b = make_block(shape, 2, 0), c = make_block(shape, 3, 0);
  EXPECT_EQ(put(*s, {a, b, c}), 3);
  EXPECT_EQ(fetch(*s, {a}), (Names{1}));  // B is now the least recently used
  const auto put_step = [&](int t) {
    const KvRange r = decode_range(shape, t);
    return s->put(chunk_key(9, 1, r), make_chunk(shape, 9, 1, r));
  };
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(put_step(t).ok()) << t;  // just fits
  EXPECT_EQ(stats(*s).prefix_evictions, 0u);
  auto third = put_step(2);
  ASSERT_TRUE(third.ok()) << third.error().to_string();
  EXPECT_EQ(*third, 3);
  KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_evictions, 1u);
  EXPECT_EQ(st.prefix_blocks, 2u);
  EXPECT_EQ(st.refused_writes, 0u);
  EXPECT_GE(st.compactions, 1u);  // the dropped block's space came back
  EXPECT_EQ(st.deleted_bytes, vb);
  EXPECT_FALSE(kept(*s, b));
  EXPECT_TRUE(kept(*s, c));
  EXPECT_TRUE(kept(*s, a));  // fetched last: C is the least recently used

  // A chunk too large even with every prefix block gone is refused, and
  // drops none of them.
  const KvRange prefill{0, shape.num_layers, 0, 16};
  auto refused = s->put(chunk_key(9, 2, prefill), make_chunk(shape, 9, 2, prefill));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::disk_full) << refused.error().to_string();
  st = stats(*s);
  EXPECT_EQ(st.prefix_blocks, 2u);
  EXPECT_EQ(st.prefix_evictions, 1u);
  EXPECT_EQ(st.refused_writes, 1u);

  // A new prefix block under the disk budget drops the least recently used
  // block too (C).
  const Block d = make_block(shape, 4, 0);
  EXPECT_EQ(put(*s, {d}), 1);
  EXPECT_FALSE(kept(*s, c));
  EXPECT_TRUE(kept(*s, a));
  EXPECT_TRUE(kept(*s, d));
  st = stats(*s);
  EXPECT_LE(st.prefix_bytes + st.chunk_bytes, o.disk_budget_bytes);
  EXPECT_EQ(s->durable_tokens(9, 1), 3);
}

TEST(KvStorePrefixBlocks, APrefixPutPastTheDiskBudgetIsRefused) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  KvStoreOptions o = options();
  o.disk_budget_bytes = value_bytes(shape) - 1;
  auto s = open_store(tmp.file("kv"), o);
  auto refused = s->put_prefix_blocks(std::vector<PrefixBlockWrite>{make_block(shape, 1, 0).write()});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::disk_full) << refused.error().to_string();
  const KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_blocks, 0u);
  EXPECT_EQ(st.prefix_bytes, 0u);
  EXPECT_EQ(st.refused_writes, 1u);
}

// Prefix blocks outlive jobs, so a node restarted with another model or KV
// dtype meets blocks of another shape, and a damaged record may be among
// them: the store opens (it does not call itself corrupt and move aside),
// drops those records from disk and keeps the blocks that fit.
TEST(KvStorePrefixBlocks, OpenDropsPrefixRecordsThatDoNotFitTheShape) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const Block b = make_block(shape, 11, 0), other = make_block(shape, 12, 0);
  const std::string key = block_key(shape, kSalt, b);
  const std::size_t good = value_bytes(shape);
  const std::string not_all_layers =
      encode_key(KvChunkKey{kPrefixBlockJobBit | kSalt, 13, KvRange{0, 2, 0, kBlockTokens}});
  const std::vector<std::pair<std::string, std::string>> records{
      {key, std::string(good - 1, 'x')},        // one byte short
      {key, std::string(good + 4, 'x')},        // a token too many
      {key, std::string(b.chunk.size(), 'x')},  // a chunk with no trailer
      {not_all_layers,
       std::string(testing::chunk_size(shape, KvRange{0, 2, 0, kBlockTokens}) + 16 + 4 * kBlockTokens, 'x')},
  };
  for (std::size_t i = 0; i < records.size(); ++i) {
    const std::string dir = tmp.file("bad" + std::to_string(i));
    {
      auto s = open_store(dir, options());
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(put(*s, {b, other}), 2);
    }
    {
      rocksdb::DB* raw = nullptr;
      ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
      std::unique_ptr<rocksdb::DB> db(raw);
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), records[i].first, records[i].second).ok());
    }
    {
      auto s = KvStore::open(dir, options());
      ASSERT_TRUE(s.ok()) << i << ": " << s.error().to_string();
      if (i < 3) EXPECT_FALSE(kept(**s, b)) << i << ": its record was damaged";
      else EXPECT_TRUE(kept(**s, b)) << i;
      EXPECT_TRUE(kept(**s, other)) << i;
      EXPECT_EQ(stats(**s).prefix_blocks, i < 3 ? 1u : 2u) << i;
    }
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string v;
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), records[i].first, &v).IsNotFound()) << i << ": dropped from disk";
  }
  // Another model's shape: every block is dropped, the store opens empty of them.
  const std::string dir = tmp.file("bad0");
  KvStoreOptions wider = options();
  wider.shape.head_dim *= 2;
  auto s = KvStore::open(dir, wider);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(stats(**s).prefix_blocks, 0u);
}

// A store opened with a smaller budget (or none) drops its least recently
// written blocks down to it at once, not only at the next put.
TEST(KvStorePrefixBlocks, OpenTrimsTheBlocksToASmallerBudget) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  const std::uint64_t vb = value_bytes(shape);
  const Block a = make_block(shape, 30, 0), b = make_block(shape, 20, 0), c = make_block(shape, 10, 0);
  {
    auto s = open_store(tmp.file("kv"), options(3 * vb));
    for (const Block& x : {a, b, c}) EXPECT_EQ(put(*s, {x}), 1);
  }
  {
    auto s = open_store(tmp.file("kv"), options(2 * vb));
    const KvStoreStats st = stats(*s);
    EXPECT_EQ(st.prefix_blocks, 2u);
    EXPECT_EQ(st.prefix_bytes, 2 * vb);
    EXPECT_EQ(st.prefix_evictions, 1u);
    EXPECT_FALSE(kept(*s, a)) << "the oldest write";
    EXPECT_TRUE(kept(*s, b));
    EXPECT_TRUE(kept(*s, c));
  }
  auto s = open_store(tmp.file("kv"), options(0));
  EXPECT_EQ(stats(*s).prefix_blocks, 0u);
  s.reset();
  s = open_store(tmp.file("kv"), options(3 * vb));
  EXPECT_EQ(stats(*s).prefix_blocks, 0u) << "the drops were written";
}

TEST(KvStorePrefixBlocks, InvalidInputIsRejectedAndStoresNothing) {
  TempDir tmp;
  const KvModelShape shape = small_shape();
  auto s = open_store(tmp.file("kv"), options());
  const Block kept_one = make_block(shape, 1, 0);
  EXPECT_EQ(put(*s, {kept_one}), 1);
  const KvStoreStats before = stats(*s);
  const Block good = make_block(shape, 2, 1);
  Block no_tokens = make_block(shape, 3, 2);
  no_tokens.tokens.clear();
  Block nothing = no_tokens;  // no tokens and a chunk of 0 positions to match
  nothing.chunk.clear();
  Block short_chunk = make_block(shape, 4, 3);
  short_chunk.chunk.pop_back();
  Block fewer_layers = make_block(shape, 5, 4);
  fewer_layers.chunk = make_chunk(shape, 0, 5, KvRange{0, shape.num_layers - 1, 0, kBlockTokens});
  Block too_many_tokens = make_block(shape, 6, 5);
  too_many_tokens.tokens.push_back(1);  // the chunk is of kBlockTokens positions
  for (const Block& bad : {no_tokens, nothing, short_chunk, fewer_layers, too_many_tokens}) {
    const std::vector<PrefixBlockWrite> writes{good.write(), bad.write()};
    auto r = s->put_prefix_blocks(writes);
    ASSERT_FALSE(r.ok()) << bad.name;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << r.error().to_string();
  }
  EXPECT_TRUE(fetch(*s, {good}).empty());
  const KvStoreStats after = stats(*s);
  EXPECT_EQ(after.prefix_blocks, before.prefix_blocks);
  EXPECT_EQ(after.prefix_bytes, before.prefix_bytes);
  EXPECT_EQ(after.prefix_evictions, 0u);
  EXPECT_EQ(after.refused_writes, 0u);
  EXPECT_TRUE(kept(*s, kept_one));
  EXPECT_EQ(put(*s, {good}), 1);  // and the store goes on
}

}  // namespace kvstore_kv_store_prefix_blocks_test
}  // namespace shardline::kvstore
