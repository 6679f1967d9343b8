#pragma once
/// \file
/// DéjàVuLib, the KV cache streaming library of DéjàVu (seed 003 §4.1,
/// Table 1), over Shardline's paged KV caches. Three levels, as in the paper:
///
///  - `stream_out` / `stream_in`: given the source (or destination) ranks of
///    an engine group, their shard layouts and a sequence's block table, find
///    where each piece of a KV range comes from (or goes to). The cache is
///    split at the source (each (layer, KV head) is read from the first rank
///    that holds it: a TP / SP group may replicate a head, a PP group holds
///    each layer on one stage) and merged at the destination (written into
///    every rank that holds it), through one layout-free *canonical chunk*.
///    So a tp=2 group can stream out what a tp=4 or pp=2 group streams in
///    (Seesaw's re-sharding reuses this).
///  - `gather` / `scatter`: a non-contiguous region of one rank's paged cache
///    (blocks of a block table, some layers, some KV heads, a token range)
///    to / from one contiguous buffer.
///  - `flush` / `fetch`: one contiguous chunk to / from a target (KvTarget):
///    local memory, a KV-store actor, or a remote rank over a communicator.
///
/// Buffered copies (§4.1.1 (1), Fig. 6a / 7): a step's many small
/// per-token, per-layer, per-head pieces are gathered into one buffer per
/// destination and sent as one transfer, never one transfer per piece.
///
/// The canonical chunk of a KvRange ("HND" per layer and per K / V):
///   [layer_end - layer_begin, 2 (K then V), num_kv_heads, token_end - token_begin, head_dim]
/// elements of KvModelShape::dtype, bit-for-bit the cache's elements. It does
/// not depend on the block size, the block table or the shard layout, so a
/// round trip out of one layout and into another is bit-identical.
///
/// Thread safety: functions are pure over their arguments; a KvTarget is
/// used by one thread at a time unless it says otherwise.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"

