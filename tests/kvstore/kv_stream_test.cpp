// DéjàVuLib primitives (kvstore/kv_stream.hpp): gather / scatter on one rank,
// copy_out / copy_in / stream_out / stream_in / stream_out_batch over engine
// groups of many layouts, block sizes, dtypes and token ranges. Every check
// compares bits against reference accessors written from the layout's
// description (tests/kvstore/kv_test_util.hpp), so a round trip that is
// wrong both ways (e.g. no K transpose) still fails.
#include "kvstore/kv_stream.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvstore/kv_targets.hpp"
#include "tests/kvstore/kv_test_util.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_stream_test {

using namespace testing;  // NOLINT
using ::testing::HasSubstr;

constexpr int kHeads = 8;     // query heads of the test model
constexpr int kLayers = 5;    // odd, so pp=2 splits 3 + 2
constexpr int kHeadDim = 6;   // not a power of two
constexpr int kTokens = 37;   // the sequence's tokens in the caches

KvModelShape shape_of(int kv_heads, DType dtype) { return {kLayers, kv_heads, kHeadDim, dtype}; }

/// Expects `chunk` to be the canonical chunk of `range` of `src` (first holder of each head).
void expect_chunk_of(const Group& src, std::span<const std::int32_t> table, const KvRange& range,
                     std::span<const std::byte> chunk) {
  ASSERT_EQ(chunk.size(), chunk_bytes(src.shape, range));
  int bad = 0;
  for (int l = range.layer_begin; l < range.layer_end; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < src.shape.num_kv_heads; ++h) {
        const auto who = holders(src, l, h);
        ASSERT_FALSE(who.empty());
        for (int t = range.token_begin; t < range.token_end; ++t)
          for (int i = 0; i < src.shape.head_dim; ++i) {
            const auto want = cache_elem(src, who[0].first, table, l, kv, who[0].second, t, i);
            const auto got = chunk_elem(chunk, src.shape, range, l, kv, h, t, i);
            if (want != got && ++bad <= 3)
              ADD_FAILURE() << "chunk: layer " << l << (kv ? " V" : " K") << " head " << h << " token " << t
                            << " dim " << i << ": " << got << " != cache " << want;
          }
      }
  EXPECT_EQ(bad, 0) << "elements of the chunk differ from the cache";
}

/// Expects every holder in `dst` of each (layer, head, token) of `range` to hold the chunk's
/// element, and every other element of every cache to equal `before` (sentinels).
void expect_written(const Group& dst, const std::vector<std::vector<std::byte>>& before,
                    std::span<const std::int32_t> table, const KvRange& range, std::span<const std::byte> chunk) {
  const std::size_t es = dtype_size(dst.shape.dtype);
  int bad = 0;
  for (std::size_t r = 0; r < dst.layouts.size(); ++r) {
    const KvRankLayout& lay = dst.layouts[r];
    std::vector<bool> in_range(dst.memory[r].size() / es, false);
    for (int l = std::max(lay.layer_begin, range.layer_begin); l < std::min(lay.layer_end, range.layer_end); ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int s = 0; s < static_cast<int>(lay.kv_heads.size()); ++s)
          for (int t = range.token_begin; t < range.token_end; ++t)
            for (int i = 0; i < dst.shape.head_dim; ++i) {
              const std::size_t e = cache_index(dst, r, table, l, kv, s, t, i);
              in_range[e] = true;
              const auto want = chunk_elem(chunk, dst.shape, range, l, kv, lay.kv_heads[static_cast<std::size_t>(s)], t, i);
              const auto got = bits_at(dst.memory[r].data(), e, es);
              if (want != got && ++bad <= 3)
                ADD_FAILURE() << "rank " << r << " layer " << l << (kv ? " V" : " K") << " head "
                              << lay.kv_heads[static_cast<std::size_t>(s)] << " token " << t << " dim " << i << ": "
                              << got << " != chunk " << want;
            }
    for (std::size_t e = 0; e < in_range.size(); ++e) {
      if (!in_range[e] && bits_at(dst.memory[r].data(), e, es) != bits_at(before[r].data(), e, es) && ++bad <= 3)
        ADD_FAILURE() << "rank " << r << " element " << e << " outside the range was changed";
    }
  }
  EXPECT_EQ(bad, 0) << "elements differ";
}

