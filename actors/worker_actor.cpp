// The worker actor: a thin behaviour around worker::WorkerRuntime. Each
// message becomes one call into the runtime; each outcome becomes messages
// to the orchestrator and metrics.
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/kv_client.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "orchestrator/job_admission.hpp"
#include "worker/worker_runtime.hpp"

namespace shardline::actors {

namespace {

struct WorkerState {
  WorkerConfig config;
  std::unique_ptr<worker::WorkerRuntime> runtime;
  bool step_scheduled = false;
  Inbox inbox;
  static inline const char* name = "shardline.worker";

  WorkerState() = default;
  WorkerState(const WorkerState&) = delete;
  WorkerState& operator=(const WorkerState&) = delete;
};

using WorkerActor = caf::stateful_actor<WorkerState>;

messages::WorkerStatus status_of(const WorkerState& st) {
  const worker::WorkerRuntime& rt = *st.runtime;
  const worker::WorkerStatusSnapshot s = rt.status();
  messages::WorkerStatus w;
  w.worker_name = st.config.name;
  w.device = st.config.device;
  w.state = rt.has_work() ? "busy" : "idle";
  w.num_running = static_cast<std::uint32_t>(s.num_running);
  w.num_waiting = static_cast<std::uint32_t>(s.num_waiting);
  w.kv_blocks_used = static_cast<std::uint64_t>(s.kv_blocks_used);
  w.kv_blocks_total = static_cast<std::uint64_t>(s.kv_blocks_total);
  w.prompt_tokens = static_cast<std::uint64_t>(s.prompt_tokens);
  w.generated_tokens = static_cast<std::uint64_t>(s.generated_tokens);
  w.steps_done = static_cast<std::uint64_t>(s.steps_done);
  w.weight_bytes = rt.weight_bytes();
  if (const char* mode = rt.sidp_mode_name()) w.sidp_mode = mode;
  if (const engine::SeesawPhases* phases = rt.seesaw()) {
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
  hello.held.assign(st.runtime->held().begin(), st.runtime->held().end());
  if (st.config.sidp) {
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
  const worker::KvCounterGrowth g = st.runtime->take_kv_counter_growth();
  MetricsRegistry& m = *st.config.metrics;
  const std::string l = "worker=\"" + st.config.name + "\"";
  auto add = [&m](const std::string& name, const std::string& labels, std::uint64_t growth) {
    if (growth > 0) m.add(name, labels, static_cast<double>(growth));
  };
  add("shardline_computed_tokens_total", l, g.computed_tokens);
  add("shardline_kv_streamed_bytes_total", l, g.streamed_bytes);
  add("shardline_recovered_tokens_total", l, g.restored_tokens);
  add("shardline_recomputed_tokens_total", "cause=\"failure\"," + l, g.recomputed_tokens);
  add("shardline_kv_resume_fallbacks_total", l, g.resume_fallbacks);
  add("shardline_prefix_cache_queries_total", l, g.prefix_query_tokens);
  add("shardline_prefix_cache_hits_total", l, g.prefix_hit_tokens);
  add("shardline_prefix_tier_restored_tokens_total", l, g.prefix_tier_restored_tokens);
  add("shardline_prefix_tier_spilled_blocks_total", l, g.prefix_tier_spilled_blocks);
  add("shardline_prefix_store_fetched_tokens_total", l, g.prefix_store_fetched_tokens);
  add("shardline_prefix_store_kept_blocks_total", l, g.prefix_store_kept_blocks);
}

using WorkerReply = messages::WorkerReply;

WorkerReply handle(WorkerActor* self, messages::AssignWork& msg) {
  WorkerState& s = self->state;
  const std::string l = "worker=\"" + s.config.name + "\"";
  for (auto& r : msg.requests) {
    const std::optional<worker::ResumeFetchReport> fetched = s.runtime->accept(std::move(r));
    if (!fetched) continue;
    if (fetched->num_fallbacks > 0)
      s.config.metrics->add("shardline_kv_resume_fallbacks_total", l, fetched->num_fallbacks);
    s.config.metrics->observe("shardline_recovery_seconds", l, fetched->fetch_seconds);
  }
  schedule_step(self);
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::CancelJob& msg) {
  self->state.runtime->cancel_job(msg.job_id);
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::HelloAgain&) {
  spdlog::info("worker {}: the orchestrator asks for a hello again; {} lines held", self->state.config.name,
               self->state.runtime->held().size());
  say_hello(self);
  return messages::Ack{};
}

/// The test hook of WorkerConfig::stall_at_step: this thread sticks, as a
/// hung engine would, and sends no heartbeat meanwhile.
void maybe_stall(const WorkerConfig& c, std::uint64_t step) {
  if (c.stall_at_step == 0 || step != c.stall_at_step || !c.stall_once || c.stall_once->exchange(true)) return;
  spdlog::warn("worker {}: test hook: stalling for {} ms in step {}", c.name, c.stall_ms, step);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(c.stall_ms);
  while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  spdlog::warn("worker {}: test hook: stall over", c.name);
}

WorkerReply handle(WorkerActor* self, const messages::SidpSwitch& sw) {
  if (Status ok = self->state.runtime->directive(sw.group, sw.mode, sw.epoch); !ok) return ok.error();
  schedule_step(self);  // an idle rank joins the switch at its next boundary
  return messages::Ack{};
}

WorkerReply handle(WorkerActor* self, const messages::WorkerStatusQuery&) { return status_of(self->state); }

WorkerReply handle(WorkerActor* self, const messages::Shutdown&) {
  spdlog::warn("worker {}: told to stop by {}", self->state.config.name, caf::to_string(self->current_sender()));
  self->quit(caf::exit_reason::user_shutdown);
  return messages::Ack{};
}

/// One turn of the step loop: the outcome's results go to the orchestrator
/// and the metrics; a failure crashes the worker (the orchestrator requeues
/// its work and the node's supervisor restarts it).
void on_step(WorkerActor* self) {
  WorkerState& s = self->state;
  s.step_scheduled = false;
  auto outcome = s.runtime->step();
  if (!outcome) {
    spdlog::error("worker {}: {}", s.config.name, outcome.error().to_string());
    self->quit(caf::exit_reason::unhandled_exception);
    return;
  }
  if (outcome->stepped) {
    MetricsRegistry& m = *s.config.metrics;
    for (const auto& r : outcome->results) {
      m.add("shardline_requests_total", r.ok ? "state=\"done\"" : "state=\"failed\"", 1);
      m.add("shardline_prompt_tokens_total", "", r.prompt_tokens);
      m.add("shardline_generation_tokens_total", "", r.completion_tokens);
    }
    if (!outcome->results.empty())
      to_orchestrator(self, messages::WorkerResults{s.config.name, std::move(outcome->results)});
    m.add("shardline_engine_steps_total", "worker=\"" + s.config.name + "\"", 1);
    export_kv_metrics(self);
  }
  if (!outcome->next_step) return;
  if (outcome->next_step->count() == 0) return schedule_step(self);
  s.step_scheduled = true;
  self->delayed_send(self, *outcome->next_step, step_atom::value);
}

/// What the worker runs, once, at its start.
void log_setup(const WorkerConfig& c, std::uint64_t weight_bytes) {
  spdlog::info("worker {} ready [{}]", c.name, orchestrator::group_label(c.engine.parallel));
  if (const auto& sh = c.engine.shift)
    spdlog::info("worker {}: Shift Parallelism: steps of at most {} tokens run as tp={} (back above {} tokens)",
                 c.name, sh->policy.threshold, c.engine.parallel.group_size(),
                 static_cast<long long>(static_cast<double>(sh->policy.threshold) * (1.0 + sh->policy.hysteresis)));
  if (const auto& ss = c.engine.seesaw) {
    const engine::ParallelConfig& cp = c.engine.parallel;
    const engine::ParallelConfig cd = c.engine.parallel_decode.value_or(cp);
    const auto& link = c.engine.host_link;
    spdlog::info("worker {}: Seesaw: prefill as [{}], decode as [{}], {} schedule, host KV buffer {} MiB, {} weights "
                 "({:.1f} MiB packed now), {} KV copies{}",
                 c.name, orchestrator::group_label(cp), orchestrator::group_label(cd), engine::to_string(ss->schedule),
                 c.engine.swap_space_bytes >> 20, engine::to_string(c.engine.reshard_weights),
                 static_cast<double>(weight_bytes) / static_cast<double>(1 << 20),
                 c.engine.seesaw_async_kv ? "async" : "sync",
                 link ? fmt::format(" over an emulated {} GB/s host link", link->gbps) : std::string());
  }
}

/// A worker that cannot start: a configuration problem (recorded for the
/// node's start report; no restart helps) or, with `transient`, a crash.
caf::behavior fail_start(WorkerActor* self, const Error& e, bool transient) {
  const WorkerConfig& c = self->state.config;
  spdlog::error("worker {}: {}{}", c.name, transient ? "" : "cannot start its engine: ", e.to_string());
  if (!transient) {
    if (c.start_errors) c.start_errors->add(c.name + ": " + e.to_string());
    c.metrics->add("shardline_worker_start_failures_total", "", 1);
  }
  self->quit(transient ? caf::exit_reason::unhandled_exception : caf::exit_reason::user_shutdown);
  return {};
}

worker::WorkerRuntimeOptions runtime_options(const WorkerConfig& c) {
  worker::WorkerRuntimeOptions o;
  o.name = c.name;
  o.engine = c.engine;
  o.sidp = c.sidp;
  o.sidp_rank = c.sidp_rank;
  o.sidp_group = c.sidp_group;
  o.kv_queue_bytes = c.kv_queue_bytes;
  o.failure_timeout_ms = c.failure_timeout_ms;
  if (c.stall_at_step != 0) o.before_step = [c](std::uint64_t step) { maybe_stall(c, step); };
  return o;
}

caf::behavior worker_behavior(WorkerActor* self, WorkerConfig config) {
  self->state.config = std::move(config);
  WorkerState& st = self->state;
  auto runtime = worker::WorkerRuntime::create(runtime_options(st.config));
  if (!runtime) return fail_start(self, runtime.error(), false);
  st.runtime = std::move(runtime).value();
  if (Status joined = st.runtime->join_sidp(); !joined) return fail_start(self, joined.error(), true);
  for (const char* metric : {"shardline_kv_streamed_bytes_total", "shardline_recovered_tokens_total",
                             "shardline_kv_resume_fallbacks_total", "shardline_prefix_cache_queries_total",
                             "shardline_prefix_cache_hits_total", "shardline_prefix_tier_restored_tokens_total",
                             "shardline_prefix_tier_spilled_blocks_total", "shardline_prefix_store_fetched_tokens_total",
                             "shardline_prefix_store_kept_blocks_total"})
    st.config.metrics->add(metric, "worker=\"" + st.config.name + "\"", 0);  // shown from the start
  st.config.metrics->add("shardline_recomputed_tokens_total", "cause=\"failure\",worker=\"" + st.config.name + "\"", 0);
  if (st.config.kv_store) {
    // Token streaming to the node's KV store (DéjàVu §4.1.1 (3)), off the
    // step loop: after each flush the store's acks go to the orchestrator.
    auto report = [orchestrator = st.config.orchestrator, key = st.config.key,
                   name = st.config.name](std::vector<worker::KvProgress> p) {
      const Signed s =
          sign(*key, messages::encode(messages::OrchestratorMsg{messages::KvProgressReport{name, std::move(p)}}));
      caf::anon_send(orchestrator, msg_atom::value, s.tag, s.bytes);
    };
    const bool streaming = st.runtime->connect_kv_store(
        std::make_shared<ActorResumeKvSource>(self->system(), st.config.kv_store, st.config.key),
        std::make_shared<ActorKvTarget>(self->system(), st.config.kv_store, st.config.key), std::move(report));
    if (!streaming)
      spdlog::warn("worker {}: its engine cannot copy KV out (no KV views): no KV streaming; a failed line "
                   "resumes from its tokens only", st.config.name);
    if (st.config.prefix_store_host_bytes > 0 &&
        st.runtime->connect_prefix_store(
            std::make_shared<ActorPrefixBlockStore>(self->system(), st.config.kv_store, st.config.key),
            st.config.prefix_store_host_bytes))
      spdlog::info("worker {}: prefix blocks kept in {} MiB of host memory and the node's KV store", st.config.name,
                   st.config.prefix_store_host_bytes >> 20);
  }
  // Refusals are not counted here (as before the inbox helper); the orchestrator counts its own.
  st.inbox = Inbox("worker " + st.config.name, st.config.key, nullptr);
  say_hello(self);
  self->send(self, beat_atom::value);
  log_setup(st.config, st.runtime->weight_bytes());

  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
        return self->state.inbox.serve(self->current_sender(), tag, bytes, messages::decode_worker,
                                       [self](auto& msg) { return handle(self, msg); });
      },
      [self](step_atom) { on_step(self); },
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
