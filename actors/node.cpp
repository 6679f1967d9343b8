#include "actors/node.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "actors/protocol.hpp"
#include "comm/address.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

using down_atom = caf::atom_constant<caf::atom("sldown")>;

/// Spawns the node's workers and restarts any that die other than by a
/// shutdown (a kill, a crash), after a short delay.
struct SupervisorState {
  std::vector<WorkerConfig> configs;  // one per worker, by index
  std::vector<caf::actor> workers;
  static inline const char* name = "shardline.supervisor";
};

caf::behavior supervisor_behavior(caf::stateful_actor<SupervisorState>* self, std::vector<WorkerConfig> configs) {
  auto& st = self->state;
  st.configs = std::move(configs);
  for (const WorkerConfig& c : st.configs) {
    st.workers.push_back(spawn_worker(self->system(), c));
    self->monitor(st.workers.back());
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (std::size_t i = 0; i < st.workers.size(); ++i) {
      if (st.workers[i].address() != dm.source) continue;
      st.workers[i] = caf::actor();
      if (dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal) return;
      spdlog::warn("supervisor: worker {} died ({}); restarting it", st.configs[i].name, caf::to_string(dm.reason));
      self->delayed_send(self, std::chrono::milliseconds(300), down_atom::value, static_cast<std::uint64_t>(i));
      return;
    }
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& w : self->state.workers)
      if (w) self->send_exit(w, caf::exit_reason::user_shutdown);
    self->quit(em.reason);
  });
  return {
      [self](down_atom, std::uint64_t i) {
        auto& st = self->state;
        if (i >= st.workers.size() || st.workers[i]) return;
        st.workers[i] = spawn_worker(self->system(), st.configs[i]);
        self->monitor(st.workers[i]);
      },
  };
}

Result<caf::actor> connect_orchestrator(caf::actor_system& sys, const std::string& host_port) {
  auto hp = comm::parse_host_port(host_port);
  if (!hp) return std::move(hp).error();
  auto remote = sys.middleman().remote_actor(hp->first, static_cast<std::uint16_t>(hp->second));
  if (!remote)
    return make_error(ErrorCode::io, "cannot reach the node at " + host_port + ": " + sys.render(remote.error()));
  return *remote;
}

}  // namespace

std::string worker_name(const std::string& node, int index, const engine::ParallelConfig& parallel) {
  const int g = parallel.group_size();
  const int first = index * g;
  return node + "/cpu:" + std::to_string(first) + (g == 1 ? "" : "-" + std::to_string(first + g - 1));
}