// ---- sizes and layouts -------------------------------------------------------------

TEST(KvStream, ByteCounts) {
  const KvModelShape s{12, 12, 64, DType::f32};
  EXPECT_EQ(chunk_bytes(s, {0, 12, 5, 6}), 12u * 2 * 12 * 1 * 64 * 4);
  EXPECT_EQ(chunk_bytes({12, 4, 64, DType::bf16}, {2, 4, 0, 10}), 2u * 2 * 4 * 10 * 64 * 2);
  EXPECT_EQ(chunk_bytes(s, {3, 3, 0, 10}), 0u);
  const KvRankLayout l{4, 8, {1, 2, 3}, 10, 16};
  EXPECT_EQ(cache_bytes(s, l), 4u * 2 * 10 * 3 * 16 * 64 * 4);
  EXPECT_EQ(gather_bytes(s, l, {6, 12, 3, 7}), 2u * 2 * 3 * 4 * 64 * 4);  // layers 6, 7
  EXPECT_EQ(gather_bytes(s, l, {8, 12, 3, 7}), 0u);                    // none of its layers
}

TEST(KvStream, CheckLayoutNamesTheField) {
  const KvModelShape s{4, 4, 8, DType::f16};
  EXPECT_TRUE(check_layout(s, {0, 4, {0, 1, 2, 3}, 8, 4}).ok());
  struct Case {
    KvRankLayout layout;
    const char* field;
  } cases[] = {
      {{-1, 2, {0}, 8, 4}, "layer_begin"}, {{0, 5, {0}, 8, 4}, "layer_end"},   {{2, 2, {0}, 8, 4}, "layer_begin"},
      {{0, 4, {}, 8, 4}, "kv_heads"},      {{0, 4, {4}, 8, 4}, "kv_heads[0]"}, {{0, 4, {1, -1}, 8, 4}, "kv_heads[1]"},
      {{0, 4, {1, 1}, 8, 4}, "repeated"},  {{0, 4, {0}, 0, 4}, "num_blocks"},  {{0, 4, {0}, 8, 0}, "block_size"},
  };
  for (const Case& c : cases) {
    Status st = check_layout(s, c.layout);
    ASSERT_FALSE(st.ok()) << c.field;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_THAT(st.error().message, HasSubstr(c.field));
  }
  EXPECT_THAT(check_layout({0, 4, 8, DType::f32}, {0, 1, {0}, 1, 1}).error().message, HasSubstr("num_layers"));
  EXPECT_THAT(check_layout({4, 0, 8, DType::f32}, {0, 1, {0}, 1, 1}).error().message, HasSubstr("num_kv_heads"));
  EXPECT_THAT(check_layout({4, 4, 0, DType::f32}, {0, 1, {0}, 1, 1}).error().message, HasSubstr("head_dim"));
}

// ---- gather / scatter on one rank ------------------------------------------------------

