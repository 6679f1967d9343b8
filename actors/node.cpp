#include "actors/node.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>

#include "actors/cluster_tls.hpp"
#include "actors/protocol.hpp"
#include "comm/address.hpp"
#include "model/config.hpp"
#include "model/model_fingerprint.hpp"
#include "orchestrator/job_admission.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

using down_atom = caf::atom_constant<caf::atom("sldown")>;
using restart_atom = caf::atom_constant<caf::atom("slrestart")>;
using kv_restart_atom = caf::atom_constant<caf::atom("slkvrest")>;
using owner_down_atom = caf::atom_constant<caf::atom("slowndn")>;

/// Starts an orchestrator incarnation (opening the JobManager on the data
/// dir).
using OrchestratorFactory = std::function<Result<caf::actor>(caf::actor_system&)>;

struct SupervisorConfig {
  std::vector<WorkerConfig> workers;  ///< one per worker, by index
  std::vector<LayerOwnerConfig> owners;  ///< SiDP layer owners, by rank (empty without SiDP)
  caf::actor relay;                   ///< this node's orchestrator relay (null on a joined node)
  OrchestratorFactory start_orchestrator;  ///< empty on a joined node
  std::shared_ptr<OrchestratorRoster> roster;
  std::shared_ptr<MetricsRegistry> metrics;
  std::shared_ptr<const ClusterKey> key;
  /// The node's KV store (null link: none); the supervisor restarts it from
  /// its RocksDB and points the link, which the workers hold, at each
  /// incarnation.
  KvStoreConfig kvstore;
  std::shared_ptr<KvStoreLink> kv_link;
};

/// Spawns the node's workers and restarts any that die other than by a
/// shutdown (a kill, a crash), after a short delay. On the node running the
/// orchestrator it does the same for the orchestrator: each incarnation
/// goes to the relay, and then the workers are told to say hello again.
struct SupervisorState {
  SupervisorConfig config;
  std::vector<caf::actor> workers;
  std::vector<caf::actor> owners;
  caf::actor orchestrator;
  caf::actor kvstore;
  static inline const char* name = "shardline.supervisor";
};

using SupervisorActor = caf::stateful_actor<SupervisorState>;

/// Installs `orchestrator` as the current incarnation.
void adopt_orchestrator(SupervisorActor* self, caf::actor orchestrator) {
  SupervisorState& st = self->state;
  st.orchestrator = std::move(orchestrator);
  self->monitor(st.orchestrator);
  self->send(st.config.relay, orchestrator_atom::value, st.orchestrator);
}

void restart_orchestrator(SupervisorActor* self) {
  SupervisorState& st = self->state;
  auto next = st.config.start_orchestrator(self->system());
  if (!next) {
    // E.g. a data dir that cannot be opened now: try again.
    spdlog::error("supervisor: cannot restart the orchestrator: {}; trying again", next.error().to_string());
    self->delayed_send(self, std::chrono::milliseconds(500), restart_atom::value);
    return;
  }
  adopt_orchestrator(self, std::move(next).value());
  // The relay has the new incarnation before any hello below reaches it.
  // (Workers of joined nodes are asked when their next heartbeat arrives.)
  const Signed again = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::HelloAgain{}}));
  for (const caf::actor& w : st.workers)
    if (w) self->send(w, msg_atom::value, again.tag, again.bytes);
  spdlog::info("supervisor: orchestrator restarted");
}

void start_kvstore(SupervisorActor* self) {
  SupervisorState& st = self->state;
  st.kvstore = spawn_kvstore(self->system(), st.config.kvstore);
  self->monitor(st.kvstore);
  st.config.kv_link->set(st.kvstore);
}