namespace shardline::kvstore {

/// KV geometry of the whole model, as every rank of a group sees it.
struct KvModelShape {
  int num_layers = 0;    ///< transformer layers of the model
  int num_kv_heads = 0;  ///< KV heads of the model (before any split)
  int head_dim = 0;      ///< elements per head
  DType dtype = DType::f32;  ///< element type of the caches and of chunks (f32, bf16 or f16)
};

/// The layout of one rank's paged KV cache (model/shard_runner.hpp,
/// kernels/cpu/attention.hpp; the CUDA runner uses the same):
///   [layer_end - layer_begin, 2 (K, V), num_blocks, kv_heads.size(), block_size, head_dim]
/// elements, where inside one (layer, K|V, block, head) slab of
/// block_size * head_dim elements K is stored transposed, [head_dim][block_size],
/// and V row-major, [block_size][head_dim].
struct KvRankLayout {
  int layer_begin = 0;        ///< first model layer this rank caches (its PP stage)
  int layer_end = 0;          ///< one past its last layer
  /// Model KV head of each local head slot, in slot order (its TP / SP
  /// share; with tp * sp > num_kv_heads a head is on several ranks).
  std::vector<int> kv_heads;
  int num_blocks = 0;         ///< blocks in this rank's cache
  int block_size = 0;         ///< tokens per block
};

/// One rank's KV cache memory (host-addressable: a CPU device's cache, or
/// a host tier laid out like one).
struct KvCacheView {
  void* data = nullptr;  // [layers_local, 2, num_blocks, heads_local, block_size, head_dim] of dtype
  KvRankLayout layout;
};

/// A part of one sequence's KV: layers [layer_begin, layer_end) by token
/// positions [token_begin, token_end).
struct KvRange {
  int layer_begin = 0;
  int layer_end = 0;
  int token_begin = 0;
  int token_end = 0;
  [[nodiscard]] int num_layers() const noexcept { return layer_end - layer_begin; }
  [[nodiscard]] int num_tokens() const noexcept { return token_end - token_begin; }
  bool operator==(const KvRange&) const = default;
};

/// Bytes of the canonical chunk of `range`:
/// num_layers * 2 * num_kv_heads * num_tokens * head_dim * dtype_size.
[[nodiscard]] std::size_t chunk_bytes(const KvModelShape& shape, const KvRange& range) noexcept;

/// Bytes of one rank's cache (for allocating a view's memory).
[[nodiscard]] std::size_t cache_bytes(const KvModelShape& shape, const KvRankLayout& layout) noexcept;

/// Checks a layout against a shape: the shape itself (positive num_layers,
/// num_kv_heads, head_dim), layers a non-empty part of [0, num_layers),
/// heads non-empty, inside [0, num_kv_heads) and not repeated, positive block
/// size / count. Errors: invalid_argument naming the field.
[[nodiscard]] Status check_layout(const KvModelShape& shape, const KvRankLayout& layout);

/// Bytes that gather writes (and scatter reads) for `range` on a rank of
/// `layout`: layers in both * 2 * kv_heads.size() * num_tokens * head_dim *
/// dtype_size (0 when the rank holds no layer of the range).
[[nodiscard]] std::size_t gather_bytes(const KvModelShape& shape, const KvRankLayout& layout,
                                       const KvRange& range) noexcept;

// ---- gather / scatter: one rank, non-contiguous <-> contiguous ------------------

/// Copies the part of `range` that `view` holds (its layers of the range, all
/// its head slots) out of the paged cache into `out`, laid out as the
/// canonical chunk of that sub-range restricted to the rank's heads, in slot
/// order:
///   [layers in both, 2, kv_heads.size(), num_tokens, head_dim].
/// `block_table`: logical block i of the sequence -> physical block of the
/// rank's cache; it must cover range.token_end. A range must be non-empty:
/// 0 <= layer_begin < layer_end <= num_layers, 0 <= token_begin < token_end.
/// Writes the first gather_bytes() bytes of `out`. Errors: invalid_argument
/// (bad shape / layout / range, table too short, physical block out of
/// range, `out` smaller than gather_bytes()).
[[nodiscard]] Status gather(const KvModelShape& shape, const KvCacheView& view,
                            std::span<const std::int32_t> block_table, const KvRange& range,
                            std::span<std::byte> out);

/// The reverse of gather: writes `in` (same layout, exactly gather_bytes()
/// bytes) into the rank's cache; touches no other element. Errors: as gather
/// (`in` of another size).
[[nodiscard]] Status scatter(const KvModelShape& shape, const KvCacheView& view,
                             std::span<const std::int32_t> block_table, const KvRange& range,
                             std::span<const std::byte> in);

// ---- flush / fetch: one contiguous chunk to / from a target --------------------

/// Names one chunk of one request's KV in a target.
struct KvChunkKey {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;  ///< the job's request (line and choice), see the KV store
  KvRange range;
  bool operator==(const KvChunkKey&) const = default;
};

/// One chunk of a batch buffer (KvTarget::flush_batch).
struct KvChunkRef {
  KvChunkKey key;
  std::size_t offset = 0;  ///< first byte in the buffer
  std::size_t bytes = 0;   ///< length
};

/// Checks that chunks[i] lies inside a buffer of `buffer_bytes`: what every
/// flush_batch checks first. Errors: invalid_argument naming the chunk.
[[nodiscard]] Status check_chunk_ref(const KvChunkRef& chunk, std::size_t index, std::size_t buffer_bytes);

/// A request's positions [0, c) as prefix blocks a KV store keeps
/// (kvstore/kv_store.hpp "Prefix links"): KvTarget::flush_linked, KvStore::put_many.
struct PrefixLinkWrite {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  std::uint64_t salt = 0;                ///< the blocks' salt (its low 63 bits are used)
  std::uint64_t root = 0;                ///< the first block's parent name
  std::span<const std::uint64_t> names;  ///< the blocks, first first (>= 1)
  /// The request's tokens at positions [0, c): every block's tokens in
  /// order, c = names.size() x tokens per block.
  std::span<const std::int32_t> tokens;
};

/// Where chunks go and come from.
class KvTarget {
 public:
  virtual ~KvTarget() = default;
  /// Stores one contiguous chunk under `key` (replacing an equal key).
  /// Errors: the target's (out_of_memory over a budget, io).
  [[nodiscard]] virtual Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) = 0;
  /// The chunk stored under `key`. Errors: not_found, io.
  [[nodiscard]] virtual Result<std::vector<std::byte>> fetch(const KvChunkKey& key) = 0;
  /// Stores several chunks that lie in one buffer (buffered copies: a target
  /// that moves data does it in one transfer). chunks[i] is bytes
  /// [offset, offset + bytes) of `buffer`. The default calls flush() per
  /// chunk, in order, stopping at the first error. Errors: invalid_argument
  /// (a chunk outside `buffer`), the target's.
  [[nodiscard]] virtual Status flush_batch(std::span<const KvChunkRef> chunks,
                                           std::span<const std::byte> buffer);
  /// Whether flush_linked takes prefix links (a KV store does; DéjàVuLib's
  /// memory and comm targets do not).
  [[nodiscard]] virtual bool takes_prefix_links() const { return false; }
  /// flush_batch, and prefix links in the same write. The default:
  /// flush_batch when `links` is empty. Errors: unsupported (links to a
  /// target that does not take them), those of flush_batch.
  [[nodiscard]] virtual Status flush_linked(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer,
                                            std::span<const PrefixLinkWrite> links);
};

