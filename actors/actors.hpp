#pragma once
/// \file
/// The actors of a node. Each is a thin CAF behaviour around a plain class:
/// the job orchestrator around orchestrator::JobManager, a worker (one per
/// device, on its own thread) around worker::BatchWorker, the KV store around
/// kvstore::HostKvStore. Messages are signed Cap'n Proto bytes
/// (actors/protocol.hpp); a message with a bad tag is refused, logged, and
/// answered with an "unauthenticated" error.

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/metrics.hpp"
#include "engine/engine_builder.hpp"
#include "messages/types.hpp"
#include "orchestrator/job_manager.hpp"

namespace shardline::actors {

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
  double heartbeat_timeout_s = 30.0;  ///< a worker silent this long is presumed dead
};

/// Spawns the job orchestrator (one per cluster).
[[nodiscard]] caf::actor spawn_orchestrator(caf::actor_system& sys, OrchestratorConfig config);

struct WorkerConfig {
  std::string name;     ///< e.g. "node0/cpu:0", or "node0/cpu:0-1" for an engine group of two devices
  std::string device;   ///< e.g. "cpu"
  std::string node_name;
  engine::EngineOptions engine;  ///< engine.parallel: the worker's engine group (dp == 1)
  int max_batch = 64;   ///< requests the orchestrator keeps queued here: 2 x max_batch
  caf::actor orchestrator;
  std::shared_ptr<const ClusterKey> key;
  std::shared_ptr<MetricsRegistry> metrics;
};

/// Spawns a worker on its own thread. It loads its engine (one engine group:
/// engine.parallel's tp x sp x pp in-process ranks, each on its own thread),
/// says hello to the orchestrator with its group shape, and then steps its
/// engine while it has work, under the token budget policy of the job whose
/// lines it took last.
[[nodiscard]] caf::actor spawn_worker(caf::actor_system& sys, WorkerConfig config);

struct KvStoreConfig {
  std::string name;
  std::uint64_t capacity_bytes = 1ull << 30;
  std::shared_ptr<const ClusterKey> key;
};

[[nodiscard]] caf::actor spawn_kvstore(caf::actor_system& sys, KvStoreConfig config);

/// Registers metric families every node exports.
void describe_node_metrics(MetricsRegistry& metrics);

}  // namespace shardline::actors
