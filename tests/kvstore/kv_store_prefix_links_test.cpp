// The KV store's prefix links (issue 42: DéjàVu's token streaming from the
// end of a cached prefix): a request's positions [0, c) stored as a link to
// the prefix blocks the store keeps, not as its own chunks. Golden: a
// request that linked its head fetches the very bytes of one that streamed
// them.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/kv_store.hpp"
#include "tests/kvstore/kv_store_test_util.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_store_prefix_links_test {

using testing::make_chunk;
using testing::small_shape;
using testing::TempDir;

constexpr std::uint64_t kSalt = 0x5a17;
constexpr std::uint64_t kRoot = 0x2007;
constexpr int kBlockTokens = 4;
/// The request whose KV every prefix here is (make_chunk's (job, request)).
constexpr std::uint64_t kSourceJob = 0xb10c;
constexpr std::uint64_t kSourceRequest = 77;

struct Block {
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::byte> chunk;
};

/// A prompt of `count` full blocks: block i holds positions [4i, 4i + 4) of
/// the source request's KV, named name0 + i, the first's parent kRoot.
std::vector<Block> make_prompt(std::uint64_t name0, int count) {
  const KvModelShape s = small_shape();
  std::vector<Block> out;
  for (int i = 0; i < count; ++i) {
    Block b;
    b.name = name0 + static_cast<std::uint64_t>(i);
    b.parent = i == 0 ? kRoot : out.back().name;
    for (int t = 0; t < kBlockTokens; ++t) b.tokens.push_back(1000 + i * kBlockTokens + t);
    b.chunk = make_chunk(s, kSourceJob, kSourceRequest,
                         KvRange{0, s.num_layers, i * kBlockTokens, (i + 1) * kBlockTokens});
    out.push_back(std::move(b));
  }
  return out;
}

KvStoreOptions options(std::uint64_t prefix_budget_bytes = 1ull << 30) {
  return testing::prefix_store_options(prefix_budget_bytes);
}
using testing::open_store;

void put_blocks(KvStore& s, const std::vector<Block>& blocks) {
  std::vector<PrefixBlockWrite> writes;
  for (const Block& b : blocks) writes.push_back(PrefixBlockWrite{kSalt, b.name, b.parent, b.tokens, b.chunk});
  auto n = s.put_prefix_blocks(writes);
  ASSERT_TRUE(n.ok()) << n.error().to_string();
}

/// The link of `blocks` (its names and tokens live in `names` / `tokens`).
PrefixLinkWrite link_of(std::uint64_t job, std::uint64_t request, const std::vector<Block>& blocks,
                        std::vector<std::uint64_t>& names, std::vector<std::int32_t>& tokens) {
  names.clear();
  tokens.clear();
  for (const Block& b : blocks) {
    names.push_back(b.name);
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
  }
  return PrefixLinkWrite{job, request, kSalt, kRoot, names, tokens};
}

/// Puts the link of `blocks` for (job, request) with the source's chunk of
/// positions [tail_begin, tail_end) (none when equal); returns the acks.
std::vector<int> put_linked(KvStore& s, std::uint64_t job, std::uint64_t request, const std::vector<Block>& blocks,
                            int tail_begin, int tail_end) {
  const KvModelShape shape = small_shape();
  std::vector<std::uint64_t> names;
  std::vector<std::int32_t> tokens;
  const PrefixLinkWrite link = link_of(job, request, blocks, names, tokens);
  std::vector<std::byte> tail;
  std::vector<KvChunkWrite> writes;
  if (tail_end > tail_begin) {
    const KvRange r{0, shape.num_layers, tail_begin, tail_end};
    tail = make_chunk(shape, kSourceJob, kSourceRequest, r);
    writes.push_back(KvChunkWrite{KvChunkKey{job, request, r}, tail});
  }
  auto acks = s.put_many(writes, std::span<const PrefixLinkWrite>(&link, 1));
  EXPECT_TRUE(acks.ok()) << acks.error().to_string();
  return acks.ok() ? *acks : std::vector<int>{};
}

KvStoreStats stats(const KvStore& s) {
  auto st = s.stats();
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return st.ok() ? *st : KvStoreStats{};
}

/// The source's KV of positions [0, t), all layers: what a request that
/// streamed every position would fetch.
std::vector<std::byte> source_prefix(int t) {
  const KvModelShape s = small_shape();
  return make_chunk(s, kSourceJob, kSourceRequest, KvRange{0, s.num_layers, 0, t});
}

