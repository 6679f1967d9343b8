// The job orchestrator actor: a thin behaviour around orchestrator::JobManager
// and orchestrator::WorkerPool (the worker registry: hello checks, in-flight
// counts, queue room, heartbeat timeouts, requeues, the hold after a restart).
// It keeps the workers' actor handles, monitors them, and sends what the pool
// hands out. Its messages come through the node's relay (orchestrator_relay.cpp)
// with the original sender. Its SiDP half (mode switching of SiDP groups,
// layer owners) is OrchestratorSidp (orchestrator_sidp.hpp).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/orchestrator_sidp.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "orchestrator/job_admission.hpp"
#include "kvstore/replication.hpp"
#include "orchestrator/worker_pool.hpp"

namespace shardline::actors {

namespace {

using messages::OrchestratorReply;
/// A handler's answer: a reply to a client, nullopt for a worker (no reply).
using Answer = std::optional<OrchestratorReply>;
using Clock = orchestrator::WorkerPool::Clock;

/// A KV store of the cluster, as its heartbeats report it.
struct KvStoreEntry {
  caf::actor handle;  ///< null while it is down
  std::string node;
  messages::KvStoreStats stats;
  int restarts = 0;   ///< new incarnations seen by this orchestrator
  bool seen = false;  ///< an incarnation registered before
};

struct OrchestratorState {
  OrchestratorConfig config;
  std::optional<orchestrator::WorkerPool> pool;  ///< over *config.jobs
  std::map<std::string, caf::actor> handles;     ///< the pool's workers, by name
  std::map<std::string, KvStoreEntry> stores;    ///< every KV store heard of, by name
  std::set<std::uint64_t> kv_dropped_jobs;       ///< finished jobs whose KV the stores were told to drop
  std::optional<OrchestratorSidp> sidp;          ///< SiDP switching and layer owners
  Inbox inbox;
  caf::strong_actor_ptr sender;  ///< of the message being handled (the relay passes it on)
  Clock::time_point last_tick;
  bool kv_progress_failing = false;  ///< the last KV progress record failed (logged once per run of failures)
  static inline const char* name = "shardline.orchestrator";
};

using OrchestratorActor = caf::stateful_actor<OrchestratorState>;

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
  m.requeued = p.requeued;
  m.resumed = p.resumed;
  m.error = p.error;
  m.paused = p.paused;
  m.cached_tokens = p.cached_tokens;
  m.prefix_ordered = p.prefix_ordered;
  m.prefix_ideal_hit_rate = p.prefix_ideal_hit_rate;
  return m;
}

/// A heartbeat's status as the pool keeps it; none while the worker has no
/// name in it yet (shown as "starting").
std::optional<orchestrator::WorkerLoad> load_of(const messages::WorkerStatus& s) {
  if (s.worker_name.empty()) return std::nullopt;
  return orchestrator::WorkerLoad{s.state,          s.num_running,  s.num_waiting, s.kv_blocks_used,
                                  s.kv_blocks_total, s.weight_bytes, s.sidp_mode,   s.seesaw_phase,
                                  s.seesaw_transitions};
}

/// Sends the pool's hand-outs (each worker's queue up to 2 x max_batch).
void dispatch(OrchestratorActor* self) {
  OrchestratorState& st = self->state;
  for (orchestrator::Assignment& a : st.pool->dispatch()) {
    const Signed s =
        sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::AssignWork{std::move(a.work)}}));
    if (const auto h = st.handles.find(a.worker); h != st.handles.end())
      self->send(h->second, msg_atom::value, s.tag, s.bytes);
  }
}

/// Sends each SiDP directive to the workers it names.
void send_sidp(OrchestratorActor* self, const OrchestratorSidp::Directives& directives) {
  OrchestratorState& st = self->state;
  for (const orchestrator::SidpDirective& d : directives) {
    const Signed s =
        sign(*st.config.key, messages::encode(messages::WorkerMsg{OrchestratorSidp::to_message(d)}));
    for (const std::string& w : d.workers)
      if (const auto h = st.handles.find(w); h != st.handles.end())
        self->send(h->second, msg_atom::value, s.tag, s.bytes);
  }
}