TEST(KvStream, GatherReadsTheLayoutAndScatterWritesOnlyTheRange) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int bs : {1, 4, 16})
      for (KvRange range : {KvRange{0, kLayers, 0, kTokens}, KvRange{1, 4, 5, 23}, KvRange{2, 3, 17, 18},
                            KvRange{0, 2, 3, 4}}) {
        // A pp stage holding layers [1, 4) and heads {1, 3} of 4: gather takes its part.
        const KvModelShape s = shape_of(4, dt);
        const int nb = blocks_for(kTokens, bs) + 2;
        Group g;
        g.shape = s;
        g.layouts = {{1, 4, {3, 1}, nb, bs}};
        g.memory.emplace_back(cache_bytes(s, g.layouts[0]));
        g.views = {{g.memory[0].data(), g.layouts[0]}};
        SCOPED_TRACE(std::string(dtype_name(dt)) + " bs " + std::to_string(bs) + " layers [" +
                     std::to_string(range.layer_begin) + "," + std::to_string(range.layer_end) + ") tokens [" +
                     std::to_string(range.token_begin) + "," + std::to_string(range.token_end) + ")");
        fill_random(g, 11);
        const auto tbl = random_table(blocks_for(kTokens, bs), nb, 5);
        const int l0 = std::max(1, range.layer_begin), l1 = std::min(4, range.layer_end);
        std::vector<std::byte> out(gather_bytes(s, g.layouts[0], range));
        ASSERT_TRUE(gather(s, g.views[0], tbl, range, out).ok());
        const std::size_t es = dtype_size(dt);
        std::size_t e = 0;
        int bad = 0;
        for (int l = l0; l < l1; ++l)
          for (int kv = 0; kv < 2; ++kv)
            for (int slot = 0; slot < 2; ++slot)
              for (int tok = range.token_begin; tok < range.token_end; ++tok)
                for (int i = 0; i < kHeadDim; ++i, ++e)
                  bad += bits_at(out.data(), e, es) != cache_elem(g, 0, tbl, l, kv, slot, tok, i);
        EXPECT_EQ(e * es, out.size());
        EXPECT_EQ(bad, 0) << "gathered elements differ from the cache";

        // Scatter a random buffer: exactly the range's elements change.
        std::vector<std::byte> in(out.size());
        fill_random(in, 99);
        const std::vector<std::vector<std::byte>> before = g.memory;
        ASSERT_TRUE(scatter(s, g.views[0], tbl, range, in).ok());
        e = 0;
        bad = 0;
        std::vector<bool> touched(g.memory[0].size() / es, false);
        for (int l = l0; l < l1; ++l)
          for (int kv = 0; kv < 2; ++kv)
            for (int slot = 0; slot < 2; ++slot)
              for (int tok = range.token_begin; tok < range.token_end; ++tok)
                for (int i = 0; i < kHeadDim; ++i, ++e) {
                  const std::size_t idx = cache_index(g, 0, tbl, l, kv, slot, tok, i);
                  touched[idx] = true;
                  bad += bits_at(g.memory[0].data(), idx, es) != bits_at(in.data(), e, es);
                }
        for (std::size_t i = 0; i < touched.size(); ++i)
          bad += !touched[i] && bits_at(g.memory[0].data(), i, es) != bits_at(before[0].data(), i, es);
        EXPECT_EQ(bad, 0) << "scatter wrote wrong elements or touched others";
      }
}

