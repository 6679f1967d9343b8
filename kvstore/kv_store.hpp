#pragma once
/// \file
/// The persistent KV store of one node (DéjàVu §4.2.3's replica memory,
/// issue "KV-store actors with RocksDB"): canonical KV chunks
/// (kvstore/kv_stream.hpp) of in-flight requests, in two tiers:
///
///  - a host-memory tier: an LRU of recently written or read chunks under a
///    byte budget (`KvStoreOptions::host_bytes`); `fetch` and `fetch_prefix`
///    look there first; an evicted chunk stays on disk;
///  - RocksDB in one directory (the node passes `DATA/kv`): every chunk, with
///    the durability of the configured KvSyncPolicy.
///
/// Key layout (28 bytes, fixed width, big-endian, so RocksDB's bytewise order
/// is the numeric order and a request's chunks are one key range, in token
/// order):
///   job_id u64 | request_id u64 | token_begin u32 | token_end u32 | layer_begin u16 | layer_end u16
/// Value: the canonical chunk of the key's range, exactly
/// chunk size = layers * 2 * num_kv_heads * tokens * head_dim * dtype_size bytes
/// (no header; RocksDB checksums its blocks and WAL records).
///
/// Acknowledgements (the paper's (x, j, t)): per (job, request),
/// `durable_tokens` is the largest t such that every layer in
/// [0, num_layers) has stored chunks covering positions [0, t) with no gap.
/// A chunk counts once the write that stored it returned ok, that is once it
/// is durable at the configured sync level (for `fsync`: once the synced WAL
/// write returned). Chunks may arrive per layer range (a prefill streamed
/// layer by layer) or for all layers (a decode step), in any order, and may
/// overlap earlier ones (a recovered worker resending); overlapping chunks
/// are expected to hold the same bytes (batch-invariant kernels). On open
/// the coverage of every request is rebuilt from what RocksDB holds, so a
/// restarted store acknowledges only what survived.
///
/// Garbage collection: `drop_request` / `drop_job` delete a key range
/// (RocksDB DeleteRange, one tombstone) and drop those chunks from the host
/// tier; once `compact_after_bytes` of chunks were deleted, the key span
/// from the first to the last deleted key is compacted (live chunks inside
/// it are rewritten), so their disk space comes back.
///
/// A full disk (issue 46, item 7): a failed write returns disk_full and
/// counts nothing; RocksDB then refuses writes until reopened, so the next
/// call closes and opens it again (kvstore/rocksdb_support.hpp), trying at
/// every call while the disk stays full. Its LOG is written by
/// open_info_log(), which survives a full disk.
///
/// Prefix blocks (issue 42, step 5: the persistent prefix tier). Beside
/// requests' chunks, the store keeps full KV blocks of shared prompt
/// prefixes that workers spilled (engine/prefix_tier.hpp), so that a
/// restarted node or the next job over the same prompts fetches them
/// instead of computing them. A block is keyed by its name (the engine's
/// hash chain, engine/prefix_cache.hpp) under a salt (what else changes the
/// KV: model, dtypes, parallel layout), in the same key layout: job_id =
/// kPrefixBlockJobBit | salt (63 bits), request_id = name, tokens
/// [0, num_tokens), layers [0, num_layers). Job ids never have the top bit
/// (puts of chunks with it are refused), so prefix blocks sort after every
/// job's chunks, no job's GC reaches them and they have no coverage or
/// acks. Value: the canonical chunk, then a trailer of the parent's name
/// (u64), a use sequence number (u64) and the block's token ids (i32 each),
/// little-endian; a fetch compares parent and tokens, so a 64-bit name
/// collision never hands out another prefix's KV. They are bounded by
/// their own share, `prefix_budget_bytes`, least recently used (put or
/// fetched; across a reopen: last written) dropped first (open drops those
/// past the budget at once, and those that do not fit the shape: a node
/// restarted with another model meets them, and they are a cache, so the
/// store is not called corrupt for them), and count towards
/// `disk_budget_bytes` like chunks: a chunk put that would pass the disk
/// budget first drops prefix blocks (a cache of a cache) before it is
/// refused (a write of their deletes and a compaction before the chunks'
/// write). Dropped prefix blocks are deleted bytes like GC'd chunks
/// (`compact_after_bytes`, the compacted span). The store itself does not
/// replicate them (the KV-store actor forwards the puts to its replica).
///
/// Prefix links (issue 42: DéjàVu's token streaming from the end of a
/// cached prefix). A request whose prompt starts with a cached prefix does
/// not send that prefix's KV again: with its chunks from position c on, it
/// sends a link, "positions [0, c) of (job, request) are the prefix blocks
/// `names` under `salt`" (put_many's `links`). The store checks each named
/// block by parent and tokens, as a fetch does, and counts the leading run
/// it keeps as the request's positions, for every layer: they count towards
/// durable_tokens and fetch_prefix merges the blocks' chunks in. A linked
/// block is pinned: no budget drops it while a request links it; drop_request
/// / drop_job unpin it. A block the store does not keep yet leaves the link
/// pending there: the positions from it on do not count until a
/// put_prefix_blocks brings it (the worker's prefix tier sends the blocks
/// and the link on two queues, so either may come first); a block that
/// differs (a collision) ends the link for good. Key: the request's
/// prefix, tokens [0, c), layers [kPrefixLinkLayer, kPrefixLinkLayer + 1)
/// (no chunk has that layer: models have at most kPrefixLinkLayer layers).
/// Value: salt, root (the first block's parent), the number of names and
/// of tokens per block (u32 each), the names (u64), the tokens (i32),
/// little-endian. On open the links are read again and pin what they name;
/// a record that does not decode is deleted (its request counts only its
/// own chunks), not called corrupt. A put_many whose links name blocks
/// uses them: the disk budget does not drop them for that put.
///
/// Thread safety: none; one owner (the KV-store actor) serializes calls.
/// Calls block on RocksDB (a synced write, a GC compaction).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace shardline::kvstore {

