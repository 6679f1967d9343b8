#include "kvstore/kv_store.hpp"

#include "kvstore/rocksdb_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <sys/statvfs.h>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/transaction_log.h>
#include <rocksdb/write_batch.h>

namespace shardline::kvstore {
namespace {

void put_be(std::string& s, std::uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_be(std::string_view s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

void put_le(std::string& s, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(std::string_view s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

std::string hex(std::string_view s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const char c : s) {
    out.push_back(digits[(static_cast<unsigned char>(c) >> 4) & 0xf]);
    out.push_back(digits[static_cast<unsigned char>(c) & 0xf]);
  }
  return out;
}

std::string describe(const KvChunkKey& key) {
  const KvRange& r = key.range;
  return "job " + std::to_string(key.job_id) + " request " + std::to_string(key.request_id) + " layers [" +
         std::to_string(r.layer_begin) + ", " + std::to_string(r.layer_end) + ") tokens [" +
         std::to_string(r.token_begin) + ", " + std::to_string(r.token_end) + ")";
}

/// chunk_bytes of kv_stream.hpp, computed here (the store does not link the
/// streaming code).
std::size_t chunk_size(const KvModelShape& shape, const KvRange& range) {
  return static_cast<std::size_t>(range.num_layers()) * 2 * static_cast<std::size_t>(shape.num_kv_heads) *
         static_cast<std::size_t>(range.num_tokens()) * static_cast<std::size_t>(shape.head_dim) *
         dtype_size(shape.dtype);
}

/// A damaged file (checksum, MANIFEST, block) is `corrupt`, so the store
/// actor quarantines it (actors/kvstore_actor.cpp); a full disk disk_full;
/// anything else io.
Error db_error(const std::string& what, const rocksdb::Status& st) { return rocksdb_error("kv store: " + what, st); }

/// Key order of ranges inside one request: token_begin, token_end, layers.
struct RangeLess {
  bool operator()(const KvRange& a, const KvRange& b) const noexcept {
    return std::tie(a.token_begin, a.token_end, a.layer_begin, a.layer_end) <
           std::tie(b.token_begin, b.token_end, b.layer_begin, b.layer_end);
  }
};

/// Adds [b, e) to disjoint, non-touching intervals begin -> end.
void add_interval(std::map<int, int>& m, int b, int e) {
  auto it = m.upper_bound(b);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= b) {
      b = prev->first;
      e = std::max(e, prev->second);
      it = m.erase(prev);
    }
  }
  while (it != m.end() && it->first <= e) {
    e = std::max(e, it->second);
    it = m.erase(it);
  }
  m.emplace(b, e);
}

/// A request's prefix link (kv_store.hpp "Prefix links").
struct PrefixLink {
  std::uint64_t salt = 0;
  std::uint64_t root = 0;                ///< the first block's parent name
  std::vector<std::uint64_t> names;      ///< the blocks, first first
  std::vector<std::int32_t> tokens;      ///< names.size() x block_tokens
  int block_tokens = 0;
  std::size_t held = 0;                  ///< leading blocks pinned and counted
  bool broken = false;                   ///< block `held` differs from the link's: it ends there
  std::string key;                       ///< its record's key
  std::uint64_t record_bytes = 0;        ///< its record's value bytes

  [[nodiscard]] bool pending() const { return held < names.size() && !broken; }
  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
};

/// What the store knows of one request.
struct RequestState {
  std::vector<std::map<int, int>> covered;        ///< per layer: stored token intervals
  std::map<KvRange, std::uint64_t, RangeLess> chunks;  ///< stored range -> value bytes
  std::uint64_t bytes = 0;                         ///< chunks' and the link record's value bytes
  int durable = 0;
  std::optional<PrefixLink> link;

  /// Positions [0, end) of every layer are held (a link's blocks).
  void add_head(int num_layers, int end) {
    if (covered.empty()) covered.resize(static_cast<std::size_t>(num_layers));
    for (auto& layer : covered) add_interval(layer, 0, end);
  }

  void add(int num_layers, const KvRange& r, std::uint64_t size) {
    if (covered.empty()) covered.resize(static_cast<std::size_t>(num_layers));
    auto [it, inserted] = chunks.try_emplace(r, size);
    if (!inserted) {
      bytes -= it->second;
      it->second = size;
    }
    bytes += size;
    for (int l = r.layer_begin; l < r.layer_end; ++l)
      add_interval(covered[static_cast<std::size_t>(l)], r.token_begin, r.token_end);
  }
  void recompute() {
    int t = std::numeric_limits<int>::max();
    for (const auto& layer : covered) {
      const int end = !layer.empty() && layer.begin()->first == 0 ? layer.begin()->second : 0;
      t = std::min(t, end);
    }
    durable = covered.empty() ? 0 : t;
  }
};

using RequestId = std::pair<std::uint64_t, std::uint64_t>;

/// The host-memory tier: an LRU of chunks under a byte budget.
class HostTier {
 public:
  explicit HostTier(std::uint64_t budget) : budget_(budget) {}

  void put(const std::string& key, std::span<const std::byte> bytes) {
    erase(key);
    if (bytes.size() > budget_) return;
    lru_.push_front(Entry{key, std::vector<std::byte>(bytes.begin(), bytes.end())});
    index_[key] = lru_.begin();
    bytes_ += bytes.size();
    while (bytes_ > budget_) {
      bytes_ -= lru_.back().bytes.size();
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
  }
  /// The chunk (now the most recent), or null.
  const std::vector<std::byte>* get(const std::string& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return &it->second->bytes;
  }
  void erase(const std::string& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return;
    bytes_ -= it->second->bytes.size();
    lru_.erase(it->second);
    index_.erase(it);
  }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::uint64_t chunks() const noexcept { return index_.size(); }

 private:
  struct Entry {
    std::string key;
    std::vector<std::byte> bytes;
  };
  std::uint64_t budget_;
  std::uint64_t bytes_ = 0;
  std::list<Entry> lru_;  ///< front: most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

/// Bytes of a prefix block's trailer after its chunk: parent and use sequence
/// number (u64 each), then the tokens (i32 each).
constexpr std::size_t kPrefixTrailerBytes = 16;

/// The key range of a prefix block of `num_tokens` tokens: all layers.
KvRange prefix_range(const KvModelShape& shape, std::size_t num_tokens) {
  return KvRange{0, shape.num_layers, 0, static_cast<int>(num_tokens)};
}

/// The key of a prefix block (see the file comment of kv_store.hpp).
/// Precondition: 1 <= num_tokens <= INT_MAX.
std::string prefix_key(const KvModelShape& shape, std::uint64_t salt, std::uint64_t name, std::size_t num_tokens) {
  return encode_key(KvChunkKey{kPrefixBlockJobBit | (salt & ~kPrefixBlockJobBit), name, prefix_range(shape, num_tokens)});
}

/// Value bytes of a prefix block of `num_tokens` tokens: chunk and trailer.
std::size_t prefix_value_size(const KvModelShape& shape, std::size_t num_tokens) {
  return chunk_size(shape, prefix_range(shape, num_tokens)) + kPrefixTrailerBytes + 4 * num_tokens;
}

std::string describe_prefix(std::uint64_t salt, std::uint64_t name) {
  return "prefix block " + std::to_string(name) + " (salt " + std::to_string(salt & ~kPrefixBlockJobBit) + ")";
}

Status check_range(const KvModelShape& shape, const KvChunkKey& key) {
  const KvRange& r = key.range;
  if (r.layer_begin < 0 || r.layer_end > shape.num_layers || r.layer_begin >= r.layer_end)
    return make_error(ErrorCode::invalid_argument, "kv store: chunk " + describe(key) + ": layers outside [0, " +
                                                       std::to_string(shape.num_layers) + ") or empty");
  if (r.token_begin < 0 || r.token_begin >= r.token_end)
    return make_error(ErrorCode::invalid_argument,
                      "kv store: chunk " + describe(key) + ": token range negative or empty");
  return {};
}

/// Bytes of a prefix link record before its names: salt, root (u64 each),
/// the number of names and the tokens per block (u32 each).
constexpr std::size_t kLinkHeaderBytes = 24;

/// A link record's key: the request's prefix, tokens [0, c), the link layer.
std::string link_key(std::uint64_t job_id, std::uint64_t request_id, int num_tokens) {
  return encode_key(KvChunkKey{job_id, request_id, KvRange{kPrefixLinkLayer, kPrefixLinkLayer + 1, 0, num_tokens}});
}

std::string encode_link(const PrefixLink& l) {
  std::string v;
  v.reserve(kLinkHeaderBytes + 8 * l.names.size() + 4 * l.tokens.size());
  put_le(v, l.salt, 8);
  put_le(v, l.root, 8);
  put_le(v, l.names.size(), 4);
  put_le(v, static_cast<std::uint64_t>(l.block_tokens), 4);
  for (const std::uint64_t n : l.names) put_le(v, n, 8);
  for (const std::int32_t t : l.tokens) put_le(v, static_cast<std::uint32_t>(t), 4);
  return v;
}

/// A link record back (held 0). Errors: corrupt (sizes that disagree with
/// each other or with the key's num_tokens).
Result<PrefixLink> decode_link(std::string_view v, int num_tokens, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::corrupt, "kv store: prefix link of " + what + ": " + why);
  };
  if (v.size() < kLinkHeaderBytes) return bad(std::to_string(v.size()) + " bytes, shorter than its header");
  PrefixLink l;
  l.salt = get_le(v, 0, 8);
  l.root = get_le(v, 8, 8);
  const std::uint64_t n = get_le(v, 16, 4), bt = get_le(v, 20, 4);
  if (n == 0 || bt == 0 || n * bt != static_cast<std::uint64_t>(num_tokens) ||
      v.size() != kLinkHeaderBytes + 8 * n + 4 * n * bt)
    return bad(std::to_string(n) + " blocks of " + std::to_string(bt) + " tokens in " + std::to_string(v.size()) +
               " bytes for " + std::to_string(num_tokens) + " positions");
  l.block_tokens = static_cast<int>(bt);
  l.names.resize(n);
  for (std::size_t i = 0; i < n; ++i) l.names[i] = get_le(v, kLinkHeaderBytes + 8 * i, 8);
  l.tokens.resize(n * bt);
  const std::size_t at = kLinkHeaderBytes + 8 * n;
  for (std::size_t i = 0; i < l.tokens.size(); ++i)
    l.tokens[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(v, at + 4 * i, 4)));
  l.record_bytes = v.size();
  return l;
}

/// Copies the canonical chunk `src` of range `r` into `out`, the canonical
/// chunk of all layers x positions [b, t): the positions of r within them.
void place_chunk(const KvModelShape& shape, const KvRange& r, std::span<const std::byte> src, int b, int t,
                 std::vector<std::byte>& out) {
  const int from = std::max(r.token_begin, b), to = std::min(r.token_end, t);
  if (from >= to) return;
  const std::size_t row = static_cast<std::size_t>(shape.head_dim) * dtype_size(shape.dtype);
  const std::size_t heads = static_cast<std::size_t>(shape.num_kv_heads);
  const std::size_t src_tokens = static_cast<std::size_t>(r.num_tokens());
  const std::size_t dst_tokens = static_cast<std::size_t>(t - b);
  const std::size_t run = static_cast<std::size_t>(to - from) * row;
  const std::size_t src_at = static_cast<std::size_t>(from - r.token_begin) * row;
  const std::size_t dst_at = static_cast<std::size_t>(from - b) * row;
  for (int l = r.layer_begin; l < r.layer_end; ++l) {
    for (std::size_t kv = 0; kv < 2; ++kv) {
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t src_slab = (static_cast<std::size_t>(l - r.layer_begin) * 2 + kv) * heads + h;
        const std::size_t dst_slab = (static_cast<std::size_t>(l) * 2 + kv) * heads + h;
        std::memcpy(out.data() + dst_slab * dst_tokens * row + dst_at, src.data() + src_slab * src_tokens * row + src_at,
                    run);
      }
    }
  }
}

}  // namespace