caf::behavior supervisor_behavior(SupervisorActor* self, std::shared_ptr<SupervisorConfig> config) {
  auto& st = self->state;
  st.config = std::move(*config);
  // The store first: the workers stream to it from their first step.
  if (st.config.kv_link) start_kvstore(self);
  if (st.config.start_orchestrator) {
    auto first = st.config.start_orchestrator(self->system());
    if (!first) {  // Node::start opened the data dir just before; unlikely
      spdlog::error("supervisor: cannot start the orchestrator: {}", first.error().to_string());
      self->delayed_send(self, std::chrono::milliseconds(500), restart_atom::value);
    } else {
      adopt_orchestrator(self, std::move(first).value());
    }
  }
  // SiDP owners before the workers: a worker's first WaS gets wait for them.
  for (const LayerOwnerConfig& c : st.config.owners) {
    st.owners.push_back(spawn_layer_owner(self->system(), c));
    self->monitor(st.owners.back());
  }
  for (const WorkerConfig& c : st.config.workers) {
    st.workers.push_back(spawn_worker(self->system(), c));
    self->monitor(st.workers.back());
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    const bool shutdown = dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal;
    if (st.orchestrator && st.orchestrator.address() == dm.source) {
      // Its state (the JobManager, so the RocksDB lock) is gone already:
      // stateful_actor destroys it before monitors hear of the exit.
      st.orchestrator = caf::actor();
      if (shutdown) return;
      {
        std::lock_guard<std::mutex> lock(st.config.roster->mu);
        ++st.config.roster->restarts;
      }
      st.config.metrics->add("shardline_orchestrator_restarts_total", "", 1);
      spdlog::warn("supervisor: orchestrator died ({}); restarting it", caf::to_string(dm.reason));
      self->delayed_send(self, std::chrono::milliseconds(100), restart_atom::value);
      return;
    }
    if (st.kvstore && st.kvstore.address() == dm.source) {
      st.kvstore = caf::actor();
      st.config.kv_link->set(caf::actor());  // workers buffer and retry meanwhile
      if (shutdown) return;
      st.config.metrics->add("shardline_kv_store_restarts_total", "", 1);
      spdlog::warn("supervisor: kv store {} died ({}); restarting it from its RocksDB", st.config.kvstore.name,
                   caf::to_string(dm.reason));
      // A kill restarts at once; a store that could not open its directory
      // (quit with unhandled_exception) is tried again every second.
      const bool killed = dm.reason == caf::exit_reason::kill;
      self->delayed_send(self, std::chrono::milliseconds(killed ? 100 : 1000), kv_restart_atom::value);
      return;
    }
    for (std::size_t i = 0; i < st.owners.size(); ++i) {
      if (st.owners[i].address() != dm.source) continue;
      st.owners[i] = caf::actor();
      if (shutdown) return;
      // Its layers were withdrawn when it died; ranks needing them wait.
      st.config.metrics->add("shardline_layer_owner_restarts_total", "owner=\"" + st.config.owners[i].name + "\"", 1);
      spdlog::warn("supervisor: layer owner {} died ({}); respawning it", st.config.owners[i].name,
                   caf::to_string(dm.reason));
      self->delayed_send(self, std::chrono::milliseconds(100), owner_down_atom::value, static_cast<std::uint64_t>(i));
      return;
    }
    for (std::size_t i = 0; i < st.workers.size(); ++i) {
      if (st.workers[i].address() != dm.source) continue;
      st.workers[i] = caf::actor();
      if (shutdown) return;
      spdlog::warn("supervisor: worker {} died ({}); restarting it", st.config.workers[i].name,
                   caf::to_string(dm.reason));
      self->delayed_send(self, std::chrono::milliseconds(300), down_atom::value, static_cast<std::uint64_t>(i));
      return;
    }
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& w : self->state.workers)
      if (w) self->send_exit(w, caf::exit_reason::user_shutdown);
    for (auto& w : self->state.owners)
      if (w) self->send_exit(w, caf::exit_reason::user_shutdown);
    if (self->state.orchestrator) self->send_exit(self->state.orchestrator, caf::exit_reason::user_shutdown);
    if (self->state.kvstore) self->send_exit(self->state.kvstore, caf::exit_reason::user_shutdown);
    self->quit(em.reason);
  });
  return {
      [self](down_atom, std::uint64_t i) {
        auto& st = self->state;
        if (i >= st.workers.size() || st.workers[i]) return;
        st.workers[i] = spawn_worker(self->system(), st.config.workers[i]);
        self->monitor(st.workers[i]);
      },
      [self](owner_down_atom, std::uint64_t i) {
        auto& st = self->state;
        if (i >= st.owners.size() || st.owners[i]) return;
        st.owners[i] = spawn_layer_owner(self->system(), st.config.owners[i]);
        self->monitor(st.owners[i]);
      },
      [self](restart_atom) {
        if (!self->state.orchestrator) restart_orchestrator(self);
      },
      [self](kv_restart_atom) {
        if (!self->state.kvstore && self->state.config.kv_link) start_kvstore(self);
      },
      [](const std::string&) {},  // the workers' replies to HelloAgain
  };
}

