#include "kvstore/kv_stream.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace shardline::kvstore {
namespace {

Error bad(std::string message) { return make_error(ErrorCode::invalid_argument, std::move(message)); }

std::string range_str(const KvRange& r) {
  return "layers [" + std::to_string(r.layer_begin) + ", " + std::to_string(r.layer_end) +
         ") tokens [" + std::to_string(r.token_begin) + ", " + std::to_string(r.token_end) + ")";
}

Status check_shape(const KvModelShape& s) {
  if (s.num_layers <= 0) return bad("shape.num_layers = " + std::to_string(s.num_layers) + " must be positive");
  if (s.num_kv_heads <= 0)
    return bad("shape.num_kv_heads = " + std::to_string(s.num_kv_heads) + " must be positive");
  if (s.head_dim <= 0) return bad("shape.head_dim = " + std::to_string(s.head_dim) + " must be positive");
  if (s.dtype != DType::f32 && s.dtype != DType::bf16 && s.dtype != DType::f16)
    return bad("shape.dtype is not f32, bf16 or f16");
  return {};
}

Status check_range(const KvModelShape& s, const KvRange& r) {
  if (r.layer_begin < 0 || r.layer_end > s.num_layers || r.layer_begin >= r.layer_end)
    return bad("range " + range_str(r) + ": layers must be a non-empty part of [0, num_layers=" +
               std::to_string(s.num_layers) + ")");
  if (r.token_begin < 0 || r.token_begin >= r.token_end)
    return bad("range " + range_str(r) + ": tokens must be non-empty with token_begin >= 0");
  return {};
}

/// Layers of `range` that `layout` holds: [first, last) (empty when first >= last).
std::pair<int, int> common_layers(const KvRankLayout& l, const KvRange& r) {
  return {std::max(l.layer_begin, r.layer_begin), std::min(l.layer_end, r.layer_end)};
}

/// The table covers the range's logical blocks and each of them is a block of the cache.
Status check_table(const KvRankLayout& l, std::span<const std::int32_t> table, const KvRange& r,
                   const std::string& who) {
  const long last_block = (static_cast<long>(r.token_end) - 1) / l.block_size;
  if (static_cast<long>(table.size()) <= last_block)
    return bad(who + "block_table has " + std::to_string(table.size()) + " entries; token_end " +
               std::to_string(r.token_end) + " needs " + std::to_string(last_block + 1) +
               " (block_size " + std::to_string(l.block_size) + ")");
  for (long b = r.token_begin / l.block_size; b <= last_block; ++b) {
    const std::int32_t phys = table[static_cast<std::size_t>(b)];
    if (phys < 0 || phys >= l.num_blocks)
      return bad(who + "block_table[" + std::to_string(b) + "] = " + std::to_string(phys) +
                 " is outside [0, num_blocks=" + std::to_string(l.num_blocks) + ")");
  }
  return {};
}

/// Geometry of one rank's cache, in elements.
struct Geo {
  long num_blocks, heads, block_size, head_dim;
  [[nodiscard]] long slab(long layer_local, long kv, long block, long slot) const {
    return (((layer_local * 2 + kv) * num_blocks + block) * heads + slot) * block_size * head_dim;
  }
};

Geo geo_of(const KvModelShape& s, const KvRankLayout& l) {
  return {l.num_blocks, static_cast<long>(l.kv_heads.size()), l.block_size, s.head_dim};
}

/// Tokens [t0, t1) of one (layer, K|V, head slot) of a cache -> dst [t1 - t0, head_dim].
/// V is memcpy'd per block run; K is transposed from its [head_dim][block_size] slab.
template <typename E>
void read_head(const E* cache, const Geo& g, const std::int32_t* table, long ll, long kv, long slot,
               long t0, long t1, E* dst) {
  const long d = g.head_dim, bs = g.block_size;
  for (long t = t0; t < t1;) {
    const long off = t % bs, n = std::min(bs - off, t1 - t);
    const E* slab = cache + g.slab(ll, kv, table[t / bs], slot);
    if (kv == 1) {
      std::memcpy(dst, slab + off * d, static_cast<std::size_t>(n * d) * sizeof(E));
    } else {
      for (long i = 0; i < d; ++i) {
        const E* src = slab + i * bs + off;
        for (long j = 0; j < n; ++j) dst[j * d + i] = src[j];
      }
    }
    dst += n * d;
    t += n;
  }
}

/// The reverse of read_head: src [t1 - t0, head_dim] -> the cache.
template <typename E>
void write_head(E* cache, const Geo& g, const std::int32_t* table, long ll, long kv, long slot,
                long t0, long t1, const E* src) {
  const long d = g.head_dim, bs = g.block_size;
  for (long t = t0; t < t1;) {
    const long off = t % bs, n = std::min(bs - off, t1 - t);
    E* slab = cache + g.slab(ll, kv, table[t / bs], slot);
    if (kv == 1) {
      std::memcpy(slab + off * d, src, static_cast<std::size_t>(n * d) * sizeof(E));
    } else {
      for (long i = 0; i < d; ++i) {
        E* dst = slab + i * bs + off;
        for (long j = 0; j < n; ++j) dst[j] = src[j * d + i];
      }
    }
    src += n * d;
    t += n;
  }
}

/// Calls fn with a zero value of the storage type of `dtype` (same-size unsigned integer:
/// copies move bits, never values).
template <typename Fn>
void with_element(DType dtype, Fn&& fn) {
  if (dtype_size(dtype) == 4) {
    fn(std::uint32_t{});
  } else {
    fn(std::uint16_t{});
  }
}

/// Where one (layer, head) of a range comes from: rank index and head slot.
struct Source {
  int rank = -1;
  int slot = -1;
};

/// Checks a group and a range and plans the first holder of every (layer, head):
/// plan[(l - layer_begin) * num_kv_heads + h].
Result<std::vector<Source>> plan_group(const char* op, const KvModelShape& shape,
                                       std::span<const KvCacheView> ranks,
                                       std::span<const std::int32_t> table, const KvRange& range) {
  if (Status st = check_shape(shape); !st) return bad(std::string(op) + ": " + st.error().message);
  if (Status st = check_range(shape, range); !st) return bad(std::string(op) + ": " + st.error().message);
  if (ranks.empty()) return bad(std::string(op) + ": ranks is empty");
  const int heads = shape.num_kv_heads;
  std::vector<Source> plan(static_cast<std::size_t>(range.num_layers()) * heads);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string who = std::string(op) + ": ranks[" + std::to_string(r) + "].";
    const KvCacheView& v = ranks[r];
    if (Status st = check_layout(shape, v.layout); !st) return bad(who + "layout: " + st.error().message);
    const auto [l0, l1] = common_layers(v.layout, range);
    if (l0 >= l1) continue;
    if (v.data == nullptr) return bad(who + "data is null");
    if (Status st = check_table(v.layout, table, range, who); !st) return st.error();
    for (int l = l0; l < l1; ++l) {
      for (std::size_t s = 0; s < v.layout.kv_heads.size(); ++s) {
        Source& src = plan[static_cast<std::size_t>(l - range.layer_begin) * heads + v.layout.kv_heads[s]];
        if (src.rank < 0) src = {static_cast<int>(r), static_cast<int>(s)};
      }
    }
  }
  for (int l = range.layer_begin; l < range.layer_end; ++l) {
    for (int h = 0; h < heads; ++h) {
      if (plan[static_cast<std::size_t>(l - range.layer_begin) * heads + h].rank < 0)
        return bad(std::string(op) + ": layer " + std::to_string(l) + " KV head " + std::to_string(h) +
                   " of " + range_str(range) + " is held by no rank");
    }
  }
  return plan;
}