TEST(KvStream, GatherAndScatterErrors) {
  const KvModelShape s = shape_of(2, DType::f32);
  const KvRankLayout lay{0, kLayers, {0, 1}, 4, 4};
  std::vector<std::byte> mem(cache_bytes(s, lay));
  const KvCacheView v{mem.data(), lay};
  const std::vector<std::int32_t> table{0, 1, 2};
  const KvRange r{0, 2, 2, 12};
  std::vector<std::byte> buf(gather_bytes(s, lay, r));
  auto message = [](const Status& st) { return st.ok() ? std::string("ok") : st.error().to_string(); };
  EXPECT_THAT(message(gather(s, v, std::vector<std::int32_t>{0, 1}, r, buf)), HasSubstr("block_table has 2"));
  EXPECT_THAT(message(gather(s, v, std::vector<std::int32_t>{0, 4, 1}, r, buf)), HasSubstr("block_table[1] = 4"));
  EXPECT_THAT(message(gather(s, v, std::vector<std::int32_t>{0, -1, 1}, r, buf)), HasSubstr("block_table[1] = -1"));
  EXPECT_THAT(message(gather(s, v, table, r, std::span(buf).first(buf.size() - 1))), HasSubstr("out has"));
  EXPECT_THAT(message(scatter(s, v, table, r, std::span<const std::byte>(buf).first(buf.size() - 4))),
              HasSubstr("in has"));
  EXPECT_THAT(message(gather(s, v, table, {0, 2, 5, 5}, buf)), HasSubstr("tokens must be non-empty"));
  EXPECT_THAT(message(gather(s, v, table, {0, 9, 0, 1}, buf)), HasSubstr("num_layers"));
  EXPECT_THAT(message(gather(s, KvCacheView{nullptr, lay}, table, r, buf)), HasSubstr("data is null"));
  EXPECT_THAT(message(gather(s, KvCacheView{mem.data(), {0, 2, {0, 2}, 4, 4}}, table, r, buf)),
              HasSubstr("kv_heads[1]"));
  // The block of token_begin's first block is the first one checked: a bad
  // entry before it is not read and not an error.
  EXPECT_TRUE(gather(s, v, std::vector<std::int32_t>{-7, 1, 2}, {0, 1, 4, 12}, buf).ok());
}

// ---- group round trips ---------------------------------------------------------------

struct Layout {
  int kv_heads, tp, sp, pp;
};
const Layout kLayouts[] = {
    {4, 1, 1, 1}, {4, 2, 1, 1}, {4, 4, 1, 1}, {4, 1, 1, 2}, {4, 2, 1, 2}, {4, 1, 2, 1},
    {4, 2, 2, 1}, {2, 4, 1, 1},  // tp=4 over 2 KV heads: each head on two ranks
    {2, 2, 2, 2},                // SP replication too
    {1, 2, 1, 1},                // MQA: every rank holds the one head
};

TEST(KvStream, RoundTripsAreBitIdenticalAcrossLayouts) {
  int cases = 0;
  for (const Layout& lo : kLayouts)
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (int bs : {1, 4, 16}) {
        const KvModelShape s = shape_of(lo.kv_heads, dt);
        const int nb = blocks_for(kTokens, bs) + 3;
        Group src = make_group(s, kHeads, lo.tp, lo.sp, lo.pp, nb, bs);
        Group dst = make_group(s, kHeads, lo.tp, lo.sp, lo.pp, nb, bs);
        fill_random(src, 1);
        const auto stable = random_table(blocks_for(kTokens, bs), nb, 2);
        const auto dtable = random_table(blocks_for(kTokens, bs), nb, 3);
        for (KvRange range : {KvRange{0, kLayers, 0, kTokens},   // a whole prompt
                              KvRange{0, kLayers, kTokens - 1, kTokens},  // one decode token
                              KvRange{1, 4, 3, 29},              // mid-block start and end
                              KvRange{2, 5, 16, 17}}) {          // a block's first token
          SCOPED_TRACE(src.name + " layers [" + std::to_string(range.layer_begin) + "," +
                       std::to_string(range.layer_end) + ") tokens [" + std::to_string(range.token_begin) + "," +
                       std::to_string(range.token_end) + ")");
          ++cases;
          std::vector<std::byte> chunk(chunk_bytes(s, range));
          ASSERT_TRUE(copy_out(s, src.views, stable, range, chunk).ok());
          expect_chunk_of(src, stable, range, chunk);
          fill_random(dst, 7);
          const auto before = dst.memory;
          ASSERT_TRUE(copy_in(s, dst.views, dtable, range, chunk).ok());
          expect_written(dst, before, dtable, range, chunk);
          std::vector<std::byte> again(chunk.size());
          ASSERT_TRUE(copy_out(s, dst.views, dtable, range, again).ok());
          EXPECT_TRUE(again == chunk) << "round trip is not bit-identical";
        }
      }
  EXPECT_EQ(cases, 10 * 3 * 3 * 4);
}