const char* kv_sync_policy_name(KvSyncPolicy policy) noexcept {
  switch (policy) {
    case KvSyncPolicy::none: return "none";
    case KvSyncPolicy::wal: return "wal";
    case KvSyncPolicy::fsync: return "fsync";
  }
  return "?";
}

Result<KvSyncPolicy> parse_kv_sync_policy(std::string_view name) {
  for (const KvSyncPolicy p : {KvSyncPolicy::none, KvSyncPolicy::wal, KvSyncPolicy::fsync})
    if (name == kv_sync_policy_name(p)) return p;
  return make_error(ErrorCode::invalid_argument,
                    "kv sync policy '" + std::string(name) + "': expected one of none, wal, fsync");
}

std::string encode_request_prefix(std::uint64_t job_id, std::uint64_t request_id) {
  std::string k;
  k.reserve(kKvKeyBytes);
  put_be(k, job_id, 8);
  put_be(k, request_id, 8);
  return k;
}

std::string encode_key(const KvChunkKey& key) {
  std::string k = encode_request_prefix(key.job_id, key.request_id);
  put_be(k, static_cast<std::uint32_t>(key.range.token_begin), 4);
  put_be(k, static_cast<std::uint32_t>(key.range.token_end), 4);
  put_be(k, static_cast<std::uint16_t>(key.range.layer_begin), 2);
  put_be(k, static_cast<std::uint16_t>(key.range.layer_end), 2);
  return k;
}

Result<KvChunkKey> decode_key(std::string_view bytes) {
  if (bytes.size() != kKvKeyBytes)
    return make_error(ErrorCode::corrupt, "kv store: key " + hex(bytes) + ": " + std::to_string(bytes.size()) +
                                              " bytes, expected " + std::to_string(kKvKeyBytes));
  const std::uint64_t tb = get_be(bytes, 16, 4), te = get_be(bytes, 20, 4);
  const std::uint64_t lb = get_be(bytes, 24, 2), le = get_be(bytes, 26, 2);
  if (te > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) || tb >= te || lb >= le)
    return make_error(ErrorCode::corrupt, "kv store: key " + hex(bytes) + ": empty or out-of-range token or layer range");
  KvChunkKey key;
  key.job_id = get_be(bytes, 0, 8);
  key.request_id = get_be(bytes, 8, 8);
  key.range = KvRange{static_cast<int>(lb), static_cast<int>(le), static_cast<int>(tb), static_cast<int>(te)};
  return key;
}

struct KvStore::Impl {
  std::string dir;
  KvStoreOptions options;
  std::unique_ptr<rocksdb::Env> env;  // outlives db (declared first)
  /// Reopened after a write a full disk failed; the chunks it held are
  /// still there and their coverage stays as it was (a failed write counted
  /// nothing). Free space is probed at most every reopen_interval_ms: a
  /// put comes with every decode step.
  ReopenableDb db;
  std::uint64_t refused_writes = 0;   ///< put_many / put_prefix_blocks calls refused: the disk budget or the disk was full
  std::uint64_t held_bytes = 0;       ///< value bytes of every stored chunk (sum of RequestState::bytes)
  HostTier tier;
  std::map<RequestId, RequestState> requests;
  std::uint64_t deleted_bytes = 0;
  std::uint64_t compactions = 0;
  std::uint64_t memory_hits = 0;
  std::uint64_t disk_reads = 0;
  std::uint64_t gc_pending = 0;  ///< chunk and prefix block bytes deleted since the last compaction
  /// The key spans deleted since then (empty: none): jobs' chunks, and
  /// prefix blocks apart (their keys sort after every job's, so one span
  /// over both would compact every live chunk between them).
  std::string gc_begin, gc_end;
  std::string prefix_gc_begin, prefix_gc_end;

