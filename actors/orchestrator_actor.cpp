// The job orchestrator actor: a thin behaviour around orchestrator::JobManager.
// It registers workers (and monitors them), keeps each one's queue at twice
// its batch size, commits results, and requeues a dead worker's lines.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "orchestrator/job_admission.hpp"

namespace shardline::actors {

namespace {

using messages::OrchestratorReply;
/// A handler's answer: a reply to a client, nullopt for a worker (no reply).
using Answer = std::optional<OrchestratorReply>;
using Clock = std::chrono::steady_clock;

struct WorkerEntry {
  caf::actor handle;
  std::uint32_t max_batch = 1;
  engine::ParallelConfig parallel;  ///< its engine group (dp == 1)
  std::size_t in_flight = 0;  ///< lines handed out and not yet returned
  messages::WorkerStatus status;
  Clock::time_point last_seen;
};

struct OrchestratorState {
  OrchestratorConfig config;
  std::map<std::string, WorkerEntry> workers;
  Inbox inbox;
  static inline const char* name = "shardline.orchestrator";
};

using OrchestratorActor = caf::stateful_actor<OrchestratorState>;

std::string canonical(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

messages::JobProgress to_message(const orchestrator::JobProgress& p, const orchestrator::JobManager& jobs) {
  messages::JobProgress m;
  m.job_id = p.job_id;
  m.state = orchestrator::job_state_name(p.state);
  m.total = p.total;
  m.done = p.done;
  m.failed = p.failed;
  m.prompt_tokens = p.prompt_tokens;
  m.completion_tokens = p.completion_tokens;
  m.tokens_per_s = p.tokens_per_s;
  m.eta_s = p.eta_s;
  if (auto rec = jobs.job(p.job_id); rec.ok()) {
    m.output = rec->spec.output_path;
    m.inputs = rec->spec.input_paths;
    m.parallel = rec->spec.parallel;
    m.token_budget = rec->spec.token_budget;
  }
  return m;
}

/// Hands pending lines to every worker with room (queue = 2 x max_batch).
void dispatch(OrchestratorActor* self) {
  OrchestratorState& st = self->state;
  for (auto& [name, w] : st.workers) {
    const std::size_t room = 2 * static_cast<std::size_t>(w.max_batch);
    if (w.in_flight >= room) continue;
    std::vector<worker::BatchRequest> work = st.config.jobs->next_work(room - w.in_flight, name);
    if (work.empty()) break;  // nothing pending for anyone
    w.in_flight += work.size();
    const Signed s = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::AssignWork{std::move(work)}}));
    self->send(w.handle, msg_atom::value, s.tag, s.bytes);
  }
}

void drop_worker(OrchestratorActor* self, const std::string& name, const char* why) {
  OrchestratorState& st = self->state;
  const auto it = st.workers.find(name);
  if (it == st.workers.end()) return;
  const std::size_t n = st.config.jobs->requeue_in_flight(name);
  spdlog::warn("orchestrator: worker {} {}; {} lines requeued", name, why, n);
  st.workers.erase(it);
  st.config.metrics->add("shardline_worker_failures_total", "", 1);
  dispatch(self);
}

std::string node_of(const std::string& worker_name) { return worker_name.substr(0, worker_name.find('/')); }

/// Engine groups of the cluster: this node's (as configured, registered or
/// not yet) plus the registered workers of joined nodes.
int num_groups(const OrchestratorState& st) {
  int n = st.config.parallel.dp;
  for (const auto& [name, w] : st.workers)
    if (node_of(name) != st.config.node_name) ++n;
  return n;
}

/// The parallel config a job runs on: the cluster's, with dp = its groups.
engine::ParallelConfig cluster_config(const OrchestratorState& st) {
  engine::ParallelConfig pc = orchestrator::group_of(st.config.parallel);
  pc.dp = num_groups(st);
  return pc;
}