Status check_one(const char* op, const KvModelShape& shape, const KvCacheView& view,
                 std::span<const std::int32_t> table, const KvRange& range) {
  if (Status st = check_layout(shape, view.layout); !st) return bad(std::string(op) + ": layout: " + st.error().message);
  if (Status st = check_range(shape, range); !st) return bad(std::string(op) + ": " + st.error().message);
  const auto [l0, l1] = common_layers(view.layout, range);
  if (l0 >= l1) return {};
  if (view.data == nullptr) return bad(std::string(op) + ": data is null");
  return check_table(view.layout, table, range, std::string(op) + ": ");
}

/// copy_out after plan_group: the canonical chunk of `range` into `chunk`.
void copy_out_planned(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                      std::span<const std::int32_t> table, const KvRange& range,
                      const std::vector<Source>& plan, std::byte* chunk) {
  with_element(shape.dtype, [&](auto zero) {
    using E = decltype(zero);
    const long row = static_cast<long>(range.num_tokens()) * shape.head_dim;
    E* out = reinterpret_cast<E*>(chunk);
    for (int l = range.layer_begin; l < range.layer_end; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < shape.num_kv_heads; ++h, out += row) {
          const Source src = plan[static_cast<std::size_t>(l - range.layer_begin) * shape.num_kv_heads + h];
          const KvCacheView& v = ranks[static_cast<std::size_t>(src.rank)];
          read_head(static_cast<const E*>(v.data), geo_of(shape, v.layout), table.data(),
                    l - v.layout.layer_begin, kv, src.slot, range.token_begin, range.token_end, out);
        }
      }
    }
  });
}