  /// A kept prefix block. The LRU is ordered by `seq`, the highest at the
  /// front: every put or use takes the next number (next_prefix_seq).
  struct PrefixEntry {
    std::string key;
    std::uint64_t bytes = 0;  ///< value bytes: chunk and trailer
    std::uint64_t seq = 0;    ///< last use (the stored one is the last write's)
    std::uint64_t parent = 0;          ///< the trailer's parent name
    std::vector<std::int32_t> tokens;  ///< the trailer's tokens (links compare them)
    int pins = 0;                      ///< links that hold it (then it is in prefix_pinned)
  };
  /// Unpinned blocks, the ones budgets may drop. Front: most recently used.
  std::list<PrefixEntry> prefix_lru;
  /// Blocks links pin: no budget drops them (their bytes still count).
  std::list<PrefixEntry> prefix_pinned;
  /// Every kept block, in either list (std::list::splice keeps iterators).
  std::unordered_map<std::string, std::list<PrefixEntry>::iterator> prefix_index;
  /// Pending links by the key of the block each waits for.
  std::unordered_map<std::string, std::vector<RequestId>> link_waiters;
  std::uint64_t linked_tokens = 0;    ///< positions counted from links since open
  std::vector<RequestId> woken;       ///< requests wake_links advanced (take_woken_links)
  std::uint64_t prefix_bytes = 0;     ///< sum of PrefixEntry::bytes
  std::uint64_t next_prefix_seq = 0;  ///< past every seq stored or used
  std::uint64_t prefix_evictions = 0;
  std::uint64_t prefix_hits = 0;

  explicit Impl(std::uint64_t host_bytes) : tier(host_bytes) {}

  /// Bytes counted against options.disk_budget_bytes: chunks and prefix
  /// blocks held, and those deleted since the last compaction (still on
  /// disk).
  [[nodiscard]] std::uint64_t budgeted_bytes() const { return held_bytes + prefix_bytes + gc_pending; }

  /// Marks a kept prefix block used: the LRU's front, the next seq (in
  /// memory only: the stored seq stays the last write's).
  void touch_prefix(std::list<PrefixEntry>::iterator it) {
    it->seq = next_prefix_seq++;
    if (it->pins == 0) prefix_lru.splice(prefix_lru.begin(), prefix_lru, it);
  }

  /// Records a prefix block stored (the LRU's front).
  void add_prefix(std::string key, std::uint64_t bytes, std::uint64_t seq, std::uint64_t parent,
                  std::vector<std::int32_t> tokens) {
    prefix_lru.push_front(PrefixEntry{std::move(key), bytes, seq, parent, std::move(tokens), 0});
    prefix_index[prefix_lru.front().key] = prefix_lru.begin();
    prefix_bytes += bytes;
    next_prefix_seq = std::max(next_prefix_seq, seq + 1);
  }

  void pin(std::list<PrefixEntry>::iterator it) {
    if (it->pins++ == 0) prefix_pinned.splice(prefix_pinned.begin(), prefix_lru, it);
  }
  /// The last unpin puts the block back at the LRU's front (just used).
  void unpin(std::list<PrefixEntry>::iterator it) {
    if (--it->pins > 0) return;
    prefix_lru.splice(prefix_lru.begin(), prefix_pinned, it);
    it->seq = next_prefix_seq++;
  }

  [[nodiscard]] std::string link_block_key(const PrefixLink& l, std::size_t i) const {
    return prefix_key(options.shape, l.salt, l.names[i], static_cast<std::size_t>(l.block_tokens));
  }

  /// Pins and counts `id`'s link blocks from `held` on, up to the first the
  /// store lacks (the request waits for it in link_waiters) or that differs
  /// from the link's (a collision: the link ends there).
  void advance_link(const RequestId& id, RequestState& state) {
    PrefixLink& l = *state.link;
    const std::size_t before = l.held;
    const auto bt = static_cast<std::size_t>(l.block_tokens);
    while (l.pending()) {
      std::string key = link_block_key(l, l.held);
      const auto kept = prefix_index.find(key);
      if (kept == prefix_index.end()) {
        link_waiters[std::move(key)].push_back(id);
        break;
      }
      const PrefixEntry& e = *kept->second;
      const std::uint64_t parent = l.held == 0 ? l.root : l.names[l.held - 1];
      const auto want = l.tokens.begin() + static_cast<std::ptrdiff_t>(l.held * bt);
      if (e.parent != parent || e.tokens.size() != bt || !std::equal(e.tokens.begin(), e.tokens.end(), want)) {
        l.broken = true;
        break;
      }
      pin(kept->second);
      ++l.held;
    }
    if (l.held == before) return;
    state.add_head(options.shape.num_layers, static_cast<int>(l.held * bt));
    state.recompute();
    linked_tokens += (l.held - before) * bt;
  }

  /// A block was stored: the links waiting for it go on.
  void wake_links(const std::string& block_key) {
    const auto it = link_waiters.find(block_key);
    if (it == link_waiters.end()) return;
    const std::vector<RequestId> ids = std::move(it->second);
    link_waiters.erase(it);
    for (const RequestId& id : ids) {
      const auto r = requests.find(id);
      if (r == requests.end() || !r->second.link || !r->second.link->pending()) continue;
      if (link_block_key(*r->second.link, r->second.link->held) != block_key) continue;  // a stale entry
      const int before = r->second.durable;
      advance_link(id, r->second);
      if (r->second.durable > before) woken.push_back(id);
    }
  }

  /// `id`'s link `l` waits no more (for the block it was waiting for).
  void stop_waiting(const RequestId& id, const PrefixLink& l) {
    if (!l.pending()) return;
    if (const auto w = link_waiters.find(link_block_key(l, l.held)); w != link_waiters.end()) {
      std::erase(w->second, id);
      if (w->second.empty()) link_waiters.erase(w);
    }
  }

  /// A request's link goes: its blocks are unpinned, it waits no more.
  void release_link(const RequestId& id, PrefixLink& l) {
    for (std::size_t i = 0; i < l.held; ++i)
      if (const auto kept = prefix_index.find(link_block_key(l, i)); kept != prefix_index.end()) unpin(kept->second);
    stop_waiting(id, l);
    l.held = 0;
  }

  /// Gives `id` the link `l` (its record is written), in place of the one
  /// it extends (whose pinned blocks it keeps), and counts what it can.
  void set_link(const RequestId& id, PrefixLink l) {
    RequestState& state = requests[id];
    if (state.link) {
      PrefixLink& old = *state.link;
      stop_waiting(id, old);
      l.held = old.held;
      l.broken = old.broken;
      state.bytes -= old.record_bytes;
      held_bytes -= old.record_bytes;
      if (old.key != l.key) note_deleted(old.key, old.record_bytes);  // the batch deleted the old record
    }
    state.bytes += l.record_bytes;
    held_bytes += l.record_bytes;
    state.link = std::move(l);
    advance_link(id, state);
  }

  /// A request's record (a replaced link) was deleted: its bytes count as
  /// deleted, and its key joins the jobs' span the next compaction covers.
  void note_deleted(const std::string& key, std::uint64_t bytes) {
    const std::string end = key + std::string(1, '\0');
    if (gc_begin.empty() || key < gc_begin) gc_begin = key;
    if (gc_end.empty() || end > gc_end) gc_end = end;
    gc_pending += bytes;
    deleted_bytes += bytes;
  }