// ---- stream_out / stream_in: a group of ranks <-> one canonical chunk -------------

/// Streams `range` of one sequence out of an engine group: plans which rank
/// supplies each (layer, head) (the first in `ranks` order holding it),
/// gathers every piece straight into its place in one buffer holding the
/// canonical chunk (the merge) and flushes it to `target` under `key`
/// (key.range must equal `range`). One transfer per call, whatever the number
/// of pieces. The buffer is a per-thread scratch reused across calls (up to
/// 64 MiB; a larger chunk gets a buffer of its own).
/// Errors: invalid_argument (a layer or head of the range that no rank holds,
/// layouts that disagree with `shape`, a short block table, key.range !=
/// range, an empty `ranks`), the target's.
[[nodiscard]] Status stream_out(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                                std::span<const std::int32_t> block_table, const KvRange& range,
                                KvTarget& target, const KvChunkKey& key);

/// Streams `range` into an engine group: fetches the chunk under `key` from
/// `target`, splits it by destination rank and scatters each rank's share
/// into its cache; a (layer, head) held by several ranks is written to every
/// one of them. Errors: invalid_argument (as stream_out; a fetched chunk of
/// the wrong size), the target's (not_found when the chunk is absent).
[[nodiscard]] Status stream_in(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                               std::span<const std::int32_t> block_table, const KvRange& range,
                               KvTarget& target, const KvChunkKey& key);

/// One sequence of a batch streamed by stream_out_batch.
struct KvStreamItem {
  std::span<const std::int32_t> block_table;  ///< the sequence's blocks (shared by the group)
  KvRange range;                              ///< what to stream
  KvChunkKey key;                             ///< where it goes (key.range == range)
};

/// stream_out for a whole batch of sequences of one group (e.g. one decode
/// step's increments): every item's canonical chunk goes into one buffer, in
/// item order, and the buffer reaches `target` in one flush_batch call.
/// Nothing is flushed when an item is invalid, or when there are no items.
/// Errors: as stream_out (the
/// message names the item), the target's.
[[nodiscard]] Status stream_out_batch(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                                      std::span<const KvStreamItem> items, KvTarget& target);

/// stream_out's split and merge without a target: `range` of the group into
/// `chunk` (chunk_bytes(shape, range) bytes). Errors: as stream_out.
[[nodiscard]] Status copy_out(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                              std::span<const std::int32_t> block_table, const KvRange& range,
                              std::span<std::byte> chunk);

/// stream_in's split without a target: `chunk` into every rank holding each
/// part of `range`. Errors: as stream_in.
[[nodiscard]] Status copy_in(const KvModelShape& shape, std::span<const KvCacheView> ranks,
                             std::span<const std::int32_t> block_table, const KvRange& range,
                             std::span<const std::byte> chunk);

// ---- a rank's part <-> the canonical chunk (groups whose ranks are remote) -----

/// Writes one rank's gathered part of `range` (gather()'s layout for
/// `layout`: [layers in both, 2, kv_heads.size(), num_tokens, head_dim],
/// exactly gather_bytes() bytes) into its places in `chunk`, the canonical
/// chunk of `range` (chunk_bytes() bytes). Only the (layer, head) rows the
/// rank holds are written. With the parts of every rank of a group merged
/// in reverse rank order, `chunk` equals copy_out's (the first holder of a
/// replicated head wins). Errors: invalid_argument (bad shape, layout or
/// range, a buffer of the wrong size).
[[nodiscard]] Status merge_part(const KvModelShape& shape, const KvRankLayout& layout, const KvRange& range,
                                std::span<const std::byte> part, std::span<std::byte> chunk);

/// The reverse of merge_part: the rank's share of `chunk` in gather()'s
/// layout (what scatter() takes), into `part` (gather_bytes() bytes).
/// split_part then scatter on every rank equals copy_in. Errors: as merge_part.
[[nodiscard]] Status split_part(const KvModelShape& shape, const KvRankLayout& layout, const KvRange& range,
                                std::span<const std::byte> chunk, std::span<std::byte> part);

/// One sequence's range for a batched copy (KvCopier::copy_out_batch).
struct KvCopyItem {
  std::span<const std::int32_t> block_table;  ///< the sequence's blocks, covering range.token_end
  KvRange range;
};