/// stream_out's buffer: a per-thread scratch reused across calls up to
/// kScratchKeep bytes (a decode step's increments); larger chunks (a whole
/// prompt) use `local`, freed when the call returns.
constexpr std::size_t kScratchKeep = std::size_t{64} << 20;
thread_local std::vector<std::byte> t_scratch;

std::span<std::byte> scratch(std::size_t bytes, std::vector<std::byte>& local) {
  std::vector<std::byte>& buf = bytes <= kScratchKeep ? t_scratch : local;
  buf.resize(bytes);
  return {buf.data(), bytes};
}

}  // namespace

std::size_t chunk_bytes(const KvModelShape& shape, const KvRange& range) noexcept {
  if (range.num_layers() <= 0 || range.num_tokens() <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0)
    return 0;
  return static_cast<std::size_t>(range.num_layers()) * 2 * static_cast<std::size_t>(shape.num_kv_heads) *
         static_cast<std::size_t>(range.num_tokens()) * static_cast<std::size_t>(shape.head_dim) *
         dtype_size(shape.dtype);
}

std::size_t cache_bytes(const KvModelShape& shape, const KvRankLayout& layout) noexcept {
  const int layers = layout.layer_end - layout.layer_begin;
  if (layers <= 0 || layout.num_blocks <= 0 || layout.block_size <= 0 || shape.head_dim <= 0) return 0;
  return static_cast<std::size_t>(layers) * 2 * static_cast<std::size_t>(layout.num_blocks) *
         layout.kv_heads.size() * static_cast<std::size_t>(layout.block_size) *
         static_cast<std::size_t>(shape.head_dim) * dtype_size(shape.dtype);
}

std::size_t gather_bytes(const KvModelShape& shape, const KvRankLayout& layout,
                         const KvRange& range) noexcept {
  const auto [l0, l1] = common_layers(layout, range);
  if (l0 >= l1 || range.num_tokens() <= 0 || shape.head_dim <= 0) return 0;
  return static_cast<std::size_t>(l1 - l0) * 2 * layout.kv_heads.size() *
         static_cast<std::size_t>(range.num_tokens()) * static_cast<std::size_t>(shape.head_dim) *
         dtype_size(shape.dtype);
}