  /// A prefix record's delete was written: its bytes count as deleted, and
  /// its key joins the prefix span the next compaction covers.
  void note_prefix_deleted(const std::string& key, std::uint64_t bytes) {
    const std::string end = key + std::string(1, '\0');  // the key's successor
    if (prefix_gc_begin.empty() || key < prefix_gc_begin) prefix_gc_begin = key;
    if (prefix_gc_end.empty() || end > prefix_gc_end) prefix_gc_end = end;
    gc_pending += bytes;
    deleted_bytes += bytes;
  }

  /// Forgets prefix blocks whose deletes were written: their bytes count as
  /// deleted, like GC'd chunks, until the next compaction of their keys.
  void forget_prefix(const std::vector<std::list<PrefixEntry>::iterator>& victims) {
    for (const auto it : victims) {
      note_prefix_deleted(it->key, it->bytes);
      prefix_bytes -= it->bytes;
      ++prefix_evictions;
      prefix_index.erase(it->key);
      prefix_lru.erase(it);
    }
  }

  /// Drops least recently used prefix blocks, not those with seq >=
  /// keep_from_seq, until at least `need` bytes are dropped or none is left
  /// to drop; one write of its own. Errors: those of the write (nothing
  /// dropped).
  Status drop_prefix_lru(std::uint64_t need, std::uint64_t keep_from_seq) {
    rocksdb::WriteBatch batch;
    std::vector<std::list<PrefixEntry>::iterator> victims;
    std::uint64_t freed = 0;
    for (auto it = prefix_lru.end(); freed < need && it != prefix_lru.begin();) {
      --it;
      if (it->seq >= keep_from_seq) break;
      if (const rocksdb::Status b = batch.Delete(it->key); !b.ok()) return db_error("batch prefix block delete", b);
      victims.push_back(it);
      freed += it->bytes;
    }
    if (victims.empty()) return {};
    if (Status r = db.writable(); !r.ok()) return r;
    const rocksdb::Status st = db->Write(write_options(), &batch);
    if (!st.ok()) return db.write_failed("drop " + std::to_string(victims.size()) + " prefix block(s)", st);
    forget_prefix(victims);
    return {};
  }

  /// Whether a write of `adding` more value bytes may go ahead, shared by
  /// put_many and put_prefix_blocks (`what` names what is written, for the
  /// errors). Under options.disk_budget_bytes it first compacts the deleted
  /// span, then drops least recently used prefix blocks (those with seq <
  /// keep_from_seq; a write of their deletes and a compaction, before the
  /// caller's write) when that makes it fit; then checks the disk reserve
  /// and that RocksDB takes writes. Every refusal counts in refused_writes.
  /// Errors: disk_full (the budget, the reserve, a full disk), io.
  Status admit_write(std::uint64_t adding, std::uint64_t keep_from_seq, const std::string& what) {
    if (const std::uint64_t budget = options.disk_budget_bytes; budget > 0 && budgeted_bytes() + adding > budget) {
      if (gc_pending > 0) {
        if (Status c = compact(); !c.ok()) return c;  // deleted keys give their space back first
      }
      if (budgeted_bytes() + adding > budget) {
        // Then prefix blocks, a cache of a cache, when dropping them makes room.
        std::uint64_t droppable = 0;
        for (auto it = prefix_lru.rbegin(); it != prefix_lru.rend() && it->seq < keep_from_seq; ++it)
          droppable += it->bytes;
        const std::uint64_t over = budgeted_bytes() + adding - budget;
        if (over <= droppable) {
          if (Status d = drop_prefix_lru(over, keep_from_seq); !d.ok()) {
            ++refused_writes;
            return d;
          }
          if (Status c = compact(); !c.ok()) return c;
        }
      }
      if (const std::uint64_t held = budgeted_bytes(); held + adding > budget) {
        ++refused_writes;
        return make_error(ErrorCode::disk_full, "kv store: disk budget of " + std::to_string(budget) + " bytes spent (" +
                                                    std::to_string(held) + " held, " + std::to_string(adding) +
                                                    " more asked): " + what + " not stored");
      }
    }
    if (const std::uint64_t reserve = options.disk_reserve_bytes; reserve > 0) {
      struct statvfs vfs {};
      if (::statvfs(dir.c_str(), &vfs) == 0) {
        const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
        if (free_bytes < reserve + adding) {
          ++refused_writes;
          return make_error(ErrorCode::disk_full, "kv store: " + std::to_string(free_bytes) + " bytes free under " +
                                                      dir + ", it leaves " + std::to_string(reserve) +
                                                      " free for jobs.db and outputs: " + what + " not stored");
        }
      }
    }
    if (Status r = db.writable(); !r.ok()) {
      ++refused_writes;
      return r;
    }
    return {};
  }

  /// Records a stored chunk of `id` (RequestState::add), keeping held_bytes.
  void add_chunk(const RequestId& id, const KvRange& range, std::uint64_t size) {
    RequestState& state = requests[id];
    const std::uint64_t before = state.bytes;
    state.add(options.shape.num_layers, range, size);
    held_bytes += state.bytes - before;
  }

  [[nodiscard]] rocksdb::WriteOptions write_options() const {
    rocksdb::WriteOptions w;
    w.disableWAL = options.sync == KvSyncPolicy::none;
    w.sync = options.sync == KvSyncPolicy::fsync;
    return w;
  }

  /// A chunk's bytes: the host tier, else RocksDB (then cached).
  Result<std::vector<std::byte>> read(const KvChunkKey& key) {
    const std::string k = encode_key(key);
    if (const auto* hit = tier.get(k)) {
      ++memory_hits;
      return *hit;
    }
    ++disk_reads;
    if (Status r = db.readable(); !r.ok()) return r.error();
    std::string v;
    const rocksdb::Status st = db->Get(rocksdb::ReadOptions(), k, &v);
    if (st.IsNotFound()) return make_error(ErrorCode::not_found, "kv store: no chunk " + describe(key));
    if (!st.ok()) return db_error("read " + describe(key), st);
    if (v.size() != chunk_size(options.shape, key.range))
      return make_error(ErrorCode::corrupt, "kv store: chunk " + describe(key) + ": " + std::to_string(v.size()) +
                                                " bytes stored, the range needs " +
                                                std::to_string(chunk_size(options.shape, key.range)));
    std::vector<std::byte> out(v.size());
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size());
    tier.put(k, out);
    return out;
  }

  /// Deletes keys [begin, end) and forgets `ids`.
  Status drop(const std::string& begin, const std::string& end, const std::vector<RequestId>& ids) {
    if (ids.empty()) return {};
    if (Status r = db.writable(); !r.ok()) return r;
    const rocksdb::Status st = db->DeleteRange(write_options(), db->DefaultColumnFamily(), begin, end);
    if (!st.ok()) return db.write_failed("delete range " + hex(begin), st);
    for (const RequestId& id : ids) {
      const auto it = requests.find(id);
      if (it->second.link) release_link(id, *it->second.link);
      for (const auto& [range, size] : it->second.chunks) tier.erase(encode_key(KvChunkKey{id.first, id.second, range}));
      gc_pending += it->second.bytes;
      deleted_bytes += it->second.bytes;
      held_bytes -= it->second.bytes;
      requests.erase(it);
    }
    if (gc_begin.empty() || begin < gc_begin) gc_begin = begin;
    if (gc_end.empty() || end > gc_end) gc_end = end;
    if (gc_pending >= options.compact_after_bytes) return compact();
    return {};
  }

  Status compact() {
    if (gc_begin.empty() && prefix_gc_begin.empty()) return {};
    if (Status r = db.writable(); !r.ok()) return r;
    rocksdb::CompactRangeOptions o;
    o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    for (auto* span : {&gc_begin, &prefix_gc_begin}) {
      std::string& begin = *span;
      std::string& end = span == &gc_begin ? gc_end : prefix_gc_end;
      if (begin.empty()) continue;
      const rocksdb::Slice b(begin), e(end);
      const rocksdb::Status st = db->CompactRange(o, &b, &e);
      if (!st.ok()) return db.write_failed("compact deleted range", st);
      begin.clear();
      end.clear();
    }
    ++compactions;
    gc_pending = 0;
    return {};
  }
};

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStore::~KvStore() = default;