void update_job_metrics(OrchestratorState& st) {
  std::map<std::string, double> by_state{{"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}};
  for (const auto& p : st.config.jobs->list_jobs()) by_state[orchestrator::job_state_name(p.state)] += 1;
  for (const auto& [state, n] : by_state) st.config.metrics->set("shardline_jobs", "state=\"" + state + "\"", n);
  st.config.metrics->set("shardline_workers", "", static_cast<double>(st.workers.size()));
}

// ---- the inbox: one handler per message ----------------------------------------
// Clients get a reply; workers ignore replies, so their handlers answer nullopt.

Answer handle(OrchestratorActor* self, const messages::SubmitJob& sj) {
  OrchestratorState& st = self->state;
  if (canonical(sj.model_dir) != canonical(st.config.model_dir))
    return make_error(ErrorCode::invalid_argument,
                      "this cluster serves the model " + st.config.model_dir + ", not " + sj.model_dir);
  if (sj.parallel) {
    if (Status ok = orchestrator::check_job_parallel(*sj.parallel, st.config.parallel, num_groups(st)); !ok)
      return ok.error();
  }
  orchestrator::JobSpec spec;
  spec.model_dir = sj.model_dir;
  spec.input_paths = sj.inputs;
  spec.output_path = sj.output;
  spec.parallel = sj.parallel.value_or(cluster_config(st)).to_string();  // what it runs on
  spec.token_budget = sj.token_budget;
  auto id = st.config.jobs->submit(spec);
  if (!id) return id.error();
  spdlog::info("orchestrator: job {} submitted ({} shard(s) -> {}; {}, token budget {})", *id, sj.inputs.size(),
               sj.output, spec.parallel, sj.token_budget.empty() ? "fixed" : sj.token_budget);
  update_job_metrics(st);
  dispatch(self);
  return messages::JobSubmitted{*id};
}

Answer handle(OrchestratorActor* self, const messages::JobStatusQuery& q) {
  OrchestratorState& st = self->state;
  messages::JobStatusList list;
  if (q.job_id == 0) {
    for (const auto& p : st.config.jobs->list_jobs()) list.jobs.push_back(to_message(p, *st.config.jobs));
  } else {
    auto p = st.config.jobs->progress(q.job_id);
    if (!p) return p.error();
    list.jobs.push_back(to_message(*p, *st.config.jobs));
  }
  return list;
}

Answer handle(OrchestratorActor* self, const messages::ActorListQuery&) {
  OrchestratorState& st = self->state;
  messages::ActorList list;
  list.actors.push_back({"orchestrator", "orchestrator", st.config.node_name, "running", ""});
  for (const auto& [name, w] : st.workers) {
    const std::string node = node_of(name);
    const std::string state = w.status.worker_name.empty()
                                  ? "starting"
                                  : w.status.state + " running=" + std::to_string(w.status.num_running) +
                                        " waiting=" + std::to_string(w.status.num_waiting) +
                                        " kv=" + std::to_string(w.status.kv_blocks_used) + "/" +
                                        std::to_string(w.status.kv_blocks_total);
    list.actors.push_back({name, "worker", node, state, orchestrator::group_label(w.parallel)});
  }
  if (st.config.local_actors)
    for (auto& a : st.config.local_actors()) list.actors.push_back(std::move(a));
  return list;
}

Answer handle(OrchestratorActor* self, const messages::KillActor& kill) {
  OrchestratorState& st = self->state;
  const std::string& name = kill.name;
  if (const auto it = st.workers.find(name); it != st.workers.end()) {
    spdlog::warn("orchestrator: killing {} on request", name);
    self->send_exit(it->second.handle, caf::exit_reason::kill);
    return messages::Ack{};
  }
  if (st.config.kill_local && st.config.kill_local(name)) return messages::Ack{};
  return make_error(ErrorCode::not_found, "no actor named '" + name + "' (see `shardline actor list`)");
}

Answer handle(OrchestratorActor* self, const messages::Shutdown&) {
  self->quit(caf::exit_reason::user_shutdown);
  return messages::Ack{};
}

// ---- workers ----------------------------------------------------------------------

Answer handle(OrchestratorActor* self, const messages::WorkerHello& hello) {
  OrchestratorState& st = self->state;
  const std::string& name = hello.worker_name;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return std::nullopt;
  if (Status ok = orchestrator::check_worker_group(name, hello.parallel, st.config.parallel); !ok) {
    // Jobs run on one group shape; a node started with another --parallel
    // is told to stop its worker (a shutdown: its supervisor leaves it).
    spdlog::warn("orchestrator: refused {}", ok.error().message);
    const Signed bye = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::Shutdown{}}));
    self->send(sender, msg_atom::value, bye.tag, bye.bytes);
    return std::nullopt;
  }
  if (st.workers.count(name)) drop_worker(self, name, "was replaced by a new instance");
  WorkerEntry w;
  w.handle = sender;
  w.max_batch = std::max<std::uint32_t>(1, hello.max_batch);
  w.parallel = hello.parallel;
  w.last_seen = Clock::now();
  st.workers[name] = w;
  self->monitor(sender);
  spdlog::info("orchestrator: worker {} joined (device {}, [{}], batch {})", name, hello.device,
               orchestrator::group_label(w.parallel), w.max_batch);
  update_job_metrics(st);
  dispatch(self);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::WorkerResults& wr) {
  OrchestratorState& st = self->state;
  if (const auto it = st.workers.find(wr.worker_name); it != st.workers.end()) {
    it->second.in_flight -= std::min(it->second.in_flight, wr.results.size());
    it->second.last_seen = Clock::now();
  }
  auto committed = st.config.jobs->on_results(wr.results);
  if (!committed) spdlog::error("orchestrator: committing results failed: {}", committed.error().to_string());
  update_job_metrics(st);
  dispatch(self);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::WorkerHeartbeat& beat) {
  OrchestratorState& st = self->state;
  if (const auto it = st.workers.find(beat.worker_name); it != st.workers.end()) {
    it->second.status = beat.status;
    it->second.last_seen = Clock::now();
  }
  return std::nullopt;
}

