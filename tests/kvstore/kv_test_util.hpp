#pragma once
// Helpers of the KV streaming tests: the paged KV caches of a (tp, sp, pp)
// engine group, laid out as model/shard_runner.cpp lays them out, filled
// with random bit patterns, and reference accessors written from the layout's
// description (kvstore/kv_stream.hpp, kernels/cpu/attention.cpp write_kv),
// independently of the library's copy loops.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/kv_stream.hpp"
#include "model/shard_runner.hpp"

namespace shardline::kvstore::testing {

/// Model KV heads of rank (tp_rank, sp_rank) of a group, as model/shard_runner.cpp
/// assigns them (query heads H, KV heads kvh).
inline std::vector<int> rank_kv_heads(int H, int kvh, int tp, int sp, int tp_rank, int sp_rank) {
  const int group = H / kvh, hq_t = H / tp, hq_attn = hq_t / sp;
  const int kv_attn = std::max(1, hq_attn / group);
  const int first = (tp_rank * hq_t + sp_rank * hq_attn) / group;
  std::vector<int> heads(static_cast<std::size_t>(kv_attn));
  std::iota(heads.begin(), heads.end(), first);
  return heads;
}

/// The caches of one engine group, in group rank order (docs/parallel.md):
/// rank = stage * (sp * tp) + sp_rank * tp + tp_rank.
struct Group {
  KvModelShape shape;
  std::vector<KvRankLayout> layouts;
  std::vector<std::vector<std::byte>> memory;
  std::vector<KvCacheView> views;
  std::string name;
};

inline Group make_group(const KvModelShape& shape, int H, int tp, int sp, int pp, int num_blocks,
                        int block_size) {
  Group g;
  g.shape = shape;
  g.name = "tp" + std::to_string(tp) + "_sp" + std::to_string(sp) + "_pp" + std::to_string(pp) + "_kvh" +
           std::to_string(shape.num_kv_heads) + "_bs" + std::to_string(block_size) + "_" + dtype_name(shape.dtype);
  for (int s = 0; s < pp; ++s) {
    const auto [l0, l1] = model::stage_layer_range(shape.num_layers, pp, s);
    for (int r = 0; r < sp; ++r) {
      for (int t = 0; t < tp; ++t) {
        g.layouts.push_back({l0, l1, rank_kv_heads(H, shape.num_kv_heads, tp, sp, t, r), num_blocks, block_size});
      }
    }
  }
  for (const KvRankLayout& l : g.layouts) g.memory.emplace_back(cache_bytes(shape, l));
  for (std::size_t r = 0; r < g.layouts.size(); ++r) g.views.push_back({g.memory[r].data(), g.layouts[r]});
  return g;
}

/// Random bit patterns (for 16-bit dtypes: random uint16 bits, NaNs and all).
inline void fill_random(std::span<std::byte> bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  for (; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(rng());
}

inline void fill_random(Group& g, std::uint64_t seed) {
  for (std::size_t r = 0; r < g.memory.size(); ++r) fill_random(g.memory[r], seed * 1000003 + r);
}

/// A block table of `num_logical` entries: a seeded permutation of distinct
/// physical blocks in [0, num_blocks).
inline std::vector<std::int32_t> random_table(int num_logical, int num_blocks, std::uint64_t seed) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(num_blocks));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<std::size_t>(num_logical));
  return all;
}

/// Bits of one element at byte offset `elem * esize`.
inline std::uint32_t bits_at(const std::byte* base, std::size_t elem, std::size_t esize) {
  std::uint32_t v = 0;
  std::memcpy(&v, base + elem * esize, esize);
  return v;
}

/// Element index of (layer, kv, local slot, token, dim) in rank `r`'s cache, from the layout
/// description: slab (layer_local, kv, block, slot) of block_size * head_dim elements, K at
/// [dim][offset], V at [offset][dim].
inline std::size_t cache_index(const Group& g, std::size_t r, std::span<const std::int32_t> table, int layer, int kv,
                               int slot, int token, int dim) {
  const KvRankLayout& l = g.layouts[r];
  const std::size_t d = static_cast<std::size_t>(g.shape.head_dim), bs = static_cast<std::size_t>(l.block_size);
  const std::size_t block = static_cast<std::size_t>(table[static_cast<std::size_t>(token) / bs]);
  const std::size_t off = static_cast<std::size_t>(token) % bs;
  const std::size_t slab =
      (((static_cast<std::size_t>(layer - l.layer_begin) * 2 + static_cast<std::size_t>(kv)) * l.num_blocks + block) *
           l.kv_heads.size() + static_cast<std::size_t>(slot)) * bs * d;
  return slab + (kv == 0 ? static_cast<std::size_t>(dim) * bs + off : off * d + static_cast<std::size_t>(dim));
}

inline std::uint32_t cache_elem(const Group& g, std::size_t r, std::span<const std::int32_t> table, int layer,
                                int kv, int slot, int token, int dim) {
  return bits_at(g.memory[r].data(), cache_index(g, r, table, layer, kv, slot, token, dim), dtype_size(g.shape.dtype));
}

/// Element (layer, kv, model head, token, dim) of a canonical chunk of `range`.
inline std::uint32_t chunk_elem(std::span<const std::byte> chunk, const KvModelShape& s, const KvRange& range,
                                int layer, int kv, int head, int token, int dim) {
  const std::size_t e = ((((static_cast<std::size_t>(layer - range.layer_begin) * 2 + static_cast<std::size_t>(kv)) *
                               static_cast<std::size_t>(s.num_kv_heads) + static_cast<std::size_t>(head)) *
                              static_cast<std::size_t>(range.num_tokens()) +
                          static_cast<std::size_t>(token - range.token_begin)) *
                             static_cast<std::size_t>(s.head_dim) +
                         static_cast<std::size_t>(dim));
  return bits_at(chunk.data(), e, dtype_size(s.dtype));
}

/// Every (rank, slot) of a group holding (layer, head).
inline std::vector<std::pair<std::size_t, int>> holders(const Group& g, int layer, int head) {
  std::vector<std::pair<std::size_t, int>> out;
  for (std::size_t r = 0; r < g.layouts.size(); ++r) {
    const KvRankLayout& l = g.layouts[r];
    if (layer < l.layer_begin || layer >= l.layer_end) continue;
    for (std::size_t s = 0; s < l.kv_heads.size(); ++s)
      if (l.kv_heads[s] == head) out.emplace_back(r, static_cast<int>(s));
  }
  return out;
}

inline int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace shardline::kvstore::testing
