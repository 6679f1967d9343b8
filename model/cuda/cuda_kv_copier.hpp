#pragma once
/// \file
/// DéjàVu's KV movement on CUDA devices (seed 003 §4.1: stream_out /
/// stream_in; issue 41 item 7): the paged KV caches of one CUDA runner, or
/// of every rank of a CudaShardGroup, as a kvstore::KvCopier, so that a CUDA
/// worker streams its KV to the KV stores, restores a resumed request's KV
/// from them instead of recomputing it, and swaps preempted sequences to
/// host memory.
///
/// copy_out and copy_out_batch (DéjàVu's buffered copies, §4.1.1 (1),
/// Fig. 6a / 7) gather every sequence's range out of the paged cache with
/// ONE kernel launch per cache (kernels/cuda/kv_gather.hpp) into a device
/// slot and bring it to pinned memory in ONE transfer, on the copier's own
/// copy stream (one per GPU, for the caches of a group whose ranks are on
/// several); the host then merges the ranks' pieces into each canonical
/// chunk (each (layer, head) from the first cache holding it: the bytes the
/// CPU caches give). A batch larger than the device slot (kGatherSlotBytes,
/// or one layer of the largest piece) goes in several passes on the same
/// stream, which reuse the slot in stream order.
///
/// begin_copy_out / end_copy_out (copies_in_stream_order(): true) are the
/// same copies ordered on the device instead of the host: begin records an
/// event on each cache's writer stream (the runner's stream, whose queued
/// kernels write the cache), makes the copy stream wait for it, queues the
/// gathers and transfers, records a done event and returns; end waits for
/// that event and merges. So a layer hook (DéjàVu's layer-by-layer prompt
/// streaming, §4.1.1 (3)) copies layer l while the runner's stream computes
/// layer l + 1, with no host synchronisation in the step.
///
/// copy_in stages the blocks a range touches (one strided copy per cache
/// and block, cudaMemcpy2DAsync, of every layer and K|V of that block),
/// writes the chunk into them with kvstore::copy_in (only the range's
/// tokens change) and copies them back: restores are rarer than streaming.
///
/// Contract: copy_out, copy_out_batch and copy_in run between steps (after
/// execute() has returned); begin_copy_out may also run while a step is
/// queued, for KV its queued work has written. Thread-safe: calls are
/// serialised.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"

struct CUstream_st;
struct CUevent_st;

namespace shardline::model {

/// One device KV cache: `data` is [layers, 2, num_blocks, kv_heads, block_size,
/// head_dim] elements of the shape's dtype on CUDA device `device`, laid out as
/// `layout` says (kvstore::KvRankLayout).
struct DeviceKvCache {
  void* data = nullptr;
  kvstore::KvRankLayout layout;
  int device = 0;
  /// The stream whose work writes the cache (the runner's), or null: then
  /// begin_copy_out orders nothing before its copies (only the host does).
  CUstream_st* writer = nullptr;
};

class CudaKvCopier final : public kvstore::KvCopier {
 public:
  /// Copies to and from `caches` (at least one; every layout checked against
  /// `shape`), gathering through a device slot of `gather_slot_bytes` per
  /// device (kGatherSlotBytes by default; tests make it small to force
  /// passes). Errors: invalid_argument (no cache, a null one, a layout
  /// kvstore::check_layout refuses, caches of different block sizes, a zero
  /// slot), internal (the copy stream cannot be made).
  [[nodiscard]] static Result<std::unique_ptr<CudaKvCopier>> create(kvstore::KvModelShape shape,
                                                                    std::vector<DeviceKvCache> caches,
                                                                    std::size_t gather_slot_bytes = kGatherSlotBytes);
  ~CudaKvCopier() override;
  CudaKvCopier(const CudaKvCopier&) = delete;
  CudaKvCopier& operator=(const CudaKvCopier&) = delete;

