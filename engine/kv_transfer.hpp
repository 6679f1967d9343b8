#pragma once
/// \file
/// Whole-sequence KV copies that run beside the engine's steps: the queue
/// KvCacheIo hands its offloads and onboards to, and their completions. The
/// engine core defines the interface; Seesaw's asynchronous pipeline
/// implements it (engine/seesaw/kv_mover.hpp, seed 000 §5.2: a prefetcher
/// thread, or the caller's thread in synchronous mode), so the core depends
/// on no technique.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"

namespace shardline::engine {

/// One sequence's KV moving between the device caches and host memory.
struct KvTransfer {
  enum class Direction {
    to_host,    ///< swap-out / offload: the caches -> `chunk`
    to_device,  ///< swap-in / onboard (prefetch): `chunk` -> the caches
  };
  Direction direction = Direction::to_host;
  std::uint64_t seq_id = 0;
  std::vector<std::int32_t> block_table;  ///< the sequence's device blocks
  kvstore::KvRange range;                 ///< the positions and layers moved
  /// Canonical chunk of `range` (kvstore::chunk_bytes(shape, range) bytes).
  /// to_host: sized by the submitter, filled by the queue; to_device: the KV
  /// to write. Handed back in the completion either way.
  std::vector<std::byte> chunk;
};

/// A finished transfer, as poll() returns it.
struct KvTransferDone {
  KvTransfer transfer;
  /// ok, or the copy's error (invalid_argument on a bad table: a bug of the
  /// submitter; nothing is retried).
  Status status = Status::ok_status();
  double transfer_ms = 0;  ///< copy + emulated link time
};

/// Counters of a transfer queue (monotonic).
struct KvMoverStats {
  std::uint64_t num_transfers = 0;  ///< completed
  std::uint64_t bytes_to_host = 0;
  std::uint64_t bytes_to_device = 0;
  double transfer_ms = 0;  ///< sum over completed transfers of their copy + link time
  /// Time the engine's thread was blocked on transfers. It includes a
  /// transfer's wait in the queue and for a core, so it can exceed
  /// transfer_ms on a loaded machine.
  double wait_ms = 0;
  /// 1 - wait_ms / transfer_ms, clamped to [0, 1]; 0 with no transfer.
  [[nodiscard]] double hidden_share() const noexcept {
    if (transfer_ms <= 0) return 0;
    return std::clamp(1.0 - wait_ms / transfer_ms, 0.0, 1.0);
  }
};

/// A queue of KV transfers that completes them in submission order, on its
/// own thread or the caller's. Thread safety: every call is from the
/// engine's thread; the transfers' blocks stay out of every step until
/// their completion is polled.
class KvTransferQueue {
 public:
  virtual ~KvTransferQueue() = default;
  /// The caches transfers read and write from now on. Errors: internal
  /// while a transfer is pending (drain first: the layout would change under
  /// a running copy).
  [[nodiscard]] virtual Status set_caches(kvstore::KvModelShape shape, std::vector<kvstore::KvCacheView> views) = 0;
  /// As set_caches, for caches that are not host-addressable: transfers go
  /// through `copier` (not owned; it must outlive the queue and allow calls
  /// from another thread while the engine's thread steps). Errors: as
  /// set_caches; internal for a null copier.
  [[nodiscard]] virtual Status set_copier(kvstore::KvCopier* copier) = 0;
  /// Queues a transfer (or runs it now and queues its completion).
  virtual void submit(KvTransfer transfer) = 0;
  /// Transfers submitted whose completion has not been returned yet.
  [[nodiscard]] virtual int num_pending() const noexcept = 0;
  /// The completions ready now, in completion order (never blocks).
  [[nodiscard]] virtual std::vector<KvTransferDone> poll() = 0;
  /// Blocks until at least one completion is ready (none pending: returns
  /// at once, empty), then returns every ready one; the time blocked counts
  /// as wait_ms.
  [[nodiscard]] virtual std::vector<KvTransferDone> wait_any() = 0;
  /// Blocks until every pending transfer is done; returns their completions.
  [[nodiscard]] virtual std::vector<KvTransferDone> drain() = 0;
  /// A snapshot of the counters.
  [[nodiscard]] virtual KvMoverStats stats() const = 0;
};

}  // namespace shardline::engine
