// The worker actor: a thin behaviour around worker::BatchWorker.
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>
#include <thread>

#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/kv_client.hpp"
#include "actors/protocol.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "worker/batch_worker.hpp"
#include "worker/kv_progress.hpp"
#include "worker/kv_streamer.hpp"
#include "messages/codec.hpp"
#include "orchestrator/job_admission.hpp"
#include "worker/job_token_budget.hpp"
#include "worker/sidp_stepper.hpp"

namespace shardline::actors {

namespace {

/// Counters of the BatchWorker already exported to the metrics registry.
struct Exported {
  std::uint64_t computed_tokens = 0;
  std::uint64_t streamed_bytes = 0;
  std::uint64_t restored_tokens = 0;
  std::uint64_t recomputed_tokens = 0;
  std::uint64_t resume_fallbacks = 0;
};

struct WorkerState {
  WorkerConfig config;
  // KV streaming (DéjàVu): the store target and the progress tracker are
  // shared with the streamer's thread; the streamer is destroyed before
  // the worker whose steps push into it.
  std::shared_ptr<ActorKvTarget> kv_target;
  std::shared_ptr<worker::KvProgressTracker> kv_progress;
  /// SiDP (seed 002): this worker's rank of the node's group; destroyed after
  /// the engine (declared before it), which marks its compute generation dead.
  std::unique_ptr<worker::SidpStepper> sidp;
  std::uint64_t weight_bytes = 0;  ///< EngineInstance::weight_bytes of its engine
  std::unique_ptr<worker::BatchWorker> worker;
  std::unique_ptr<worker::KvStreamer> kv_streamer;
  Exported exported;
  std::unique_ptr<worker::JobTokenBudget> token_budget;
  bool step_scheduled = false;
  /// Lines accepted and not yet answered: what it says it holds when an
  /// orchestrator that restarted asks it to say hello again.
  std::set<worker::LineRef> held;
  std::uint64_t steps = 0;
  bool warned_slow_step = false;
  Inbox inbox;
  static inline const char* name = "shardline.worker";