  [[nodiscard]] int num_devices() const override { return static_cast<int>(caches_.size()); }
  /// Per-step copies on the stepping thread are cheap enough here for
  /// DéjàVu's streaming and resumed-KV restores.
  [[nodiscard]] bool supports_streaming() const override { return true; }
  [[nodiscard]] bool copies_in_stream_order() const override { return true; }
  /// `range` of the sequence with `block_table` into `chunk` (the canonical
  /// chunk, kvstore::chunk_bytes): copy_out_batch of one. Errors:
  /// invalid_argument (a bad range or table, a block outside a cache, a
  /// chunk of the wrong size), internal (a CUDA call failed).
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                std::span<std::byte> chunk) override;
  /// Every item in one gather launch per cache and pass, one transfer per
  /// device and pass, then waits. Errors: as copy_out.
  [[nodiscard]] Status copy_out_batch(std::span<const kvstore::KvCopyItem> items,
                                      std::span<const std::span<std::byte>> chunks) override;
  /// Queues copy_out_batch's copies after the work queued so far on every
  /// cache's writer stream and returns. Errors: as copy_out (then no ticket
  /// is open and nothing of the call is left queued).
  [[nodiscard]] Result<std::uint64_t> begin_copy_out(std::span<const kvstore::KvCopyItem> items) override;
  /// Waits for the ticket's copies and merges its chunks. Errors: see
  /// kvstore::KvCopier::end_copy_out.
  [[nodiscard]] Status end_copy_out(std::uint64_t ticket, std::span<const std::span<std::byte>> chunks) override;
  /// `chunk` into every cache holding part of `range`; other tokens of the
  /// blocks are kept. Errors: as copy_out.
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                               std::span<const std::byte> chunk) override;
  /// Host <-> device transfers of KV made so far: one per device and pass
  /// of a gather, one per cache and block of a copy_in.
  [[nodiscard]] std::uint64_t num_copies() const;
  /// gather_kv launches so far (one per cache and pass).
  [[nodiscard]] std::uint64_t num_gather_launches() const;
  /// Tickets begun and not ended.
  [[nodiscard]] std::size_t open_tickets() const;

  /// The device slot a gather pass fills (per device): a pass holds at most
  /// this many bytes of gathered KV, unless one layer of one sequence needs more.
  static constexpr std::size_t kGatherSlotBytes = std::size_t{32} << 20;

 private:
  CudaKvCopier(kvstore::KvModelShape shape, std::vector<DeviceKvCache> caches, std::vector<CUstream_st*> streams,
               std::vector<std::size_t> stream_of_cache, std::vector<int> stream_devices);
  /// One block of a cache, every (layer, K|V) row of it that a range needs:
  /// `rows` slabs of `bytes`, `device_pitch` apart in the cache and
  /// `host_pitch` apart in the staging buffer (one cudaMemcpy2DAsync).
  struct Slab {
    std::size_t cache = 0;
    std::size_t device_offset = 0;  ///< bytes into the cache's data
    std::size_t device_pitch = 0;
    std::size_t host_offset = 0;    ///< bytes into the staging buffer
    std::size_t host_pitch = 0;
    std::size_t bytes = 0;          ///< one slab: kv_heads * block_size * head_dim elements
    std::size_t rows = 0;           ///< 2 x the layers of the range the cache holds
  };
  /// Plans copy_in's slabs of `range`, sizes the staging buffer and fills
  /// `views` (host views of the staged blocks, caches holding none of the
  /// range left out) and `table` (the sequence's logical blocks -> staged
  /// blocks). Errors: invalid_argument (a short table, a block out of a
  /// cache's range, an empty range), internal (pinned memory).
  [[nodiscard]] Status plan(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                            std::vector<Slab>& slabs, std::vector<kvstore::KvCacheView>& views,
                            std::vector<std::int32_t>& table);
  /// Copies every slab device -> staging (to_host) or back, then waits.
  [[nodiscard]] Status move(const std::vector<Slab>& slabs, bool to_host);

  /// One item's layers of one cache, gathered: [layer_end - layer_begin, 2,
  /// the cache's heads, num_tokens, head_dim] at `host` once the ticket lands.
  struct Piece {
    std::size_t item = 0;
    std::size_t cache = 0;
    int layer_begin = 0;  ///< model layers
    int layer_end = 0;
    const std::byte* host = nullptr;
  };
  struct Ticket {
    std::uint64_t id = 0;
    std::vector<kvstore::KvRange> ranges;  ///< [items]
    std::vector<Piece> pieces;
    std::vector<CUevent_st*> done;         ///< [streams] recorded after the ticket's copies (null: none queued)
  };
  /// Validates `items` and queues their gathers (after the writers' work
  /// when `after_writers`). Errors: invalid_argument, internal.
  [[nodiscard]] Result<Ticket> queue_gathers(std::span<const kvstore::KvCopyItem> items, bool after_writers);
  /// Waits for `t`'s copies and merges its pieces into `chunks`.
  [[nodiscard]] Status finish(Ticket& t, std::span<const std::span<std::byte>> chunks);
  /// `bytes` of pinned memory for a ticket, 256-byte aligned, valid until
  /// no ticket is open. Errors: internal.
  [[nodiscard]] Result<std::byte*> pinned(std::size_t bytes);
  /// Device slot of stream `s` of at least `bytes`. Errors: internal.
  [[nodiscard]] Result<std::byte*> slot(std::size_t s, std::size_t bytes);
  /// An event from the pool (made on the current device). Errors: internal.
  [[nodiscard]] Result<CUevent_st*> take_event();
  /// Frees what grew while tickets were open, once none is.
  void release_retired();

  kvstore::KvModelShape shape_;
  std::vector<DeviceKvCache> caches_;
  std::vector<CUstream_st*> streams_;         ///< [devices] a copy stream per device the caches are on
  std::vector<std::size_t> stream_of_cache_;  ///< [caches] the index of the cache's device's stream
  std::vector<int> stream_devices_;           ///< [devices] the device of each stream
  std::size_t gather_slot_bytes_ = kGatherSlotBytes;
  mutable std::mutex mu_;
  void* staging_ = nullptr;  ///< copy_in's, pinned, staging_bytes_
  std::size_t staging_bytes_ = 0;
  // Tickets' memory: a pinned arena (bump-allocated while tickets are open)
  // and a device slot per stream; what is outgrown waits in retired_* for
  // the last open ticket.
  std::byte* arena_ = nullptr;  // pinned, arena_bytes_
  std::size_t arena_bytes_ = 0, arena_used_ = 0;
  std::vector<std::byte*> slots_;          ///< [streams] device memory, slot_bytes_[s]
  std::vector<std::size_t> slot_bytes_;
  std::vector<void*> retired_pinned_, retired_device_;
  std::vector<std::vector<CUevent_st*>> free_events_;  ///< [streams] events made on that stream's device
  std::vector<CUevent_st*> writer_events_;             ///< [caches] recorded on the cache's writer
  std::deque<Ticket> open_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t num_copies_ = 0;
  std::uint64_t num_gathers_ = 0;
};

}  // namespace shardline::model
