#pragma once
/// \file
/// What a worker needs of its node's KV store (DéjàVu, seed 003 §4.1.1 (3)
/// token streaming and §4.2.3 recovery), as interfaces: the actor layer
/// implements them over the KV-store actor (actors/kv_client.hpp), tests
/// over plain objects. The worker runtime (worker/worker_runtime.hpp)
/// streams through an AckedKvTarget, fetches resumed lines' KV from a
/// ResumeKvSource and drops cancelled jobs' KV there.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_store.hpp"
#include "kvstore/kv_stream.hpp"
#include "worker/kv_progress.hpp"

namespace shardline::worker {

/// A request whose prefix link waits at the store for a block it does not
/// keep (the store dropped it after the worker learned it kept it, or
/// skipped it): its head must go as KV after all.
struct KvLinkWait {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;  ///< kv_request_key(line, choice)
  std::uint64_t name = 0;        ///< the block
  /// When the batch the store answered with this was sent: a block the
  /// tier learned was kept after that may have landed after the answer.
  std::chrono::steady_clock::time_point sent_at{};
};

/// A KvTarget whose flushes are acknowledged per request (the store's
/// ChunksAcked): after a flush_batch that succeeded, take_acks() returns
/// what the store holds now. Called on the streamer's thread only.
class AckedKvTarget : public kvstore::KvTarget {
 public:
  /// The acknowledgements of the last successful flush (then cleared).
  [[nodiscard]] virtual std::vector<KvStoreAck> take_acks() = 0;
  /// The flushed requests whose link waits for a block (then cleared).
  [[nodiscard]] virtual std::vector<KvLinkWait> take_link_waits() { return {}; }
};

/// A request's durable KV prefix, as the store answered a fetch.
struct KvPrefix {
  int num_tokens = 0;             ///< positions [0, num_tokens) in `chunk`
  std::vector<std::byte> chunk;   ///< canonical chunk (kvstore/kv_stream.hpp): all layers x [0, num_tokens)
  std::string source;             ///< the store that had it (for logs)
};

/// Where resumed lines' KV comes from, and where cancelled jobs' KV is
/// deleted. Called on the worker's thread; both may block (a request to
/// the store).
class ResumeKvSource {
 public:
  virtual ~ResumeKvSource() = default;
  /// The durable prefix of (job_id, request_id), at most `max_tokens`
  /// positions (it may hold fewer). Errors: io (no store now, e.g. it is
  /// restarting; no answer in time), or the store's error. The runtime
  /// asks again for a while after an error.
  [[nodiscard]] virtual Result<KvPrefix> fetch_prefix(std::uint64_t job_id, std::uint64_t request_id,
                                                      int max_tokens) = 0;
  /// Deletes every request's KV of `job_id` (best effort: with no store
  /// now, the orchestrator drops the job's KV when the job ends).
  virtual void drop_job(std::uint64_t job_id) = 0;
};

/// The store's answer to a put of prefix blocks.
struct PrefixPutAck {
  int stored = 0;                    ///< blocks newly kept
  std::vector<std::uint64_t> kept;   ///< the names of the put's blocks the store keeps after it
};

/// Where a worker's prefix tier keeps prefix blocks beyond its host memory:
/// the node's KV store (kvstore/kv_store.hpp "Prefix blocks"; issue 42,
/// step 5). Both calls block (a request to the store); the tier calls
/// put_blocks from its writer thread and fetch_blocks from the worker's
/// thread when a line arrives.
class PrefixBlockStore {
 public:
  virtual ~PrefixBlockStore() = default;
  /// Keeps `blocks` under `salt`. Returns how many were newly kept and
  /// which the store keeps (its budget may skip some). Errors: io (no
  /// store now, no answer in time), or the store's (disk_full,
  /// invalid_argument).
  [[nodiscard]] virtual Result<PrefixPutAck> put_blocks(std::uint64_t salt,
                                                        std::span<const kvstore::PrefixBlockWrite> blocks) = 0;
  /// The leading run of `queries` the store keeps under `salt`, in order
  /// (parents and tokens compared). Errors: as put_blocks.
  [[nodiscard]] virtual Result<std::vector<kvstore::StoredPrefixBlock>> fetch_blocks(
      std::uint64_t salt, std::span<const kvstore::PrefixBlockQuery> queries) = 0;
};

}  // namespace shardline::worker