void drop_worker(OrchestratorActor* self, const std::string& name, const char* why) {
  OrchestratorState& st = self->state;
  const std::optional<std::size_t> n = st.pool->remove(name);
  if (!n) return;
  st.sidp->left(name, Clock::now());
  spdlog::warn("orchestrator: worker {} {}; {} lines requeued", name, why, *n);
  st.handles.erase(name);
  {
    std::lock_guard<std::mutex> lock(st.config.roster->mu);
    st.config.roster->workers.erase(name);
  }
  st.config.metrics->add("shardline_worker_failures_total", "", 1);
  dispatch(self);
}

/// A message from worker `name` that the pool does not know (this
/// orchestrator restarted under it): ask it to say hello again.
void ask_hello_if_unknown(OrchestratorActor* self, const std::string& name) {
  OrchestratorState& st = self->state;
  if (!st.sender || !st.pool->ask_hello(name, Clock::now())) return;
  const Signed s = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::HelloAgain{}}));
  self->send(caf::actor_cast<caf::actor>(st.sender), msg_atom::value, s.tag, s.bytes);
}

int restarts(const OrchestratorState& st) {
  std::lock_guard<std::mutex> lock(st.config.roster->mu);
  return st.config.roster->restarts;
}

void update_job_metrics(OrchestratorState& st) {
  std::map<std::string, double> by_state{{"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}, {"cancelled", 0}};
  std::map<std::string, double> paused{{"disk_full", 0}, {"io", 0}};
  for (const auto& p : st.config.jobs->list_jobs()) {
    by_state[orchestrator::job_state_name(p.state)] += 1;
    if (!p.paused.empty()) paused[p.paused.substr(0, p.paused.find(':'))] += 1;  // "disk_full: ..." -> disk_full
  }
  for (const auto& [state, n] : by_state) st.config.metrics->set("shardline_jobs", "state=\"" + state + "\"", n);
  for (const auto& [reason, n] : paused) st.config.metrics->set("shardline_jobs_paused", "reason=\"" + reason + "\"", n);
  st.config.metrics->set("shardline_workers", "", static_cast<double>(st.pool->size()));
}

// ---- KV stores ----------------------------------------------------------------------

/// Sends every live store the ring of every store heard of (ring order,
/// with their handles beside the signed names; null for a store that is
/// down: it stays in the ring, so its predecessor acknowledges nothing it
/// does not hold, until it is back and caught up).
void broadcast_ring(OrchestratorActor* self) {
  OrchestratorState& st = self->state;
  std::vector<std::string> names;
  for (const auto& [name, e] : st.stores) names.push_back(name);
  messages::SetRing ring{kvstore::ring_order(names)};
  std::vector<caf::actor> handles;
  for (const std::string& n : ring.names) handles.push_back(st.stores[n].handle);
  const Signed s = sign(*st.config.key, messages::encode(messages::KvStoreMsg{ring}));
  for (const caf::actor& h : handles)
    if (h) self->send(h, ring_atom::value, s.tag, s.bytes, handles);
}

/// A store's heartbeat registers it (first time, or a new incarnation after
/// a restart) and keeps its stats for `actor list`.
void kv_store_seen(OrchestratorActor* self, const std::string& name, const std::string& node,
                   const messages::KvStoreStats* stats) {
  OrchestratorState& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(st.sender);
  if (!sender || name.empty()) return;
  KvStoreEntry& e = st.stores[name];
  if (!node.empty()) e.node = node;
  if (stats) e.stats = *stats;
  if (e.handle == sender) return;
  if (e.seen) {
    ++e.restarts;
    spdlog::warn("orchestrator: kv store {} is a new instance (restarted)", name);
  } else {
    spdlog::info("orchestrator: kv store {} joined", name);
  }
  e.handle = sender;
  e.seen = true;
  self->monitor(sender);
  broadcast_ring(self);
}

/// Lines whose results are now durable: their KV is garbage. It is dropped
/// in the store of the node whose worker finished them (which drops it on
/// its replica too) only now, after the commit: a line whose result a crash
/// lost before the commit resumes from that KV. (What other nodes' stores
/// hold of earlier attempts goes when the job ends.)
void drop_committed_lines_kv(OrchestratorActor* self, const messages::WorkerResults& wr) {
  OrchestratorState& st = self->state;
  const std::string node = orchestrator::node_of(wr.worker_name);
  caf::actor store;
  for (const auto& [name, e] : st.stores)
    if (e.node == node && e.handle) store = e.handle;
  if (!store) return;  // none, or restarting: the job-end drop collects it
  std::map<std::uint64_t, std::vector<std::uint64_t>> by_job;
  for (const worker::BatchResult& r : wr.results)
    for (int c = 0; c < static_cast<int>(r.choices.size()); ++c)
      by_job[r.job_id].push_back(worker::kv_request_key(r.line_index, c));
  for (auto& [job, keys] : by_job) {
    const Signed s =
        sign(*st.config.key, messages::encode(messages::KvStoreMsg{messages::DropRequests{job, std::move(keys), ""}}));
    self->send(store, msg_atom::value, s.tag, s.bytes);
  }
}

/// Finished jobs' KV is garbage on every store (what workers did not drop
/// line by line: lines whose worker died, a cancelled job).
void drop_finished_jobs_kv(OrchestratorActor* self) {
  OrchestratorState& st = self->state;
  for (const auto& p : st.config.jobs->list_jobs()) {
    if (p.state == orchestrator::JobState::queued || p.state == orchestrator::JobState::running) continue;
    if (!st.kv_dropped_jobs.insert(p.job_id).second) continue;
    const Signed s = sign(*st.config.key,
                          messages::encode(messages::KvStoreMsg{messages::DropRequests{p.job_id, {}, "orchestrator"}}));
    for (const auto& [name, e] : st.stores)
      if (e.handle) self->send(e.handle, msg_atom::value, s.tag, s.bytes);
  }
}

/// A worker's `actor list` detail from its last heartbeat: "weights 12.3
/// MiB, kv blocks 5/10, sidp cas" or "..., seesaw decode (7 transitions)".
std::string worker_detail(const orchestrator::WorkerPool::Worker* w) {
  if (w == nullptr || !w->load) return "";
  const orchestrator::WorkerLoad& l = *w->load;
  std::string d = "weights " + mib(l.weight_bytes) + ", kv blocks " + std::to_string(l.kv_blocks_used) + "/" +
                  std::to_string(l.kv_blocks_total);
  if (!l.sidp_mode.empty()) d += ", sidp " + l.sidp_mode;
  if (!l.seesaw_phase.empty())
    d += ", seesaw " + l.seesaw_phase + " (" + std::to_string(l.seesaw_transitions) + " transitions)";
  return d;
}

// ---- the inbox: one handler per message ----------------------------------------
// Clients get a reply; workers ignore replies, so their handlers answer nullopt.

Answer handle(OrchestratorActor* self, const messages::SubmitJob& sj) {
  OrchestratorState& st = self->state;
  orchestrator::JobSpec spec;
  spec.model_dir = sj.model_dir;
  spec.input_paths = sj.inputs;
  spec.output_path = sj.output;
  spec.parallel = sj.parallel ? sj.parallel->to_string() : "";  // "": the cluster's
  spec.weight_sharing = sj.weight_sharing;
  spec.token_budget = sj.token_budget;
  spec.chat_template = sj.chat_template;
  spec.overwrite = sj.overwrite;
  const orchestrator::ClusterShape cluster{st.config.model_dir, st.pool->cluster_config(), st.pool->num_groups(),
                                           st.config.weight_sharing};
  auto id = st.config.jobs->submit(spec, &cluster);
  if (!id) return id.error();
  spdlog::info("orchestrator: job {} submitted ({} shard(s) -> {}; {}, token budget {})", *id, sj.inputs.size(),
               sj.output, sj.parallel.value_or(cluster.group).to_string(),
               sj.token_budget.empty() ? "fixed" : sj.token_budget);
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
  list.sidp_groups = st.sidp->groups();
  return list;
}

Answer handle(OrchestratorActor* self, const messages::JobCancel& c) {
  OrchestratorState& st = self->state;
  auto held = st.pool->cancel_job(c.job_id);
  if (!held) {
    // The record may be written even when the file is not (cancel() and
    // open() finish it later): report the error, keep the state current.
    update_job_metrics(st);
    return held.error();
  }
  spdlog::info("orchestrator: job {} cancelled; {} worker(s) told to drop its lines", c.job_id, held->size());
  const Signed s = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::CancelJob{c.job_id}}));
  for (const std::string& w : *held)
    if (const auto h = st.handles.find(w); h != st.handles.end()) self->send(h->second, msg_atom::value, s.tag, s.bytes);
  update_job_metrics(st);
  drop_finished_jobs_kv(self);
  dispatch(self);  // their queues have room again
  messages::JobStatusList list;
  if (auto p = st.config.jobs->progress(c.job_id); p) list.jobs.push_back(to_message(*p, *st.config.jobs));
  return list;
}