  WorkerState() = default;
  WorkerState(const WorkerState&) = delete;
  WorkerState& operator=(const WorkerState&) = delete;
  /// Seesaw: what the phases did, once, when the worker stops.
  ~WorkerState() {
    const engine::SeesawPhases* phases = worker ? engine::seesaw_phases_of(worker->engine()) : nullptr;
    if (phases == nullptr) return;
    const engine::SeesawStats& s = phases->stats();
    const engine::KvMoverStats m = worker->engine().kv_mover_stats();
    spdlog::info("worker {}: Seesaw: {} transitions, {} prefill / {} decode steps, {} offloads to the host KV buffer "
                 "(peak {} tokens), {:.1f} ms in transitions ({:.1f} ms switching configs); {} KV copies, {:.1f} ms, "
                 "{:.0f}% hidden behind steps",
                 config.name, s.transitions, s.prefill_steps, s.decode_steps, s.offloads, s.host_peak_tokens,
                 s.transition_ms, s.switch_ms, m.num_transfers, m.transfer_ms, 100 * m.hidden_share());
  }
};

using WorkerActor = caf::stateful_actor<WorkerState>;

messages::WorkerStatus status_of(const WorkerState& st) {
  const worker::WorkerStatusSnapshot s = st.worker->status();
  messages::WorkerStatus w;
  w.worker_name = st.config.name;
  w.device = st.config.device;
  w.state = st.worker->has_work() ? "busy" : "idle";
  w.num_running = static_cast<std::uint32_t>(s.num_running);
  w.num_waiting = static_cast<std::uint32_t>(s.num_waiting);
  w.kv_blocks_used = static_cast<std::uint64_t>(s.kv_blocks_used);
  w.kv_blocks_total = static_cast<std::uint64_t>(s.kv_blocks_total);
  w.prompt_tokens = static_cast<std::uint64_t>(s.prompt_tokens);
  w.generated_tokens = static_cast<std::uint64_t>(s.generated_tokens);
  w.steps_done = static_cast<std::uint64_t>(s.steps_done);
  w.weight_bytes = st.weight_bytes;
  if (st.sidp) w.sidp_mode = st.sidp->mode_name();
  if (const engine::SeesawPhases* phases = engine::seesaw_phases_of(st.worker->engine())) {
    w.seesaw_phase = engine::to_string(phases->phase());
    w.seesaw_transitions = phases->stats().transitions;
  }
  return w;
}

void to_orchestrator(WorkerActor* self, const messages::OrchestratorMsg& msg) {
  const Signed s = sign(*self->state.config.key, messages::encode(msg));
  self->send(self->state.config.orchestrator, msg_atom::value, s.tag, s.bytes);
}

void say_hello(WorkerActor* self) {
  const WorkerState& st = self->state;
  messages::WorkerHello hello;
  hello.worker_name = st.config.name;
  hello.device = st.config.device;
  hello.max_batch = static_cast<std::uint32_t>(st.config.max_batch);
  hello.parallel = st.config.engine.parallel;
  hello.held.assign(st.held.begin(), st.held.end());
  if (st.sidp) {
    hello.sidp_group = st.config.sidp_group;
    hello.sidp_rank = static_cast<std::uint32_t>(st.config.sidp_rank);
    hello.sidp_ranks = static_cast<std::uint32_t>(st.config.sidp->dp());
  }
  to_orchestrator(self, hello);
}

void schedule_step(WorkerActor* self) {
  if (self->state.step_scheduled) return;
  self->state.step_scheduled = true;
  self->send(self, step_atom::value);
}

void export_metrics(WorkerActor* self, const messages::WorkerStatus& s) {
  MetricsRegistry& m = *self->state.config.metrics;
  const std::string l = "worker=\"" + self->state.config.name + "\"";
  m.set("shardline_kv_blocks_used", l, static_cast<double>(s.kv_blocks_used));
  m.set("shardline_kv_blocks_total", l, static_cast<double>(s.kv_blocks_total));
  m.set("shardline_worker_running_requests", l, s.num_running);
  m.set("shardline_worker_waiting_requests", l, s.num_waiting);
}

/// Adds what the worker's KV counters grew by since the last call.
void export_kv_metrics(WorkerActor* self) {
  WorkerState& st = self->state;
  const worker::WorkerStatusSnapshot s = st.worker->status();
  MetricsRegistry& m = *st.config.metrics;
  const std::string l = "worker=\"" + st.config.name + "\"";
  Exported& e = st.exported;
  auto bump = [&m](const std::string& name, const std::string& labels, std::uint64_t now, std::uint64_t& seen) {
    if (now > seen) m.add(name, labels, static_cast<double>(now - seen));
    seen = std::max(seen, now);
  };
  bump("shardline_computed_tokens_total", l, s.computed_tokens, e.computed_tokens);
  bump("shardline_kv_streamed_bytes_total", l, s.kv_streamed_bytes, e.streamed_bytes);
  bump("shardline_recovered_tokens_total", l, s.kv_restored_tokens, e.restored_tokens);
  bump("shardline_recomputed_tokens_total", "cause=\"failure\"," + l, s.kv_resume_recomputed_tokens,
       e.recomputed_tokens);
  bump("shardline_kv_resume_fallbacks_total", l, s.kv_resume_fallbacks, e.resume_fallbacks);
}

/// A resumed line: fetch each choice's replicated KV from the node's store
/// (which asks the ring when it lacks it). A choice whose KV cannot be
/// fetched resumes from its tokens alone (recomputed, and counted as a
/// fallback); one the stores hold less of resumes from what they hold.
void fetch_resume_kv(WorkerActor* self, worker::BatchRequest& r) {
  WorkerState& st = self->state;
  if (static_cast<int>(r.resume.size()) != r.n) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < r.n; ++c) {
    worker::ChoiceResume& cr = r.resume[static_cast<std::size_t>(c)];
    const std::uint64_t key = worker::kv_request_key(r.line_index, c);
    if (st.kv_progress) st.kv_progress->seed(r.job_id, key, cr.output_ids);
    if (cr.num_kv_tokens <= 0 || !st.config.kv_store) continue;
    // A store that is restarting (killed just before) is back within a
    // moment: wait for it, and ask again after an error, for a few seconds.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    Result<messages::KvPrefixData> fetched = make_error(ErrorCode::io, "no KV store now (it is restarting)");
    while (true) {
      if (const caf::actor store = st.config.kv_store->get(); store)
        fetched = fetch_kv_prefix(self->system(), store, *st.config.key, r.job_id, key, cr.num_kv_tokens,
                                  std::chrono::seconds(5));
      if (fetched || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!fetched) {
      // E.g. the store is restarting: resume from the tokens alone (the
      // engine counts the recomputed positions), never fail the line.
      spdlog::warn("worker {}: line {} of job {} choice {}: cannot fetch its KV ({}); recomputing it",
                   st.config.name, r.line_index, r.job_id, c, fetched.error().to_string());
      cr.num_kv_tokens = 0;
      st.config.metrics->add("shardline_kv_resume_fallbacks_total", "worker=\"" + st.config.name + "\"", 1);
      continue;
    }
    if (fetched->tokens < cr.num_kv_tokens)
      spdlog::warn("worker {}: line {} of job {} choice {}: the stores hold {} of {} replicated positions",
                   st.config.name, r.line_index, r.job_id, c, fetched->tokens, cr.num_kv_tokens);
    spdlog::debug("worker {}: line {} of job {} choice {}: {} of {} positions from {}", st.config.name,
                  r.line_index, r.job_id, c, fetched->tokens, cr.num_kv_tokens, fetched->source);
    cr.num_kv_tokens = std::min(cr.num_kv_tokens, fetched->tokens);
    cr.kv_chunk = std::move(fetched->chunk);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.config.metrics->observe("shardline_recovery_seconds", "worker=\"" + st.config.name + "\"", s);
}

/// Forgets the queued increments and progress of finished lines (or of a
/// whole job: no request ids). Their KV in the store is the orchestrator's
/// to drop, once their results are durable (a crash before the commit
/// resumes them from it).
void forget_kv(WorkerActor* self, std::uint64_t job_id, const std::vector<std::uint64_t>& request_ids) {
  WorkerState& st = self->state;
  if (!st.kv_streamer) return;
  for (std::uint64_t r : request_ids) {
    st.kv_streamer->forget_request(job_id, r);
    st.kv_progress->forget(job_id, r);
  }
  if (request_ids.empty()) st.kv_progress->forget_job(job_id);
}

/// A cancelled job: forgets it and deletes its KV in the store.
void drop_job_kv(WorkerActor* self, std::uint64_t job_id) {
  WorkerState& st = self->state;
  if (!st.kv_streamer) return;
  forget_kv(self, job_id, {});
  const std::vector<std::uint64_t> request_ids;  // the whole job
  const caf::actor store = st.config.kv_store->get();
  if (!store) return;  // it restarts; the orchestrator drops the job's KV when the job ends
  const Signed s =
      sign(*st.config.key, messages::encode(messages::KvStoreMsg{messages::DropRequests{job_id, request_ids, ""}}));
  self->send(store, msg_atom::value, s.tag, s.bytes);
}

using WorkerReply = messages::WorkerReply;

WorkerReply handle(WorkerActor* self, messages::AssignWork& msg) {
  WorkerState& s = self->state;
  for (auto& r : msg.requests) {
    // The codec checked the name; an error here would be a bug, not bad input.
    auto switched = s.token_budget->use(r.token_budget, s.worker->engine());
    if (!switched)
      spdlog::error("worker {}: {}", s.config.name, switched.error().to_string());
    else if (*switched)
      spdlog::info("worker {}: token budget {} (job {})", s.config.name, s.token_budget->current(), r.job_id);
    s.held.insert(worker::LineRef{r.job_id, r.line_index});
    if (!r.resume.empty()) fetch_resume_kv(self, r);
    s.worker->submit(std::move(r));
  }
  schedule_step(self);
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::CancelJob& msg) {
  self->state.worker->cancel_job(msg.job_id);
  drop_job_kv(self, msg.job_id);
  auto& held = self->state.held;
  held.erase(held.lower_bound({msg.job_id, 0}), held.lower_bound({msg.job_id + 1, 0}));
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::HelloAgain&) {
  spdlog::info("worker {}: the orchestrator asks for a hello again; {} lines held", self->state.config.name,
               self->state.held.size());
  say_hello(self);
  return messages::Ack{};
}

/// A SiDP step hook failed (not because a peer left: that only moves the
/// rank to WaS): a crash of this worker, as an engine failure is.
void sidp_failed(WorkerActor* self, const Error& e) {
  spdlog::error("worker {}: SiDP step failed: {}", self->state.config.name, e.to_string());
  self->quit(caf::exit_reason::unhandled_exception);
}

/// No work: a SiDP rank in CaS takes its lockstep turn (a dummy step), one in
/// WaS joins a pending switch; then it comes back after the delay the
/// stepper asks for, or waits for a message (work or a directive).
void sidp_idle(WorkerActor* self) {
  WorkerState& s = self->state;
  auto idle = s.sidp->idle();
  if (!idle) return sidp_failed(self, idle.error());
  if (!idle->again) return;
  if (idle->delay.count() == 0) return schedule_step(self);
  s.step_scheduled = true;
  self->delayed_send(self, idle->delay, step_atom::value);
}

/// The test hook of WorkerConfig::stall_at_step: this thread sticks, as a
/// hung engine would, and sends no heartbeat meanwhile.
void maybe_stall(WorkerActor* self) {
  WorkerState& s = self->state;
  if (s.config.stall_at_step == 0 || s.steps != s.config.stall_at_step || !s.config.stall_once ||
      s.config.stall_once->exchange(true))
    return;
  spdlog::warn("worker {}: test hook: stalling for {} ms in step {}", s.config.name, s.config.stall_ms, s.steps);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.config.stall_ms);
  while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  spdlog::warn("worker {}: test hook: stall over", s.config.name);
}

WorkerReply handle(WorkerActor* self, const messages::SidpSwitch& sw) {
  WorkerState& s = self->state;
  if (!s.sidp || sw.group != s.config.sidp_group)
    return make_error(ErrorCode::invalid_argument,
                      "worker " + s.config.name + " is not in SiDP group '" + sw.group + "'");
  const auto mode = engine::parse_sidp_mode(sw.mode);
  if (!mode) return mode.error();  // the codec checked it
  spdlog::info("worker {}: SiDP directive {} (epoch {})", s.config.name, sw.mode, sw.epoch);
  s.sidp->directive(*mode, sw.epoch);
  schedule_step(self);  // an idle rank joins the switch at its next boundary
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::WorkerStatusQuery&) { return status_of(self->state); }

WorkerReply handle(WorkerActor* self, const messages::Shutdown&) {
  spdlog::warn("worker {}: told to stop by {}", self->state.config.name, caf::to_string(self->current_sender()));
  self->quit(caf::exit_reason::user_shutdown);
  return messages::Ack{};
}

caf::behavior worker_behavior(WorkerActor* self, WorkerConfig config) {
  self->state.config = std::move(config);
  WorkerState& st = self->state;
  std::unique_ptr<engine::SidpRank> sidp_rank;
  engine::EngineOptions engine_options = st.config.engine;
  if (st.config.sidp) {
    auto r = st.config.sidp->attach(st.config.sidp_rank);
    if (!r) {
      spdlog::error("worker {}: cannot join SiDP group {}: {}", st.config.name, st.config.sidp_group,
                    r.error().to_string());
      if (st.config.start_errors) st.config.start_errors->add(st.config.name + ": " + r.error().to_string());
      st.config.metrics->add("shardline_worker_start_failures_total", "", 1);
      self->quit(caf::exit_reason::user_shutdown);
      return {};
    }
    sidp_rank = std::move(r).value();
    engine_options = sidp_rank->engine_options();
  }
  auto built = engine::build_engine(engine_options);
  if (!built) {
    spdlog::error("worker {}: cannot start its engine: {}", st.config.name, built.error().to_string());
    if (st.config.start_errors) st.config.start_errors->add(st.config.name + ": " + built.error().to_string());
    st.config.metrics->add("shardline_worker_start_failures_total", "", 1);
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  auto worker = worker::BatchWorker::create(std::move(built).value(), st.config.name);
  if (!worker) {
    spdlog::error("worker {}: {}", st.config.name, worker.error().to_string());
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  st.weight_bytes = worker->engine_instance().weight_bytes;
  st.worker = std::make_unique<worker::BatchWorker>(std::move(worker).value());
  if (sidp_rank) {
    // The engine is built: join the group's compute generation (peers that
    // follow into a new one wait for this rank there).
    if (Status joined = sidp_rank->join(); !joined) {
      spdlog::error("worker {}: cannot join SiDP group {}: {}", st.config.name, st.config.sidp_group,
                    joined.error().to_string());
      self->quit(caf::exit_reason::unhandled_exception);
      return {};
    }
    st.sidp = std::make_unique<worker::SidpStepper>(std::move(sidp_rank));
  }
  st.token_budget = std::make_unique<worker::JobTokenBudget>(st.config.engine.max_num_batched_tokens);
  for (const char* metric : {"shardline_kv_streamed_bytes_total", "shardline_recovered_tokens_total",
                             "shardline_kv_resume_fallbacks_total"})
    st.config.metrics->add(metric, "worker=\"" + st.config.name + "\"", 0);  // shown from the start
  st.config.metrics->add("shardline_recomputed_tokens_total", "cause=\"failure\",worker=\"" + st.config.name + "\"", 0);
  if (st.config.kv_store && st.worker->engine().kv_io().can_move_kv()) {
    // Token streaming to the node's KV store (DéjàVu §4.1.1 (3)), off the
    // step loop: after each flush the store's acks go to the orchestrator.
    st.kv_target = std::make_shared<ActorKvTarget>(self->system(), st.config.kv_store, st.config.key);
    st.kv_progress = std::make_shared<worker::KvProgressTracker>();
    worker::KvStreamerOptions so;
    so.max_queued_bytes = st.config.kv_queue_bytes;
    auto on_flushed = [target = st.kv_target, progress = st.kv_progress, orchestrator = st.config.orchestrator,
                       key = st.config.key, name = st.config.name](std::vector<worker::QueuedIncrement> flushed) {
      std::vector<worker::KvProgress> p = progress->on_flushed(flushed, target->take_acks());
      if (p.empty()) return;
      const Signed s =
          sign(*key, messages::encode(messages::OrchestratorMsg{messages::KvProgressReport{name, std::move(p)}}));
      caf::anon_send(orchestrator, msg_atom::value, s.tag, s.bytes);
    };
    st.kv_streamer = std::make_unique<worker::KvStreamer>(st.kv_target, so, std::move(on_flushed));
    st.worker->set_kv_streamer(st.kv_streamer.get());
  } else if (st.config.kv_store) {
    spdlog::warn("worker {}: its engine cannot copy KV out (no KV views): no KV streaming; a failed line "
                 "resumes from its tokens only", st.config.name);
  }
  // Refusals are not counted here (as before the inbox helper); the orchestrator counts its own.
  st.inbox = Inbox("worker " + st.config.name, st.config.key, nullptr);
  say_hello(self);
  self->send(self, beat_atom::value);
  spdlog::info("worker {} ready [{}]", st.config.name, orchestrator::group_label(st.config.engine.parallel));
  if (const auto& sh = st.config.engine.shift)
    spdlog::info("worker {}: Shift Parallelism: steps of at most {} tokens run as tp={} (back above {} tokens)",
                 st.config.name, sh->policy.threshold, st.config.engine.parallel.group_size(),
                 static_cast<long long>(static_cast<double>(sh->policy.threshold) * (1.0 + sh->policy.hysteresis)));
  if (const auto& ss = st.config.engine.seesaw) {
    const engine::ParallelConfig& cp = st.config.engine.parallel;
    const engine::ParallelConfig cd = st.config.engine.parallel_decode.value_or(cp);
    const auto& link = st.config.engine.host_link;
    spdlog::info("worker {}: Seesaw: prefill as [{}], decode as [{}], {} schedule, host KV buffer {} MiB, {} weights "
                 "({:.1f} MiB packed now), {} KV copies{}",
                 st.config.name, orchestrator::group_label(cp), orchestrator::group_label(cd),
                 engine::to_string(ss->schedule), st.config.engine.swap_space_bytes >> 20,
                 engine::to_string(st.config.engine.reshard_weights),
                 static_cast<double>(st.weight_bytes) / static_cast<double>(1 << 20),
                 st.config.engine.seesaw_async_kv ? "async" : "sync",
                 link ? fmt::format(" over an emulated {} GB/s host link", link->gbps) : std::string());
  }

  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
        return self->state.inbox.serve(self->current_sender(), tag, bytes, messages::decode_worker,
                                       [self](auto& msg) { return handle(self, msg); });
      },
      [self](step_atom) {
        WorkerState& s = self->state;
        s.step_scheduled = false;
        if (!s.worker->has_work()) {
          if (s.sidp) sidp_idle(self);
          return;
        }
        ++s.steps;
        maybe_stall(self);
        if (s.sidp)
          if (Status st = s.sidp->before_step(); !st) return sidp_failed(self, st.error());
        const auto t0 = std::chrono::steady_clock::now();
        auto results = s.worker->step();
        if (results && s.sidp)
          if (Status st = s.sidp->after_step(); !st) return sidp_failed(self, st.error());
        const auto step_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        if (step_ms > s.config.failure_timeout_ms / 2 && !s.warned_slow_step) {
          s.warned_slow_step = true;
          spdlog::warn("worker {}: an engine step took {} ms, more than half of --failure-timeout-ms ({}); the "
                       "orchestrator may declare this worker dead: raise --failure-timeout-ms or lower "
                       "--max-num-batched-tokens",
                       s.config.name, step_ms, s.config.failure_timeout_ms);
        }
        if (!results) {
          // An engine failure is a crash of this worker: the orchestrator
          // requeues its work and the node's supervisor restarts it.
          spdlog::error("worker {}: step failed: {}", s.config.name, results.error().to_string());
          self->quit(caf::exit_reason::unhandled_exception);
          return;
        }
        if (!results->empty()) {
          MetricsRegistry& m = *s.config.metrics;
          for (const auto& r : *results) {
            s.held.erase(worker::LineRef{r.job_id, r.line_index});
            if (!r.choices.empty()) {
              std::vector<std::uint64_t> keys;
              for (int c = 0; c < static_cast<int>(r.choices.size()); ++c)
                keys.push_back(worker::kv_request_key(r.line_index, c));
              forget_kv(self, r.job_id, keys);
            }
            m.add("shardline_requests_total", r.ok ? "state=\"done\"" : "state=\"failed\"", 1);
            m.add("shardline_prompt_tokens_total", "", r.prompt_tokens);
            m.add("shardline_generation_tokens_total", "", r.completion_tokens);
          }
          to_orchestrator(self, messages::WorkerResults{s.config.name, std::move(results).value()});
        }
        s.config.metrics->add("shardline_engine_steps_total", "worker=\"" + s.config.name + "\"", 1);
        export_kv_metrics(self);
        if (s.worker->has_work() || s.sidp) schedule_step(self);  // a SiDP rank goes on idle (CaS lockstep)
      },
      [self](beat_atom) {
        const messages::WorkerStatus status = status_of(self->state);
        export_metrics(self, status);
        to_orchestrator(self, messages::WorkerHeartbeat{self->state.config.name, status});
        self->delayed_send(self, std::chrono::milliseconds(self->state.config.heartbeat_ms), beat_atom::value);
      },
      [](const std::string&) {},  // replies of the orchestrator to our sends
  };
}

}  // namespace

caf::actor spawn_worker(caf::actor_system& sys, WorkerConfig config) {
  return sys.spawn<caf::detached>(worker_behavior, std::move(config));
}

}  // namespace shardline::actors
