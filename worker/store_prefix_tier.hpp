#pragma once
/// \file
/// The persistent prefix tier (issue 42, step 5): a worker's tier below its
/// engine's prefix cache (engine/prefix_tier.hpp) that keeps full prefix
/// blocks in host memory (a HostPrefixTier) and in the node's KV store
/// (kvstore/kv_store.hpp "Prefix blocks": the same store and actor as
/// DéjàVu's token streaming, under keys no job has), so that a restarted
/// node, a resumed job or the next job over the same prompts fetches a
/// shared prefix's KV instead of computing it. LMCache and vLLM's KV
/// connectors keep prefix blocks in a store below the GPU cache the same
/// way; here the store is the DéjàVu replica memory that already exists.
///
///  - put (a block the cache evicts, or shares for the first time:
///    keeps_shared_blocks): into host memory at once, and queued for the
///    store; a writer thread sends the queue in batches (PutPrefixBlocks),
///    off the step loop. The queue is bounded (max_queued_bytes): past it
///    a block is kept in host memory only (counted as dropped). A block the
///    store acknowledged (or handed out) is not sent again.
///  - get (an admission): host memory only: the step loop never waits on
///    the store.
///  - prefetch (a line arrives, before its requests enter the engine): of
///    the prompt's full blocks the device cache lacks, those after the
///    ones host memory holds are asked of the store (one FetchPrefixBlocks
///    of the whole run); the run it keeps is staged in host memory, where
///    the admission finds it. This blocks the worker's thread for one
///    request to its node's store, as a resumed line's KV fetch does.
///
/// Names carry the engine's salt (PrefixCacheConfig::salt: model
/// fingerprint, dtypes, layout), and every block is compared by parent and
/// tokens on the way out of the store and of host memory.
///
/// Thread safety: put / touch / get / prefetch / drain / stats from any
/// thread (the engine's and the worker's).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/prefix_cache.hpp"
#include "engine/prefix_tier.hpp"
#include "worker/kv_store_client.hpp"

namespace shardline::worker {

struct StorePrefixTierOptions {
  std::uint64_t salt = 0;                        ///< the engine's PrefixCacheConfig::salt
  std::uint64_t host_bytes = 256ull << 20;       ///< the host-memory LRU's budget (chunk bytes)
  std::uint64_t max_queued_bytes = 256ull << 20;  ///< chunk bytes waiting for the store at most
  std::uint64_t max_batch_bytes = 16ull << 20;   ///< chunk bytes per PutPrefixBlocks at most (one block at least)
  /// Chunk bytes of one block (all layers x block_size positions): sizes
  /// the fetches.
  std::uint64_t block_bytes = 0;
  /// Chunk bytes one FetchPrefixBlocks asks for at most (a message stays
  /// under messages::kMaxMessageBytes); a prefetch asks again for the rest
  /// while the store had every block asked.
  std::uint64_t max_fetch_bytes = 16ull << 20;
  /// After a failed fetch (the store is down, restarting or slow), new lines
  /// do not ask it for this long: each ask would hold the worker's thread.
  std::chrono::milliseconds fetch_backoff{1000};
};

/// Counters (monotonic, but queued_bytes).
struct StorePrefixTierStats {
  engine::PrefixTierStats host;            ///< the host-memory LRU
  std::uint64_t store_sent_blocks = 0;     ///< blocks sent to the store
  std::uint64_t store_kept_blocks = 0;     ///< of them, newly kept there
  std::uint64_t store_skipped_blocks = 0;  ///< of them, not kept there (its budget)
  std::uint64_t store_put_failures = 0;    ///< batches the store refused or did not answer (dropped)
  std::uint64_t dropped_blocks = 0;        ///< blocks not queued: the queue was full
  std::uint64_t prefetches = 0;            ///< FetchPrefixBlocks requests to the store
  std::uint64_t prefetch_failures = 0;     ///< of them, failed (the line computes its prefix)
  std::uint64_t prefetches_skipped = 0;    ///< lines that did not ask: within fetch_backoff of a failure
  std::uint64_t wrong_size_blocks = 0;     ///< blocks the store handed out whose chunk is not block_bytes (dropped)
  std::uint64_t fetched_blocks = 0;        ///< blocks the store handed out, staged in host memory
  std::uint64_t fetched_tokens = 0;        ///< their positions
  std::uint64_t queued_bytes = 0;          ///< now
};

class StorePrefixTier final : public engine::PrefixTier {
 public:
  /// Starts the writer thread. `store` is used from it and from prefetch.
  StorePrefixTier(std::shared_ptr<PrefixBlockStore> store, StorePrefixTierOptions options);
  /// Stops the writer thread; blocks still queued are not sent (drain first).
  ~StorePrefixTier() override;
  StorePrefixTier(const StorePrefixTier&) = delete;
  StorePrefixTier& operator=(const StorePrefixTier&) = delete;