// A group whose ranks are remote (a TCP group's rank 0 asks each rank for its
// gathered part and merges; engine/group/parallel_executor.hpp): merge_part over
// every rank in reverse order is copy_out, split_part + scatter is copy_in.
TEST(KvStream, PartsMergedAndSplitEqualTheGroupCopies) {
  int cases = 0;
  for (const Layout& lo : kLayouts)
    for (DType dt : {DType::f32, DType::bf16}) {
      const int bs = 4;
      const KvModelShape s = shape_of(lo.kv_heads, dt);
      const int nb = blocks_for(kTokens, bs) + 3;
      Group src = make_group(s, kHeads, lo.tp, lo.sp, lo.pp, nb, bs);
      fill_random(src, 11);
      const auto table = random_table(blocks_for(kTokens, bs), nb, 5);
      for (KvRange range : {KvRange{0, kLayers, 0, kTokens}, KvRange{1, 4, 3, 29}}) {
        SCOPED_TRACE(src.name + " tokens [" + std::to_string(range.token_begin) + "," +
                     std::to_string(range.token_end) + ")");
        ++cases;
        std::vector<std::byte> want(chunk_bytes(s, range));
        ASSERT_TRUE(copy_out(s, src.views, table, range, want).ok());
        std::vector<std::byte> merged(want.size(), std::byte{0x5a});
        for (std::size_t r = src.views.size(); r-- > 0;) {
          std::vector<std::byte> part(gather_bytes(s, src.layouts[r], range));
          ASSERT_TRUE(gather(s, src.views[r], table, range, part).ok());
          ASSERT_TRUE(merge_part(s, src.layouts[r], range, part, merged).ok());
        }
        EXPECT_TRUE(merged == want) << "merged parts differ from copy_out";
        std::vector<std::byte> via_copier(want.size());
        KvViewsCopier copier(s, src.views);
        EXPECT_EQ(copier.num_devices(), static_cast<int>(src.views.size()));
        ASSERT_TRUE(copier.copy_out(table, range, via_copier).ok());
        EXPECT_TRUE(via_copier == want);

        Group by_copy_in = make_group(s, kHeads, lo.tp, lo.sp, lo.pp, nb, bs);
        Group by_parts = make_group(s, kHeads, lo.tp, lo.sp, lo.pp, nb, bs);
        fill_random(by_copy_in, 3);
        fill_random(by_parts, 3);
        ASSERT_TRUE(copy_in(s, by_copy_in.views, table, range, want).ok());
        for (std::size_t r = 0; r < by_parts.views.size(); ++r) {
          std::vector<std::byte> part(gather_bytes(s, by_parts.layouts[r], range));
          ASSERT_TRUE(split_part(s, by_parts.layouts[r], range, want, part).ok());
          if (!part.empty()) {
            ASSERT_TRUE(scatter(s, by_parts.views[r], table, range, part).ok());
          }
        }
        EXPECT_TRUE(by_parts.memory == by_copy_in.memory) << "split + scatter differs from copy_in";
      }
    }
  EXPECT_EQ(cases, 10 * 2 * 2);
}

TEST(KvStream, PartErrorsNameTheBuffers) {
  const KvModelShape s = shape_of(2, DType::f32);
  Group g = make_group(s, kHeads, 2, 1, 1, 8, 4);
  const KvRange range{0, kLayers, 0, 9};
  std::vector<std::byte> chunk(chunk_bytes(s, range));
  std::vector<std::byte> part(gather_bytes(s, g.layouts[0], range) - 1);
  const Status m = merge_part(s, g.layouts[0], range, part, chunk);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::invalid_argument);
  EXPECT_THAT(m.error().message, HasSubstr("merge_part: chunk of"));
  const Status sp = split_part(s, g.layouts[0], KvRange{0, kLayers, 5, 5}, chunk, part);
  ASSERT_FALSE(sp.ok());
  EXPECT_THAT(sp.error().message, HasSubstr("split_part"));
}