Status check_layout(const KvModelShape& shape, const KvRankLayout& layout) {
  if (Status st = check_shape(shape); !st) return st;
  if (layout.layer_begin < 0 || layout.layer_end > shape.num_layers || layout.layer_begin >= layout.layer_end)
    return bad("layer_begin = " + std::to_string(layout.layer_begin) + ", layer_end = " +
               std::to_string(layout.layer_end) + ": must be a non-empty part of [0, num_layers=" +
               std::to_string(shape.num_layers) + ")");
  if (layout.kv_heads.empty()) return bad("kv_heads is empty");
  std::vector<bool> seen(static_cast<std::size_t>(shape.num_kv_heads), false);
  for (std::size_t i = 0; i < layout.kv_heads.size(); ++i) {
    const int h = layout.kv_heads[i];
    if (h < 0 || h >= shape.num_kv_heads)
      return bad("kv_heads[" + std::to_string(i) + "] = " + std::to_string(h) + " is outside [0, num_kv_heads=" +
                 std::to_string(shape.num_kv_heads) + ")");
    if (seen[static_cast<std::size_t>(h)])
      return bad("kv_heads[" + std::to_string(i) + "] = " + std::to_string(h) + " is repeated");
    seen[static_cast<std::size_t>(h)] = true;
  }
  if (layout.num_blocks <= 0) return bad("num_blocks = " + std::to_string(layout.num_blocks) + " must be positive");
  if (layout.block_size <= 0) return bad("block_size = " + std::to_string(layout.block_size) + " must be positive");
  return {};
}