Answer handle(OrchestratorActor* self, const messages::ActorListQuery&) {
  OrchestratorState& st = self->state;
  messages::ActorList list;
  list.actors.push_back({"orchestrator", "orchestrator", st.config.node_name,
                         std::string(st.pool->holding() ? "recovering" : "running") +
                             " restarts=" + std::to_string(restarts(st)),
                         "", ""});
  for (auto& w : st.pool->list()) {
    std::string detail = worker_detail(st.pool->find(w.name));
    list.actors.push_back(
        {std::move(w.name), "worker", std::move(w.node), std::move(w.state), std::move(w.group), std::move(detail)});
  }
  for (const auto& [name, e] : st.stores) {
    const messages::KvStoreStats& k = e.stats;
    std::string detail = "mem " + mib(k.bytes_used) + " / " + mib(k.bytes_capacity) + ", disk " + mib(k.disk_bytes) +
                         ", " + std::to_string(k.requests) + " requests, ";
    detail += k.replica.empty() ? std::string("no replica")
                                : "replica " + k.replica + " lag " + std::to_string(k.lag_tokens) + " tokens";
    list.actors.push_back({name, "kvstore", e.node,
                           std::string(e.handle ? "running" : "down") + " restarts=" + std::to_string(e.restarts),
                           "", std::move(detail)});
  }
  for (auto& a : st.sidp->list_owners(Clock::now(), std::chrono::milliseconds(st.config.failure.failure_timeout_ms)))
    list.actors.push_back(std::move(a));
  if (st.config.local_actors)
    for (auto& a : st.config.local_actors()) list.actors.push_back(std::move(a));
  return list;
}

