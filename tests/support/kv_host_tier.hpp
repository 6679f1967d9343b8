#pragma once
// A host tier laid out like one whole-model KV cache, for tests that play
// the KV store: streamed increments are merged into it with
// kvstore::copy_in and a request's prefix is cut back out with copy_out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kvstore/kv_stream.hpp"

namespace shardline::testing_support {

/// A host tier laid out like one whole-model cache (every layer and head),
/// one block per 16 positions in order: increments are merged into it with
/// copy_in and cut back out with copy_out, as a KV store would.
struct HostTier {
  kvstore::KvModelShape shape;
  kvstore::KvCacheView view;
  std::vector<std::byte> memory;
  std::vector<std::int32_t> table;
  int covered = 0;  ///< positions [0, covered) merged, contiguously
  int end = 0;      ///< one past the last position merged

  explicit HostTier(const kvstore::KvModelShape& s, int max_tokens = 256) : shape(s) {
    view.layout.layer_begin = 0;
    view.layout.layer_end = s.num_layers;
    for (int h = 0; h < s.num_kv_heads; ++h) view.layout.kv_heads.push_back(h);
    view.layout.block_size = 16;
    view.layout.num_blocks = (max_tokens + 15) / 16;
    memory.resize(kvstore::cache_bytes(s, view.layout));
    view.data = memory.data();
    table.resize(static_cast<std::size_t>(view.layout.num_blocks));
    std::iota(table.begin(), table.end(), 0);
  }
  /// Merges one increment's chunk for `range` (its positions, all layers).
  void merge(const kvstore::KvRange& range, std::span<const std::byte> chunk) {
    ASSERT_TRUE(kvstore::copy_in(shape, std::span(&view, 1), table, range, chunk).ok());
    const kvstore::KvRange& r = range;
    if (r.token_begin <= covered) covered = std::max(covered, r.token_end);
    end = std::max(end, r.token_end);
  }
  std::vector<std::byte> prefix(int num_tokens) const {
    const kvstore::KvRange range{0, shape.num_layers, 0, num_tokens};
    std::vector<std::byte> chunk(kvstore::chunk_bytes(shape, range));
    EXPECT_TRUE(kvstore::copy_out(shape, std::span(&view, 1), table, range, chunk).ok());
    return chunk;
  }
};

}  // namespace shardline::testing_support