/// SHARDLINE_TEST_STALL_WORKER=NAME,STEP,MS (read by tests only): worker
/// NAME of this process sticks in its step STEP for MS ms, once
/// (WorkerConfig::stall_at_step). Unset or malformed: no stall.
void apply_stall_hook(std::vector<WorkerConfig>& workers) {
  const char* env = std::getenv("SHARDLINE_TEST_STALL_WORKER");
  if (env == nullptr) return;
  const std::string spec = env;
  const auto a = spec.find(',');
  const auto b = a == std::string::npos ? a : spec.find(',', a + 1);
  if (b == std::string::npos) return;
  const std::string name = spec.substr(0, a);
  const std::uint64_t step = std::strtoull(spec.c_str() + a + 1, nullptr, 10);
  const int ms = std::atoi(spec.c_str() + b + 1);
  for (WorkerConfig& w : workers) {
    if (w.name != name) continue;
    w.stall_at_step = step;
    w.stall_ms = ms;
    w.stall_once = std::make_shared<std::atomic<bool>>(false);
    spdlog::warn("test hook: worker {} will stall for {} ms in step {}", name, ms, step);
  }
}

}  // namespace

Status FailureDetection::check() const {
  if (heartbeat_ms < 1)
    return make_error(ErrorCode::invalid_argument, "--heartbeat-ms must be positive, got " + std::to_string(heartbeat_ms));
  if (failure_timeout_ms <= heartbeat_ms)
    return make_error(ErrorCode::invalid_argument, "--failure-timeout-ms (" + std::to_string(failure_timeout_ms) +
                                                       ") must be greater than --heartbeat-ms (" +
                                                       std::to_string(heartbeat_ms) + ")");
  return Status::ok_status();
}

int FailureDetection::tick_ms() const { return std::clamp(failure_timeout_ms / 10, 10, 250); }

std::string worker_name(const std::string& node, int index, const engine::ParallelConfig& parallel) {
  const int g = parallel.group_size();
  const int first = index * g;
  return node + "/cpu:" + std::to_string(first) + (g == 1 ? "" : "-" + std::to_string(first + g - 1));
}