Answer handle(OrchestratorActor* self, const messages::KillActor& kill) {
  OrchestratorState& st = self->state;
  const std::string& name = kill.name;
  if (name == "orchestrator" || name == st.config.node_name + "/orchestrator") {
    // Like a crash: the supervisor starts a new one from the RocksDB state;
    // the relay hands it what arrives meanwhile. The reply still goes out.
    spdlog::warn("orchestrator: killing the orchestrator on request");
    self->quit(caf::exit_reason::kill);
    return messages::Ack{};
  }
  if (const auto it = st.handles.find(name); it != st.handles.end()) {
    spdlog::warn("orchestrator: killing {} on request", name);
    self->send_exit(it->second, caf::exit_reason::kill);
    return messages::Ack{};
  }
  if (const auto it = st.stores.find(name); it != st.stores.end() && it->second.handle) {
    // Like a crash: the store's node restarts it from its RocksDB.
    spdlog::warn("orchestrator: killing kv store {} on request", name);
    self->send_exit(it->second.handle, caf::exit_reason::kill);
    return messages::Ack{};
  }
  if (caf::actor owner = st.sidp->owner(name)) {
    // Like a crash: its node's supervisor respawns it, and it reloads its layers.
    spdlog::warn("orchestrator: killing layer owner {} on request", name);
    self->send_exit(owner, caf::exit_reason::kill);
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
  auto sender = caf::actor_cast<caf::actor>(st.sender);
  if (!sender) return std::nullopt;
  orchestrator::HelloInfo info;
  info.max_batch = hello.max_batch;
  info.group = hello.parallel;
  info.held = hello.held;
  info.instance = caf::to_string(sender.address());
  const bool sidp = !hello.sidp_group.empty();
  Status sidp_ok = sidp ? st.sidp->check(hello) : Status::ok_status();
  auto joined = sidp_ok ? st.pool->hello(name, info, Clock::now())
                        : Result<orchestrator::WorkerPool::Hello>(
                              make_error(sidp_ok.error().code, "worker " + name + ": " + sidp_ok.error().message));
  if (!joined) {
    // Jobs run on one group shape; a node started with another --parallel
    // (or a SiDP group the orchestrator cannot take) is told to stop its
    // worker (a shutdown: its supervisor leaves it).
    spdlog::warn("orchestrator: refused {}", joined.error().message);
    const Signed bye = sign(*st.config.key, messages::encode(messages::WorkerMsg{messages::Shutdown{}}));
    self->send(sender, msg_atom::value, bye.tag, bye.bytes);
    return std::nullopt;
  }
  if (joined->replaced) {
    spdlog::warn("orchestrator: worker {} was replaced by a new instance; {} lines requeued", name,
                 joined->requeued);
    st.config.metrics->add("shardline_worker_failures_total", "", 1);
  }
  if (joined->claim_error)
    spdlog::error("orchestrator: the lines worker {} holds stay pending: {}", name, joined->claim_error->to_string());
  if (!joined->again) self->monitor(sender);
  st.handles[name] = sender;
  {
    std::lock_guard<std::mutex> lock(st.config.roster->mu);
    st.config.roster->workers.insert(name);
  }
  const orchestrator::WorkerPool::Worker& w = *st.pool->find(name);
  if (hello.held.empty())
    spdlog::info("orchestrator: worker {} joined (device {}, [{}], batch {})", name, hello.device,
                 orchestrator::group_label(w.parallel), w.max_batch);
  else
    spdlog::info("orchestrator: worker {} joined again holding {} lines ({} in flight on it)", name,
                 hello.held.size(), joined->claimed);
  if (joined->hold_ended) spdlog::info("orchestrator: every worker is back; dispatching");
  if (sidp) {
    // The sync when its group is complete for the first time, else its mode.
    auto directives = st.sidp->joined(hello, Clock::now());
    if (directives)
      send_sidp(self, *directives);
    else  // (checked above: does not happen)
      spdlog::error("orchestrator: SiDP worker {}: {}", name, directives.error().to_string());
  }
  update_job_metrics(st);
  dispatch(self);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::WorkerResults& wr) {
  OrchestratorState& st = self->state;
  auto committed = st.pool->on_results(wr.worker_name, wr.results, Clock::now());
  if (!committed) {
    // The job is paused, its results kept; tick() retries with back-off.
    spdlog::error("orchestrator: job paused: {}; its results wait in memory and its writes are retried until "
                  "they succeed{}",
                  committed.error().to_string(),
                  committed.error().code == ErrorCode::disk_full ? " (free space on that disk)" : "");
  } else {
    drop_committed_lines_kv(self, wr);
  }
  ask_hello_if_unknown(self, wr.worker_name);
  drop_finished_jobs_kv(self);
  update_job_metrics(st);
  dispatch(self);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::WorkerHeartbeat& beat) {
  OrchestratorState& st = self->state;
  const Clock::time_point now = Clock::now();
  st.pool->heartbeat(beat.worker_name, load_of(beat.status), now);
  ask_hello_if_unknown(self, beat.worker_name);
  // A SiDP rank's running sequences feed its group's policy (a worker still
  // starting has no status yet: it reports nothing).
  if (st.pool->contains(beat.worker_name) && !beat.status.worker_name.empty())
    send_sidp(self, st.sidp->heartbeat(beat.worker_name, beat.status.num_running, now, beat.status.num_waiting));
  return std::nullopt;
}

/// A layer owner's hello (at its start and every heartbeat) registers it,
/// or a new incarnation of it, for `actor list` and `actor kill`.
Answer handle(OrchestratorActor* self, const messages::LayerOwnerHello& hello) {
  OrchestratorState& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(st.sender);
  if (hello.owner_name.empty() || !sender) {
    spdlog::warn("orchestrator: ignored a layer owner hello without a name or sender");
    return std::nullopt;
  }
  if (st.sidp->owner_seen(sender, hello, Clock::now())) self->monitor(sender);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::KvStoreHello& hello) {
  kv_store_seen(self, hello.store_name, hello.node, nullptr);
  return std::nullopt;
}

Answer handle(OrchestratorActor* self, const messages::KvStoreHeartbeat& beat) {
  const std::string& name = beat.stats.store_name;
  const auto slash = name.find('/');
  kv_store_seen(self, name, slash == std::string::npos ? "" : name.substr(0, slash), &beat.stats);
  return std::nullopt;
}

/// A worker forwards its store's acks: the orchestrator records each
/// choice's replicated_tokens (and tokens) in the job state, so that a line
/// whose worker dies resumes from there.
Answer handle(OrchestratorActor* self, const messages::KvProgressReport& report) {
  OrchestratorState& st = self->state;
  // Logged once per run of failures (a full disk fails every report); the
  // lines still resume from the progress held in memory.
  if (Status ok = st.config.jobs->on_kv_progress(report.worker_name, report.progress); !ok) {
    if (!st.kv_progress_failing)
      spdlog::error("orchestrator: recording KV progress of {} failed: {}", report.worker_name, ok.error().to_string());
    st.kv_progress_failing = true;
  } else {
    st.kv_progress_failing = false;
  }
  return std::nullopt;
}

/// Heartbeat timeouts catch workers that hang (their thread does not come
/// back to its mailbox) and those whose node vanished without a connection
/// loss being noticed; then keep the queues full.
void tick(OrchestratorActor* self) {
  OrchestratorState& st = self->state;
  const Clock::time_point now = Clock::now();
  const auto period = std::chrono::milliseconds(st.config.failure.tick_ms());
  const auto late = now - (st.last_tick + period);
  st.last_tick = now;
  if (late > std::chrono::milliseconds(st.config.failure.failure_timeout_ms / 2)) {
    // This actor could not read its mailbox for a while: the heartbeats
    // queued behind the stall are not silence.
    spdlog::warn("orchestrator: stalled for {} ms; heartbeat clocks restarted",
                 std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
    st.pool->excuse_silence(now);
  }
  for (const std::string& name : st.pool->silent_workers(now)) {
    self->send_exit(st.handles[name], caf::exit_reason::kill);
    drop_worker(self, name, "missed its heartbeats");
  }
  for (const std::string& name : st.pool->end_hold_if_due(now)) {
    spdlog::warn("orchestrator: worker {} did not say hello again after the restart", name);
    std::lock_guard<std::mutex> lock(st.config.roster->mu);
    st.config.roster->workers.erase(name);
  }
  send_sidp(self, st.sidp->decide(now));  // a dwell can end between heartbeats
  for (const std::uint64_t id : st.config.jobs->retry_paused())
    spdlog::warn("orchestrator: job {} resumed: its results and output are written again", id);
  dispatch(self);
  update_job_metrics(st);
  self->delayed_send(self, period, tick_atom::value);
}

caf::behavior orchestrator_behavior(OrchestratorActor* self, std::shared_ptr<OrchestratorConfig> cfg) {
  OrchestratorState& state = self->state;
  state.config = std::move(*cfg);
  state.pool.emplace(*state.config.jobs,
                     orchestrator::WorkerPoolOptions{state.config.node_name, state.config.parallel,
                                                     state.config.failure.failure_timeout_ms / 1000.0,
                                                     state.config.failure.heartbeat_ms / 1000.0});
  state.inbox = Inbox("orchestrator", state.config.key, state.config.metrics);
  state.sidp.emplace(state.config.sidp_policy, state.config.roster, state.config.metrics);
  state.last_tick = Clock::now();
  {
    OrchestratorRoster& roster = *state.config.roster;
    std::lock_guard<std::mutex> lock(roster.mu);
    if (roster.restarts > 0) {
      // A restart: the workers the previous incarnation had keep running and
      // hold lines this one has as pending. Hand out nothing until they said
      // hello again (with those lines), for at most the failure timeout.
      const std::vector<std::string> names(roster.workers.begin(), roster.workers.end());
      state.pool->await_workers(names, state.last_tick +
                                           std::chrono::milliseconds(state.config.failure.failure_timeout_ms));
      spdlog::warn("orchestrator: restarted (restart {}); waiting for {} workers to say hello again",
                   roster.restarts, names.size());
      // The names stay until they are back or the hold ends without them, so
      // that a kill before then still waits for them next time.
    } else if (!state.config.jobs->idle() && state.config.remote_workers) {
      // A fresh process over unfinished jobs: this node was restarted (after
      // a crash, or kill -9). Workers of other nodes kept running: they hold
      // lines that are pending here, or finished some and their results are
      // queued on the link. Handing those lines out now would run them twice
      // (and the second run's KV fetch finds the KV of a committed line
      // dropped). Hand out nothing for the failure timeout, while they
      // reconnect and say hello again.
      state.pool->await_unknown_workers(state.last_tick +
                                        std::chrono::milliseconds(state.config.failure.failure_timeout_ms));
      spdlog::warn("orchestrator: started over unfinished jobs; waiting {} ms for running workers to say hello",
                   state.config.failure.failure_timeout_ms);
    }
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    if (self->state.sidp->owner_down(dm.source)) return;
    for (auto& [name, e] : self->state.stores) {
      if (e.handle && e.handle.address() == dm.source) {
        spdlog::warn("orchestrator: kv store {} is down ({})", name, caf::to_string(dm.reason));
        e.handle = caf::actor();
        broadcast_ring(self);
        return;
      }
    }
    for (const auto& [name, handle] : self->state.handles) {
      if (handle.address() == dm.source) {
        const std::string dead = name;  // drop_worker erases the entry
        drop_worker(self, dead, ("died (" + caf::to_string(dm.reason) + ")").c_str());
        return;
      }
    }
  });
  self->send(self, tick_atom::value);
  update_job_metrics(self->state);
  return {
      [self](relayed_atom, caf::strong_actor_ptr& sender, const std::string& tag,
             const std::string& bytes) -> std::string {
        OrchestratorState& st = self->state;
        st.sender = std::move(sender);
        std::string reply = st.inbox.serve(st.sender, tag, bytes, messages::decode_orchestrator,
                                           [self](const auto& msg) { return handle(self, msg); });
        st.sender = nullptr;  // (a quit() destroys the state only after this handler)
        return reply;
      },
      [self](tick_atom) { tick(self); },
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
  m.describe("shardline_jobs_paused", "gauge",
             "Unfinished jobs paused because a write failed, by reason (disk_full: no space for jobs.db or the "
             "output file); retried with back-off.");
  m.describe("shardline_workers", "gauge", "Workers registered with the orchestrator.");
  m.describe("shardline_worker_failures_total", "counter", "Workers lost (killed, crashed, silent).");
  m.describe("shardline_orchestrator_restarts_total", "counter",
             "Orchestrators started again by this node's supervisor after a kill or crash.");
  m.describe("shardline_worker_start_failures_total", "counter",
             "Workers of this node that could not start their engine (not restarted).");
  m.describe("shardline_auth_failures_total", "counter", "Messages refused for a bad cluster key tag.");
  m.describe("shardline_replays_refused_total", "counter",
             "Signed messages refused as replayed (nonce seen before) or outside the signing-time window.");
  m.describe("shardline_tls_handshake_failures_total", "counter",
             "TLS handshakes on this node's connections that failed: a peer without the cluster key, or not TLS.");
  m.describe("shardline_relay_refused_total", "counter",
             "Messages the node port's relay refused: a new orchestrator or an exit from an actor not of this node.");
  m.describe("shardline_computed_tokens_total", "counter",
             "Positions the model computed (prefill and decode, recomputation included), by worker.");
  m.describe("shardline_kv_streamed_bytes_total", "counter",
             "KV bytes workers of this node streamed to their KV store (DéjàVu token streaming), by worker.");
  m.describe("shardline_kv_replicated_tokens_total", "counter",
             "KV positions a store of this node acknowledged as held by it and every replica, by store.");
  m.describe("shardline_recovered_tokens_total", "counter",
             "KV positions of resumed requests restored from a KV store instead of recomputed, by worker.");
  m.describe("shardline_recomputed_tokens_total", "counter",
             "KV positions computed again, by cause and worker; cause=\"failure\": positions a resumed request "
             "had computed before its worker failed that no KV store could restore.");
  m.describe("shardline_kv_resume_fallbacks_total", "counter",
             "Resumed requests whose KV could not be fetched or restored (recomputed from the tokens).");
  m.describe("shardline_prefix_cache_queries_total", "counter",
             "Prefix caching: prompt (and output) tokens of the requests a worker admitted with nothing to restore, "
             "by worker (docs/prefix-caching.md).");
  m.describe("shardline_prefix_cache_hits_total", "counter",
             "Prefix caching: of those tokens, the ones found in cached KV blocks and not computed, by worker.");
  m.describe("shardline_prefix_tier_restored_tokens_total", "counter",
             "Prefix caching: prompt positions restored from the worker's prefix tier (host memory, then the node's "
             "KV store) instead of computed, by worker.");
  m.describe("shardline_prefix_tier_spilled_blocks_total", "counter",
             "Prefix caching: named KV blocks the device cache evicted (or, with the KV store's tier, shared for the "
             "first time) and copied out to the prefix tier, by worker.");
  m.describe("shardline_prefix_store_fetched_tokens_total", "counter",
             "Prefix caching: prefix positions the node's KV store handed a worker's prefix tier (a restarted node "
             "or a later job fetching a prefix instead of computing it), by worker.");
  m.describe("shardline_prefix_store_kept_blocks_total", "counter",
             "Prefix caching: prefix blocks a worker sent that the node's KV store newly kept, by worker.");
  m.describe("shardline_kv_store_prefix_bytes", "gauge",
             "Bytes of prefix blocks a KV store keeps (--kv-prefix-mib bounds them), by store.");
  m.describe("shardline_kv_linked_tokens_total", "counter",
             "DéjàVu streaming from the end of a cached prefix: positions a KV store counted from requests' "
             "prefix links (their KV was not sent again) since it opened, by store.");
  m.describe("shardline_kv_store_memory_bytes", "gauge", "Bytes in a KV store's host-memory tier, by store.");
  m.describe("shardline_kv_store_disk_bytes", "gauge", "Bytes of a KV store's RocksDB directory, by store.");
  m.describe("shardline_kv_replication_lag_tokens", "gauge",
             "Positions a KV store's replica is behind it, by store.");
  m.describe("shardline_kv_store_restarts_total", "counter",
             "KV stores started again by this node's supervisor after a kill or crash.");
  describe_sidp_metrics(m);
  m.describe_histogram("shardline_recovery_seconds",
                       "Time a worker took to resume a line after a failure: fetching its KV from the stores "
                       "until the line was submitted to the engine, by worker.",
                       {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10});
}

}  // namespace shardline::actors
