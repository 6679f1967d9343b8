#include "worker/worker_runtime.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

namespace shardline::worker {

WorkerRuntime::WorkerRuntime(WorkerRuntimeOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<WorkerRuntime>> WorkerRuntime::create(WorkerRuntimeOptions options) {
  std::unique_ptr<WorkerRuntime> rt(new WorkerRuntime(std::move(options)));
  const WorkerRuntimeOptions& o = rt->options_;
  engine::EngineOptions engine_options = o.engine;
  if (o.sidp) {
    auto rank = o.sidp->attach(o.sidp_rank);
    if (!rank) return Error{rank.error().code, "cannot join SiDP group " + o.sidp_group + ": " + rank.error().message};
    rt->joining_rank_ = std::move(rank).value();
    engine_options = rt->joining_rank_->engine_options();
  }
  auto built = engine::build_engine(engine_options);
  if (!built) return built.error();
  auto worker = BatchWorker::create(std::move(built).value(), o.name);
  if (!worker) return worker.error();
  rt->weight_bytes_ = worker->engine_instance().weight_bytes;
  rt->worker_ = std::make_unique<BatchWorker>(std::move(worker).value());
  rt->token_budget_ = std::make_unique<JobTokenBudget>(o.engine.max_num_batched_tokens);
  return rt;
}

WorkerRuntime::~WorkerRuntime() {
  if (prefix_store_tier_) {
    // Blocks still queued for the store go out first (a clean stop; a
    // killed process loses them, as a crash does).
    if (!prefix_store_tier_->drain(std::chrono::seconds(2)))
      spdlog::warn("worker {}: prefix blocks still queued for the KV store are dropped", options_.name);
    const StorePrefixTierStats p = prefix_store_tier_->stats();
    spdlog::info("worker {}: prefix store: {} positions fetched from the KV store, {} blocks newly kept there "
                 "({} sent, {} batches failed, {} not queued); host memory {} blocks, {} hits",
                 options_.name, p.fetched_tokens, p.store_kept_blocks, p.store_sent_blocks, p.store_put_failures,
                 p.dropped_blocks, p.host.blocks, p.host.hits);
  }
  const engine::SeesawPhases* phases = worker_ ? seesaw() : nullptr;
  if (phases == nullptr) return;
  const engine::SeesawStats& s = phases->stats();
  const engine::KvMoverStats m = worker_->engine().kv_mover_stats();
  spdlog::info("worker {}: Seesaw: {} transitions, {} prefill / {} decode steps, {} offloads to the host KV buffer "
               "(peak {} tokens), {:.1f} ms in transitions ({:.1f} ms switching configs); {} KV copies, {:.1f} ms, "
               "{:.0f}% hidden behind steps",
               options_.name, s.transitions, s.prefill_steps, s.decode_steps, s.offloads, s.host_peak_tokens,
               s.transition_ms, s.switch_ms, m.num_transfers, m.transfer_ms, 100 * m.hidden_share());
}

Status WorkerRuntime::join_sidp() {
  if (!joining_rank_) return Status::ok_status();
  if (Status joined = joining_rank_->join(); !joined)
    return Error{joined.error().code, "cannot join SiDP group " + options_.sidp_group + ": " + joined.error().message};
  sidp_ = std::make_unique<SidpStepper>(std::move(joining_rank_));
  return Status::ok_status();
}

bool WorkerRuntime::connect_kv_store(std::shared_ptr<ResumeKvSource> source, std::shared_ptr<AckedKvTarget> target,
                                     KvProgressCallback on_progress) {
  resume_source_ = std::move(source);
  if (!worker_->engine().kv_io().can_move_kv()) return false;
  kv_target_ = std::move(target);
  kv_progress_ = std::make_shared<KvProgressTracker>();
  KvStreamerOptions so;
  so.max_queued_bytes = options_.kv_queue_bytes;
  so.num_kv_heads = worker_->engine().kv_io().shape().num_kv_heads;
  so.num_layers = worker_->engine().kv_io().shape().num_layers;
  // On the streamer's thread: only the shared target and tracker are touched.
  auto on_flushed = [target = kv_target_, progress = kv_progress_, waits = link_waits_,
                     report = std::move(on_progress)](std::vector<QueuedIncrement> flushed) {
    std::vector<KvProgress> p = progress->on_flushed(flushed, target->take_acks());
    if (std::vector<KvLinkWait> w = target->take_link_waits(); !w.empty()) {
      std::lock_guard lock(waits->mu);
      waits->waits.insert(waits->waits.end(), w.begin(), w.end());
    }
    if (!p.empty() && report) report(std::move(p));
  };
  kv_streamer_ = std::make_unique<KvStreamer>(kv_target_, so, std::move(on_flushed));
  worker_->set_kv_streamer(kv_streamer_.get());
  return true;
}

bool WorkerRuntime::connect_prefix_store(std::shared_ptr<PrefixBlockStore> store, std::uint64_t host_bytes) {
  engine::LlmEngine& eng = worker_->engine();
  const engine::KvCacheIo& io = eng.kv_io();
  if (!eng.config().prefix_cache.enabled || !io.can_copy_kv() || !io.copies_bytes()) return false;
  StorePrefixTierOptions o;
  o.salt = eng.config().prefix_cache.salt;
  o.host_bytes = host_bytes;
  const kvstore::KvModelShape shape = io.shape();
  const int block_size = eng.scheduler().block_manager().block_size();
  o.block_bytes = kvstore::chunk_bytes(shape, kvstore::KvRange{0, shape.num_layers, 0, block_size});
  worker_->set_prefix_store_tier(nullptr);
  eng.set_prefix_tier(nullptr);
  prefix_store_tier_ = std::make_unique<StorePrefixTier>(std::move(store), o);
  eng.set_prefix_tier(prefix_store_tier_.get());
  worker_->set_prefix_store_tier(prefix_store_tier_.get());
  return true;
}

std::optional<StorePrefixTierStats> WorkerRuntime::prefix_store_stats() const {
  if (!prefix_store_tier_) return std::nullopt;
  return prefix_store_tier_->stats();
}

bool WorkerRuntime::drain_kv(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (kv_streamer_ && !kv_streamer_->drain(timeout)) return false;
  if (!prefix_store_tier_) return true;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return prefix_store_tier_->drain(std::max(left, std::chrono::milliseconds(0)));
}

std::optional<ResumeFetchReport> WorkerRuntime::accept(BatchRequest request) {
  // The codec checked the name; an error here would be a bug, not bad input.
  auto switched = token_budget_->use(request.token_budget, worker_->engine());
  if (!switched)
    spdlog::error("worker {}: {}", options_.name, switched.error().to_string());
  else if (*switched)
    spdlog::info("worker {}: token budget {} (job {})", options_.name, token_budget_->current(), request.job_id);
  held_.insert(LineRef{request.job_id, request.line_index});
  std::optional<ResumeFetchReport> report;
  if (!request.resume.empty() && static_cast<int>(request.resume.size()) == request.n) {
    report.emplace();
    fetch_resume_kv(request, *report);
  }
  worker_->submit(std::move(request));
  return report;
}

/// Each choice's replicated KV comes from the node's store (which asks the
/// ring when it lacks it). A choice whose KV cannot be fetched resumes from
/// its tokens alone (recomputed, and counted as a fallback); one the stores
/// hold less of resumes from what they hold.
void WorkerRuntime::fetch_resume_kv(BatchRequest& r, ResumeFetchReport& report) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < r.n; ++c) {
    ChoiceResume& cr = r.resume[static_cast<std::size_t>(c)];
    const std::uint64_t key = kv_request_key(r.line_index, c);
    if (kv_progress_) kv_progress_->seed(r.job_id, key, cr.output_ids);
    if (cr.num_kv_tokens <= 0 || !resume_source_) continue;
    // A store that is restarting (killed just before) is back within a
    // moment: ask again after an error, for a while.
    const auto deadline = std::chrono::steady_clock::now() + options_.resume_fetch_window;
    Result<KvPrefix> fetched = resume_source_->fetch_prefix(r.job_id, key, cr.num_kv_tokens);
    while (!fetched && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(options_.resume_retry_interval);
      fetched = resume_source_->fetch_prefix(r.job_id, key, cr.num_kv_tokens);
    }
    if (!fetched) {
      // Resume from the tokens alone (the engine counts the recomputed
      // positions): never fail the line.
      spdlog::warn("worker {}: line {} of job {} choice {}: cannot fetch its KV ({}); recomputing it", options_.name,
                   r.line_index, r.job_id, c, fetched.error().to_string());
      cr.num_kv_tokens = 0;
      ++report.num_fallbacks;
      continue;
    }
    if (fetched->num_tokens == 0) {
      // The stores answer but hold none of the promised positions (e.g.
      // unsynced KV lost in a crash): as good as a failed fetch.
      spdlog::warn("worker {}: line {} of job {} choice {}: the stores hold none of its {} replicated positions; "
                   "recomputing them",
                   options_.name, r.line_index, r.job_id, c, cr.num_kv_tokens);
      cr.num_kv_tokens = 0;
      ++report.num_fallbacks;
      continue;
    }
    if (fetched->num_tokens < cr.num_kv_tokens)
      spdlog::warn("worker {}: line {} of job {} choice {}: the stores hold {} of {} replicated positions",
                   options_.name, r.line_index, r.job_id, c, fetched->num_tokens, cr.num_kv_tokens);
    spdlog::debug("worker {}: line {} of job {} choice {}: {} of {} positions from {}", options_.name, r.line_index,
                  r.job_id, c, fetched->num_tokens, cr.num_kv_tokens, fetched->source);
    cr.num_kv_tokens = std::min(cr.num_kv_tokens, fetched->num_tokens);
    cr.kv_chunk = std::move(fetched->chunk);
  }
  report.fetch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void WorkerRuntime::forget_kv(std::uint64_t job_id, const std::vector<std::uint64_t>& request_ids) {
  // The KV in the store is the orchestrator's to drop, once the results are
  // durable (a crash before the commit resumes them from it).
  if (!kv_streamer_) return;
  for (std::uint64_t r : request_ids) {
    kv_streamer_->forget_request(job_id, r);
    kv_progress_->forget(job_id, r);
    restreamed_.erase({job_id, r});
  }
  if (request_ids.empty()) {
    kv_progress_->forget_job(job_id);
    std::erase_if(restreamed_, [job_id](const auto& k) { return k.first == job_id; });
  }
}

void WorkerRuntime::cancel_job(std::uint64_t job_id) {
  worker_->cancel_job(job_id);
  held_.erase(held_.lower_bound({job_id, 0}), held_.lower_bound({job_id + 1, 0}));
  if (!kv_streamer_) return;
  forget_kv(job_id, {});
  if (resume_source_) resume_source_->drop_job(job_id);
}

Result<WorkerStepOutcome> WorkerRuntime::step() { return worker_->has_work() ? engine_step() : idle_turn(); }

/// No work: a SiDP rank in CaS takes its lockstep turn (a dummy step), one
/// in WaS joins a pending switch; then it comes back after the delay the
/// stepper asks for, or waits for a message.
Result<WorkerStepOutcome> WorkerRuntime::idle_turn() {
  WorkerStepOutcome out;
  if (!sidp_) return out;
  auto idle = sidp_->idle();
  if (!idle) return Error{idle.error().code, "SiDP step failed: " + idle.error().message};
  if (idle->again) out.next_step = idle->delay;
  return out;
}

void WorkerRuntime::handle_link_waits() {
  std::vector<KvLinkWait> waits;
  {
    std::lock_guard lock(link_waits_->mu);
    waits.swap(link_waits_->waits);
  }
  for (const KvLinkWait& w : waits) {
    // The block is still on its way from this worker's tier (the link came
    // first), or landed after the batch was answered: the store counts the
    // head once it lands (a later batch tells, if it does not).
    if (prefix_store_tier_ && prefix_store_tier_->on_its_way(w.name, w.sent_at)) continue;
    if (!restreamed_.insert({w.job_id, w.request_id}).second) continue;  // streamed again already
    if (worker_->restream_kv(w.job_id, w.request_id))
      spdlog::debug("worker {}: the KV store lacks prefix block {} that choice ({}, {}) links: streaming its head",
                    options_.name, w.name, w.job_id, w.request_id);
  }
}

Result<WorkerStepOutcome> WorkerRuntime::engine_step() {
  ++steps_;
  handle_link_waits();
  if (options_.before_step) options_.before_step(steps_);
  // A SiDP step hook that fails (not because a peer left: that only moves
  // the rank to WaS) is a crash of this worker, as an engine failure is.
  if (sidp_)
    if (Status st = sidp_->before_step(); !st)
      return Error{st.error().code, "SiDP step failed: " + st.error().message};
  const auto t0 = std::chrono::steady_clock::now();
  auto results = worker_->step();
  if (!results) return Error{results.error().code, "step failed: " + results.error().message};
  if (sidp_)
    if (Status st = sidp_->after_step(); !st)
      return Error{st.error().code, "SiDP step failed: " + st.error().message};
  const auto step_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  if (step_ms > options_.failure_timeout_ms / 2 && !warned_slow_step_) {
    warned_slow_step_ = true;
    spdlog::warn("worker {}: an engine step took {} ms, more than half of --failure-timeout-ms ({}); the "
                 "orchestrator may declare this worker dead: raise --failure-timeout-ms or lower "
                 "--max-num-batched-tokens",
                 options_.name, step_ms, options_.failure_timeout_ms);
  }
  for (const BatchResult& r : *results) {
    held_.erase(LineRef{r.job_id, r.line_index});
    if (r.choices.empty()) continue;
    std::vector<std::uint64_t> keys;
    for (int c = 0; c < static_cast<int>(r.choices.size()); ++c) keys.push_back(kv_request_key(r.line_index, c));
    forget_kv(r.job_id, keys);
  }
  WorkerStepOutcome out;
  out.stepped = true;
  out.results = std::move(results).value();
  // A SiDP rank goes on when idle (its CaS lockstep turns).
  if (worker_->has_work() || sidp_) out.next_step = std::chrono::milliseconds(0);
  return out;
}

Status WorkerRuntime::directive(const std::string& group, const std::string& mode_name, std::uint64_t epoch) {
  if (!sidp_ || group != options_.sidp_group)
    return make_error(ErrorCode::invalid_argument, "worker " + options_.name + " is not in SiDP group '" + group + "'");
  const auto mode = engine::parse_sidp_mode(mode_name);
  if (!mode) return mode.error();
  spdlog::info("worker {}: SiDP directive {} (epoch {})", options_.name, mode_name, epoch);
  sidp_->directive(*mode, epoch);
  return Status::ok_status();
}

KvCounterGrowth WorkerRuntime::take_kv_counter_growth() {
  const WorkerStatusSnapshot s = worker_->status();
  KvCounterGrowth grew;
  auto take = [](std::uint64_t now, std::uint64_t& seen, std::uint64_t& growth) {
    growth = now > seen ? now - seen : 0;
    seen = std::max(seen, now);
  };
  take(s.computed_tokens, exported_.computed_tokens, grew.computed_tokens);
  take(s.kv_streamed_bytes, exported_.streamed_bytes, grew.streamed_bytes);
  take(s.kv_restored_tokens, exported_.restored_tokens, grew.restored_tokens);
  take(s.kv_resume_recomputed_tokens, exported_.recomputed_tokens, grew.recomputed_tokens);
  take(s.kv_resume_fallbacks, exported_.resume_fallbacks, grew.resume_fallbacks);
  take(s.prefix_query_tokens, exported_.prefix_query_tokens, grew.prefix_query_tokens);
  take(s.prefix_hit_tokens, exported_.prefix_hit_tokens, grew.prefix_hit_tokens);
  take(s.prefix_tier_restored_tokens, exported_.prefix_tier_restored_tokens, grew.prefix_tier_restored_tokens);
  take(s.prefix_tier_spilled_blocks, exported_.prefix_tier_spilled_blocks, grew.prefix_tier_spilled_blocks);
  if (prefix_store_tier_) {
    const StorePrefixTierStats p = prefix_store_tier_->stats();
    take(p.fetched_tokens, exported_.prefix_store_fetched_tokens, grew.prefix_store_fetched_tokens);
    take(p.store_kept_blocks, exported_.prefix_store_kept_blocks, grew.prefix_store_kept_blocks);
  }
  return grew;
}

}  // namespace shardline::worker