/// When a write counts as durable (see docs/kv-store.md for what each
/// survives, with and without replication).
enum class KvSyncPolicy {
  /// RocksDB memtable only (WriteOptions::disableWAL): an ack means "in this
  /// process's memory". A clean close flushes it to disk; a process crash or
  /// a power loss loses what was not flushed yet.
  none,
  /// WAL written, not fsynced: survives a process crash (kill -9: the kernel
  /// has the bytes), not a power loss / OS crash.
  wal,
  /// WAL fsynced per write batch (WriteOptions::sync): survives a power loss.
  fsync,
};

/// "none", "wal" or "fsync".
[[nodiscard]] const char* kv_sync_policy_name(KvSyncPolicy policy) noexcept;

/// Parses a policy name. Errors: invalid_argument naming the allowed names.
[[nodiscard]] Result<KvSyncPolicy> parse_kv_sync_policy(std::string_view name);

/// Bytes of an encoded key.
inline constexpr std::size_t kKvKeyBytes = 28;
/// Bytes of the (job, request) prefix of a key.
inline constexpr std::size_t kKvRequestPrefixBytes = 16;

/// The key of a chunk (layout above). Precondition: the range is valid for
/// the store (0 <= begin < end, tokens < 2^31, layers < 2^16); KvStore
/// checks this before encoding.
[[nodiscard]] std::string encode_key(const KvChunkKey& key);

/// The 16-byte (job, request) prefix of every key of a request.
[[nodiscard]] std::string encode_request_prefix(std::uint64_t job_id, std::uint64_t request_id);

/// Parses a key. Errors: corrupt (not 28 bytes, begin >= end, a token
/// position >= 2^31).
[[nodiscard]] Result<KvChunkKey> decode_key(std::string_view bytes);

