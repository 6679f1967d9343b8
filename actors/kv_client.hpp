#pragma once
/// \file
/// How a worker reaches its node's KV-store actor (DéjàVu §4.1's flush /
/// fetch to "a KV-store actor"): a link that always names the current store
/// incarnation (the supervisor restarts a killed store and updates it), the
/// KvTarget the worker's KvStreamer flushes through, and the blocking fetch
/// of a request's durable prefix that recovery uses.
///
/// Both block the calling thread on a CAF request (a scoped actor): call
/// them from the streamer's thread or from a detached worker actor, never
/// from an event-based actor on the shared scheduler.

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"
#include "messages/types.hpp"
#include "worker/kv_progress.hpp"
#include "worker/kv_store_client.hpp"

namespace shardline::actors {

/// The node's current KV-store actor (null between a kill and the restart).
class KvStoreLink {
 public:
  void set(caf::actor store) {
    std::lock_guard<std::mutex> lock(mu_);
    store_ = std::move(store);
  }
  [[nodiscard]] caf::actor get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return store_;
  }

 private:
  mutable std::mutex mu_;
  caf::actor store_;
};

/// A KvTarget over the KV-store actor: flush_batch sends one PutChunks of
/// every chunk of the batch (one message: the buffered copy's one transfer)
/// and waits for the store's ChunksAcked, which it keeps for take_acks().
/// flush() is a batch of one; fetch() is unsupported (recovery uses
/// fetch_kv_prefix). Errors: io (no store now, it did not answer within
/// `timeout`, or it answered with an error: the streamer retries).
class ActorKvTarget final : public worker::AckedKvTarget {
 public:
  ActorKvTarget(caf::actor_system& system, std::shared_ptr<KvStoreLink> link, std::shared_ptr<const ClusterKey> key,
                std::chrono::milliseconds timeout = std::chrono::seconds(5));

  [[nodiscard]] Status flush(const kvstore::KvChunkKey& key, std::span<const std::byte> chunk) override;
  [[nodiscard]] Result<std::vector<std::byte>> fetch(const kvstore::KvChunkKey& key) override;
  /// One PutChunks of the chunks and the prefix links.
  [[nodiscard]] Status flush_linked(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer,
                                    std::span<const kvstore::PrefixLinkWrite> links) override;
  [[nodiscard]] bool takes_prefix_links() const override { return true; }
  [[nodiscard]] Status flush_batch(std::span<const kvstore::KvChunkRef> chunks,
                                   std::span<const std::byte> buffer) override;

  /// The acknowledgements of the last successful flush (then cleared).
  [[nodiscard]] std::vector<worker::KvStoreAck> take_acks() override;
  [[nodiscard]] std::vector<worker::KvLinkWait> take_link_waits() override;

 private:
  caf::actor_system& system_;
  std::shared_ptr<KvStoreLink> link_;
  std::shared_ptr<const ClusterKey> key_;
  std::chrono::milliseconds timeout_;
  std::vector<worker::KvStoreAck> acks_;
  std::vector<worker::KvLinkWait> waits_;
};

/// A ResumeKvSource over the node's KV-store actor: fetch_prefix is
/// fetch_kv_prefix on the current store (io when there is none: it is
/// restarting); drop_job sends a signed DropRequests of the whole job and
/// does not wait. Call it from a detached actor's thread (it blocks).
class ActorResumeKvSource final : public worker::ResumeKvSource {
 public:
  ActorResumeKvSource(caf::actor_system& system, std::shared_ptr<KvStoreLink> link,
                      std::shared_ptr<const ClusterKey> key, std::chrono::milliseconds timeout = std::chrono::seconds(5));

  [[nodiscard]] Result<worker::KvPrefix> fetch_prefix(std::uint64_t job_id, std::uint64_t request_id,
                                                      int max_tokens) override;
  void drop_job(std::uint64_t job_id) override;

 private:
  caf::actor_system& system_;
  std::shared_ptr<KvStoreLink> link_;
  std::shared_ptr<const ClusterKey> key_;
  std::chrono::milliseconds timeout_;
};

/// A PrefixBlockStore over the node's KV-store actor (the persistent prefix
/// tier, worker/store_prefix_tier.hpp): put_blocks sends one
/// PutPrefixBlocks, fetch_blocks one FetchPrefixBlocks, and each waits for
/// the answer: a put (the tier's writer thread) up to `timeout`, a fetch
/// (the worker's thread, ahead of a line) up to `fetch_timeout`. Errors: io
/// (no store now: it is restarting; no answer in time), or the store's.
class ActorPrefixBlockStore final : public worker::PrefixBlockStore {
 public:
  ActorPrefixBlockStore(caf::actor_system& system, std::shared_ptr<KvStoreLink> link,
                        std::shared_ptr<const ClusterKey> key, std::chrono::milliseconds timeout = std::chrono::seconds(5),
                        std::chrono::milliseconds fetch_timeout = std::chrono::milliseconds(1000));

  [[nodiscard]] Result<worker::PrefixPutAck> put_blocks(std::uint64_t salt,
                                                        std::span<const kvstore::PrefixBlockWrite> blocks) override;
  [[nodiscard]] Result<std::vector<kvstore::StoredPrefixBlock>> fetch_blocks(
      std::uint64_t salt, std::span<const kvstore::PrefixBlockQuery> queries) override;

 private:
  caf::actor_system& system_;
  std::shared_ptr<KvStoreLink> link_;
  std::shared_ptr<const ClusterKey> key_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds fetch_timeout_;
};

/// Sends a signed KV-store message and waits for the reply. Errors: io (no
/// store, timeout, a refused or undecodable reply), or the store's Error.
[[nodiscard]] Result<messages::KvStoreReply> ask_kv_store(caf::actor_system& system, const caf::actor& store,
                                                          const ClusterKey& key, const messages::KvStoreMsg& msg,
                                                          std::chrono::milliseconds timeout);

/// Fetches the durable prefix of (job, request), at most `max_tokens`
/// positions, from `store` (which asks the other stores of the ring when it
/// holds fewer). Errors: as ask_kv_store.
[[nodiscard]] Result<messages::KvPrefixData> fetch_kv_prefix(caf::actor_system& system, const caf::actor& store,
                                                             const ClusterKey& key, std::uint64_t job_id,
                                                             std::uint64_t request_id, int max_tokens,
                                                             std::chrono::milliseconds timeout);

}  // namespace shardline::actors
