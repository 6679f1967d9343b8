#pragma once
/// \file
/// A worker's KV streaming queue (DéjàVu, seed 003 §4.1.1 (3) and §4.2.3):
/// the background thread that takes each step's KV increments off the step
/// loop and flushes them to a KV target (the node's KV store), overlapped
/// with the next step.
///
/// Bounded, with backpressure that never blocks the step loop: push() only
/// queues; while the queued bytes exceed max_queued_bytes, accepting() is
/// false and the engine stops copying increments out (the KV stays in its
/// cache, and the engine later hands over one catch-up increment from the
/// last streamed position: engine/llm_engine.hpp KvStreamSink). The thread
/// flushes what is queued in batches of at most max_batch_bytes
/// (KvTarget::flush_batch: buffered copies, one transfer per destination). A failed flush (the store is down
/// or restarting) is retried every retry_interval, in order; nothing queued
/// is dropped except by forget_request().
///
/// Thread safety: push / accepting / forget_request / stats / drain may be
/// called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kvstore/kv_stream.hpp"

namespace shardline::worker {

struct KvStreamerOptions {
  std::uint64_t max_queued_bytes = 64ull << 20;  ///< above it, accepting() is false
  std::chrono::milliseconds retry_interval{50};  ///< wait between retries of a failed flush
  /// Chunk bytes of one flush_batch at most (one increment at least): a
  /// batch is one message to the store, which refuses messages over
  /// messages::kMaxMessageBytes (64 MiB), so an unbounded batch was refused
  /// and retried for ever. An increment larger than this is split by layers
  /// at push (a chunk's layers are contiguous), down to one layer each, and
  /// a single layer still over it by positions (with num_kv_heads known).
  std::uint64_t max_batch_bytes = 32ull << 20;
  /// KV heads of the model (the chunk's rows per layer: 2 x heads); 0:
  /// unknown, a single layer is not split by positions.
  int num_kv_heads = 0;
  /// Layers of the model: a prefix link's key covers them all.
  int num_layers = 1;
};

/// A request's cached head sent as a prefix link (kvstore/kv_store.hpp
/// "Prefix links"; issue 42): the blocks' names under `salt`, from `root`.
struct QueuedLink {
  std::uint64_t salt = 0;
  std::uint64_t root = 0;
  std::vector<std::uint64_t> names;
};

/// One increment on its way to the store: KV, or a prefix link.
struct QueuedIncrement {
  kvstore::KvChunkKey key;             ///< (job, request, all layers x positions)
  std::vector<std::byte> chunk;        ///< canonical chunk of key.range (empty for a link)
  /// Tokens at positions [token_begin, token_end + 1); a link's at
  /// [0, token_end): its blocks' tokens.
  std::vector<std::int32_t> token_ids;
  int num_prompt_tokens = 0;
  /// Set: positions key.range are these prefix blocks (no chunk). Flushed
  /// in order with the chunks (KvTarget::flush_linked).
  std::optional<QueuedLink> link;
};

struct KvStreamerStats {
  std::uint64_t pushed = 0;          ///< increments queued (the parts of a split one each)
  std::uint64_t flushed = 0;         ///< increments the target accepted
  std::uint64_t flushed_bytes = 0;   ///< their chunk bytes
  std::uint64_t batches = 0;         ///< flush_batch calls that succeeded
  std::uint64_t failed_flushes = 0;  ///< flush_batch calls that failed (then retried)
  std::uint64_t forgotten = 0;       ///< increments dropped by forget_request
  std::uint64_t queued_bytes = 0;    ///< now
  std::uint64_t max_queued_bytes_seen = 0;
};

class KvStreamer {
 public:
  /// Called on the streamer's thread after a batch reached the target, with
  /// its increments (chunks already released: key, token ids and prompt
  /// length only), in push order.
  using FlushedCallback = std::function<void(std::vector<QueuedIncrement> flushed)>;

  /// Starts the thread. `target` is used only from it.
  KvStreamer(std::shared_ptr<kvstore::KvTarget> target, KvStreamerOptions options = {},
             FlushedCallback on_flushed = {});
  /// Stops the thread; increments still queued are dropped (as a crash would).
  ~KvStreamer();
  KvStreamer(const KvStreamer&) = delete;
  KvStreamer& operator=(const KvStreamer&) = delete;

  /// True while the queued bytes are within max_queued_bytes.
  [[nodiscard]] bool accepting() const;
  /// Whether the target takes prefix links (KvTarget::takes_prefix_links).
  [[nodiscard]] bool takes_prefix_links() const { return target_->takes_prefix_links(); }
  [[nodiscard]] int num_layers() const noexcept { return options_.num_layers; }
  /// Queues one increment (never blocks); one over max_batch_bytes is
  /// queued as several of fewer layers each (same positions and token ids).
  void push(QueuedIncrement increment);
  /// Drops the queued increments of (job, request) (it finished or was
  /// cancelled: its KV is garbage). Returns how many.
  std::size_t forget_request(std::uint64_t job_id, std::uint64_t request_id);
  /// Waits until everything queued was flushed; false on timeout.
  [[nodiscard]] bool drain(std::chrono::milliseconds timeout);
  [[nodiscard]] KvStreamerStats stats() const;

 private:
  void run();

  std::shared_ptr<kvstore::KvTarget> target_;
  KvStreamerOptions options_;
  FlushedCallback on_flushed_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        ///< work queued, or stop
  std::condition_variable drained_;   ///< queue empty and nothing in flight
  std::deque<QueuedIncrement> queue_;
  bool in_flight_ = false;            ///< the thread holds a batch
  bool stop_ = false;
  KvStreamerStats stats_;
  std::thread thread_;
};

}  // namespace shardline::worker
