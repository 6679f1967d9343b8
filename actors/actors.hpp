#pragma once
/// \file
/// The actors of a node. Each is a thin CAF behaviour around a plain class:
/// the job orchestrator around orchestrator::JobManager and WorkerPool, a
/// worker (one per device, on its own thread) around worker::BatchWorker, the
/// KV store around kvstore::KvStore. Messages are signed Cap'n Proto bytes
/// (actors/protocol.hpp); a message with a bad tag is refused, logged, and
/// answered with an "unauthenticated" error.
///
/// Workers, clients and joined nodes never hold the orchestrator itself but
/// the node's orchestrator relay (spawn_orchestrator_relay), a stable address
/// that forwards to whichever orchestrator incarnation is current: the node's
/// supervisor restarts a killed orchestrator from its RocksDB state and hands
/// the new one to the relay.

#include <caf/all.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/kv_client.hpp"
#include "actors/metrics.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_node.hpp"
#include "engine/policies/sidp_mode_policy.hpp"
#include "kvstore/kv_store.hpp"
#include "kvstore/replication.hpp"
#include "messages/types.hpp"
#include "orchestrator/job_manager.hpp"

namespace shardline::actors {

class ClusterTls;  // actors/cluster_tls.hpp

/// Heartbeats and failure detection (DéjàVu §4.2.3: 1 s, 3 s).
struct FailureDetection {
  int heartbeat_ms = 1000;         ///< `--heartbeat-ms`: a worker beats this often, between engine steps
  int failure_timeout_ms = 3000;   ///< `--failure-timeout-ms`: a worker silent this long is declared dead
  /// invalid_argument unless both are positive and the timeout exceeds the interval.
  [[nodiscard]] Status check() const;
  /// How often the orchestrator looks for silent workers: a tenth of the
  /// timeout, between 10 and 250 ms.
  [[nodiscard]] int tick_ms() const;
};

/// What the node keeps across orchestrator restarts, owned by the node and
/// shared by every incarnation (each reads and updates it from its own
/// behaviour; hence the mutex). It is a hint, not state: a restarted
/// orchestrator waits for these workers to say hello again before it hands
/// out work (WorkerPool::await_workers), and `actor list` shows the count.
struct OrchestratorRoster {
  std::mutex mu;
  std::set<std::string> workers;  ///< registered (or awaited) by the current incarnation
  int restarts = 0;               ///< incarnations started after a kill or crash
  /// The highest SiDP mode-switch epoch an incarnation has sent
  /// (orchestrator::SidpSwitcher::last_epoch): the next one continues above
  /// it, so the ranks never see an epoch go back.
  std::uint64_t sidp_epoch = 0;
};

struct OrchestratorConfig {
  std::string node_name;
  std::string model_dir;  ///< the model this cluster serves; jobs must name it
  /// This node's parallel config: the engine-group shape every worker of the
  /// cluster must have (tp, pp, sp) and this node's number of groups (dp).
  /// A job's --parallel must match it (dp counting the groups of joined nodes too).
  engine::ParallelConfig parallel;
  std::unique_ptr<orchestrator::JobManager> jobs;
  std::shared_ptr<const ClusterKey> key;
  std::shared_ptr<MetricsRegistry> metrics;
  /// Node-local actors besides workers (KV store, ...), for `actor list`.
  std::function<std::vector<messages::ActorInfo>()> local_actors;
  /// Kills a node-local actor by name the way a crash would; false if unknown.
  std::function<bool(const std::string&)> kill_local;
  FailureDetection failure;
  /// SiDP mode switching (`--sidp-mode`, `--sidp-switch-batch`,
  /// `--sidp-hysteresis`, `--sidp-min-dwell`) for every SiDP group of the
  /// cluster; num_ranks is ignored (each group's comes with its workers'
  /// hellos). Checked on the first hello of a SiDP worker (a cluster without
  /// SiDP never checks it): invalid options refuse the SiDP workers.
  engine::SidpModePolicyOptions sidp_policy;
  /// What this node's workers run, "none" or "sidp" (`--weight-sharing`); a
  /// job that names another is refused.
  std::string weight_sharing = "none";
  /// Shared with the incarnations before and after this one; never null.
  std::shared_ptr<OrchestratorRoster> roster = std::make_shared<OrchestratorRoster>();
  /// Workers of other nodes may exist: the node listens (`--listen`). A
  /// fresh process over unfinished jobs then waits for them to say hello
  /// before it hands lines out; one that cannot have any (`run`, a node
  /// without --listen) starts at once.
  bool remote_workers = true;
};

/// Spawns the job orchestrator (one per cluster). It takes its messages from
/// the node's relay as (relayed_atom, sender, tag, bytes). `actor kill
/// orchestrator` (or NODE/orchestrator) makes it quit with exit_reason::kill,
/// as a crash would; the node's supervisor then starts a new one. When
/// config.roster->restarts > 0 it is such a restart: it holds its dispatch
/// until the roster's workers said hello again (each with the lines it
/// holds) or the failure timeout has passed.
///
/// SiDP (actors/orchestrator_sidp.hpp, docs/sidp.md): it runs the WaS <->
/// CaS policy of every SiDP group its workers name in their hellos, sends the
/// group's workers a sidpSwitch for each decision (and a sync when a group is
/// first complete), and lists and kills the layer owners that say hello.
[[nodiscard]] caf::actor spawn_orchestrator(caf::actor_system& sys, OrchestratorConfig config);

/// Spawns the orchestrator relay: it forwards every (msg_atom, tag, bytes)
/// to the current orchestrator as (relayed_atom, sender, tag, bytes) and
/// the orchestrator's reply back to the sender. It learns the current
/// orchestrator from (orchestrator_atom, actor) messages and monitors it;
/// while there is none (between a kill and the restart) it queues what
/// arrives, and what an orchestrator left unanswered when it died
/// (request_receiver_down) goes to the next one, so no message is lost to a
/// restart. (orchestrator_atom, actor) and exit messages are taken only from
/// actors of this node; others are logged and counted in `metrics`
/// (shardline_relay_refused_total; may be null).
[[nodiscard]] caf::actor spawn_orchestrator_relay(caf::actor_system& sys,
                                                  std::shared_ptr<MetricsRegistry> metrics = nullptr);

/// A joined node's link to the orchestrator's node at `host_port`: its
/// workers and KV store send to it; it forwards as them (send_as) to the
/// remote relay. When the connection drops (that node was killed) it queues
/// and reconnects every 500 ms, so the joined node lives through a restart
/// of the orchestrator's node. It connects through `tls` (started in
/// `sys`). Errors: invalid_argument (bad address), io (cannot reach it now).
[[nodiscard]] Result<caf::actor> spawn_remote_link(caf::actor_system& sys, std::shared_ptr<ClusterTls> tls,
                                                   const std::string& host_port);

/// Why workers of a node could not start their engine, shared by the node
/// and its workers: the node's owner prints the cause as its final error
/// (`run`), not only the log line (issue 46, item 14).
struct WorkerStartErrors {
  std::mutex mu;
  std::vector<std::string> errors;  ///< "node0/cpu:0: out_of_memory: ...", in the order they happened
  void add(std::string e) {
    std::lock_guard lock(mu);
    errors.push_back(std::move(e));
  }
};

struct WorkerConfig {
  std::string name;     ///< e.g. "node0/cpu:0", or "node0/cpu:0-1" for an engine group of two devices
  std::string device;   ///< e.g. "cpu"
  std::string node_name;
  engine::EngineOptions engine;  ///< engine.parallel: the worker's engine group (dp == 1)
  int max_batch = 64;   ///< requests the orchestrator keeps queued here: 2 x max_batch
  caf::actor orchestrator;  ///< the orchestrator relay of the node running it (local or remote)
  std::shared_ptr<const ClusterKey> key;
  std::shared_ptr<MetricsRegistry> metrics;
  std::shared_ptr<WorkerStartErrors> start_errors;  ///< null: not recorded
  int heartbeat_ms = 1000;  ///< FailureDetection::heartbeat_ms
  /// FailureDetection::failure_timeout_ms: a step longer than half of it is
  /// logged (once per instance), as the orchestrator may take the silence
  /// for a hang.
  int failure_timeout_ms = 3000;
  /// Test hook (`SHARDLINE_TEST_STALL_WORKER`, see Node::start): the worker's
  /// thread sticks inside its step number `stall_at_step` (1-based; 0 = never)
  /// for `stall_ms`, beating no heartbeat. A detached CAF actor stuck in C++
  /// code cannot be interrupted, so the stall is a sleep in 10 ms slices
  /// that ends at its deadline; then the thread returns to its mailbox, where
  /// the kill of the orchestrator that declared it dead is waiting, and the
  /// supervisor replaces it. `stall_once` (shared by the worker's
  /// incarnations) makes it fire once per process.
  std::uint64_t stall_at_step = 0;
  int stall_ms = 0;
  std::shared_ptr<std::atomic<bool>> stall_once;
  /// The node's KV store (DéjàVu token streaming and recovery); null: no
  /// streaming, and resumed lines recompute from their tokens.
  std::shared_ptr<KvStoreLink> kv_store;
  std::uint64_t kv_queue_bytes = 64ull << 20;  ///< KvStreamerOptions::max_queued_bytes
  /// The persistent prefix tier (worker/store_prefix_tier.hpp) over the
  /// node's KV store, with prefix caching on: host memory of this many
  /// bytes in front of the store (`--prefix-tier-mib`, else 256 MiB); 0: off
  /// (the store keeps no prefix blocks: `--kv-prefix-mib 0`).
  std::uint64_t prefix_store_host_bytes = 0;
  /// `--weight-sharing sidp`: the node's SiDP group this worker is rank
  /// `sidp_rank` of (its engine comes from SidpNodeGroup::attach, not from
  /// `engine`); null = no SiDP.
  std::shared_ptr<engine::SidpNodeGroup> sidp;
  int sidp_rank = 0;
  std::string sidp_group;  ///< "NODE/sidp"
};

/// A SiDP layer owner (seed 002 §4.1): one per device of a SiDP group.
struct LayerOwnerConfig {
  std::string name;        ///< "NODE/cpu:I/owner"
  std::string node_name;
  std::string group_name;  ///< "NODE/sidp"
  int rank = 0;
  std::shared_ptr<engine::SidpNodeGroup> sidp;
  caf::actor orchestrator;  ///< the orchestrator relay its hellos go to
  std::shared_ptr<const ClusterKey> key;
  int heartbeat_ms = 1000;
};

/// Spawns a layer owner on its own thread: it packs its rank's FFN layers
/// from the host copy of the model and exposes them on the group's weights
/// communicator (SidpNodeGroup::load_owner), registers with the orchestrator
/// (LayerOwnerHello) and again every heartbeat_ms. When it dies (`actor
/// kill`, a crash) its layers are withdrawn and freed: ranks that need them
/// wait (WaS gets retry, a CaS owner rank waits for its lease) until the
/// node's supervisor respawns it, which loads them again; the bytes are the
/// same, so are the outputs. CaS requests for its layers are computed by its
/// device's worker, on its weights. If loading fails it quits with
/// unhandled_exception (the supervisor tries again).
[[nodiscard]] caf::actor spawn_layer_owner(caf::actor_system& sys, LayerOwnerConfig config);

/// Spawns a worker on its own thread. It loads its engine (one engine group:
/// engine.parallel's tp x sp x pp in-process ranks, each on its own thread),
/// says hello to the orchestrator with its group shape, and then steps its
/// engine while it has work, under the token budget policy of the job whose
/// lines it took last. Between steps it beats every heartbeat_ms. Told
/// HelloAgain (an orchestrator restarted and does not know it), it says
/// hello again with the lines it holds.
[[nodiscard]] caf::actor spawn_worker(caf::actor_system& sys, WorkerConfig config);

struct KvStoreConfig {
  std::string name;       ///< "NODE/kvstore"
  std::string node_name;
  std::string dir;        ///< its RocksDB directory, DATA/kv
  kvstore::KvModelShape shape;  ///< the served model's KV geometry (layers, KV heads, head dim, KV dtype)
  std::uint64_t capacity_bytes = 256ull << 20;  ///< host-memory tier budget (`--kv-store-bytes`)
  std::uint64_t disk_budget_bytes = 0;          ///< KvStoreOptions::disk_budget_bytes (`--kv-disk-mib`)
  std::uint64_t disk_reserve_bytes = 256ull << 20;  ///< KvStoreOptions::disk_reserve_bytes (`--kv-disk-reserve-mib`)
  std::uint64_t prefix_budget_bytes = 1ull << 30;   ///< KvStoreOptions::prefix_budget_bytes (`--kv-prefix-mib`)
  kvstore::KvSyncPolicy sync = kvstore::KvSyncPolicy::wal;  ///< `--kv-sync`
  int replication_factor = kvstore::kDefaultReplicationFactor;  ///< `--kv-replication`
  std::shared_ptr<const ClusterKey> key;
  std::shared_ptr<MetricsRegistry> metrics;
  /// The orchestrator relay (local or the joined node's) its heartbeats go
  /// to; they register it, and the orchestrator answers with the ring.
  caf::actor orchestrator;
  int heartbeat_ms = 1000;
};

/// Spawns a KV-store actor on its own thread (RocksDB calls block). It opens
/// `dir` (creating it; a store written for another model is deleted and
/// started empty, as it only holds recomputable state), counts what it holds
/// as its own acknowledged positions, and beats to the orchestrator every
/// heartbeat_ms. It serves putChunks (store, replicate to the ring
/// successor, answer chunksAcked: per request the positions this store and
/// its replica hold), fetchPrefix (a request's durable prefix; when short
/// here and asked to, the longest any other store of the ring holds),
/// dropRequests (delete, and the same on the replica) and statsQuery. If
/// `dir` cannot be opened it quits with unhandled_exception (its
/// supervisor tries again). See docs/kv-recovery.md.
[[nodiscard]] caf::actor spawn_kvstore(caf::actor_system& sys, KvStoreConfig config);

/// Registers metric families every node exports.
void describe_node_metrics(MetricsRegistry& metrics);

}  // namespace shardline::actors