Result<std::unique_ptr<KvStore>> KvStore::open(const std::string& dir, KvStoreOptions store_options) {
  const KvModelShape& shape = store_options.shape;
  if (shape.num_layers < 1 || shape.num_layers > kPrefixLinkLayer || shape.num_kv_heads < 1 || shape.head_dim < 1)
    return make_error(ErrorCode::invalid_argument,
                      "kv store: shape needs 1.." + std::to_string(kPrefixLinkLayer) +
                          " layers and positive num_kv_heads, head_dim (got " +
                          std::to_string(shape.num_layers) + ", " + std::to_string(shape.num_kv_heads) + ", " +
                          std::to_string(shape.head_dim) + ")");
  auto impl = std::make_unique<Impl>(store_options.host_bytes);
  impl->dir = dir;
  impl->options = std::move(store_options);

  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_open_files = 256;
  options.write_buffer_size = static_cast<std::size_t>(std::max<std::uint64_t>(impl->options.memtable_bytes, 64 << 10));
  if (impl->options.file_system) {
    impl->env = rocksdb::NewCompositeEnv(impl->options.file_system);
    options.env = impl->env.get();
  }
  auto db = ReopenableDb::open("kv store", dir, std::move(options),
                               std::chrono::milliseconds(impl->options.reopen_interval_ms));
  if (!db.ok()) return std::move(db).error();
  impl->db = std::move(db).value();

  // Rebuild every request's coverage, and the prefix blocks, from what survived.
  std::vector<Impl::PrefixEntry> prefix_blocks;
  std::vector<std::pair<std::string, std::uint64_t>> stale_prefix;  // records that do not fit the shape, value bytes
  std::vector<std::pair<RequestId, PrefixLink>> links;              // requests' prefix links
  std::vector<std::pair<std::string, std::uint64_t>> stale_links;   // link records that do not decode
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(impl->db->NewIterator(ro));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    auto key = decode_key(std::string_view(k.data(), k.size()));
    if (!key.ok()) return std::move(key).error();
    if ((key->job_id & kPrefixBlockJobBit) != 0) {
      // A prefix block of another shape (the node now serves another model
      // or KV dtype) or a damaged one is a cache entry of no use: dropped
      // below, not a reason to call the store corrupt (prefix blocks
      // outlive jobs, so a model change meets them).
      const KvRange& r = key->range;
      const std::size_t tokens = static_cast<std::size_t>(r.token_end);
      const std::size_t want = prefix_value_size(shape, tokens);
      if (r.layer_begin != 0 || r.layer_end != shape.num_layers || r.token_begin != 0 ||
          it->value().size() != want) {
        stale_prefix.emplace_back(std::string(k.data(), k.size()), it->value().size());
        continue;
      }
      const std::string_view v(it->value().data(), it->value().size());
      const std::size_t trailer = chunk_size(shape, r);
      Impl::PrefixEntry e{std::string(k.data(), k.size()), want, get_le(v, trailer + 8, 8), get_le(v, trailer, 8),
                          std::vector<std::int32_t>(tokens), 0};
      for (std::size_t i = 0; i < tokens; ++i)
        e.tokens[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(v, trailer + kPrefixTrailerBytes + 4 * i, 4)));
      prefix_blocks.push_back(std::move(e));
      continue;
    }
    if (key->range.layer_begin == kPrefixLinkLayer) {
      const std::string what = "(" + std::to_string(key->job_id) + ", " + std::to_string(key->request_id) + ")";
      auto link = decode_link(std::string_view(it->value().data(), it->value().size()), key->range.token_end, what);
      if (!link.ok() || key->range.token_begin != 0 || key->range.layer_end != kPrefixLinkLayer + 1) {
        // A damaged link is dropped (its request then counts only its own
        // chunks), not a reason to call the whole store corrupt.
        stale_links.emplace_back(std::string(k.data(), k.size()), it->value().size());
        continue;
      }
      link->key = std::string(k.data(), k.size());
      links.emplace_back(RequestId{key->job_id, key->request_id}, std::move(link).value());
      continue;
    }
    if (key->range.layer_end > shape.num_layers)
      return make_error(ErrorCode::corrupt, "kv store: " + dir + ": chunk " + describe(*key) + " beyond the model's " +
                                                std::to_string(shape.num_layers) + " layers");
    const std::size_t want = chunk_size(shape, key->range);
    if (it->value().size() != want)
      return make_error(ErrorCode::corrupt, "kv store: " + dir + ": chunk " + describe(*key) + ": " +
                                                std::to_string(it->value().size()) + " bytes stored, the range needs " +
                                                std::to_string(want));
    impl->add_chunk({key->job_id, key->request_id}, key->range, want);
  }
  if (!it->status().ok()) return db_error("scan " + dir, it->status());
  it.reset();
  for (auto& [id, state] : impl->requests) state.recompute();
  // The LRU by last write: the oldest seq at the back, dropped first.
  std::sort(prefix_blocks.begin(), prefix_blocks.end(),
            [](const Impl::PrefixEntry& a, const Impl::PrefixEntry& b) { return a.seq < b.seq; });
  for (Impl::PrefixEntry& e : prefix_blocks)
    impl->add_prefix(std::move(e.key), e.bytes, e.seq, e.parent, std::move(e.tokens));
  // Records that do not fit the shape are deleted, then the least recently
  // used blocks past the budget (a store opened with a smaller
  // --kv-prefix-mib, or 0). If a write fails the store still opens: stale
  // records are not indexed (never read), and the next put keeps the budget.
  if (!stale_prefix.empty() || !stale_links.empty()) {
    rocksdb::WriteBatch drop;
    bool ok = true;
    for (const auto& [k, bytes] : stale_prefix) ok = ok && drop.Delete(k).ok();
    for (const auto& [k, bytes] : stale_links) ok = ok && drop.Delete(k).ok();
    if (ok && impl->db->Write(impl->write_options(), &drop).ok()) {
      for (const auto& [k, bytes] : stale_prefix) impl->note_prefix_deleted(k, bytes);
      for (const auto& [k, bytes] : stale_links) impl->note_deleted(k, bytes);
    }
  }
  // Links pin their blocks again (so the budget below does not drop them)
  // and count what those blocks hold. A request has one record (a longer
  // link's write deletes the shorter one's in the same batch).
  for (auto& [id, link] : links) impl->set_link(id, std::move(link));
  impl->linked_tokens = 0;  // counts links made since open
  if (const std::uint64_t budget = impl->options.prefix_budget_bytes; impl->prefix_bytes > budget)
    (void)impl->drop_prefix_lru(impl->prefix_bytes - budget, std::numeric_limits<std::uint64_t>::max());
  return std::unique_ptr<KvStore>(new KvStore(std::move(impl)));
}

Result<int> KvStore::put(const KvChunkKey& key, std::span<const std::byte> chunk) {
  const KvChunkWrite w{key, chunk};
  auto acks = put_many(std::span<const KvChunkWrite>(&w, 1));
  if (!acks.ok()) return std::move(acks).error();
  return acks->front();
}