TEST(KvStream, CrossLayoutStreamThroughAMemoryTarget) {
  // Out of tp=2 (block 4), into tp=4 x pp=2 (block 16, another table and cache size).
  for (int kvh : {4, 2})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const KvModelShape s = shape_of(kvh, dt);
      Group src = make_group(s, kHeads, 2, 1, 1, 14, 4);
      Group dst = make_group(s, kHeads, 4, 1, 2, 9, 16);
      SCOPED_TRACE(src.name + " -> " + dst.name);
      fill_random(src, 21);
      fill_random(dst, 22);
      const auto before = dst.memory;
      const auto stable = random_table(blocks_for(kTokens, 4), 14, 23);
      const auto dtable = random_table(blocks_for(kTokens, 16), 9, 24);
      MemoryKvTarget target;
      const KvRange all{0, kLayers, 0, kTokens};
      const KvChunkKey key{3, 9, all};
      ASSERT_TRUE(stream_out(s, src.views, stable, all, target, key).ok());
      EXPECT_EQ(target.stats().chunks, 1u);
      EXPECT_EQ(target.stats().bytes, chunk_bytes(s, all));
      ASSERT_TRUE(stream_in(s, dst.views, dtable, all, target, key).ok());
      // Every (layer, head, token) element of every holder equals the source's.
      int bad = 0, checked = 0;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kvh; ++h) {
          const auto from = holders(src, l, h)[0];
          const auto to = holders(dst, l, h);
          EXPECT_EQ(to.size(), kvh == 2 ? 2u : 1u);
          for (const auto& [r, slot] : to)
            for (int kv = 0; kv < 2; ++kv)
              for (int t = 0; t < kTokens; ++t)
                for (int i = 0; i < kHeadDim; ++i, ++checked)
                  bad += cache_elem(dst, r, dtable, l, kv, slot, t, i) !=
                         cache_elem(src, from.first, stable, l, kv, from.second, t, i);
        }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(checked, kLayers * kvh * 2 * kTokens * kHeadDim * (kvh == 2 ? 2 : 1));
      auto chunk = target.fetch(key);
      ASSERT_TRUE(chunk.ok());
      expect_written(dst, before, dtable, all, *chunk);
    }
}

TEST(KvStream, DecodeIncrementsAccumulate) {
  // A prompt streamed layer by layer, then one token per step: the store's chunks rebuild the cache.
  const KvModelShape s = shape_of(4, DType::bf16);
  Group src = make_group(s, kHeads, 2, 1, 2, 12, 4);
  Group dst = make_group(s, kHeads, 1, 2, 1, 20, 2);
  fill_random(src, 31);
  fill_random(dst, 32);
  const auto before = dst.memory;
  const auto stable = random_table(blocks_for(kTokens, 4), 12, 33);
  const auto dtable = random_table(blocks_for(kTokens, 2), 20, 34);
  MemoryKvTarget target;
  const int prompt = 13;
  std::vector<KvChunkKey> keys;
  for (int l = 0; l < kLayers; ++l) keys.push_back({1, 2, {l, l + 1, 0, prompt}});
  for (int t = prompt; t < kTokens; ++t) keys.push_back({1, 2, {0, kLayers, t, t + 1}});
  for (const KvChunkKey& k : keys) ASSERT_TRUE(stream_out(s, src.views, stable, k.range, target, k).ok());
  EXPECT_EQ(target.stats().chunks, keys.size());
  EXPECT_EQ(target.stats().bytes, chunk_bytes(s, {0, kLayers, 0, kTokens}));
  for (const KvChunkKey& k : keys) ASSERT_TRUE(stream_in(s, dst.views, dtable, k.range, target, k).ok());
  std::vector<std::byte> want(chunk_bytes(s, {0, kLayers, 0, kTokens}));
  ASSERT_TRUE(copy_out(s, src.views, stable, {0, kLayers, 0, kTokens}, want).ok());
  expect_written(dst, before, dtable, {0, kLayers, 0, kTokens}, want);
}