TEST(KvStorePrefixLinks, ALinkedHeadFetchesTheBytesOfAStreamedOne) {
  TempDir tmp;
  auto s = open_store(tmp.path(), options());
  const std::vector<Block> prompt = make_prompt(500, 3);
  put_blocks(*s, prompt);
  // Positions [0, 12) by the link, [12, 14) as the request's own chunk.
  const std::vector<int> acks = put_linked(*s, 1, 5, prompt, 12, 14);
  EXPECT_EQ(acks, (std::vector<int>{14, 14}));  // the chunk's request, then the link's
  EXPECT_EQ(s->durable_tokens(1, 5), 14);
  auto got = s->fetch_prefix(1, 5, 14);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(got->tokens, 14);
  EXPECT_EQ(got->chunk, source_prefix(14));
  // Shorter fetches cut inside a block.
  auto cut = s->fetch_prefix(1, 5, 6);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->chunk, source_prefix(6));
  // A fetch in parts: from inside a linked block, and from the tail on.
  const KvModelShape shape = small_shape();
  for (const int begin : {6, 12, 13}) {
    auto part = s->fetch_prefix(1, 5, 14, begin);
    ASSERT_TRUE(part.ok()) << part.error().to_string();
    EXPECT_EQ(part->tokens, 14);
    EXPECT_EQ(part->chunk, make_chunk(shape, kSourceJob, kSourceRequest, KvRange{0, shape.num_layers, begin, 14}))
        << "from " << begin;
  }
  auto none = s->fetch_prefix(1, 5, 14, 14);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->chunk.empty());
  const std::optional<StoredPrefixLink> link = s->prefix_link(1, 5);
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->names, (std::vector<std::uint64_t>{500, 501, 502}));
  EXPECT_EQ(link->root, kRoot);
  EXPECT_EQ(link->held_tokens, 12);
  EXPECT_EQ(link->tokens.size(), 12u);
  EXPECT_FALSE(s->prefix_link(1, 6).has_value());
  const KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_links, 1u);
  EXPECT_EQ(st.prefix_links_pending, 0u);
  EXPECT_EQ(st.prefix_pinned, 3u);
  EXPECT_EQ(st.linked_tokens, 12u);
  EXPECT_EQ(st.chunks, 1u);  // the link is not a chunk
}

TEST(KvStorePrefixLinks, APendingLinkCountsEachBlockWhenItArrives) {
  TempDir tmp;
  auto s = open_store(tmp.path(), options());
  const std::vector<Block> prompt = make_prompt(600, 3);
  // The link and the tail come before the blocks (the worker sends them on
  // two queues): nothing of the head counts yet.
  EXPECT_EQ(put_linked(*s, 1, 5, prompt, 12, 13), (std::vector<int>{0, 0}));
  EXPECT_EQ(stats(*s).prefix_links_pending, 1u);
  EXPECT_EQ(s->waiting_link_block(1, 5), std::optional<std::uint64_t>(600));
  put_blocks(*s, {prompt[1]});  // not the one it waits for
  EXPECT_EQ(s->durable_tokens(1, 5), 0);
  EXPECT_EQ(s->waiting_link_block(1, 5), std::optional<std::uint64_t>(600));
  EXPECT_TRUE(s->take_woken_links().empty());
  put_blocks(*s, {prompt[0]});  // block 0, then block 1 that was there
  EXPECT_EQ(s->durable_tokens(1, 5), 8);
  const std::vector<KvRequestCoverage> woken = s->take_woken_links();
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].request_id, 5u);
  EXPECT_EQ(woken[0].durable_tokens, 8);
  EXPECT_TRUE(s->take_woken_links().empty());
  EXPECT_EQ(s->waiting_link_block(1, 5), std::optional<std::uint64_t>(602));
  put_blocks(*s, {prompt[2]});
  EXPECT_EQ(s->durable_tokens(1, 5), 13);
  EXPECT_EQ(stats(*s).prefix_links_pending, 0u);
  EXPECT_FALSE(s->waiting_link_block(1, 5).has_value());
  // A link still waiting no longer holds anything back once the request's
  // own chunks cover its positions (its head was streamed as KV after all).
  const std::vector<Block> other = make_prompt(650, 2);
  EXPECT_EQ(put_linked(*s, 1, 6, other, 8, 9), (std::vector<int>{0, 0}));
  EXPECT_EQ(s->waiting_link_block(1, 6), std::optional<std::uint64_t>(650));
  const KvModelShape shape = small_shape();
  const KvRange head{0, shape.num_layers, 0, 8};
  auto acked = s->put(KvChunkKey{1, 6, head}, make_chunk(shape, kSourceJob, kSourceRequest, head));  // the head as KV
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(*acked, 9);
  EXPECT_FALSE(s->waiting_link_block(1, 6).has_value());
  auto got = s->fetch_prefix(1, 5, 100);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->tokens, 13);
  EXPECT_EQ(got->chunk, source_prefix(13));
}