namespace {

/// The engine options of this node's worker `i` (its dp replica i).
engine::EngineOptions worker_engine_options(const NodeOptions& o, int i) {
  engine::EngineOptions e = o.engine;
  e.parallel = orchestrator::group_of(o.parallel);
  if (o.device_kind == model::DeviceKind::cuda) {
    e.device = model::DeviceKind::cuda;
    const int g = o.parallel.group_size();
    if (g > 1 && o.cuda_ranks_per_gpu == 1) {  // a GPU per rank
      const auto first = o.cuda_devices.begin() + static_cast<std::ptrdiff_t>(i) * g;
      e.group_devices.assign(first, first + g);
      e.device_index = e.group_devices.front();
    } else {
      e.device_index = o.cuda_devices[static_cast<std::size_t>(i)];
      // dp workers sharing a GPU (`cuda:0x2 --parallel dp=2`) split its memory.
      if (g == 1 && o.cuda_ranks_per_gpu > 1) e.gpu_memory_utilization /= o.cuda_ranks_per_gpu;
    }
  } else {
    e.device = model::DeviceKind::cpu;
  }
  e.max_num_seqs = o.max_batch;
  return e;
}

/// Worker `i`'s GPUs: "0,1" (a GPU per rank), "0x2" (a group's ranks
/// sharing GPU 0) or "0" (one GPU, perhaps shared by dp workers).
std::string worker_gpus(const NodeOptions& o, int i) {
  const engine::EngineOptions e = worker_engine_options(o, i);
  std::string gpus;
  if (!e.group_devices.empty()) {
    for (int d : e.group_devices) gpus += (gpus.empty() ? "" : ",") + std::to_string(d);
    return gpus;
  }
  const int group = o.parallel.group_size();
  return std::to_string(e.device_index) + (group > 1 ? "x" + std::to_string(group) : "");
}

/// Worker `i`'s actor name: node/cpu:N[-M], node/cuda:GPUS, and with dp
/// workers sharing a GPU node/cuda:0.K (K = its place on the GPU).
std::string worker_actor_name(const NodeOptions& o, int i) {
  if (o.device_kind != model::DeviceKind::cuda) return worker_name(o.name, i, orchestrator::group_of(o.parallel));
  std::string name = o.name + "/cuda:" + worker_gpus(o, i);
  if (o.parallel.group_size() == 1 && o.cuda_ranks_per_gpu > 1)
    name += "." + std::to_string(i % o.cuda_ranks_per_gpu);
  return name;
}

/// What Node::start checks before it creates anything (the data dir, an
/// output, the actor system). Errors: invalid_argument / unsupported
/// naming the option; a worker's engine that cannot start (preflight).
Status check_node_options(const NodeOptions& o) {
  const bool cuda = o.device_kind == model::DeviceKind::cuda;
  if (cuda) {
    const int g = o.parallel.group_size();
    const bool per_rank = g > 1 && o.cuda_ranks_per_gpu == 1;
    const int want = per_rank ? g * o.parallel.dp : o.parallel.dp;
    if (o.cuda_devices.empty() || static_cast<int>(o.cuda_devices.size()) != want)
      return make_error(ErrorCode::invalid_argument,
                        "a CUDA node needs one worker (dp) per device, each one GPU or an engine group sharing it, "
                        "or a GPU per rank of each group, got " +
                            std::to_string(o.cuda_devices.size()) + " devices and " + o.parallel.to_string());
  } else if (o.num_cpu_devices < 1) {
    return make_error(ErrorCode::invalid_argument, "a node needs at least one device");
  } else if (o.num_cpu_devices != o.parallel.world_size())
    return make_error(ErrorCode::invalid_argument,
                      std::to_string(o.num_cpu_devices) + " devices but the parallel config " + o.parallel.to_string() +
                          " needs tp*pp*sp*dp = " + std::to_string(o.parallel.world_size()));
  if (o.join.empty() && o.data_dir.empty())
    return make_error(ErrorCode::invalid_argument, "the node running the orchestrator needs --data-dir");
  if (Status ok = o.failure.check(); !ok) return ok.error();
  if (o.kv_replication < 0)
    return make_error(ErrorCode::invalid_argument,
                      "--kv-replication must be >= 0, got " + std::to_string(o.kv_replication));
  if (o.sidp) {
    if (o.parallel.group_size() != 1 || o.parallel.dp < 2)
      return make_error(ErrorCode::invalid_argument,
                        "--weight-sharing sidp needs --parallel dp=N (N >= 2, each rank one device), got " +
                            o.parallel.to_string());
    if (!o.engine.group_master.empty())
      return make_error(ErrorCode::unsupported, "--weight-sharing sidp with --group-master is not built");
  }
  // Whatever would keep a worker's engine from starting (a bad model
  // folder, a tp that does not divide the heads, a missing GPU) fails the
  // start here, before the data dir or any output exists, with its cause
  // (issue 46, item 14).
  for (int i = 0; i < o.parallel.dp; ++i)
    if (Status ok = engine::preflight_engine(worker_engine_options(o, i)); !ok)
      return make_error(ok.error().code, "worker " + std::to_string(i) + " cannot start its engine: " +
                                             ok.error().message);
  return Status::ok_status();
}

/// The cluster key: the key file's for a node that listens or joins (or
/// names one), else an ephemeral one (in-process only). Errors: the key
/// file's; invalid_argument when a networked node has none.
Result<std::shared_ptr<const ClusterKey>> node_key(const NodeOptions& o) {
  const bool networked = !o.listen.empty() || !o.join.empty();
  if (!networked && o.key_file.empty()) {
    auto key = ClusterKey::generate();
    if (!key) return std::move(key).error();
    return std::make_shared<const ClusterKey>(std::move(key).value());
  }
  if (o.key_file.empty())
    return make_error(ErrorCode::invalid_argument,
                      "a node that listens or joins needs --key-file (make one with `shardline cluster init`)");
  auto key = ClusterKey::load(o.key_file);
  if (!key) return std::move(key).error();
  return std::make_shared<const ClusterKey>(std::move(key).value());
}

/// What the node's actors share: its key, metrics, the orchestrator they
/// talk to (the relay, or a joined node's link) and the start errors.
struct NodeShared {
  std::shared_ptr<const ClusterKey> key;
  std::shared_ptr<MetricsRegistry> metrics;
  caf::actor orchestrator;
  std::shared_ptr<WorkerStartErrors> start_errors;
};

/// The node running the orchestrator: each incarnation opens the
/// JobManager on the data dir (opened here once, so that a bad data dir
/// fails the start). Jobs record the model they run on and are not resumed
/// on another one. Errors: the model's fingerprint, the data dir's.
Result<OrchestratorFactory> orchestrator_factory(const NodeOptions& o, std::shared_ptr<OrchestratorRoster> roster,
                                                 const NodeShared& shared) {
  orchestrator::JobManagerOptions jm;
  auto fingerprint = model::model_fingerprint(o.engine.model_dir);
  if (!fingerprint) return make_error(fingerprint.error().code, "--model: " + fingerprint.error().message);
  jm.model_fingerprint = *fingerprint;
  jm.model_dir = o.engine.model_dir;
  auto check = orchestrator::JobManager::open(o.data_dir, jm);
  if (!check) return std::move(check).error();
  for (const auto& p : (*check)->list_jobs())
    if ((p.state == orchestrator::JobState::queued || p.state == orchestrator::JobState::running) && !p.error.empty())
      spdlog::error("{}", p.error);
  check->reset();
  return OrchestratorFactory([o, jm, roster = std::move(roster), key = shared.key,
                              metrics = shared.metrics](caf::actor_system& sys) -> Result<caf::actor> {
    auto jobs = orchestrator::JobManager::open(o.data_dir, jm);
    if (!jobs) return std::move(jobs).error();
    OrchestratorConfig oc;
    oc.node_name = o.name;
    oc.model_dir = o.engine.model_dir;
    oc.parallel = o.parallel;
    oc.jobs = std::move(jobs).value();
    oc.key = key;
    oc.metrics = metrics;
    oc.failure = o.failure;
    oc.roster = roster;
    oc.sidp_policy = o.sidp_policy;
    oc.weight_sharing = o.sidp ? "sidp" : "none";
    oc.remote_workers = !o.listen.empty();
    return spawn_orchestrator(sys, std::move(oc));
  });
}

/// `--weight-sharing sidp`: one SiDP group over the node's workers (the
/// model loaded once) and a layer owner per rank.
struct NodeSidp {
  std::shared_ptr<engine::SidpNodeGroup> group;
  std::string group_name;
  std::vector<LayerOwnerConfig> owners;
};

Result<NodeSidp> node_sidp(NodeOptions& o, const NodeShared& shared) {
  NodeSidp out;
  if (!o.sidp) return out;
  const engine::ParallelConfig group = orchestrator::group_of(o.parallel);
  o.sidp->dp = o.parallel.dp;
  engine::EngineOptions base = worker_engine_options(o, 0);
  base.parallel = group;
  o.sidp->rank_devices.clear();
  if (base.device == model::DeviceKind::cuda)
    for (int i = 0; i < o.parallel.dp; ++i) o.sidp->rank_devices.push_back(worker_engine_options(o, i).device_index);
  auto made = engine::SidpNodeGroup::create(base, *o.sidp);
  if (!made) return std::move(made).error();
  out.group = std::move(made).value();
  out.group_name = o.name + "/sidp";
  for (int i = 0; i < o.parallel.dp; ++i) {
    LayerOwnerConfig oc;
    oc.name = worker_actor_name(o, i) + "/owner";
    oc.node_name = o.name;
    oc.group_name = out.group_name;
    oc.rank = i;
    oc.sidp = out.group;
    oc.orchestrator = shared.orchestrator;
    oc.key = shared.key;
    oc.heartbeat_ms = o.failure.heartbeat_ms;
    out.owners.push_back(std::move(oc));
  }
  return out;
}

/// One worker per engine group (dp of them), named after its devices.
std::vector<WorkerConfig> node_workers(const NodeOptions& o, const NodeShared& shared, const NodeSidp& sidp) {
  std::vector<WorkerConfig> workers;
  for (int i = 0; i < o.parallel.dp; ++i) {
    WorkerConfig wc;
    wc.node_name = o.name;
    wc.engine = worker_engine_options(o, i);
    wc.name = worker_actor_name(o, i);
    wc.device = o.device_kind == model::DeviceKind::cuda ? "cuda:" + worker_gpus(o, i) : "cpu";
    wc.max_batch = o.max_batch;
    wc.orchestrator = shared.orchestrator;
    wc.key = shared.key;
    wc.metrics = shared.metrics;
    wc.start_errors = shared.start_errors;
    wc.heartbeat_ms = o.failure.heartbeat_ms;
    wc.failure_timeout_ms = o.failure.failure_timeout_ms;
    if (sidp.group) {
      wc.sidp = sidp.group;
      wc.sidp_rank = i;
      wc.sidp_group = sidp.group_name;
    }
    workers.push_back(std::move(wc));
  }
  return workers;
}

/// The KV store under DATA/kv (DéjàVu: RocksDB backs replicated KV state).
/// It needs the model's KV geometry; without a data dir or a readable
/// model config the node runs without one (lines then resume from their
/// tokens only): nullopt.
std::optional<KvStoreConfig> node_kv_store(const NodeOptions& o, const NodeShared& shared) {
  if (o.kv_replication == 0) {
    spdlog::info("node {}: --kv-replication 0: no KV store, no KV streaming", o.name);
    return std::nullopt;
  }
  if (o.data_dir.empty()) {
    spdlog::warn("node {}: no --data-dir: no KV store, no KV streaming", o.name);
    return std::nullopt;
  }
  auto cfg = model::load_model_config(o.engine.model_dir);
  if (!cfg) {
    spdlog::warn("node {}: no KV store: {}", o.name, cfg.error().to_string());
    return std::nullopt;
  }
  KvStoreConfig kc;
  kc.name = o.name + "/kvstore";
  kc.node_name = o.name;
  kc.dir = (std::filesystem::path(o.data_dir) / "kv").string();
  kc.shape =
      kvstore::KvModelShape{cfg->num_hidden_layers, cfg->num_key_value_heads, cfg->head_dim, o.engine.kv_cache_dtype};
  kc.capacity_bytes = o.kv_store_bytes;
  kc.disk_budget_bytes = o.kv_disk_bytes;
  kc.disk_reserve_bytes = o.kv_disk_reserve_bytes;
  kc.prefix_budget_bytes = o.kv_prefix_bytes;
  kc.sync = o.kv_sync;
  kc.replication_factor = o.kv_replication;
  kc.key = shared.key;
  kc.metrics = shared.metrics;
  kc.orchestrator = shared.orchestrator;
  kc.heartbeat_ms = o.failure.heartbeat_ms;
  return kc;
}

}  // namespace