// ---- batches ---------------------------------------------------------------------------

/// Counts transfers and keeps what arrives.
class CountingTarget final : public KvTarget {
 public:
  Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) override {
    ++flushes;
    return store.flush(key, chunk);
  }
  Result<std::vector<std::byte>> fetch(const KvChunkKey& key) override { return store.fetch(key); }
  Status flush_batch(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer) override {
    ++batches;
    return store.flush_batch(chunks, buffer);
  }
  int flushes = 0, batches = 0;
  MemoryKvTarget store;
};

TEST(KvStream, StreamOutIsOneTransferAndBatchIsOneForAll) {
  const KvModelShape s = shape_of(2, DType::f16);
  Group src = make_group(s, kHeads, 4, 1, 2, 40, 4);
  fill_random(src, 41);
  std::vector<std::vector<std::int32_t>> tables;
  for (int i = 0; i < 3; ++i) {
    auto t = random_table(40, 40, 42);
    tables.emplace_back(t.begin() + i * 12, t.begin() + i * 12 + 10);  // disjoint blocks per sequence
  }
  const KvRange ranges[] = {{0, kLayers, 30, 31}, {0, kLayers, 0, 17}, {2, 4, 5, 6}};
  CountingTarget one;
  ASSERT_TRUE(stream_out(s, src.views, tables[1], ranges[1], one, {5, 1, ranges[1]}).ok());
  EXPECT_EQ(one.flushes, 1);  // 5 layers x K|V x 2 heads x 5 blocks of pieces, one transfer

  std::vector<KvStreamItem> items;
  for (int i = 0; i < 3; ++i) items.push_back({tables[static_cast<std::size_t>(i)], ranges[i], {5, static_cast<std::uint64_t>(i), ranges[i]}});
  CountingTarget batch;
  ASSERT_TRUE(stream_out_batch(s, src.views, items, batch).ok());
  EXPECT_EQ(batch.batches, 1);
  EXPECT_EQ(batch.flushes, 0);
  EXPECT_EQ(batch.store.stats().chunks, 3u);
  for (int i = 0; i < 3; ++i) {
    auto c = batch.store.fetch(items[static_cast<std::size_t>(i)].key);
    ASSERT_TRUE(c.ok());
    expect_chunk_of(src, tables[static_cast<std::size_t>(i)], ranges[i], *c);
  }

  // The default flush_batch (a target without its own) flushes each chunk.
  class Plain final : public KvTarget {
   public:
    Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) override { return m.flush(key, chunk); }
    Result<std::vector<std::byte>> fetch(const KvChunkKey& key) override { return m.fetch(key); }
    MemoryKvTarget m;
  } plain;
  ASSERT_TRUE(stream_out_batch(s, src.views, items, plain).ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(*plain.m.fetch(items[static_cast<std::size_t>(i)].key) == *batch.store.fetch(items[static_cast<std::size_t>(i)].key));

  // An invalid item: nothing is flushed.
  items[2].block_table = std::span(tables[2]).first(1);
  CountingTarget none;
  Status st = stream_out_batch(s, src.views, items, none);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message, HasSubstr("items[2]"));
  EXPECT_EQ(none.batches + none.flushes, 0);
  EXPECT_TRUE(stream_out_batch(s, src.views, {}, none).ok());
  EXPECT_EQ(none.batches + none.flushes, 0);
}

// ---- group errors --------------------------------------------------------------------------