TEST(KvStorePrefixLinks, ABlockThatDiffersEndsTheLink) {
  TempDir tmp;
  auto s = open_store(tmp.path(), options());
  std::vector<Block> prompt = make_prompt(700, 3);
  put_blocks(*s, prompt);
  // The request's second block has the same name but another token (a
  // 64-bit name collision, or a parent that is not the chain's): its
  // positions and everything after never count.
  std::vector<Block> other = prompt;
  other[1].tokens[2] += 1;
  EXPECT_EQ(put_linked(*s, 1, 5, other, 12, 14), (std::vector<int>{4, 4}));
  std::vector<Block> orphan = prompt;
  orphan[0].parent = kRoot + 1;  // its link says another root
  std::vector<std::uint64_t> names;
  std::vector<std::int32_t> tokens;
  PrefixLinkWrite l = link_of(1, 6, orphan, names, tokens);
  l.root = kRoot + 1;
  ASSERT_TRUE(s->put_many({}, std::span<const PrefixLinkWrite>(&l, 1)).ok());
  EXPECT_EQ(s->durable_tokens(1, 6), 0);
  const KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_links_pending, 0u);  // ended, not waiting
  EXPECT_EQ(st.prefix_pinned, 1u);         // only request 5's first block
}

TEST(KvStorePrefixLinks, LinkedBlocksAreNotDroppedUntilTheRequestIs) {
  TempDir tmp;
  const std::vector<Block> prompt = make_prompt(800, 2);
  const std::vector<Block> others = make_prompt(900, 3);
  const KvModelShape shape = small_shape();
  const std::uint64_t block_bytes =
      testing::chunk_size(shape, KvRange{0, shape.num_layers, 0, kBlockTokens}) + 16 + 4 * kBlockTokens;
  auto s = open_store(tmp.path(), options(3 * block_bytes));  // room for three blocks
  put_blocks(*s, prompt);
  (void)put_linked(*s, 1, 5, prompt, 8, 9);
  // Three more blocks: only one fits beside the two pinned ones, whatever
  // their age.
  put_blocks(*s, others);
  std::vector<PrefixBlockQuery> queries;
  for (const Block& b : prompt) queries.push_back(PrefixBlockQuery{b.name, b.parent, b.tokens});
  auto kept = s->fetch_prefix_blocks(kSalt, queries);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 2u);
  EXPECT_EQ(stats(*s).prefix_blocks, 3u);
  EXPECT_EQ(s->durable_tokens(1, 5), 9);
  // Once the request is dropped its blocks are unpinned and the budget may
  // drop them again.
  ASSERT_TRUE(s->drop_request(1, 5).ok());
  EXPECT_EQ(stats(*s).prefix_pinned, 0u);
  const std::vector<Block> fresh = make_prompt(950, 3);
  put_blocks(*s, fresh);  // three new ones take the whole budget
  for (const Block& b : prompt) EXPECT_FALSE(s->keeps_prefix_block(kSalt, b.name, kBlockTokens)) << b.name;
  for (const Block& b : fresh) EXPECT_TRUE(s->keeps_prefix_block(kSalt, b.name, kBlockTokens)) << b.name;
}