Status gather(const KvModelShape& shape, const KvCacheView& view, std::span<const std::int32_t> block_table,
              const KvRange& range, std::span<std::byte> out) {
  if (Status st = check_one("gather", shape, view, block_table, range); !st) return st;
  const std::size_t need = gather_bytes(shape, view.layout, range);
  if (out.size() < need)
    return bad("gather: out has " + std::to_string(out.size()) + " bytes, needs " + std::to_string(need));
  const auto [l0, l1] = common_layers(view.layout, range);
  with_element(shape.dtype, [&](auto zero) {
    using E = decltype(zero);
    const Geo g = geo_of(shape, view.layout);
    const long row = static_cast<long>(range.num_tokens()) * shape.head_dim;
    E* dst = reinterpret_cast<E*>(out.data());
    for (int l = l0; l < l1; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (long s = 0; s < g.heads; ++s, dst += row)
          read_head(static_cast<const E*>(view.data), g, block_table.data(), l - view.layout.layer_begin, kv, s,
                    range.token_begin, range.token_end, dst);
  });
  return {};
}

Status scatter(const KvModelShape& shape, const KvCacheView& view, std::span<const std::int32_t> block_table,
               const KvRange& range, std::span<const std::byte> in) {
  if (Status st = check_one("scatter", shape, view, block_table, range); !st) return st;
  const std::size_t need = gather_bytes(shape, view.layout, range);
  if (in.size() != need)
    return bad("scatter: in has " + std::to_string(in.size()) + " bytes, expected " + std::to_string(need));
  const auto [l0, l1] = common_layers(view.layout, range);
  with_element(shape.dtype, [&](auto zero) {
    using E = decltype(zero);
    const Geo g = geo_of(shape, view.layout);
    const long row = static_cast<long>(range.num_tokens()) * shape.head_dim;
    const E* src = reinterpret_cast<const E*>(in.data());
    for (int l = l0; l < l1; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (long s = 0; s < g.heads; ++s, src += row)
          write_head(static_cast<E*>(view.data), g, block_table.data(), l - view.layout.layer_begin, kv, s,
                     range.token_begin, range.token_end, src);
  });
  return {};
}

Status check_chunk_ref(const KvChunkRef& chunk, std::size_t index, std::size_t buffer_bytes) {
  if (chunk.offset <= buffer_bytes && chunk.bytes <= buffer_bytes - chunk.offset) return {};
  return bad("flush_batch: chunks[" + std::to_string(index) + "] (offset " + std::to_string(chunk.offset) +
             ", bytes " + std::to_string(chunk.bytes) + ") is outside the buffer of " + std::to_string(buffer_bytes) +
             " bytes");
}

Status KvTarget::flush_batch(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer) {
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if (Status st = check_chunk_ref(chunks[i], i, buffer.size()); !st) return st;
  for (const KvChunkRef& c : chunks) {
    if (Status st = flush(c.key, buffer.subspan(c.offset, c.bytes)); !st) return st;
  }
  return {};
}

Status KvTarget::flush_linked(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer,
                              std::span<const PrefixLinkWrite> links) {
  if (!links.empty())
    return make_error(ErrorCode::unsupported, "KV target: " + std::to_string(links.size()) +
                                                  " prefix link(s) to a target that keeps no prefix blocks");
  return flush_batch(chunks, buffer);
}

Status KvCopier::copy_out_batch(std::span<const KvCopyItem> items, std::span<const std::span<std::byte>> chunks) {
  if (chunks.size() != items.size())
    return bad("copy_out_batch: " + std::to_string(chunks.size()) + " chunks for " + std::to_string(items.size()) +
               " items");
  for (std::size_t i = 0; i < items.size(); ++i)
    if (Status st = copy_out(items[i].block_table, items[i].range, chunks[i]); !st) return st;
  return {};
}

Result<std::uint64_t> KvCopier::begin_copy_out(std::span<const KvCopyItem> /*items*/) {
  return make_error(ErrorCode::unsupported, "KV copier: no stream-ordered copies");
}

Status KvCopier::end_copy_out(std::uint64_t /*ticket*/, std::span<const std::span<std::byte>> /*chunks*/) {
  return make_error(ErrorCode::unsupported, "KV copier: no stream-ordered copies");
}

Status copy_out(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                std::span<const std::int32_t> block_table, const KvRange& range, std::span<std::byte> chunk) {
  auto plan = plan_group("copy_out", shape, ranks, block_table, range);
  if (!plan) return plan.error();
  const std::size_t need = chunk_bytes(shape, range);
  if (chunk.size() != need)
    return bad("copy_out: chunk has " + std::to_string(chunk.size()) + " bytes, expected " + std::to_string(need));
  copy_out_planned(shape, ranks, block_table, range, *plan, chunk.data());
  return {};
}

Status copy_in(const KvModelShape& shape, std::span<const KvCacheView> ranks,
               std::span<const std::int32_t> block_table, const KvRange& range, std::span<const std::byte> chunk) {
  auto plan = plan_group("copy_in", shape, ranks, block_table, range);
  if (!plan) return plan.error();
  const std::size_t need = chunk_bytes(shape, range);
  if (chunk.size() != need)
    return bad("copy_in: chunk has " + std::to_string(chunk.size()) + " bytes, expected " + std::to_string(need));
  with_element(shape.dtype, [&](auto zero) {
    using E = decltype(zero);
    const long row = static_cast<long>(range.num_tokens()) * shape.head_dim;
    const E* in = reinterpret_cast<const E*>(chunk.data());
    for (const KvCacheView& v : ranks) {  // every holder of a (layer, head) gets it
      const auto [l0, l1] = common_layers(v.layout, range);
      const Geo g = geo_of(shape, v.layout);
      for (int l = l0; l < l1; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const E* base = in + (static_cast<long>(l - range.layer_begin) * 2 + kv) * shape.num_kv_heads * row;
          for (long s = 0; s < g.heads; ++s)
            write_head(static_cast<E*>(v.data), g, block_table.data(), l - v.layout.layer_begin, kv, s,
                       range.token_begin, range.token_end, base + v.layout.kv_heads[static_cast<std::size_t>(s)] * row);
        }
      }
    }
  });
  return {};
}

Status stream_out(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                  std::span<const std::int32_t> block_table, const KvRange& range, KvTarget& target,
                  const KvChunkKey& key) {
  if (!(key.range == range))
    return bad("stream_out: key.range " + range_str(key.range) + " differs from range " + range_str(range));
  auto plan = plan_group("stream_out", shape, ranks, block_table, range);
  if (!plan) return plan.error();
  std::vector<std::byte> local;
  const std::span<std::byte> buf = scratch(chunk_bytes(shape, range), local);
  copy_out_planned(shape, ranks, block_table, range, *plan, buf.data());
  return target.flush(key, buf);
}

Status stream_out_batch(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                        std::span<const KvStreamItem> items, KvTarget& target) {
  if (items.empty()) return {};
  std::vector<std::vector<Source>> plans;
  std::vector<KvChunkRef> refs;
  plans.reserve(items.size());
  refs.reserve(items.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const KvStreamItem& it = items[i];
    const std::string op = "stream_out_batch: items[" + std::to_string(i) + "]";
    if (!(it.key.range == it.range))
      return bad(op + ": key.range " + range_str(it.key.range) + " differs from range " + range_str(it.range));
    auto plan = plan_group(op.c_str(), shape, ranks, it.block_table, it.range);
    if (!plan) return plan.error();
    plans.push_back(std::move(plan).value());
    const std::size_t n = chunk_bytes(shape, it.range);
    refs.push_back({it.key, total, n});
    total += n;
  }
  std::vector<std::byte> local;
  const std::span<std::byte> buf = scratch(total, local);
  for (std::size_t i = 0; i < items.size(); ++i)
    copy_out_planned(shape, ranks, items[i].block_table, items[i].range, plans[i], buf.data() + refs[i].offset);
  return target.flush_batch(refs, buf);
}

Status stream_in(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                 std::span<const std::int32_t> block_table, const KvRange& range, KvTarget& target,
                 const KvChunkKey& key) {
  if (!(key.range == range))
    return bad("stream_in: key.range " + range_str(key.range) + " differs from range " + range_str(range));
  // Check the group before fetching, so a bad layout is reported as such.
  auto plan = plan_group("stream_in", shape, ranks, block_table, range);
  if (!plan) return plan.error();
  auto chunk = target.fetch(key);
  if (!chunk) return chunk.error();
  const std::size_t need = chunk_bytes(shape, range);
  if (chunk->size() != need)
    return bad("stream_in: fetched chunk has " + std::to_string(chunk->size()) + " bytes, expected " +
               std::to_string(need) + " for " + range_str(range));
  return copy_in(shape, ranks, block_table, range, *chunk);
}

namespace {

/// merge_part / split_part: checks the buffers and calls copy_row(chunk
/// row offset, part row offset, row bytes) for every row the rank holds.
template <typename CopyRow>
Status for_part_rows(const char* op, const KvModelShape& shape, const KvRankLayout& layout, const KvRange& range,
                     std::size_t chunk_size, std::size_t part_size, CopyRow&& copy_row) {
  if (Status st = check_layout(shape, layout); !st) return bad(std::string(op) + ": layout: " + st.error().message);
  if (Status st = check_range(shape, range); !st) return bad(std::string(op) + ": " + st.error().message);
  const std::size_t need_chunk = chunk_bytes(shape, range), need_part = gather_bytes(shape, layout, range);
  if (chunk_size != need_chunk || part_size != need_part)
    return bad(std::string(op) + ": chunk of " + std::to_string(chunk_size) + " bytes and part of " +
               std::to_string(part_size) + ", expected " + std::to_string(need_chunk) + " and " +
               std::to_string(need_part));
  const auto [l0, l1] = common_layers(layout, range);
  const std::size_t row = static_cast<std::size_t>(range.num_tokens()) * shape.head_dim * dtype_size(shape.dtype);
  std::size_t p = 0;
  for (int l = l0; l < l1; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::size_t base = (static_cast<std::size_t>(l - range.layer_begin) * 2 + kv) * shape.num_kv_heads;
      for (const int h : layout.kv_heads) {
        copy_row((base + static_cast<std::size_t>(h)) * row, p, row);
        p += row;
      }
    }
  }
  return {};
}

}  // namespace

Status merge_part(const KvModelShape& shape, const KvRankLayout& layout, const KvRange& range,
                  std::span<const std::byte> part, std::span<std::byte> chunk) {
  return for_part_rows("merge_part", shape, layout, range, chunk.size(), part.size(),
                       [&](std::size_t c, std::size_t p, std::size_t n) { std::memcpy(&chunk[c], &part[p], n); });
}

Status split_part(const KvModelShape& shape, const KvRankLayout& layout, const KvRange& range,
                  std::span<const std::byte> chunk, std::span<std::byte> part) {
  return for_part_rows("split_part", shape, layout, range, chunk.size(), part.size(),
                       [&](std::size_t c, std::size_t p, std::size_t n) { std::memcpy(&part[p], &chunk[c], n); });
}

}  // namespace shardline::kvstore
