#pragma once
/// \file
/// Replication of KV stores in a ring (DéjàVu §4.2.3), as plain logic the
/// KV-store actor drives: which peers hold a node's replicas, and which
/// token positions of each request are acknowledged.
///
/// The ring: the cluster's node names, sorted and without repeats; node x
/// replicates its chunks to the next f - 1 nodes of the ring (x + 1, ...,
/// x + f - 1 mod N), the paper's worker x -> (x + 1) mod N for f = 2. A
/// single-node cluster has no peers: it keeps only its own RocksDB copy.
///
/// Acknowledgements: the paper's (x, j, t) messages. Each store reports, per
/// (job, request), its `durable_tokens` (kvstore/kv_store.hpp): the local
/// store of x, and each replica when it stored x's chunks. A position is
/// acknowledged once the local store and each of the first f - 1 replicas
/// hold it (all of them, durable at their sync policy): `acked_tokens` is
/// that minimum, and never decreases. With fewer nodes than f the replicas
/// that exist are required.
///
/// What an acknowledged position survives, by replication factor f and sync
/// policy (KvSyncPolicy; "one node": the failure hits one node at a time and
/// the ring is repaired (catch-up) before the next; "all nodes": every node
/// at once, e.g. a shared power feed):
///
/// | f | sync  | store actor restart | kill -9 of one process | power loss of one node | loss of one node (disk gone) | kill -9 of all | power loss of all |
/// |---|-------|---------------------|------------------------|------------------------|------------------------------|----------------|-------------------|
/// | 1 | none  | yes (clean close)   | no                     | no                     | no                           | no             | no                |
/// | 1 | wal   | yes                 | yes                    | no                     | no                           | yes            | no                |
/// | 1 | fsync | yes                 | yes                    | yes                    | no                           | yes            | yes               |
/// | 2 | none  | yes                 | yes (replica)          | yes (replica)          | yes (replica)                | no             | no                |
/// | 2 | wal   | yes                 | yes                    | yes (replica)          | yes (replica)                | yes            | no                |
/// | 2 | fsync | yes                 | yes                    | yes                    | yes (replica)                | yes            | yes               |
///
/// "store actor restart" assumes the store is closed (RocksDB flushes its
/// memtable); a single-node cluster with f = 2 behaves as f = 1. The
/// defaults (f = 2, wal) survive kill -9 of any one process and the loss of
/// any one node of a cluster of two or more. tests/kvstore/kv_store_fault_test
/// shows the single-store rows.
///
/// Thread safety: none; the owning actor serializes calls.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"

namespace shardline::kvstore {

/// The default replication factor: with the default sync policy (wal) it
/// survives kill -9 of any one process and the loss of any one node.
inline constexpr int kDefaultReplicationFactor = 2;

/// The ring order: `nodes` sorted, repeats removed.
[[nodiscard]] std::vector<std::string> ring_order(std::span<const std::string> nodes);

/// The node after `self` in the ring, or nullopt in a single-node cluster.
/// Errors: invalid_argument (`self` is not in `nodes`).
[[nodiscard]] Result<std::optional<std::string>> ring_successor(std::span<const std::string> nodes,
                                                                const std::string& self);

/// The nodes holding `self`'s replicas for replication factor f: the next
/// min(f - 1, N - 1) nodes of the ring, nearest first. Errors:
/// invalid_argument (`self` not in `nodes`, f < 1).
[[nodiscard]] Result<std::vector<std::string>> replica_peers(std::span<const std::string> nodes,
                                                             const std::string& self, int replication_factor);

/// The nodes whose replicas `self` holds (the previous min(f - 1, N - 1)
/// nodes, nearest first): what a restarted `self` must re-receive. Errors:
/// as replica_peers.
[[nodiscard]] Result<std::vector<std::string>> replica_sources(std::span<const std::string> nodes,
                                                               const std::string& self, int replication_factor);

/// How far one replica is behind the local store.
struct ReplicaLag {
  std::string replica;
  std::uint64_t tokens_behind = 0;    ///< sum over requests of max(0, local - replica)
  std::uint64_t requests_behind = 0;  ///< requests where the replica holds less than the local store
  int max_tokens_behind = 0;          ///< the largest gap of one request
  bool catching_up = false;           ///< replaced, and not yet caught up with every request
};

/// Per (job, request) durable tokens of the local store and of each replica,
/// and the acknowledged prefix.
class AckTracker {
 public:
  /// `replicas`: the peers in ring order (replica_peers); only the first
  /// f - 1 count. f < 1 is taken as 1.
  AckTracker(int replication_factor, std::vector<std::string> replicas);

  [[nodiscard]] int replication_factor() const noexcept { return factor_; }
  /// The replicas that count, nearest first.
  [[nodiscard]] const std::vector<std::string>& replicas() const noexcept { return replicas_; }

  /// Membership changed: replicas kept by name keep their entries; a new one
  /// starts from nothing and is catching up. acked_tokens does not go back.
  void set_replicas(std::vector<std::string> replicas);
  /// `replica`'s store was replaced (restarted empty or from a store that
  /// lost data): its entries reset to 0, it is catching up. Unknown
  /// replicas are ignored.
  void replica_replaced(const std::string& replica);

  /// The local store's durable tokens for a request (a lower report than an
  /// earlier one is ignored: a store that lost data is reset instead).
  void on_local(std::uint64_t job_id, std::uint64_t request_id, int durable_tokens);
  /// A replica's ack (x, j, t). Errors: invalid_argument (not a replica
  /// that counts: a stale peer's late ack).
  [[nodiscard]] Status on_replica(const std::string& replica, std::uint64_t job_id, std::uint64_t request_id,
                                  int durable_tokens);

  /// Positions [0, acked) are held by the local store and every replica;
  /// never decreases until forgotten. 0 for an unknown request.
  [[nodiscard]] int acked_tokens(std::uint64_t job_id, std::uint64_t request_id) const;
  [[nodiscard]] int local_tokens(std::uint64_t job_id, std::uint64_t request_id) const;
  /// A replica's reported tokens (0 when unknown).
  [[nodiscard]] int replica_tokens(const std::string& replica, std::uint64_t job_id,
                                   std::uint64_t request_id) const;

  /// Lag of each replica, in replicas() order.
  [[nodiscard]] std::vector<ReplicaLag> lag() const;

  /// The request finished (its KV is dropped): forget it.
  void forget(std::uint64_t job_id, std::uint64_t request_id);
  void forget_job(std::uint64_t job_id);
  [[nodiscard]] std::size_t tracked() const noexcept { return requests_.size(); }

 private:
  struct Entry {
    int local = 0;
    std::vector<int> replica;  ///< by replicas_ slot
    int acked = 0;
  };
  void update(Entry& e) const;
  [[nodiscard]] int slot(const std::string& replica) const;
  void refresh_catching_up(std::size_t slot);

  int factor_ = 1;
  std::vector<std::string> replicas_;
  std::vector<bool> catching_up_;  ///< by slot
  std::map<std::pair<std::uint64_t, std::uint64_t>, Entry> requests_;
};

}  // namespace shardline::kvstore