Result<std::vector<int>> KvStore::put_many(std::span<const KvChunkWrite> writes,
                                           std::span<const PrefixLinkWrite> links) {
  const KvModelShape& shape = impl_->options.shape;
  rocksdb::WriteBatch batch;
  // The links that change something: new, or extending the request's link.
  struct NewLink {
    RequestId id;
    PrefixLink link;
  };
  std::vector<NewLink> new_links;
  std::uint64_t link_bytes = 0;
  for (const PrefixLinkWrite& w : links) {
    const std::string what = "(" + std::to_string(w.job_id) + ", " + std::to_string(w.request_id) + ")";
    if ((w.job_id & kPrefixBlockJobBit) != 0)
      return make_error(ErrorCode::invalid_argument,
                        "kv store: prefix link of " + what + ": a job id with the top bit (kept for prefix blocks)");
    if (w.names.empty() || w.tokens.empty() || w.tokens.size() % w.names.size() != 0 ||
        w.tokens.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      return make_error(ErrorCode::invalid_argument, "kv store: prefix link of " + what + ": " +
                                                         std::to_string(w.names.size()) + " blocks and " +
                                                         std::to_string(w.tokens.size()) +
                                                         " tokens (expected >= 1 block, the same tokens per block, "
                                                         "< 2^31 tokens)");
    PrefixLink l;
    l.salt = w.salt & ~kPrefixBlockJobBit;
    l.root = w.root;
    l.names.assign(w.names.begin(), w.names.end());
    l.tokens.assign(w.tokens.begin(), w.tokens.end());
    l.block_tokens = static_cast<int>(w.tokens.size() / w.names.size());
    const RequestId id{w.job_id, w.request_id};
    // A link for a request with one: kept only when it extends it (a
    // request resent with a longer cached head).
    const PrefixLink* old = nullptr;
    if (const auto r = impl_->requests.find(id); r != impl_->requests.end() && r->second.link) old = &*r->second.link;
    for (const NewLink& n : new_links)
      if (n.id == id) old = &n.link;
    if (old != nullptr && !(old->salt == l.salt && old->root == l.root && old->block_tokens == l.block_tokens &&
                            l.names.size() > old->names.size() &&
                            std::equal(old->names.begin(), old->names.end(), l.names.begin()) &&
                            std::equal(old->tokens.begin(), old->tokens.end(), l.tokens.begin())))
      continue;
    l.key = link_key(w.job_id, w.request_id, l.num_tokens());
    const std::string value = encode_link(l);
    l.record_bytes = value.size();
    if (old != nullptr)
      if (const rocksdb::Status b = batch.Delete(old->key); !b.ok()) return db_error("batch link delete " + what, b);
    if (const rocksdb::Status b = batch.Put(l.key, value); !b.ok()) return db_error("batch link " + what, b);
    link_bytes += l.record_bytes;
    new_links.push_back(NewLink{id, std::move(l)});
  }
  std::vector<std::string> keys;
  keys.reserve(writes.size());
  for (const KvChunkWrite& w : writes) {
    if ((w.key.job_id & kPrefixBlockJobBit) != 0)
      return make_error(ErrorCode::invalid_argument,
                        "kv store: chunk " + describe(w.key) + ": a job id with the top bit (kept for prefix blocks)");
    if (Status s = check_range(shape, w.key); !s.ok()) return s.error();
    const std::size_t want = chunk_size(shape, w.key.range);
    if (w.chunk.size() != want)
      return make_error(ErrorCode::invalid_argument, "kv store: chunk " + describe(w.key) + ": " +
                                                         std::to_string(w.chunk.size()) + " bytes, the range needs " +
                                                         std::to_string(want));
    keys.push_back(encode_key(w.key));
    const rocksdb::Status b = batch.Put(
        keys.back(), rocksdb::Slice(reinterpret_cast<const char*>(w.chunk.data()), w.chunk.size()));
    if (!b.ok()) return db_error("batch " + describe(w.key), b);
  }
  const auto acks_now = [&] {
    std::vector<int> acks;
    acks.reserve(writes.size() + links.size());
    for (const KvChunkWrite& w : writes) acks.push_back(durable_tokens(w.key.job_id, w.key.request_id));
    for (const PrefixLinkWrite& w : links) acks.push_back(durable_tokens(w.job_id, w.request_id));
    return acks;
  };
  if (writes.empty() && new_links.empty()) return acks_now();
  std::uint64_t adding = link_bytes;  // bytes the batch stores
  for (const KvChunkWrite& w : writes) adding += w.chunk.size();
  // The blocks the batch's links name are used now: a disk budget that drops
  // prefix blocks to make room keeps them (admit_write keeps seq >= keep_from).
  const std::uint64_t keep_from = new_links.empty() ? std::numeric_limits<std::uint64_t>::max() : impl_->next_prefix_seq;
  for (const NewLink& n : new_links)
    for (std::size_t i = 0; i < n.link.names.size(); ++i)
      if (const auto kept = impl_->prefix_index.find(impl_->link_block_key(n.link, i)); kept != impl_->prefix_index.end())
        impl_->touch_prefix(kept->second);
  if (Status a = impl_->admit_write(adding, keep_from, "chunks"); !a.ok())
    return a.error();
  // The chunks count only once this returned ok: durable at the policy's level.
  const rocksdb::Status st = impl_->db->Write(impl_->write_options(), &batch);
  if (!st.ok()) {
    ++impl_->refused_writes;
    return impl_->db.write_failed("write " + std::to_string(writes.size()) + " chunk(s)", st);
  }
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const KvChunkWrite& w = writes[i];
    impl_->add_chunk({w.key.job_id, w.key.request_id}, w.key.range, w.chunk.size());
    impl_->tier.put(keys[i], w.chunk);
  }
  for (const KvChunkWrite& w : writes) impl_->requests[{w.key.job_id, w.key.request_id}].recompute();
  for (NewLink& n : new_links) impl_->set_link(n.id, std::move(n.link));
  return acks_now();
}

Status KvStore::flush(const KvChunkKey& key, std::span<const std::byte> chunk) {
  auto ack = put(key, chunk);
  if (!ack.ok()) return std::move(ack).error();
  return {};
}

Status KvStore::flush_linked(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer,
                             std::span<const PrefixLinkWrite> links) {
  std::vector<KvChunkWrite> writes;
  writes.reserve(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (Status s = check_chunk_ref(chunks[i], i, buffer.size()); !s.ok()) return s;
    writes.push_back(KvChunkWrite{chunks[i].key, buffer.subspan(chunks[i].offset, chunks[i].bytes)});
  }
  auto acks = put_many(writes, links);
  if (!acks.ok()) return std::move(acks).error();
  return {};
}

Result<std::vector<std::byte>> KvStore::fetch(const KvChunkKey& key) {
  if (Status s = check_range(impl_->options.shape, key); !s.ok()) return s.error();
  return impl_->read(key);
}

int KvStore::durable_tokens(std::uint64_t job_id, std::uint64_t request_id) const {
  const auto it = impl_->requests.find({job_id, request_id});
  return it == impl_->requests.end() ? 0 : it->second.durable;
}