struct KvStoreOptions {
  /// KV geometry of the model: num_layers (1 .. kPrefixLinkLayer) for coverage and
  /// acks, num_kv_heads, head_dim and dtype for chunk sizes and merging.
  KvModelShape shape;
  /// Byte budget of the host-memory tier (0: no tier, every fetch reads
  /// RocksDB).
  std::uint64_t host_bytes = 256ull << 20;
  KvSyncPolicy sync = KvSyncPolicy::wal;
  /// Compact the deleted key span once this many chunk (and prefix block)
  /// bytes were deleted.
  std::uint64_t compact_after_bytes = 64ull << 20;
  /// RocksDB memtable size (write_buffer_size), bytes.
  std::uint64_t memtable_bytes = 16ull << 20;
  /// Byte budget on disk (0: none): a put that would take the chunk and
  /// prefix block bytes held, plus those deleted but not compacted yet, past
  /// it first compacts the deleted span, then drops least recently used
  /// prefix blocks when that makes it fit, else is refused with disk_full
  /// (the store is a cache: that KV is recomputed if needed). RocksDB's own files (index
  /// blocks, MANIFEST, LOG) come on top, a few percent.
  std::uint64_t disk_budget_bytes = 0;
  /// Free space the store leaves on its disk (0: none): a put that would
  /// leave less free (statvfs of the directory) is refused with disk_full,
  /// so that the cache never takes the last space jobs.db and the output
  /// files on the same disk need.
  std::uint64_t disk_reserve_bytes = 256ull << 20;
  /// After a write failed on a full disk: the least time between two
  /// probes for free space (each writes and syncs 1 MiB,
  /// kvstore::probe_free_space) before the store reopens RocksDB; writes
  /// in between are refused at once with that error.
  std::uint64_t reopen_interval_ms = 1000;
  /// The file system RocksDB runs on; null: RocksDB's default (POSIX). Tests
  /// inject one that drops unsynced writes at a simulated crash
  /// (tests/support/fault_injection_rocksdb_fs.hpp).
  std::shared_ptr<rocksdb::FileSystem> file_system;
  /// Bytes of prefix blocks (value bytes: chunk and trailer) the store
  /// keeps at most (0: it keeps none, put_prefix_blocks stores nothing).
  std::uint64_t prefix_budget_bytes = 1ull << 30;
};

/// The top bit of a prefix block's job id (see the file comment).
inline constexpr std::uint64_t kPrefixBlockJobBit = 1ull << 63;

/// The layer of a prefix link's key (see the file comment): one past the
/// last layer a model may have.
inline constexpr int kPrefixLinkLayer = 65534;

/// One block of put_prefix_blocks.
struct PrefixBlockWrite {
  std::uint64_t salt = 0;                ///< its low 63 bits are used
  std::uint64_t name = 0;                ///< the block's name (engine/prefix_cache.hpp)
  std::uint64_t parent = 0;              ///< its parent's name
  std::span<const std::int32_t> tokens;  ///< the block's token ids (>= 1)
  std::span<const std::byte> chunk;      ///< canonical chunk of all layers x tokens.size() positions
};

/// A prefix block as fetch_prefix_blocks returns it.
struct StoredPrefixBlock {
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::byte> chunk;  ///< canonical chunk of all layers x tokens.size() positions
};

/// One block fetch_prefix_blocks looks for: the request's own parent name
/// and tokens, compared with the stored block's.
struct PrefixBlockQuery {
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::span<const std::int32_t> tokens;
};

/// One write of `put_many`.
struct KvChunkWrite {
  KvChunkKey key;
  std::span<const std::byte> chunk;  ///< the canonical chunk of key.range
};

/// A request's durable prefix (or the part of it from token_begin on) as
/// one canonical chunk.
struct KvPrefix {
  int tokens = 0;                ///< t: the chunk is KvRange{0, num_layers, token_begin, t}
  std::vector<std::byte> chunk;  ///< chunk size of that range (empty when t <= token_begin)
};

/// A request's prefix link as the store keeps it (for a replica's catch-up).
struct StoredPrefixLink {
  std::uint64_t salt = 0;
  std::uint64_t root = 0;
  std::vector<std::uint64_t> names;
  std::vector<std::int32_t> tokens;
  int held_tokens = 0;  ///< positions of its leading blocks the store keeps (counted)
};

/// A request the store holds chunks of.
struct KvRequestCoverage {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  int durable_tokens = 0;
  std::uint64_t chunks = 0;  ///< stored chunks (RocksDB keys)
  std::uint64_t bytes = 0;   ///< their value bytes
};

