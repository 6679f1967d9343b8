#pragma once
/// \file
/// One Shardline node: a CAF actor system with the job orchestrator and its
/// relay (unless the node joins another node's cluster), one worker per
/// device, a KV store, and a supervisor that restarts crashed or killed
/// workers and orchestrators. It listens on loopback
/// unless told otherwise; everything that crosses the network is signed with
/// the cluster key (actors/auth.hpp).

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/actors.hpp"
#include "actors/auth.hpp"
#include "actors/metrics.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/policies/sidp_mode_policy.hpp"
#include "engine/sidp/sidp_group.hpp"

namespace shardline::actors {

class ClusterTls;  // actors/cluster_tls.hpp

struct NodeOptions {
  std::string name = "node0";
  std::string listen;     ///< "HOST:PORT" to accept clients and nodes ("" = in-process only)
  std::string join;       ///< "HOST:PORT" of the node running the orchestrator ("" = run it here)
  // The devices and parallel config, already resolved from `--devices` and
  // `--parallel` (cli/devices.hpp, resolve_node_devices); start() checks
  // that they agree.
  int num_cpu_devices = 1;  ///< N CPU devices (`--devices cpu:N`); must equal parallel.world_size()
  /// With cuda: the listed GPUs (`--devices cuda:LIST`). One worker per GPU
  /// (parallel.dp == cuda_devices.size()), each a single device or, with
  /// tp * pp * sp = cuda_ranks_per_gpu > 1 (`cuda:LISTxK`), an engine group
  /// of ranks sharing its GPU (model::CudaShardGroup). With
  /// cuda_ranks_per_gpu = 1 and tp * pp * sp = g > 1, worker i's group is
  /// GPUs [i * g, (i + 1) * g) of the list instead (g * dp GPUs), a rank on
  /// each (`cuda:0,1 --parallel tp=2`; the ranks talk over NCCL). With
  /// tp * pp * sp = 1 and cuda_ranks_per_gpu = K > 1, the list holds each GPU
  /// K times: K single-device workers share it (`cuda:0x2 --parallel dp=2`;
  /// each plans 1/K of --gpu-memory-utilization).
  model::DeviceKind device_kind = model::DeviceKind::cpu;
  std::vector<int> cuda_devices;
  int cuda_ranks_per_gpu = 1;
  /// parallel.dp workers, each one engine group of tp x sp x pp devices
  /// (in-process ranks, each on its own thread, with its own KV cache).
  engine::ParallelConfig parallel;
  std::string data_dir;     ///< durable job state (needed when this node runs the orchestrator)
  /// model_dir, dtype, KV budget per rank, threads per rank; engine.parallel
  /// is set per worker from `parallel` (dp = 1).
  engine::EngineOptions engine;
  int max_batch = 64;       ///< running sequences per worker
  std::string key_file;     ///< cluster key; required with listen or join
  std::string metrics;      ///< "HOST:PORT" of the Prometheus endpoint ("" = none)
  std::uint64_t kv_store_bytes = 256ull << 20;  ///< the KV store's host-memory tier (`--kv-store-bytes`)
  /// The KV store's budget on disk (`--kv-disk-mib`; 0: none) and the free
  /// space it leaves on its disk for jobs.db and outputs
  /// (`--kv-disk-reserve-mib`): kvstore::KvStoreOptions.
  std::uint64_t kv_disk_bytes = 0;
  std::uint64_t kv_disk_reserve_bytes = 256ull << 20;
  /// `--kv-prefix-mib`: the KV store's share for prefix blocks (the
  /// persistent prefix tier, docs/prefix-caching.md); 0: none kept, and
  /// workers keep evicted prefix blocks in host memory only.
  std::uint64_t kv_prefix_bytes = 1ull << 30;
  /// `--kv-sync`: when a KV store write counts as durable (docs/kv-recovery.md).
  kvstore::KvSyncPolicy kv_sync = kvstore::KvSyncPolicy::wal;
  /// `--kv-replication`: copies of each KV chunk (this node's store and the
  /// next f - 1 stores of the ring); 1 = local RocksDB only; 0 = no KV
  /// store and no streaming.
  int kv_replication = kvstore::kDefaultReplicationFactor;
  /// `--heartbeat-ms` / `--failure-timeout-ms`: how often this node's
  /// workers beat, and (on the node running the orchestrator) how long a
  /// silent worker lives on.
  FailureDetection failure;
  /// `--weight-sharing sidp` (seed 002): the node's dp CPU workers (one
  /// device each) form one SiDP group "NODE/sidp" whose FFN layers each live
  /// on one device's layer owner ("NODE/cpu:I/owner"); sidp->dp is set from
  /// parallel.dp. nullopt = plain DP (every worker holds the whole model).
  std::optional<engine::SidpOptions> sidp;
  /// `--sidp-mode`, `--sidp-switch-batch`, `--sidp-hysteresis`,
  /// `--sidp-min-dwell`: the orchestrator's switching policy for every SiDP
  /// group of the cluster (used on the node that runs the orchestrator).
  engine::SidpModePolicyOptions sidp_policy;
};

class Node {
 public:
  /// Starts everything; returns when the workers are spawned (they load
  /// their engines on their own threads). Errors: invalid_argument (bad
  /// options), not_found / corrupt (key file, model), io (listen failed,
  /// cannot reach --join), plus JobManager errors for the data dir.
  [[nodiscard]] static Result<std::unique_ptr<Node>> start(NodeOptions options);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// Where to send orchestrator messages: this node's orchestrator relay
  /// (it survives orchestrator restarts), or a proxy of the joined node's.
  [[nodiscard]] caf::actor orchestrator() const { return orchestrator_; }
  [[nodiscard]] const std::shared_ptr<const ClusterKey>& key() const { return key_; }
  [[nodiscard]] caf::actor_system& system() { return *system_; }
  [[nodiscard]] int port() const { return port_; }  ///< listening port, 0 if none
  [[nodiscard]] int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  [[nodiscard]] const MetricsRegistry& metrics() const { return *metrics_; }
  /// For front ends of the node that count into its metrics (the HTTP API).
  [[nodiscard]] MetricsRegistry& metrics() { return *metrics_; }
  /// Workers of this node, and how many of them could not start their engine
  /// (bad model, a TCP group whose ranks never joined, ...); those are not restarted.
  [[nodiscard]] int num_workers() const { return num_workers_; }
  [[nodiscard]] int worker_start_failures() const {
    return static_cast<int>(metrics_->get("shardline_worker_start_failures_total"));
  }
  /// Why the first worker that could not start its engine failed
  /// ("node0/cpu:0: out_of_memory: ..."); "" when none did.
  [[nodiscard]] std::string first_worker_start_error() const {
    std::lock_guard lock(start_errors_->mu);
    return start_errors_->errors.empty() ? std::string() : start_errors_->errors.front();
  }

  /// Stops every actor and waits for them (also done by the destructor).
  void stop();

 private:
  Node() = default;

  NodeOptions options_;
  std::shared_ptr<WorkerStartErrors> start_errors_ = std::make_shared<WorkerStartErrors>();
  std::shared_ptr<const ClusterKey> key_;
  std::shared_ptr<MetricsRegistry> metrics_;
  int num_workers_ = 0;
  std::shared_ptr<ClusterTls> tls_;  ///< this system's TLS transport; stopped before system_ goes
  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor orchestrator_;  ///< relay_, or the joined node's relay
  caf::actor relay_;         ///< null on a joined node
  caf::actor link_;          ///< a joined node's link to the orchestrator's node (null otherwise)
  caf::actor supervisor_;    ///< workers, the KV store, and the orchestrator when it runs here
  std::unique_ptr<MetricsServer> metrics_server_;
  int port_ = 0;
  bool stopped_ = false;
};

/// The name of worker `index` (its engine group) on `node`: "node/cpu:I" for
/// a single device, "node/cpu:A-B" for a group over devices A..B.
[[nodiscard]] std::string worker_name(const std::string& node, int index, const engine::ParallelConfig& parallel);

}  // namespace shardline::actors