Result<KvPrefix> KvStore::fetch_prefix(std::uint64_t job_id, std::uint64_t request_id, int max_tokens,
                                       int token_begin) {
  if (max_tokens < 0 || token_begin < 0)
    return make_error(ErrorCode::invalid_argument, "kv store: fetch_prefix: max_tokens " + std::to_string(max_tokens) +
                                                       ", token_begin " + std::to_string(token_begin));
  KvPrefix out;
  const auto found = impl_->requests.find({job_id, request_id});
  if (found == impl_->requests.end()) return out;
  const RequestState& state = found->second;
  const int t = std::min(state.durable, max_tokens);
  const int b = token_begin;
  if (t == 0) return out;
  out.tokens = t;
  if (t <= b) return out;
  const KvModelShape& shape = impl_->options.shape;
  out.chunk.resize(chunk_size(shape, KvRange{0, shape.num_layers, b, t}));
  if (state.link) {
    // The linked blocks first (the request's own chunks of the same
    // positions, if any, hold the same bytes).
    const PrefixLink& l = *state.link;
    for (std::size_t i = 0; i < l.held && static_cast<int>(i) * l.block_tokens < t; ++i) {
      if (static_cast<int>(i + 1) * l.block_tokens <= b) continue;
      const std::string key = impl_->link_block_key(l, i);
      if (Status r = impl_->db.readable(); !r.ok()) return r.error();
      std::string v;
      const rocksdb::Status st = impl_->db->Get(rocksdb::ReadOptions(), key, &v);
      if (!st.ok()) return db_error("read linked " + describe_prefix(l.salt, l.names[i]), st);  // pinned: kept
      const KvRange r{0, shape.num_layers, static_cast<int>(i) * l.block_tokens,
                      static_cast<int>(i + 1) * l.block_tokens};
      if (v.size() != prefix_value_size(shape, static_cast<std::size_t>(l.block_tokens)))
        return make_error(ErrorCode::corrupt, "kv store: linked " + describe_prefix(l.salt, l.names[i]) + ": " +
                                                  std::to_string(v.size()) + " bytes stored");
      place_chunk(shape, r, std::as_bytes(std::span<const char>(v.data(), chunk_size(shape, r))), b, t, out.chunk);
    }
  }
  // Ranges in token_begin order: stop at the first one starting at or past t.
  for (const auto& [r, size] : state.chunks) {
    if (r.token_begin >= t) break;
    if (r.token_end <= b) continue;
    auto bytes = impl_->read(KvChunkKey{job_id, request_id, r});
    if (!bytes.ok()) return std::move(bytes).error();
    place_chunk(shape, r, *bytes, b, t, out.chunk);
  }
  return out;
}

std::vector<KvRequestCoverage> KvStore::take_woken_links() {
  std::vector<KvRequestCoverage> out;
  for (const RequestId& id : std::exchange(impl_->woken, {}))
    if (const auto r = impl_->requests.find(id); r != impl_->requests.end())
      out.push_back(KvRequestCoverage{id.first, id.second, r->second.durable, r->second.chunks.size(), r->second.bytes});
  return out;
}

std::optional<std::uint64_t> KvStore::waiting_link_block(std::uint64_t job_id, std::uint64_t request_id) const {
  const auto found = impl_->requests.find({job_id, request_id});
  if (found == impl_->requests.end() || !found->second.link || !found->second.link->pending()) return std::nullopt;
  // Not once the request's own chunks cover the link's positions (its head
  // was streamed as KV after all): then the wait holds nothing back.
  if (found->second.durable >= found->second.link->num_tokens()) return std::nullopt;
  return found->second.link->names[found->second.link->held];
}

std::optional<StoredPrefixLink> KvStore::prefix_link(std::uint64_t job_id, std::uint64_t request_id) const {
  const auto found = impl_->requests.find({job_id, request_id});
  if (found == impl_->requests.end() || !found->second.link) return std::nullopt;
  const PrefixLink& l = *found->second.link;
  return StoredPrefixLink{l.salt, l.root, l.names, l.tokens, static_cast<int>(l.held) * l.block_tokens};
}

Status KvStore::drop_request(std::uint64_t job_id, std::uint64_t request_id) {
  if (impl_->requests.count({job_id, request_id}) == 0) return {};
  const std::string begin = encode_request_prefix(job_id, request_id);
  // Past every 28-byte key of the request, without overflowing request_id.
  const std::string end = begin + std::string(kKvKeyBytes - kKvRequestPrefixBytes, '\xff') + std::string(1, '\0');
  return impl_->drop(begin, end, {{job_id, request_id}});
}

Status KvStore::drop_job(std::uint64_t job_id) {
  if ((job_id & kPrefixBlockJobBit) != 0)
    return make_error(ErrorCode::invalid_argument, "kv store: drop_job " + std::to_string(job_id) +
                                                       ": a job id with the top bit (kept for prefix blocks)");
  std::vector<RequestId> ids;
  for (auto it = impl_->requests.lower_bound({job_id, 0}); it != impl_->requests.end() && it->first.first == job_id;
       ++it)
    ids.push_back(it->first);
  std::string begin;
  put_be(begin, job_id, 8);
  const std::string end = begin + std::string(kKvKeyBytes - 8, '\xff') + std::string(1, '\0');
  return impl_->drop(begin, end, ids);
}

Status KvStore::compact() { return impl_->compact(); }

Result<int> KvStore::put_prefix_blocks(std::span<const PrefixBlockWrite> writes) {
  Impl& m = *impl_;
  const KvModelShape& shape = m.options.shape;
  for (const PrefixBlockWrite& w : writes) {
    if (w.tokens.empty() || w.tokens.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      return make_error(ErrorCode::invalid_argument, "kv store: " + describe_prefix(w.salt, w.name) + ": " +
                                                         std::to_string(w.tokens.size()) +
                                                         " tokens, expected 1 to 2^31 - 1");
    const std::size_t want = chunk_size(shape, prefix_range(shape, w.tokens.size()));
    if (w.chunk.size() != want)
      return make_error(ErrorCode::invalid_argument, "kv store: " + describe_prefix(w.salt, w.name) + ": " +
                                                         std::to_string(w.chunk.size()) + " chunk bytes, " +
                                                         std::to_string(w.tokens.size()) + " tokens of all " +
                                                         std::to_string(shape.num_layers) + " layers need " +
                                                         std::to_string(want));
  }
  // Blocks kept already are used now (in memory, whatever the write does);
  // they and the call's new blocks (seq >= first_seq) are not dropped for it.
  const std::uint64_t first_seq = m.next_prefix_seq;
  struct NewBlock {
    std::size_t write = 0;  ///< index in `writes`
    std::string key;
    std::uint64_t bytes = 0;
  };
  std::vector<NewBlock> news;
  std::unordered_set<std::string> new_keys;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const PrefixBlockWrite& w = writes[i];
    std::string key = prefix_key(shape, w.salt, w.name, w.tokens.size());
    if (const auto kept = m.prefix_index.find(key); kept != m.prefix_index.end()) {
      m.touch_prefix(kept->second);
      continue;
    }
    if (!new_keys.insert(key).second) continue;  // named twice: the first counts
    news.push_back(NewBlock{i, std::move(key), prefix_value_size(shape, w.tokens.size())});
  }

  // Which new blocks the budget takes, and which kept ones (least recently
  // used first) make room for them: a block larger than the budget, or one
  // that fits only by dropping blocks of this call, is skipped (the call's
  // earlier blocks, a fetch's leading run, win). A store reopened with a
  // smaller budget drops the excess here too.
  const std::uint64_t budget = m.options.prefix_budget_bytes;
  struct Plan {
    std::vector<std::list<Impl::PrefixEntry>::iterator> victims;
    std::vector<const NewBlock*> stored;
    std::uint64_t adding = 0;
  };
  const auto plan = [&] {
    Plan p;
    std::uint64_t planned = m.prefix_bytes, droppable = 0;
    for (auto it = m.prefix_lru.rbegin(); it != m.prefix_lru.rend() && it->seq < first_seq; ++it)
      droppable += it->bytes;
    auto next_victim = m.prefix_lru.end();
    const auto drop_one = [&] {
      --next_victim;
      planned -= next_victim->bytes;
      droppable -= next_victim->bytes;
      p.victims.push_back(next_victim);
    };
    while (planned > budget && droppable > 0) drop_one();
    for (const NewBlock& n : news) {
      if (n.bytes > budget || planned - droppable + n.bytes > budget) continue;
      while (planned + n.bytes > budget) drop_one();
      planned += n.bytes;
      p.stored.push_back(&n);
      p.adding += n.bytes;
    }
    return p;
  };
  Plan p = plan();
  if (p.victims.empty() && p.stored.empty()) return 0;
  if (!p.stored.empty()) {
    // The disk budget may drop more of the least recently used blocks (a
    // write of their own): plan again over what is left. The same blocks
    // are stored (those dropped were the plan's first victims).
    if (Status a = m.admit_write(p.adding, first_seq, "prefix blocks"); !a.ok()) return a.error();
    p = plan();
  } else if (Status r = m.db.writable(); !r.ok()) {
    return r.error();
  }

  rocksdb::WriteBatch batch;
  for (const auto it : p.victims)
    if (const rocksdb::Status b = batch.Delete(it->key); !b.ok()) return db_error("batch prefix block delete", b);
  std::vector<std::uint64_t> seqs;
  seqs.reserve(p.stored.size());
  for (std::size_t i = 0; i < p.stored.size(); ++i) {
    const NewBlock& n = *p.stored[i];
    const PrefixBlockWrite& w = writes[n.write];
    const std::uint64_t seq = m.next_prefix_seq + i;
    seqs.push_back(seq);
    std::string value;
    value.reserve(n.bytes);
    value.append(reinterpret_cast<const char*>(w.chunk.data()), w.chunk.size());
    put_le(value, w.parent, 8);
    put_le(value, seq, 8);
    for (const std::int32_t t : w.tokens) put_le(value, static_cast<std::uint32_t>(t), 4);
    if (const rocksdb::Status b = batch.Put(n.key, value); !b.ok())
      return db_error("batch " + describe_prefix(w.salt, w.name), b);
  }
  const rocksdb::Status st = m.db->Write(m.write_options(), &batch);
  if (!st.ok()) {
    ++m.refused_writes;
    return m.db.write_failed("write " + std::to_string(p.stored.size()) + " prefix block(s), drop " +
                                 std::to_string(p.victims.size()),
                             st);
  }
  m.forget_prefix(p.victims);
  for (std::size_t i = 0; i < p.stored.size(); ++i) {
    const PrefixBlockWrite& w = writes[p.stored[i]->write];
    m.add_prefix(p.stored[i]->key, p.stored[i]->bytes, seqs[i], w.parent,
                 std::vector<std::int32_t>(w.tokens.begin(), w.tokens.end()));
  }
  for (const NewBlock* n : p.stored) m.wake_links(n->key);
  if (m.gc_pending >= m.options.compact_after_bytes) {
    if (Status c = m.compact(); !c.ok()) return c.error();
  }
  return static_cast<int>(p.stored.size());
}