struct KvStoreStats {
  std::uint64_t memory_chunks = 0;     ///< chunks in the host tier
  std::uint64_t memory_bytes = 0;      ///< their bytes (<= memory_budget)
  std::uint64_t memory_budget = 0;     ///< KvStoreOptions::host_bytes
  std::uint64_t memory_hits = 0;       ///< chunk reads served by the host tier since open
  std::uint64_t disk_reads = 0;        ///< chunk reads that went to RocksDB since open
  std::uint64_t memtable_bytes = 0;    ///< RocksDB memtables (rocksdb.cur-size-all-mem-tables)
  std::uint64_t sst_bytes = 0;         ///< live SST files (rocksdb.live-sst-files-size)
  std::uint64_t wal_bytes = 0;         ///< WAL files
  std::uint64_t disk_bytes = 0;        ///< every file in the directory (SST, WAL, MANIFEST, LOG, ...)
  std::uint64_t requests = 0;          ///< requests tracked
  std::uint64_t chunks = 0;            ///< chunks stored
  std::uint64_t chunk_bytes = 0;       ///< their value bytes
  std::uint64_t deleted_bytes = 0;     ///< chunk and prefix block bytes deleted (GC, budgets) since open
  std::uint64_t compactions = 0;       ///< GC compactions since open
  std::uint64_t disk_budget = 0;       ///< KvStoreOptions::disk_budget_bytes (0: none)
  std::uint64_t refused_writes = 0;    ///< put (chunk or prefix block) calls refused since open: budget spent or disk full
  std::uint64_t reopens = 0;           ///< RocksDB closed and opened again after a failed write
  std::uint64_t prefix_blocks = 0;     ///< prefix blocks kept
  std::uint64_t prefix_bytes = 0;      ///< their value bytes (<= prefix_budget)
  std::uint64_t prefix_budget = 0;     ///< KvStoreOptions::prefix_budget_bytes
  std::uint64_t prefix_evictions = 0;  ///< prefix blocks dropped for a budget since open
  std::uint64_t prefix_hits = 0;       ///< prefix blocks fetched since open
  std::uint64_t prefix_links = 0;      ///< requests with a prefix link
  std::uint64_t prefix_links_pending = 0;  ///< of them, waiting for a block the store does not keep yet
  std::uint64_t prefix_pinned = 0;     ///< prefix blocks a link pins
  std::uint64_t linked_tokens = 0;     ///< positions counted from links since open (KV not sent again)
};

class KvStore final : public KvTarget {
 public:
  /// Opens (creating if missing) the RocksDB database in `dir` and rebuilds
  /// the coverage of every stored request. Errors: invalid_argument (a bad
  /// shape), io (RocksDB cannot open it), corrupt (a key that does not
  /// decode, a request's chunk whose value size is not its range's chunk
  /// size or with a layer outside the shape: the store was written for
  /// another model). Prefix blocks that do not fit the shape are dropped,
  /// not corrupt.
  [[nodiscard]] static Result<std::unique_ptr<KvStore>> open(const std::string& dir, KvStoreOptions options);
  ~KvStore() override;
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  /// Stores one chunk (replacing an equal key) and returns the request's new
  /// durable_tokens: its acknowledgement. Errors: invalid_argument (layers
  /// outside [0, num_layers), an empty or negative range, a chunk that is not
  /// the range's chunk size, a job id with kPrefixBlockJobBit; nothing is
  /// written), disk_full (the disk
  /// budget is spent or the disk is full; nothing counts), io (RocksDB;
  /// nothing counts).
  [[nodiscard]] Result<int> put(const KvChunkKey& key, std::span<const std::byte> chunk);

  /// Stores several chunks, and prefix links (see the file comment), in one
  /// RocksDB write batch (one fsync with `fsync`): all or none. Returns each
  /// write's request's durable_tokens after the batch, in `writes` order,
  /// then each link's request's. A link for a request that has one already
  /// replaces it only when it extends it (same salt and root, the old names
  /// a prefix of the new); otherwise it is ignored (the old one stays).
  /// Errors: as put (one invalid write rejects the batch); invalid_argument
  /// for a link without names, with tokens that are not a whole number per
  /// name, of 2^31 tokens or more, or of a job id with kPrefixBlockJobBit.
  [[nodiscard]] Result<std::vector<int>> put_many(std::span<const KvChunkWrite> writes,
                                                  std::span<const PrefixLinkWrite> links = {});