/// A group's KV caches as copy_out / copy_in reach them: host-addressable
/// views (KvViewsCopier), or ranks in other processes that gather and
/// scatter their own share on request (engine/group/parallel_executor.hpp, a TCP
/// group's rank 0). One sequence's KV, through its block table, always in
/// the canonical chunk of the range.
/// Thread safety: an implementation says; the engine calls one from one
/// thread at a time (its own, or Seesaw's KV mover thread).
class KvCopier {
 public:
  virtual ~KvCopier() = default;
  /// Devices the caches are spread over (each has its own host link).
  [[nodiscard]] virtual int num_devices() const = 0;
  /// False for a copier that moves no data (the cluster simulator's,
  /// sim/simulated_executor.hpp, which only prices each copy on its
  /// emulated host link): callers then allocate no chunk and pass an empty
  /// span. True for every copier that really copies.
  [[nodiscard]] virtual bool copies_bytes() const { return true; }
  /// True when a call is cheap enough, and safe on the stepping thread
  /// between steps, for DéjàVu's per-step streaming of every sequence's
  /// increment and for resumed-KV restores (a CUDA device's copier,
  /// model/cuda/cuda_kv_copier.hpp). False by default: a TCP group's copier
  /// takes a round trip to every rank, so it serves swaps and Seesaw's
  /// moves only.
  [[nodiscard]] virtual bool supports_streaming() const { return false; }
  /// As kvstore::copy_out over the group. Errors: invalid_argument (a bad
  /// table or range), io (a remote rank is gone), internal (a remote rank
  /// refused the request).
  [[nodiscard]] virtual Status copy_out(std::span<const std::int32_t> block_table, const KvRange& range,
                                        std::span<std::byte> chunk) = 0;
  /// As kvstore::copy_in over the group; returns once every rank wrote its
  /// share. Errors: as copy_out.
  [[nodiscard]] virtual Status copy_in(std::span<const std::int32_t> block_table, const KvRange& range,
                                       std::span<const std::byte> chunk) = 0;
  /// Several sequences' ranges at once: items[i] into chunks[i] (each
  /// exactly chunk_bytes of its range). The default calls copy_out per item;
  /// a device copier gathers them all in one launch and one transfer
  /// (DéjàVu's buffered copies, §4.1.1 (1)). Errors: invalid_argument (as
  /// copy_out; chunks.size() != items.size()), the copier's.
  [[nodiscard]] virtual Status copy_out_batch(std::span<const KvCopyItem> items,
                                              std::span<const std::span<std::byte>> chunks);

  // ---- stream-ordered copies (layer-by-layer prompt streaming, §4.1.1 (3)) ---
  // On a device whose steps run asynchronously to the host, an executor's
  // layer KV hook (model/executor.hpp) fires when a layer's KV write is
  // queued, not done. begin_copy_out then queues the copies behind the work
  // queued so far (an event per call) and returns at once, so the copies
  // overlap the step's later layers; end_copy_out waits for them.

  /// True when begin_copy_out / end_copy_out work (false by default).
  [[nodiscard]] virtual bool copies_in_stream_order() const { return false; }
  /// Queues copies of `items` after the device work queued so far on the
  /// caches' writers (block tables are read before it returns); returns a
  /// ticket for end_copy_out. Errors: unsupported (the default),
  /// invalid_argument (as copy_out), internal (a CUDA call).
  [[nodiscard]] virtual Result<std::uint64_t> begin_copy_out(std::span<const KvCopyItem> items);
  /// Waits for `ticket`'s copies and writes items[i]'s canonical chunk into
  /// chunks[i]. Tickets end in the order they began: a ticket that is not
  /// the oldest open one is refused and stays open; the oldest ends whether
  /// or not the call succeeds. Errors: invalid_argument (not the oldest open
  /// ticket, chunks of the wrong number or size), internal (a CUDA call).
  [[nodiscard]] virtual Status end_copy_out(std::uint64_t ticket, std::span<const std::span<std::byte>> chunks);
};

/// KvCopier over host-addressable views (copy_out / copy_in above).
/// Stateless apart from the views: safe from several threads at once.
class KvViewsCopier final : public KvCopier {
 public:
  KvViewsCopier(KvModelShape shape, std::vector<KvCacheView> views) : shape_(shape), views_(std::move(views)) {}
  [[nodiscard]] int num_devices() const override { return static_cast<int>(views_.size()); }
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const KvRange& range,
                                std::span<std::byte> chunk) override {
    return kvstore::copy_out(shape_, views_, block_table, range, chunk);
  }
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const KvRange& range,
                               std::span<const std::byte> chunk) override {
    return kvstore::copy_in(shape_, views_, block_table, range, chunk);
  }

 private:
  KvModelShape shape_;
  std::vector<KvCacheView> views_;
};

}  // namespace shardline::kvstore