  void put(std::uint64_t name, std::uint64_t parent, std::span<const std::int32_t> tokens,
           std::vector<std::byte> chunk) override;
  [[nodiscard]] bool touch(std::uint64_t name) override;
  [[nodiscard]] std::optional<std::vector<std::byte>> get(std::uint64_t name, std::uint64_t parent,
                                                          std::span<const std::int32_t> tokens) override;
  [[nodiscard]] bool keeps_shared_blocks() const override { return true; }

  /// Stages from the store the blocks of `blocks` (a prompt's full blocks
  /// the device lacks, in chain order: LlmEngine::uncached_prefix_blocks)
  /// after the leading ones host memory holds, up to the first the store
  /// lacks. Returns how many were staged. A failed request to the store is
  /// counted and staged nothing (the line computes its prefix).
  [[nodiscard]] int prefetch(std::span<const engine::NamedBlock> blocks);
  /// How many of `names` (a chain, first first), from the first, the store
  /// keeps or is about to be sent (queued or in flight): what a request's
  /// prefix link may name (worker/batch_worker.hpp; the store counts a
  /// block sent later once it arrives).
  [[nodiscard]] std::size_t linkable_blocks(std::span<const std::uint64_t> names) const;
  /// The store said, answering a batch sent at `sent_at`, that a link waits
  /// for `name`. True when that may be stale: the block is queued or in
  /// flight, or the store acknowledged it after `sent_at` (it may have
  /// landed after the batch was answered; a later batch tells). Else the
  /// store does not keep it after all: it is no longer taken as kept
  /// (later links stop before it), and false.
  [[nodiscard]] bool on_its_way(std::uint64_t name, std::chrono::steady_clock::time_point sent_at);
  [[nodiscard]] std::uint64_t salt() const noexcept { return options_.salt; }
  /// Waits until every queued block was sent; false on timeout.
  [[nodiscard]] bool drain(std::chrono::milliseconds timeout);
  [[nodiscard]] StorePrefixTierStats stats() const;

 private:
  struct Pending {
    std::uint64_t name = 0;
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;
    std::vector<std::byte> chunk;
  };
  void run();
  /// Remembers that the store keeps `name` (bounded: forgotten wholesale
  /// past kMaxKnownNames; a block sent again is only marked used there).
  void note_in_store_locked(std::uint64_t name);
  static constexpr std::size_t kMaxKnownNames = 1u << 20;

  engine::HostPrefixTier host_;
  std::shared_ptr<PrefixBlockStore> store_;
  StorePrefixTierOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       ///< work queued, or stop
  std::condition_variable drained_;  ///< queue empty and nothing in flight
  std::deque<Pending> queue_;
  /// Names the store keeps (acknowledged or handed out), with when this
  /// tier learned it.
  std::unordered_map<std::uint64_t, std::chrono::steady_clock::time_point> in_store_;
  std::unordered_set<std::uint64_t> queued_;    ///< names queued or in flight
  bool in_flight_ = false;
  bool stop_ = false;
  std::chrono::steady_clock::time_point fetch_again_at_{};  ///< no fetch before (after a failure)
  StorePrefixTierStats stats_;
  std::thread thread_;
};

}  // namespace shardline::worker
