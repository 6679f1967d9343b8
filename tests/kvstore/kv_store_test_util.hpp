#pragma once
// Helpers of the KvStore tests: a temporary folder, a small model shape and
// chunks whose every element names its (job, request, layer, K|V, head,
// token, d), so a merged or restored chunk can be checked bit for bit.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <span>
#include <vector>

#include "common/dtype.hpp"
#include "kvstore/kv_store.hpp"
#include "kvstore/kv_stream.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::kvstore::testing {

using shardline::orchestrator::testing::TempDir;

inline KvModelShape small_shape(DType dtype = DType::f32) { return KvModelShape{4, 2, 8, dtype}; }

/// Bytes of the canonical chunk of `r` (kv_stream's chunk_bytes).
inline std::size_t chunk_size(const KvModelShape& s, const KvRange& r) {
  return static_cast<std::size_t>(r.num_layers()) * 2 * static_cast<std::size_t>(s.num_kv_heads) *
         static_cast<std::size_t>(r.num_tokens()) * static_cast<std::size_t>(s.head_dim) * dtype_size(s.dtype);
}

/// The element at a position of a request's KV (any bits, deterministic).
inline std::uint32_t element(std::uint64_t job, std::uint64_t request, int layer, int kv, int head, int token,
                             int d) {
  std::uint64_t h = job * 0x9E3779B97F4A7C15ull ^ (request + 0x632BE59BD9B4E019ull);
  for (const int v : {layer, kv, head, token, d}) h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001B3ull;
  return static_cast<std::uint32_t>(h ^ (h >> 29));
}

/// The canonical chunk of `r` of a request, [layers, 2, heads, tokens, head_dim].
inline std::vector<std::byte> make_chunk(const KvModelShape& s, std::uint64_t job, std::uint64_t request,
                                         const KvRange& r) {
  const std::size_t es = dtype_size(s.dtype);
  std::vector<std::byte> out(chunk_size(s, r));
  std::size_t at = 0;
  for (int l = r.layer_begin; l < r.layer_end; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < s.num_kv_heads; ++h)
        for (int t = r.token_begin; t < r.token_end; ++t)
          for (int d = 0; d < s.head_dim; ++d) {
            const std::uint32_t v = element(job, request, l, kv, h, t, d);
            std::memcpy(out.data() + at, &v, es);  // little-endian: the low bytes for 16-bit types
            at += es;
          }
  return out;
}

inline KvChunkKey chunk_key(std::uint64_t job, std::uint64_t request, KvRange r) {
  return KvChunkKey{job, request, r};
}

/// The range of a decode step at `token`: all layers, one position.
inline KvRange decode_range(const KvModelShape& s, int token) { return KvRange{0, s.num_layers, token, token + 1}; }

/// Options of a store of small_shape() with `prefix_budget_bytes` for
/// prefix blocks and no disk reserve (a test's folder may sit on a full
/// disk).
inline KvStoreOptions prefix_store_options(std::uint64_t prefix_budget_bytes = 1ull << 30) {
  KvStoreOptions o;
  o.shape = small_shape();
  o.prefix_budget_bytes = prefix_budget_bytes;
  o.disk_reserve_bytes = 0;
  return o;
}

/// Opens a store (a failure fails the test: null).
inline std::unique_ptr<KvStore> open_store(const std::string& dir, const KvStoreOptions& o) {
  auto s = KvStore::open(dir, o);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

}  // namespace shardline::kvstore::testing