TEST(KvStream, GroupErrorsLeaveCachesUntouched) {
  const KvModelShape s = shape_of(4, DType::f32);
  Group g = make_group(s, kHeads, 2, 1, 2, 12, 4);  // ranks: stage 0 (t0, t1), stage 1 (t0, t1)
  fill_random(g, 51);
  const auto table = random_table(blocks_for(kTokens, 4), 12, 52);
  const KvRange all{0, kLayers, 0, kTokens};
  MemoryKvTarget target;
  const KvChunkKey key{1, 1, all};
  ASSERT_TRUE(stream_out(s, g.views, table, all, target, key).ok());
  const auto before = g.memory;
  auto message = [](const Status& st) { return st.ok() ? std::string("ok") : st.error().to_string(); };

  // A head nobody holds: drop stage 1's tp rank 1 (heads 2, 3 of layers 3, 4).
  const std::vector<KvCacheView> missing_head{g.views[0], g.views[1], g.views[2]};
  EXPECT_THAT(message(stream_in(s, missing_head, table, all, target, key)), HasSubstr("layer 3 KV head 2"));
  EXPECT_THAT(message(stream_in(s, missing_head, table, all, target, key)), HasSubstr("held by no rank"));
  std::vector<std::byte> chunk(chunk_bytes(s, all));
  EXPECT_THAT(message(copy_out(s, missing_head, table, all, chunk)), HasSubstr("held by no rank"));
  // ... but a range of stage 0's layers only needs stage 0.
  EXPECT_TRUE(copy_out(s, std::span(g.views).first(2), table, {0, 3, 0, kTokens},
                       std::span(chunk).first(chunk_bytes(s, {0, 3, 0, kTokens}))).ok());
  // A layer nobody holds: stage 1 missing.
  EXPECT_THAT(message(copy_in(s, std::span(g.views).first(2), table, all, chunk)), HasSubstr("layer 3"));
  // Short table, bad block ids.
  EXPECT_THAT(message(stream_in(s, g.views, std::span(table).first(9), all, target, key)),
              HasSubstr("block_table has 9"));
  auto bad = table;
  bad[4] = 12;
  EXPECT_THAT(message(stream_in(s, g.views, bad, all, target, key)), HasSubstr("block_table[4] = 12"));
  bad[4] = -3;
  EXPECT_THAT(message(stream_out(s, g.views, bad, all, target, key)), HasSubstr("block_table[4] = -3"));
  // Wrong chunk sizes.
  const KvChunkKey short_key{1, 2, all};
  ASSERT_TRUE(target.flush(short_key, std::span(chunk).first(chunk.size() - 4)).ok());
  EXPECT_THAT(message(stream_in(s, g.views, table, all, target, short_key)), HasSubstr("fetched chunk has"));
  EXPECT_THAT(message(copy_in(s, g.views, table, all, std::span<const std::byte>(chunk).first(8))), HasSubstr("chunk has 8"));
  EXPECT_THAT(message(copy_out(s, g.views, table, all, std::span(chunk).first(8))), HasSubstr("chunk has 8"));
  // Not found.
  Status nf = stream_in(s, g.views, table, all, target, {1, 77, all});
  ASSERT_FALSE(nf.ok());
  EXPECT_EQ(nf.error().code, ErrorCode::not_found);
  // Key and range disagree; no ranks; a layout that disagrees with the shape.
  EXPECT_THAT(message(stream_out(s, g.views, table, {0, 1, 0, 1}, target, key)), HasSubstr("key.range"));
  EXPECT_THAT(message(stream_in(s, {}, table, all, target, key)), HasSubstr("ranks is empty"));
  std::vector<KvCacheView> wrong = g.views;
  wrong[3].layout.layer_end = kLayers + 1;
  EXPECT_THAT(message(stream_in(s, wrong, table, all, target, key)), HasSubstr("ranks[3].layout"));

  for (std::size_t r = 0; r < g.memory.size(); ++r) EXPECT_TRUE(g.memory[r] == before[r]) << "rank " << r << " changed";
}

}  // namespace
}  // namespace shardline::kvstore