Result<std::unique_ptr<Node>> Node::start(NodeOptions o) {
  std::unique_ptr<Node> node(new Node());
  const bool networked = !o.listen.empty() || !o.join.empty();
  if (networked || !o.key_file.empty()) {
    if (o.key_file.empty())
      return make_error(ErrorCode::invalid_argument,
                        "a node that listens or joins needs --key-file (make one with `shardline cluster init`)");
    auto key = ClusterKey::load(o.key_file);
    if (!key) return std::move(key).error();
    node->key_ = std::make_shared<const ClusterKey>(std::move(key).value());
  } else {
    auto key = ClusterKey::generate();  // in-process only: an ephemeral key
    if (!key) return std::move(key).error();
    node->key_ = std::make_shared<const ClusterKey>(std::move(key).value());
  }
  const bool cuda = o.device_kind == model::DeviceKind::cuda;
  if (cuda) {
    if (o.cuda_devices.empty() || static_cast<int>(o.cuda_devices.size()) != o.parallel.dp ||
        o.parallel.group_size() != 1)
      return make_error(ErrorCode::invalid_argument, "a CUDA node needs one single-device worker (dp) per device, got " +
                                                         std::to_string(o.cuda_devices.size()) + " devices and " +
                                                         o.parallel.to_string());
  } else if (o.num_cpu_devices < 1) {
    return make_error(ErrorCode::invalid_argument, "a node needs at least one device");
  } else if (o.num_cpu_devices != o.parallel.world_size())
    return make_error(ErrorCode::invalid_argument,
                      std::to_string(o.num_cpu_devices) + " devices but the parallel config " + o.parallel.to_string() +
                          " needs tp*pp*sp*dp = " + std::to_string(o.parallel.world_size()));
  if (o.join.empty() && o.data_dir.empty())
    return make_error(ErrorCode::invalid_argument, "the node running the orchestrator needs --data-dir");

  node->metrics_ = std::make_shared<MetricsRegistry>();
  describe_node_metrics(*node->metrics_);
  node->config_ = std::make_unique<caf::actor_system_config>();
  node->config_->load<caf::io::middleman>();
  node->config_->set("scheduler.max-threads", 2);
  node->config_->set("logger.console-verbosity", caf::atom("quiet"));
  node->system_ = std::make_unique<caf::actor_system>(*node->config_);
  caf::actor_system& sys = *node->system_;

  const std::string kvstore_name = o.name + "/kvstore";
  node->kvstore_ = spawn_kvstore(sys, KvStoreConfig{kvstore_name, o.kv_store_bytes, node->key_});

  if (o.join.empty()) {
    auto jobs = orchestrator::JobManager::open(o.data_dir);
    if (!jobs) return std::move(jobs).error();
    OrchestratorConfig oc;
    oc.node_name = o.name;
    oc.model_dir = o.engine.model_dir;
    oc.parallel = o.parallel;
    oc.jobs = std::move(jobs).value();
    oc.key = node->key_;
    oc.metrics = node->metrics_;
    oc.heartbeat_timeout_s = o.heartbeat_timeout_s;
    caf::actor kv = node->kvstore_;
    oc.local_actors = [kvstore_name, name = o.name] {
      return std::vector<messages::ActorInfo>{{kvstore_name, "kvstore", name, "running", ""}};
    };
    oc.kill_local = [kv, kvstore_name](const std::string& n) {
      if (n != kvstore_name) return false;
      caf::anon_send_exit(kv, caf::exit_reason::kill);
      return true;
    };
    node->orchestrator_ = spawn_orchestrator(sys, std::move(oc));
  } else {
    auto remote = connect_orchestrator(sys, o.join);
    if (!remote) return std::move(remote).error();
    node->orchestrator_ = *remote;
  }

  if (!o.listen.empty()) {
    auto hp = comm::parse_host_port(o.listen);
    if (!hp) return std::move(hp).error();
    if (!o.join.empty())
      return make_error(ErrorCode::invalid_argument, "--listen and --join together are not supported yet");
    auto port = sys.middleman().publish(node->orchestrator_, static_cast<std::uint16_t>(hp->second),
                                        hp->first.c_str(), true);
    if (!port) return make_error(ErrorCode::io, "cannot listen on " + o.listen + ": " + sys.render(port.error()));
    node->port_ = *port;
  }

  std::vector<WorkerConfig> workers;
  engine::ParallelConfig group = o.parallel;
  group.dp = 1;
  for (int i = 0; i < o.parallel.dp; ++i) {
    WorkerConfig wc;
    wc.node_name = o.name;
    wc.engine = o.engine;
    wc.engine.parallel = group;
    if (cuda) {
      const int d = o.cuda_devices[static_cast<std::size_t>(i)];
      wc.name = o.name + "/cuda:" + std::to_string(d);
      wc.device = "cuda:" + std::to_string(d);
      wc.engine.device = model::DeviceKind::cuda;
      wc.engine.device_index = d;
    } else {
      wc.name = worker_name(o.name, i, group);
      wc.device = "cpu";
      wc.engine.device = model::DeviceKind::cpu;
    }
    wc.engine.max_num_seqs = o.max_batch;
    wc.max_batch = o.max_batch;
    wc.orchestrator = node->orchestrator_;
    wc.key = node->key_;
    wc.metrics = node->metrics_;
    workers.push_back(std::move(wc));
  }
  node->num_workers_ = static_cast<int>(workers.size());
  node->supervisor_ = sys.spawn(supervisor_behavior, std::move(workers));

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
  if (supervisor_) caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  if (kvstore_) caf::anon_send_exit(kvstore_, caf::exit_reason::user_shutdown);
  if (orchestrator_ && options_.join.empty()) caf::anon_send_exit(orchestrator_, caf::exit_reason::user_shutdown);
  supervisor_ = caf::actor();
  kvstore_ = caf::actor();
  orchestrator_ = caf::actor();
  system_->await_all_actors_done();
}

Node::~Node() {
  stop();
  system_.reset();
}

}  // namespace shardline::actors