TEST(KvStorePrefixLinks, LinksSurviveAReopenAndDropJobReleasesThem) {
  TempDir tmp;
  const std::vector<Block> prompt = make_prompt(1000, 3);
  {
    auto s = open_store(tmp.path(), options());
    put_blocks(*s, {prompt[0], prompt[1]});
    (void)put_linked(*s, 3, 1, prompt, 12, 14);  // pending at block 2
    (void)put_linked(*s, 3, 2, {prompt[0]}, 4, 5);
    EXPECT_EQ(s->durable_tokens(3, 1), 8);
  }
  auto s = open_store(tmp.path(), options());
  EXPECT_EQ(s->durable_tokens(3, 1), 8);
  EXPECT_EQ(s->durable_tokens(3, 2), 5);
  KvStoreStats st = stats(*s);
  EXPECT_EQ(st.prefix_links, 2u);
  EXPECT_EQ(st.prefix_links_pending, 1u);
  EXPECT_EQ(st.prefix_pinned, 2u);
  // Still waiting after the reopen.
  put_blocks(*s, {prompt[2]});
  EXPECT_EQ(s->durable_tokens(3, 1), 14);
  auto got = s->fetch_prefix(3, 1, 14);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->chunk, source_prefix(14));
  ASSERT_TRUE(s->drop_job(3).ok());
  st = stats(*s);
  EXPECT_EQ(st.prefix_links, 0u);
  EXPECT_EQ(st.prefix_pinned, 0u);
  EXPECT_EQ(st.requests, 0u);
  s.reset();
  s = open_store(tmp.path(), options());
  EXPECT_EQ(stats(*s).prefix_links, 0u);  // the records went with the job's range
  EXPECT_EQ(stats(*s).prefix_blocks, 3u);
}

TEST(KvStorePrefixLinks, ALongerLinkReplacesAShorterOneAndAnotherIsIgnored) {
  TempDir tmp;
  auto s = open_store(tmp.path(), options());
  const std::vector<Block> prompt = make_prompt(1100, 3);
  put_blocks(*s, prompt);
  (void)put_linked(*s, 1, 5, {prompt[0]}, 4, 5);
  EXPECT_EQ(s->durable_tokens(1, 5), 5);
  (void)put_linked(*s, 1, 5, prompt, 12, 13);  // extends it
  EXPECT_EQ(s->durable_tokens(1, 5), 13);
  EXPECT_EQ(stats(*s).prefix_pinned, 3u);
  const std::vector<Block> unrelated = make_prompt(1200, 1);
  put_blocks(*s, unrelated);
  (void)put_linked(*s, 1, 5, unrelated, 4, 5);  // not an extension: ignored
  EXPECT_EQ(stats(*s).prefix_pinned, 3u);
  s.reset();
  s = open_store(tmp.path(), options());
  EXPECT_EQ(stats(*s).prefix_links, 1u);  // one record: the longer link's
  EXPECT_EQ(s->durable_tokens(1, 5), 13);
  auto got = s->fetch_prefix(1, 5, 13);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->chunk, source_prefix(13));
}

TEST(KvStorePrefixLinks, InvalidLinksAreRejectedAndTheBatchStoresNothing) {
  TempDir tmp;
  auto s = open_store(tmp.path(), options());
  const KvModelShape shape = small_shape();
  const KvRange r{0, shape.num_layers, 0, 1};
  const std::vector<std::byte> chunk = make_chunk(shape, 1, 5, r);
  const std::vector<KvChunkWrite> writes{KvChunkWrite{KvChunkKey{1, 5, r}, chunk}};
  const std::vector<std::uint64_t> names{1, 2};
  const std::vector<std::int32_t> odd{1, 2, 3};  // not a whole number of tokens per block
  const std::vector<std::int32_t> two{1, 2};
  const std::vector<PrefixLinkWrite> bad{
      PrefixLinkWrite{1, 6, kSalt, kRoot, {}, odd},
      PrefixLinkWrite{1, 6, kSalt, kRoot, names, odd},
      PrefixLinkWrite{kPrefixBlockJobBit | 1, 6, kSalt, kRoot, names, two},
  };
  for (const PrefixLinkWrite& l : bad) {
    auto r2 = s->put_many(writes, std::span<const PrefixLinkWrite>(&l, 1));
    ASSERT_FALSE(r2.ok());
    EXPECT_EQ(r2.error().code, ErrorCode::invalid_argument) << r2.error().to_string();
  }
  const KvStoreStats st = stats(*s);
  EXPECT_EQ(st.requests, 0u);  // the valid chunk of each batch was not stored either
  EXPECT_EQ(st.prefix_links, 0u);
  // A store of a model with the link's layer is refused.
  KvStoreOptions o = options();
  o.shape.num_layers = kPrefixLinkLayer + 1;
  TempDir other;
  auto refused = KvStore::open(other.path(), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
}

}  // namespace kvstore_kv_store_prefix_links_test
}  // namespace shardline::kvstore
