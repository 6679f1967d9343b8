#pragma once
/// \file
/// Seesaw's asynchronous KV pipeline (seed 000 §5.2): a *prefetcher thread*
/// that moves KV between the devices' paged caches and the host KV buffer
/// while the main thread keeps the devices computing.
///
/// What the paper describes, and what this class does for it:
///  - "Overlap swap-out with computation": a prefill's KV is not read until
///    decoding begins, so its copy to host memory runs while the next
///    prefill computes. The engine hands each finished prefill's copy-out to
///    the mover and schedules the next step at once; the sequence's device
///    blocks stay allocated until the copy is done (the scheduler's
///    `KvPending::offloading`), then they are freed.
///  - "Asynchronous swap-in": the prefetcher "is controlled directly by the
///    scheduler and runs independently of the main thread ... In each
///    iteration, the scheduler creates new prefetching tasks when there are
///    free slots in the GPU KV store. Once the prefetcher completes moving the
///    KV cache for certain sequences, it notifies the scheduler via a shared
///    queue, allowing those sequences to be scheduled for decoding tasks
///    later." Here: submit() is the task queue, poll() the shared queue of
///    completions, `KvPending::onboarding` the sequence the scheduler gave
///    blocks to and does not decode until its completion is polled.
/// The main thread blocks on the mover only when it has nothing else to run
/// (wait_any) or must drain it (a Seesaw transition switches the caches'
/// layout). The time it blocks is `wait_ms`; the time the transfers took is
/// `transfer_ms`; the share of transfer time hidden behind computation is
/// 1 - wait_ms / transfer_ms (KvMoverStats::hidden_share).
///
/// The host link. On a GPU the copy runs on a DMA engine over PCIe, at a
/// bandwidth far below the device's memory (A100: ~25 GB/s against
/// ~2 TB/s HBM), while the SMs compute. CPU devices are threads on one memory
/// bus: a "device to host" copy is a memcpy at memory bandwidth and takes a
/// core from the computation. So, as comm/paced.hpp does for NVLink, the mover
/// can EMULATE the link: with a LinkSpec, a transfer of B bytes spread over
/// `num_devices` devices (each device moves its shard over its own link, in
/// parallel) holds the mover for latency + B / num_devices / bandwidth, the
/// copy's own time included (it sleeps for the rest, taking no core). Without
/// one, a transfer costs its memcpy only. Transfers run one at a time, in
/// submission order (one copy stream per worker, as in the paper).
///
/// Caches in other processes (a TCP group): the mover's copies go through
/// the executor's KvCopier (set_copier), whose ranks gather and scatter their
/// own share when their serving loop reaches the request (between their
/// steps); the transfer and the link time still overlap the engine thread's
/// steps.
///
/// Synchronous mode (the baseline §5.2 improves on): submit() runs the
/// transfer on the caller's thread, paced the same way, and queues its
/// completion; every millisecond of it is waited for (hidden_share 0). The
/// engine's code path is the same in both modes.
///
/// Thread safety: submit / poll / wait_any / drain / stats are for one
/// (the engine's) thread; the mover thread only runs transfers. A transfer
/// reads or writes the blocks of one sequence that the scheduler keeps out of
/// every step until its completion is polled, so the device threads never
/// touch them meanwhile; the completion's hand-off (a mutex) orders the
/// copy before any later use of those blocks.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/kv_transfer.hpp"
#include "kvstore/kv_stream.hpp"

namespace shardline::engine {

struct KvMoverOptions {
  /// true: a prefetcher thread (§5.2); false: transfers run inside submit().
  bool async = true;
  /// Emulated host link per device (see the file comment); none: unpaced.
  std::optional<comm::LinkSpec> host_link;
  /// Devices the KV of one sequence is spread over (each has its own link).
  int num_devices = 1;
};

/// Seesaw's KvTransferQueue (engine/kv_transfer.hpp): KvCacheIo's offloads
/// and onboards run here when the engine runs Seesaw's phases
/// (engine/seesaw/seesaw_phases.hpp).
class KvMover final : public KvTransferQueue {
 public:
  /// Errors: invalid_argument (num_devices < 1, a bad link spec).
  [[nodiscard]] static Result<std::unique_ptr<KvMover>> create(KvMoverOptions options);
  ~KvMover() override;
  KvMover(const KvMover&) = delete;
  KvMover& operator=(const KvMover&) = delete;

  [[nodiscard]] const KvMoverOptions& options() const noexcept { return options_; }

  /// The caches transfers read and write from now on. Errors: internal
  /// while a transfer is pending (a bug: drain first, or the caches' layout
  /// changes under a running copy).
  [[nodiscard]] Status set_caches(kvstore::KvModelShape shape, std::vector<kvstore::KvCacheView> views) override;
  /// As set_caches, for caches that are not host-addressable: transfers go
  /// through `copier` (not owned; it must outlive the mover and allow calls
  /// from the mover thread while the engine's thread steps: a TCP group's
  /// rank 0, engine/group/parallel_executor.hpp). Errors: as set_caches; internal
  /// for a null copier.
  [[nodiscard]] Status set_copier(kvstore::KvCopier* copier) override;

  /// Queues a transfer (async), or runs it now and queues its completion
  /// (sync). The sequence's blocks must stay untouched until its completion
  /// is polled.
  void submit(KvTransfer transfer) override;
  /// Transfers submitted whose completion has not been returned yet.
  [[nodiscard]] int num_pending() const noexcept override { return pending_; }
  /// The completions ready now, in completion order (never blocks).
  [[nodiscard]] std::vector<KvTransferDone> poll() override;
  /// Blocks until at least one completion is ready (none pending: returns
  /// at once, empty), then returns every ready one. The time blocked counts
  /// as wait_ms.
  [[nodiscard]] std::vector<KvTransferDone> wait_any() override;
  /// Blocks until every pending transfer is done; returns their completions.
  [[nodiscard]] std::vector<KvTransferDone> drain() override;

  /// A snapshot of the counters.
  [[nodiscard]] KvMoverStats stats() const override;

 private:
  using Clock = std::chrono::steady_clock;
  explicit KvMover(KvMoverOptions options);

  /// Copies (and paces) one transfer on the calling thread.
  [[nodiscard]] KvTransferDone run(KvTransfer transfer);
  void thread_main();
  /// Takes the ready completions (mu_ held) and counts them.
  [[nodiscard]] std::vector<KvTransferDone> take_ready_locked();

  const KvMoverOptions options_;
  std::shared_ptr<comm::LinkModel> link_;  // the host link's time per transfer, when paced
  int pending_ = 0;  // engine thread only
  // What transfers copy through; written only while nothing is pending.
  std::unique_ptr<kvstore::KvCopier> owned_;   // set_caches' views
  kvstore::KvCopier* copier_ = nullptr;        // owned_, or set_copier's
  mutable std::mutex mu_;
  std::condition_variable cv_;        // tasks_ or stop_ changed
  std::condition_variable done_cv_;   // ready_ grew
  std::deque<KvTransfer> tasks_;      // guarded by mu_
  std::vector<KvTransferDone> ready_; // guarded by mu_
  KvMoverStats stats_;                // guarded by mu_
  bool stop_ = false;                 // guarded by mu_
  std::thread thread_;                // async only
};

}  // namespace shardline::engine