Result<std::vector<StoredPrefixBlock>> KvStore::fetch_prefix_blocks(std::uint64_t salt,
                                                                    std::span<const PrefixBlockQuery> queries) {
  Impl& m = *impl_;
  const KvModelShape& shape = m.options.shape;
  std::vector<StoredPrefixBlock> out;
  for (const PrefixBlockQuery& q : queries) {
    const std::size_t n = q.tokens.size();
    if (n == 0 || n > static_cast<std::size_t>(std::numeric_limits<int>::max())) break;  // never stored
    const std::string key = prefix_key(shape, salt, q.name, n);
    const auto kept = m.prefix_index.find(key);
    if (kept == m.prefix_index.end()) break;
    if (Status r = m.db.readable(); !r.ok()) return r.error();
    std::string v;
    const rocksdb::Status st = m.db->Get(rocksdb::ReadOptions(), key, &v);
    if (!st.ok()) return db_error("read " + describe_prefix(salt, q.name), st);  // not_found too: the index has it
    const std::size_t want = prefix_value_size(shape, n);
    if (v.size() != want)
      return make_error(ErrorCode::corrupt, "kv store: " + describe_prefix(salt, q.name) + ": " +
                                                std::to_string(v.size()) + " bytes stored, " + std::to_string(n) +
                                                " tokens need " + std::to_string(want));
    const std::size_t chunk_bytes = chunk_size(shape, prefix_range(shape, n));
    const std::string_view view(v);
    if (get_le(view, chunk_bytes, 8) != q.parent) break;  // another prefix under the same name
    bool same = true;
    for (std::size_t i = 0; i < n && same; ++i)
      same = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(view, chunk_bytes + kPrefixTrailerBytes + 4 * i, 4))) ==
             q.tokens[i];
    if (!same) break;
    StoredPrefixBlock b;
    b.name = q.name;
    b.parent = q.parent;
    b.tokens.assign(q.tokens.begin(), q.tokens.end());
    b.chunk.resize(chunk_bytes);
    std::memcpy(b.chunk.data(), v.data(), chunk_bytes);
    out.push_back(std::move(b));
    m.touch_prefix(kept->second);
    ++m.prefix_hits;
  }
  return out;
}

std::vector<KvRequestCoverage> KvStore::requests() const {
  std::vector<KvRequestCoverage> out;
  out.reserve(impl_->requests.size());
  for (const auto& [id, state] : impl_->requests)
    out.push_back(KvRequestCoverage{id.first, id.second, state.durable, state.chunks.size(), state.bytes});
  return out;
}

Result<KvStoreStats> KvStore::stats() const {
  KvStoreStats s;
  s.memory_chunks = impl_->tier.chunks();
  s.memory_bytes = impl_->tier.bytes();
  s.memory_budget = impl_->options.host_bytes;
  s.memory_hits = impl_->memory_hits;
  s.disk_reads = impl_->disk_reads;
  s.disk_budget = impl_->options.disk_budget_bytes;
  s.refused_writes = impl_->refused_writes;
  s.reopens = impl_->db.reopens();
  if (Status r = impl_->db.readable(); !r.ok()) return r.error();
  std::uint64_t v = 0;
  if (impl_->db->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &v)) s.memtable_bytes = v;
  if (impl_->db->GetIntProperty(rocksdb::DB::Properties::kLiveSstFilesSize, &v)) s.sst_bytes = v;
  rocksdb::VectorLogPtr wals;
  const rocksdb::Status st = impl_->db->GetSortedWalFiles(wals);
  if (!st.ok()) return db_error("list WAL files", st);
  for (const auto& w : wals) s.wal_bytes += w->SizeFileBytes();
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(impl_->dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (it->is_regular_file(fe)) {
      const auto size = it->file_size(fe);
      if (!fe) s.disk_bytes += size;  // a file removed meanwhile counts 0
    }
  }
  if (ec) return make_error(ErrorCode::io, "kv store: list " + impl_->dir + ": " + ec.message());
  s.requests = impl_->requests.size();
  for (const auto& [id, state] : impl_->requests) {
    s.chunks += state.chunks.size();
    s.chunk_bytes += state.bytes;
  }
  s.deleted_bytes = impl_->deleted_bytes;
  s.compactions = impl_->compactions;
  s.prefix_blocks = impl_->prefix_index.size();
  s.prefix_bytes = impl_->prefix_bytes;
  s.prefix_budget = impl_->options.prefix_budget_bytes;
  s.prefix_evictions = impl_->prefix_evictions;
  s.prefix_hits = impl_->prefix_hits;
  for (const auto& [id, state] : impl_->requests)
    if (state.link) {
      ++s.prefix_links;
      if (state.link->pending()) ++s.prefix_links_pending;
    }
  s.prefix_pinned = impl_->prefix_pinned.size();
  s.linked_tokens = impl_->linked_tokens;
  return s;
}

bool KvStore::keeps_prefix_block(std::uint64_t salt, std::uint64_t name, std::size_t num_tokens) const {
  if (num_tokens == 0 || num_tokens > static_cast<std::size_t>(std::numeric_limits<int>::max())) return false;
  return impl_->prefix_index.count(prefix_key(impl_->options.shape, salt, name, num_tokens)) != 0;
}

const KvStoreOptions& KvStore::options() const noexcept { return impl_->options; }
const std::string& KvStore::dir() const noexcept { return impl_->dir; }

}  // namespace shardline::kvstore