caf::behavior orchestrator_behavior(OrchestratorActor* self, std::shared_ptr<OrchestratorConfig> cfg) {
  self->state.config = std::move(*cfg);
  self->state.inbox = Inbox("orchestrator", self->state.config.key, self->state.config.metrics);
  self->set_down_handler([self](caf::down_msg& dm) {
    for (const auto& [name, w] : self->state.workers) {
      if (w.handle.address() == dm.source) {
        drop_worker(self, name, ("died (" + caf::to_string(dm.reason) + ")").c_str());
        return;
      }
    }
  });
  self->send(self, tick_atom::value);
  update_job_metrics(self->state);
  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
        return self->state.inbox.serve(self->current_sender(), tag, bytes, messages::decode_orchestrator,
                                       [self](const auto& msg) { return handle(self, msg); });
      },
      [self](tick_atom) {
        // Heartbeat timeouts catch workers whose node vanished without a
        // connection loss being noticed; then keep the queues full.
        OrchestratorState& st = self->state;
        const auto now = Clock::now();
        std::vector<std::string> silent;
        for (const auto& [name, w] : st.workers)
          if (std::chrono::duration<double>(now - w.last_seen).count() > st.config.heartbeat_timeout_s)
            silent.push_back(name);
        for (const auto& name : silent) {
          self->send_exit(st.workers[name].handle, caf::exit_reason::kill);
          drop_worker(self, name, "missed its heartbeats");
        }
        dispatch(self);
        update_job_metrics(st);
        self->delayed_send(self, std::chrono::milliseconds(500), tick_atom::value);
      },
      [](const std::string&) {},  // replies of workers to our sends
  };
}

}  // namespace

caf::actor spawn_orchestrator(caf::actor_system& sys, OrchestratorConfig config) {
  return sys.spawn(orchestrator_behavior, std::make_shared<OrchestratorConfig>(std::move(config)));
}

void describe_node_metrics(MetricsRegistry& m) {
  m.describe("shardline_requests_total", "counter", "Input lines finished by workers of this node, by state.");
  m.describe("shardline_prompt_tokens_total", "counter", "Prompt tokens of finished lines.");
  m.describe("shardline_generation_tokens_total", "counter", "Generated tokens of finished lines.");
  m.describe("shardline_engine_steps_total", "counter", "Engine steps, by worker.");
  m.describe("shardline_kv_blocks_used", "gauge", "KV cache blocks in use, by worker.");
  m.describe("shardline_kv_blocks_total", "gauge", "KV cache blocks, by worker.");
  m.describe("shardline_worker_running_requests", "gauge", "Requests running in the engine, by worker.");
  m.describe("shardline_worker_waiting_requests", "gauge", "Requests waiting in the engine, by worker.");
  m.describe("shardline_jobs", "gauge", "Jobs known to the orchestrator, by state.");
  m.describe("shardline_workers", "gauge", "Workers registered with the orchestrator.");
  m.describe("shardline_worker_failures_total", "counter", "Workers lost (killed, crashed, silent).");
  m.describe("shardline_worker_start_failures_total", "counter",
             "Workers of this node that could not start their engine (not restarted).");
  m.describe("shardline_auth_failures_total", "counter", "Messages refused for a bad cluster key tag.");
}

}  // namespace shardline::actors