Result<std::unique_ptr<Node>> Node::start(NodeOptions o) {
  if (Status ok = check_node_options(o); !ok) return ok.error();
  std::unique_ptr<Node> node(new Node());
  auto key = node_key(o);
  if (!key) return std::move(key).error();
  node->key_ = std::move(key).value();
  node->metrics_ = std::make_shared<MetricsRegistry>();
  describe_node_metrics(*node->metrics_);
  // Mutual TLS on every connection of this node's actor system (the port it
  // publishes, a joined node's link): only holders of the key get in.
  auto tls = ClusterTls::create(*node->key_, node->metrics_);
  if (!tls) return std::move(tls).error();
  node->tls_ = std::move(tls).value();
  node->config_ = std::make_unique<caf::actor_system_config>();
  node->config_->load<caf::io::middleman>();
  node->config_->set("scheduler.max-threads", 2);
  node->config_->set("logger.console-verbosity", caf::atom("quiet"));
  node->system_ = std::make_unique<caf::actor_system>(*node->config_);
  caf::actor_system& sys = *node->system_;
  node->tls_->start(sys);

  NodeShared shared{node->key_, node->metrics_, caf::actor(), node->start_errors_};
  auto roster = std::make_shared<OrchestratorRoster>();
  OrchestratorFactory start_orchestrator;
  if (o.join.empty()) {
    auto factory = orchestrator_factory(o, roster, shared);
    if (!factory) return std::move(factory).error();
    start_orchestrator = std::move(factory).value();
    // Clients, workers and joined nodes hold the relay, never an
    // orchestrator incarnation.
    node->relay_ = spawn_orchestrator_relay(sys, node->metrics_);
    node->orchestrator_ = node->relay_;
  } else {
    // The joined node's link to the remote relay: the relay outlives
    // restarts of the orchestrator there, and the link reconnects when that
    // whole node restarts.
    auto link = spawn_remote_link(sys, node->tls_, o.join);
    if (!link) return std::move(link).error();
    node->orchestrator_ = *link;
    node->link_ = *link;
  }
  shared.orchestrator = node->orchestrator_;

  if (!o.listen.empty()) {
    auto hp = comm::parse_host_port(o.listen);
    if (!hp) return std::move(hp).error();
    if (!o.join.empty())
      return make_error(ErrorCode::invalid_argument, "--listen and --join together are not supported yet");
    auto port = node->tls_->publish(node->orchestrator_, hp->first, static_cast<std::uint16_t>(hp->second));
    if (!port) return std::move(port).error();
    node->port_ = *port;
  }

  auto sidp = node_sidp(o, shared);
  if (!sidp) return std::move(sidp).error();
  std::vector<WorkerConfig> workers = node_workers(o, shared, *sidp);
  auto sc = std::make_shared<SupervisorConfig>();
  if (std::optional<KvStoreConfig> kc = node_kv_store(o, shared)) {
    sc->kvstore = std::move(*kc);
    sc->kv_link = std::make_shared<KvStoreLink>();
    for (WorkerConfig& w : workers) {
      w.kv_store = sc->kv_link;
      if (o.kv_prefix_bytes > 0 && w.engine.enable_prefix_caching)
        w.prefix_store_host_bytes = w.engine.prefix_tier_bytes > 0 ? w.engine.prefix_tier_bytes : 256ull << 20;
    }
  }
  apply_stall_hook(workers);
  node->num_workers_ = static_cast<int>(workers.size());
  sc->workers = std::move(workers);
  sc->owners = std::move(sidp->owners);
  sc->relay = node->relay_;
  sc->start_orchestrator = std::move(start_orchestrator);
  sc->roster = roster;
  sc->metrics = node->metrics_;
  sc->key = node->key_;
  node->supervisor_ = sys.spawn(supervisor_behavior, std::move(sc));

  if (!o.metrics.empty()) {
    auto server = MetricsServer::start(*node->metrics_, o.metrics);
    if (!server) return std::move(server).error();
    node->metrics_server_ = std::move(server).value();
  }
  node->options_ = std::move(o);
  return node;
}

void Node::stop() {
  if (stopped_ || !system_) return;
  stopped_ = true;
  metrics_server_.reset();
  // The supervisor stops the workers and the orchestrator.
  if (supervisor_) caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  if (relay_) {  // from an actor of this node: the relay ignores anonymous exits
    caf::scoped_actor self{*system_};
    self->send_exit(relay_, caf::exit_reason::user_shutdown);
  }
  if (link_) caf::anon_send_exit(link_, caf::exit_reason::user_shutdown);
  link_ = caf::actor();
  supervisor_ = caf::actor();
  relay_ = caf::actor();
  orchestrator_ = caf::actor();
  system_->await_all_actors_done();
  if (tls_) tls_->stop();
}

Node::~Node() {
  stop();
  system_.reset();
}

}  // namespace shardline::actors