  /// KvTarget: put without the ack.
  [[nodiscard]] Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) override;
  /// KvTarget: put_many of the chunks and links (acks dropped).
  [[nodiscard]] Status flush_linked(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer,
                                    std::span<const PrefixLinkWrite> links) override;
  [[nodiscard]] bool takes_prefix_links() const override { return true; }
  /// KvTarget: the chunk stored under exactly `key` (host tier first).
  /// Errors: not_found, io, corrupt (a stored value of the wrong size).
  [[nodiscard]] Result<std::vector<std::byte>> fetch(const KvChunkKey& key) override;

  /// The acknowledged prefix of a request (0 when unknown).
  [[nodiscard]] int durable_tokens(std::uint64_t job_id, std::uint64_t request_id) const;

  /// What recovery needs: the request's positions [token_begin, t),
  /// t = min(durable_tokens, max_tokens), all layers, merged from the stored
  /// chunks (and the linked prefix blocks) into one canonical chunk of
  /// KvRange{0, num_layers, token_begin, t} (empty when t <= token_begin).
  /// A token_begin > 0 fetches a long prefix in parts (each a message under
  /// messages::kMaxMessageBytes), or the part after a prefix link.
  /// Errors: invalid_argument (max_tokens or token_begin < 0), io, corrupt.
  [[nodiscard]] Result<KvPrefix> fetch_prefix(std::uint64_t job_id, std::uint64_t request_id, int max_tokens,
                                              int token_begin = 0);

  /// The request's prefix link, if it has one.
  [[nodiscard]] std::optional<StoredPrefixLink> prefix_link(std::uint64_t job_id, std::uint64_t request_id) const;
  /// Requests whose durable_tokens grew because a put_prefix_blocks brought
  /// a block their link waited for, since the last call (then cleared).
  [[nodiscard]] std::vector<KvRequestCoverage> take_woken_links();
  /// The name of the block the request's link waits for (pending), while
  /// that keeps its durable_tokens below the link's end; else nullopt.
  [[nodiscard]] std::optional<std::uint64_t> waiting_link_block(std::uint64_t job_id, std::uint64_t request_id) const;

  /// Deletes a request's chunks (no-op when unknown); may run the GC
  /// compaction. Errors: io (the delete: nothing changed; or the compaction:
  /// the chunks are deleted, their space comes back at the next one).
  [[nodiscard]] Status drop_request(std::uint64_t job_id, std::uint64_t request_id);
  /// Deletes every chunk of a job. Errors: as drop_request; invalid_argument
  /// for a job id with kPrefixBlockJobBit (prefix blocks are not a job's;
  /// nothing changes). drop_request of such an id is a no-op (no request).
  [[nodiscard]] Status drop_job(std::uint64_t job_id);
  /// Compacts the key span deleted since the last compaction now (GC runs
  /// this itself after compact_after_bytes). Errors: io.
  [[nodiscard]] Status compact();

  /// Keeps prefix blocks (see the file comment), in one write batch. A block
  /// kept already (same salt, name and number of tokens) is only marked
  /// used (in memory, not rewritten; also when the write then fails); a
  /// name repeated in `writes` counts once. Blocks that do not fit
  /// prefix_budget_bytes drop the least recently used ones first (deletes
  /// in the same batch), never the blocks this call names; a block larger
  /// than the whole budget, or one that would fit only by dropping blocks of
  /// this call, is skipped (the call's leading blocks win, what a fetch's
  /// leading run needs). The disk budget and reserve apply as in put_many
  /// (which may drop least recently used blocks first, in a write of its
  /// own). Returns how many blocks were newly stored (0 with a budget of
  /// 0). Errors: invalid_argument (no tokens, 2^31 tokens or more, a chunk
  /// that is not all layers x tokens.size() positions; nothing is written),
  /// disk_full (as put), io (the write: nothing stored; or the GC
  /// compaction that follows once compact_after_bytes were deleted: the
  /// blocks are stored).
  [[nodiscard]] Result<int> put_prefix_blocks(std::span<const PrefixBlockWrite> writes);

  /// Whether the store keeps the prefix block (salt, name) of `num_tokens`
  /// tokens now (the KV-store actor answers a put with the names kept).
  [[nodiscard]] bool keeps_prefix_block(std::uint64_t salt, std::uint64_t name, std::size_t num_tokens) const;

  /// The leading run of `queries` the store keeps under `salt`, in order:
  /// it stops at the first block that is not kept or whose stored parent or
  /// tokens differ from the query's (a collision), or that has no tokens.
  /// Reads RocksDB (not the host tier). Marks those returned used (in
  /// memory). Errors: io, corrupt (a stored value of the wrong size).
  [[nodiscard]] Result<std::vector<StoredPrefixBlock>> fetch_prefix_blocks(std::uint64_t salt,
                                                                           std::span<const PrefixBlockQuery> queries);

  /// Every request the store holds chunks of, ascending (job, request).
  [[nodiscard]] std::vector<KvRequestCoverage> requests() const;
  /// Errors: io (reading the directory).
  [[nodiscard]] Result<KvStoreStats> stats() const;

  [[nodiscard]] const KvStoreOptions& options() const noexcept;
  [[nodiscard]] const std::string& dir() const noexcept;

 private:
  struct Impl;
  explicit KvStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::kvstore
