#include "sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "engine/gpu_memory_plan.hpp"
#include "engine/kv_budget.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sidp_memory.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "engine/policies/token_budget_policies.hpp"
#include "kvstore/kv_stream.hpp"
#include "text/id_tokenizer.hpp"
#include "sim/simulated_executor.hpp"

namespace shardline::sim {
namespace {

double gib(double bytes) { return bytes / double(1ull << 30); }

/// Seesaw's host link: the fixed time of one DMA copy over PCIe, ms. An
/// assumption (the order of a cudaMemcpyAsync launch); the device files give
/// the link's bandwidth.
constexpr double kHostLinkLatencyMs = 0.01;

std::string fixed2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  double sum = 0;
  for (const double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// One DP replica: its executor and engine (after a failure: the new ones;
/// the failed executors are kept for their records).
struct Replica {
  std::unique_ptr<SimulatedExecutor> executor;
  std::unique_ptr<engine::LlmEngine> engine;
  std::vector<std::unique_ptr<SimulatedExecutor>> failed;  ///< executors of the groups that failed, oldest first
  std::set<std::size_t> live;  ///< requests handed to it and not finished
  int peak_blocks_used = 0;
  long long preemptions = 0;
};

/// What one run (full or prefill-only) gave.
struct RunOutcome {
  double elapsed_ms = 0;
  std::unique_ptr<text::IdTokenizer> tokenizer;  ///< the engines hold it: declared before them
  std::vector<Replica> replicas;
  std::vector<double> finish_ms;      ///< [workload] when each request finished
  std::vector<int> tokens_before;     ///< [workload] tokens a request resumed with (DéjàVu)
  int num_failures = 0;
  double downtime_ms = 0;             ///< summed over failures: detection + restart
  long long recomputed_tokens = 0;    ///< positions computed again after failures
  std::vector<std::size_t> hit_by_first_failure;  ///< requests in flight at the first failure
  double first_failure_ms = -1;
  long long sidp_switches = 0;
  long long sidp_rank_steps = 0, sidp_cas_rank_steps = 0;
};

/// A SiDP group's shared state while it runs (SidpStrategy).
struct SidpRun {
  engine::SidpMode mode = engine::SidpMode::was;
  int round_ranks = 0;  ///< ranks stepping in the current CaS round
  std::optional<engine::SidpModePolicy> policy;
};

engine::SidpModePolicy::TimePoint virtual_time(double ms) {
  return engine::SidpModePolicy::TimePoint(std::chrono::duration_cast<engine::SidpModePolicy::Clock::duration>(
      std::chrono::duration<double, std::milli>(ms)));
}

}  // namespace

double sidp_was_copy_ms(const DeviceSpec& device, const sim::CostModel& model, int num_ranks,
                        int fetched_layers) {
  if (!device.shared_memory_bus || fetched_layers <= 0) return 0.0;
  return num_ranks * fetched_layers * model.ffn_layer_bytes() / device.host_link_bw_bytes_per_s.value * 1e3;
}

namespace {

/// One run of the workload (full, or prefill-only): the DP replicas'
/// engines over simulated executors, stepped in virtual time (the replica
/// furthest behind steps next; under SiDP's CaS every rank with work, in
/// lockstep rounds), with injected failures (DéjàVu §4.2.3) and SiDP's mode
/// policy. run() is the loop; each phase is one method.
class SimRun {
 public:
  SimRun(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
         const std::vector<SimRequest>& workload, const SimOptions& options, const sim::CostModel& model,
         const sim::CostModel& large_model, const sim::CostModel* shift_model, int num_kv_blocks, bool prefill_only)
      : config_(config), cluster_(cluster), strategy_(strategy), workload_(workload), options_(options),
        model_(model), large_model_(large_model), shift_model_(shift_model), num_kv_blocks_(num_kv_blocks),
        prefill_only_(prefill_only), pc_(strategy.parallel), failures_(strategy.failures),
        weight_bytes_(static_cast<double>(engine::weight_bytes_for(config, cluster.device.weight_dtype))),
        // The engine's own time as fitted for this many busy devices.
        priced_(device_for(cluster, std::min(pc_.world_size(), cluster.devices_per_node()))),
        sidp_link_{cluster.device.intra_node_bw_bytes_per_s.value, cluster.device.intra_node_latency_s.value},
        round_robin_(options.dispatch == SimOptions::Dispatch::round_robin),
        queue_capacity_(round_robin_ ? workload.size() : 2 * static_cast<std::size_t>(options.max_batch)) {}

  [[nodiscard]] Result<RunOutcome> run() {
    out_.tokenizer = std::make_unique<text::IdTokenizer>(config_.vocab_size, -1, -1);
    out_.finish_ms.assign(workload_.size(), -1.0);
    out_.tokens_before.assign(workload_.size(), 0);
    executor_options_ = executor_options();
    auto ec = engine_config();
    if (!ec) return ec.error();
    engine_config_ = std::move(ec).value();
    if (Status st = start_sidp(); !st.ok()) return st.error();
    out_.replicas.resize(static_cast<std::size_t>(pc_.dp));  // (never resized again: start_group takes indices from it)
    for (Replica& r : out_.replicas)
      if (Status st = start_group(r, 0); !st.ok()) return st.error();
    if (Status st = deal(); !st.ok()) return st.error();
    start_failures();
    for (;;) {
      const bool cas = strategy_.sidp && sidp_run_.mode == engine::SidpMode::cas;
      const std::vector<Replica*> round = next_round(cas);
      if (round.empty()) break;
      double round_end_ms = 0;
      for (Replica* pick : round)
        if (Status st = step(*pick, cas, round_end_ms); !st.ok()) return st.error();
      if (strategy_.sidp) {
        // The orchestrator's policy, on the ranks' running and waiting counts.
        if (const auto sw = sidp_run_.policy->decide(virtual_time(round_end_ms)); sw) {
          sidp_run_.mode = sw->to;
          ++out_.sidp_switches;
        }
      }
    }
    if (num_finished_ != workload_.size())
      return make_error(ErrorCode::internal, "simulate: " + std::to_string(num_finished_) + " of " +
                                                 std::to_string(workload_.size()) + " requests finished");
    for (const Replica& r : out_.replicas) out_.elapsed_ms = std::max(out_.elapsed_ms, r.executor->now_ms());
    return std::move(out_);
  }

 private:
  /// What every replica's executor is given: the parallel config, Seesaw's
  /// decode config and KV link, DéjàVu's replication link, Shift's config.
  [[nodiscard]] SimulatedExecutorOptions executor_options() const {
    const kvstore::KvModelShape kv_shape{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
                                         cluster_.device.weight_dtype == DType::f32 ? DType::f32 : DType::bf16};
    SimulatedExecutorOptions eo;
    eo.config = pc_;
    eo.config.dp = 1;
    if (strategy_.seesaw) {
      eo.decode_config = strategy_.seesaw->decode;
      eo.kv_shape = kv_shape;
      eo.weight_bytes = weight_bytes_;
      eo.kv_link_bw_bytes_per_s = cluster_.device.host_link_bw_bytes_per_s.value;
      eo.kv_link_latency_ms = kHostLinkLatencyMs;
    }
    if (failures_ && failures_->replicate_kv) {
      // The replicas live on another node: KV streams out, and comes back
      // after a failure, over the inter-node network.
      eo.kv_shape = kv_shape;
      eo.weight_bytes = weight_bytes_;
      eo.kv_link_bw_bytes_per_s = cluster_.device.inter_node_bw_bytes_per_s.value;
      eo.kv_link_latency_ms = cluster_.device.inter_node_latency_s.value * 1e3;
      eo.replicate_kv = true;
    }
    if (strategy_.shift) {
      engine::ParallelConfig shifted;
      shifted.tp = pc_.tp * pc_.sp;
      eo.shift_config = shifted;
      eo.shift = *strategy_.shift;
      eo.shift_model = shift_model_;
    }
    eo.vocab_size = config_.vocab_size;
    eo.num_kv_blocks = num_kv_blocks_;
    eo.block_size = options_.block_size;
    eo.step_overhead_ms = priced_.step_overhead_ms.value;
    eo.seq_overhead_ms = priced_.seq_overhead_ms.value;
    return eo;
  }

  /// The engines' config: batch limits, the token budget, Seesaw's policy.
  [[nodiscard]] Result<engine::EngineConfig> engine_config() const {
    int max_len = 1;
    for (const SimRequest& r : workload_)
      max_len = std::max(max_len, r.prompt_len + (prefill_only_ ? 1 : r.output_len));
    engine::EngineConfig ec;
    ec.max_num_seqs = options_.max_batch;
    ec.max_num_batched_tokens = options_.max_num_batched_tokens;
    ec.max_model_len = max_len;
    auto budget = engine::make_token_budget_policy(strategy_.token_budget, options_.max_num_batched_tokens);
    if (!budget) return budget.error();
    ec.token_budget = std::shared_ptr<const engine::TokenBudgetPolicy>(std::move(budget).value());
    if (strategy_.seesaw) {
      // Synchronous copies: the executor's virtual links overlap them.
      ec.step_phases = engine::seesaw_phases(engine::SeesawOptions{strategy_.seesaw->policy, false, std::nullopt});
      ec.swap_space_bytes =
          static_cast<std::uint64_t>(strategy_.seesaw->host_buffer_bytes_per_device * pc_.group_size());
    }
    return ec;
  }

  /// SiDP: the group's mode policy (each rank prices its steps in the
  /// group's current mode).
  [[nodiscard]] Status start_sidp() {
    if (!strategy_.sidp) return Status::ok_status();
    engine::SidpModePolicyOptions po;
    po.setting = strategy_.sidp->mode;
    po.switch_batch = strategy_.sidp->switch_batch;
    po.hysteresis = strategy_.sidp->hysteresis;
    po.min_dwell_s = strategy_.sidp->min_dwell_s;
    po.num_ranks = pc_.dp;
    auto policy = engine::SidpModePolicy::create(po);
    if (!policy) return policy.error();
    sidp_run_.policy.emplace(std::move(policy).value());
    sidp_run_.mode = sidp_run_.policy->mode();
    return Status::ok_status();
  }

  /// Rank `rank`'s executor options: under SiDP, its steps priced in the
  /// group's current mode (WaS: the step or the weight fetch of the layers
  /// it does not own, whichever is longer; CaS: its FFN rows run at their
  /// owners).
  [[nodiscard]] SimulatedExecutorOptions options_for(std::size_t rank) const {
    SimulatedExecutorOptions o = executor_options_;
    if (!strategy_.sidp) return o;
    const int layers = config_.num_hidden_layers;
    const int owned = engine::sidp_owned_ffn_layer_count(layers, pc_.dp, static_cast<int>(rank));
    const double fetch_ms = (layers - owned) * model_.sidp_weight_fetch_ms(sidp_link_);
    // On a device that shares one memory bus with its peers (CPU devices),
    // a fetch is a copy that a core makes while the cores compute: the
    // calibrated part of it adds to the step. A GPU's copy engine overlaps
    // it (the paper's setting, §4.1).
    const double copy_ms = sidp_was_copy_ms(cluster_.device, model_, pc_.dp, layers - owned);
    const double row_bytes = static_cast<double>(config_.hidden_size) * model_.sizes().activation_bytes;
    o.price = [&model = model_, &large_model = large_model_, &sidp_run = sidp_run_, &priced = priced_,
               sidp_link = sidp_link_, layers, fetch_ms, copy_ms, row_bytes](const sim::StepShape& shape,
                                                                            const sim::StepCost& cost) {
      const long long n = shape.num_tokens();
      if (sidp_run.mode == engine::SidpMode::was)
        return std::max(cost.total_ms + was_copy_exposed_at(priced, static_cast<double>(n)) * copy_ms, fetch_ms);
      // CaS: the FFN of every layer runs at its owner over the group's G
      // rows; this rank's rows go there and back. G is taken as this rank's
      // n times the ranks of the round (balanced ranks: the ranks' batches
      // of one round are not known until each has stepped). (GEMMs of many
      // rows run at the device's prefill efficiency, as the executor prices
      // them.)
      const auto ffn_ms = [&](long long rows) {
        return (rows >= kLargeStepTokens ? large_model : model).sidp_ffn_gemm_ms(rows);
      };
      const double send_ms = (sidp_link.latency_s + n * row_bytes / sidp_link.bandwidth_bytes_per_s) * 1e3;
      return std::max(0.0, cost.total_ms - layers * ffn_ms(n)) +
             layers * (ffn_ms(n * std::max(1, sidp_run.round_ranks)) + 2 * send_ms);
    };
    return o;
  }

  /// A group's executor and engine, its clock at `start_ms`.
  [[nodiscard]] Status start_group(Replica& r, double start_ms) {
    auto ex = SimulatedExecutor::create(model_, options_for(static_cast<std::size_t>(&r - out_.replicas.data())),
                                        &large_model_, kLargeStepTokens);
    if (!ex) return ex.error();
    r.engine.reset();
    if (r.executor) r.failed.push_back(std::move(r.executor));
    r.executor = std::move(ex).value();
    r.executor->advance_to(start_ms);
    auto eng = engine::LlmEngine::create(*r.executor, *out_.tokenizer, engine_config_);
    if (!eng) return eng.error();
    r.engine = std::move(eng).value();
    return Status::ok_status();
  }

  [[nodiscard]] sampling::SamplingParams params_of(std::size_t i) const {
    sampling::SamplingParams params;
    params.temperature = 0;
    params.ignore_eos = true;
    params.max_tokens = prefill_only_ ? 1 : workload_[i].output_len;
    return params;
  }

  [[nodiscard]] Status add(Replica& r, std::size_t i) {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(workload_[i].prompt_len), 3);
    if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i)); !st.ok()) return st;
    r.live.insert(i);
    return Status::ok_status();
  }

  /// Tops up `r`'s queue from the workload (all was dealt at t = 0 under
  /// round-robin).
  [[nodiscard]] Status fill(Replica& r) {
    if (round_robin_) return Status::ok_status();
    while (r.live.size() < queue_capacity_ && next_ < workload_.size())
      if (Status st = add(r, next_++); !st.ok()) return st;
    return Status::ok_status();
  }

  /// The first deal: round-robin, or WorkerPool::dispatch's (one request
  /// per replica with room per round).
  [[nodiscard]] Status deal() {
    if (round_robin_) {
      for (std::size_t i = 0; i < workload_.size(); ++i)
        if (Status st = add(out_.replicas[i % out_.replicas.size()], i); !st.ok()) return st;
      return Status::ok_status();
    }
    for (bool dealt = true; dealt && next_ < workload_.size();) {
      dealt = false;
      for (Replica& r : out_.replicas) {
        if (r.live.size() >= queue_capacity_ || next_ >= workload_.size()) continue;
        if (Status st = add(r, next_++); !st.ok()) return st;
        dealt = true;
      }
    }
    return Status::ok_status();
  }

  /// Tokens request i of `r` has generated so far (resumed ones included).
  [[nodiscard]] int generated(const Replica& r, std::size_t i) const {
    const auto& times = r.executor->token_times();
    const auto it = times.find(i);
    return out_.tokens_before[i] + (it == times.end() ? 0 : it->second.num_tokens);
  }

  /// The failing group and the failure clock (at given times, at a rate:
  /// exponential gaps of mean mtbf_s, each from the last, or at a token).
  void start_failures() {
    failing_ = failures_ && !prefill_only_ ? &out_.replicas[static_cast<std::size_t>(failures_->group)] : nullptr;
    failure_rng_.seed(failures_ ? failures_->seed : 0);
    next_rate_failure_ms_ =
        failures_ && failures_->mtbf_s > 0 ? next_gap_ms() : std::numeric_limits<double>::infinity();
  }
  [[nodiscard]] double next_gap_ms() {
    return std::exponential_distribution<double>(1.0 / failures_->mtbf_s)(failure_rng_) * 1e3;
  }

  /// Whether the failing group fails after its step that ended now.
  [[nodiscard]] bool failure_due(const Replica& r) {
    if (next_failure_at_ < failures_->at_s.size() && r.executor->now_ms() >= failures_->at_s[next_failure_at_] * 1e3) {
      ++next_failure_at_;
      return true;
    }
    if (r.executor->now_ms() >= next_rate_failure_ms_) {
      next_rate_failure_ms_ = r.executor->now_ms() + next_gap_ms();
      return true;
    }
    if (failures_->at_token > 0 && !token_failure_done_) {
      for (const std::size_t i : r.live)
        if (generated(r, i) >= failures_->at_token) return token_failure_done_ = true;
    }
    return false;
  }

  /// DéjàVu §4.2.3: the group of `r` fails now. Its in-flight requests come
  /// back on a restarted group once the failure is noticed and the weights
  /// are loaded again: from their last token with their KV restored from the
  /// replicas, or (no replication) from scratch.
  [[nodiscard]] Status fail(Replica& r) {
    const double fail_ms = r.executor->now_ms();
    const double reload_ms = weight_bytes_ / static_cast<double>(pc_.tp * pc_.pp) /
                             cluster_.device.host_link_bw_bytes_per_s.value * 1e3;
    const double downtime_ms = failures_->detect_s * 1e3 + reload_ms;
    std::vector<std::pair<std::size_t, int>> lost;
    for (const std::size_t i : r.live) lost.emplace_back(i, generated(r, i));
    if (out_.num_failures == 0) {
      out_.first_failure_ms = fail_ms;
      for (const auto& l : lost) out_.hit_by_first_failure.push_back(l.first);
    }
    ++out_.num_failures;
    out_.downtime_ms += downtime_ms;
    if (Status st = start_group(r, fail_ms + downtime_ms); !st.ok()) return st;
    for (const auto& [i, gen] : lost) {
      std::vector<std::int32_t> prompt(static_cast<std::size_t>(workload_[i].prompt_len), 3);
      if (failures_->replicate_kv && gen > 0) {
        engine::ResumeState resume;
        resume.output_ids.assign(static_cast<std::size_t>(gen), 3);
        resume.num_kv_tokens = workload_[i].prompt_len + gen - 1;
        if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i), std::move(resume)); !st.ok())
          return st;
        out_.tokens_before[i] = gen;
      } else {
        if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i)); !st.ok()) return st;
        out_.recomputed_tokens += workload_[i].prompt_len + std::max(0, gen - 1);
        out_.tokens_before[i] = 0;
      }
    }
    return Status::ok_status();
  }

  /// Who steps next: the replica furthest behind; in SiDP's CaS, every rank
  /// with work, in one lockstep round from a common start.
  [[nodiscard]] std::vector<Replica*> next_round(bool cas) {
    std::vector<Replica*> round;
    if (cas) {
      double barrier = 0;
      for (Replica& r : out_.replicas)
        if (r.engine->has_unfinished()) {
          barrier = std::max(barrier, r.executor->now_ms());
          round.push_back(&r);
        }
      for (Replica* r : round) r->executor->advance_to(barrier);
      sidp_run_.round_ranks = static_cast<int>(round.size());
      return round;
    }
    Replica* pick = nullptr;
    for (Replica& r : out_.replicas)
      if (r.engine->has_unfinished() && (pick == nullptr || r.executor->now_ms() < pick->executor->now_ms()))
        pick = &r;
    if (pick != nullptr) round.push_back(pick);
    return round;
  }

  /// One engine step of `pick`: its records, SiDP's observation, finished
  /// requests, an injected failure, and its queue topped up.
  [[nodiscard]] Status step(Replica& pick, bool cas, double& round_end_ms) {
    auto finished = pick.engine->step();
    if (!finished) return finished.error();
    for (const engine::StepStats& s : pick.engine->step_stats()) pick.preemptions += s.num_preemptions;
    pick.engine->clear_step_stats();
    if (strategy_.sidp) {
      ++out_.sidp_rank_steps;
      if (cas) ++out_.sidp_cas_rank_steps;
      const int rank = static_cast<int>(&pick - out_.replicas.data());
      if (Status st = sidp_run_.policy->observe(virtual_time(pick.executor->now_ms()), rank,
                                                pick.engine->scheduler().num_running(),
                                                pick.engine->scheduler().num_waiting());
          !st.ok())
        return st;
      round_end_ms = std::max(round_end_ms, pick.executor->now_ms());
    }
    const auto& blocks = pick.engine->scheduler().block_manager();
    pick.peak_blocks_used = std::max(pick.peak_blocks_used, num_kv_blocks_ - blocks.num_free_blocks());
    // Every request ends with exactly its tokens (ignore_eos): anything else
    // is an engine bug the simulation would hide.
    for (const engine::RequestOutput& f : *finished) {
      const std::size_t want = prefill_only_ ? 1 : static_cast<std::size_t>(workload_[f.request_id].output_len);
      if (f.token_ids.size() != want)
        return make_error(ErrorCode::internal, "simulate: request " + std::to_string(f.request_id) + " ended with " +
                                                   std::to_string(f.token_ids.size()) + " tokens, not " +
                                                   std::to_string(want));
      pick.live.erase(f.request_id);
      out_.finish_ms[f.request_id] = pick.executor->now_ms();
    }
    num_finished_ += finished->size();
    if (&pick == failing_ && !pick.live.empty() && failure_due(pick))
      if (Status st = fail(pick); !st.ok()) return st;
    return fill(pick);
  }

  const model::ModelConfig& config_;
  const ClusterSpec& cluster_;
  const Strategy& strategy_;
  const std::vector<SimRequest>& workload_;
  const SimOptions& options_;
  const sim::CostModel& model_;
  const sim::CostModel& large_model_;
  const sim::CostModel* shift_model_;
  const int num_kv_blocks_;
  const bool prefill_only_;
  const engine::ParallelConfig& pc_;
  const std::optional<FailureInjection>& failures_;
  const double weight_bytes_;
  const DeviceSpec& priced_;
  const sim::LinkSpec sidp_link_;
  const bool round_robin_;
  const std::size_t queue_capacity_;

  SimulatedExecutorOptions executor_options_;
  engine::EngineConfig engine_config_;
  // Read by the executors' price functions (options_for), so it outlives no
  // step; the run's outcome keeps the executors only for their records.
  SidpRun sidp_run_;
  RunOutcome out_;
  std::size_t next_ = 0;           ///< the next workload request to deal
  std::size_t num_finished_ = 0;
  Replica* failing_ = nullptr;     ///< the group failures hit (failures_->group)
  std::size_t next_failure_at_ = 0;
  bool token_failure_done_ = false;
  std::mt19937_64 failure_rng_;
  double next_rate_failure_ms_ = std::numeric_limits<double>::infinity();
};

Result<RunOutcome> run_once(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                            const std::vector<SimRequest>& workload, const SimOptions& options,
                            const sim::CostModel& model, const sim::CostModel& large_model,
                            const sim::CostModel* shift_model, int num_kv_blocks, bool prefill_only) {
  return SimRun(config, cluster, strategy, workload, options, model, large_model, shift_model, num_kv_blocks,
                prefill_only)
      .run();
}

}  // namespace

std::string Strategy::label() const {
  if (seesaw) {
    const auto degrees = [](const engine::ParallelConfig& c) {
      std::string d;
      for (const auto& [name, v] : {std::pair{"tp", c.tp}, std::pair{"pp", c.pp}, std::pair{"sp", c.sp}})
        if (v > 1) d += (d.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(v);
      return d.empty() ? std::string("single") : d;
    };
    std::string s = "seesaw " + degrees(parallel) + ":" + degrees(seesaw->decode);
    if (parallel.dp > 1) s += ",dp=" + std::to_string(parallel.dp);
    s += " " + token_budget;
    if (seesaw->policy.schedule != engine::SeesawSchedule::transition_minimizing)
      s += std::string(" ") + engine::to_string(seesaw->policy.schedule);
    return s;
  }
  std::string s = parallel.to_string() + " " + token_budget;
  if (shift) s += " shift(T=" + std::to_string(shift->threshold) + ")";
  if (failures) s += failures->replicate_kv ? " failures+replicated-kv" : " failures";
  if (sidp) s += std::string(" sidp(") + engine::to_string(sidp->mode) + ")";
  return s;
}

std::vector<SimRequest> fixed_workload(int num, int input_len, int output_len) {
  return std::vector<SimRequest>(static_cast<std::size_t>(std::max(num, 0)), SimRequest{input_len, output_len});
}

namespace {

/// One rank's memory on `d`: usable bytes, what its weights and its
/// activations (`activation_share` of a whole step's) leave, and the bytes
/// of one KV block of its `layers` layers and `kv_heads` KV heads.
struct RankMemory {
  double usable = 0, weights = 0, activation = 0, left = 0, per_block = 0;
  /// Whole KV blocks in `left` (capped far below INT_MAX).
  [[nodiscard]] int blocks() const {
    return static_cast<int>(std::min(std::floor(left / per_block), double(std::numeric_limits<int>::max() / 2)));
  }
};

RankMemory rank_memory(const model::ModelConfig& config, const DeviceSpec& d, double weights, double activation_share,
                       int layers, int kv_heads, const SimOptions& options) {
  RankMemory m;
  m.usable = static_cast<double>(usable_memory_bytes(d));
  m.weights = weights;
  m.activation =
      static_cast<double>(engine::activation_bytes_for(config, options.max_num_batched_tokens, options.max_batch)) *
      activation_share;
  const double kv_elem = d.weight_dtype == DType::f32 ? 4.0 : 2.0;
  m.per_block = 2.0 * layers * kv_heads * config.head_dim * options.block_size * kv_elem;
  m.left = m.usable - m.weights - m.activation;
  return m;
}

}  // namespace

Result<int> kv_blocks_per_group(const model::ModelConfig& config, const ClusterSpec& cluster,
                                const engine::ParallelConfig& pc, const SimOptions& options) {
  const DeviceSpec& d = cluster.device;
  const RankMemory m =
      rank_memory(config, d, static_cast<double>(engine::weight_bytes_for(config, d.weight_dtype)) / (pc.tp * pc.pp),
                  1.0 / pc.tp, (config.num_hidden_layers + pc.pp - 1) / pc.pp,
                  std::max(1, config.num_key_value_heads / (pc.tp * pc.sp)), options);
  if (m.left <= 0)
    return make_error(ErrorCode::out_of_memory,
                      "on " + d.name + " (" + fixed2(gib(m.usable)) + " GiB usable per device) the weights of one rank of " +
                          pc.to_string() + " (" + fixed2(gib(m.weights)) + " GiB) and its activations (" +
                          fixed2(gib(m.activation)) + " GiB) do not fit");
  return m.blocks();
}

namespace {

/// The workload, the options and the parallel degrees a simulation needs.
Status check_run(const ClusterSpec& cluster, const engine::ParallelConfig& pc, const std::vector<SimRequest>& workload,
                 const SimOptions& options) {
  if (workload.empty()) return make_error(ErrorCode::invalid_argument, "simulate: an empty workload");
  for (const SimRequest& r : workload)
    if (r.prompt_len < 1 || r.output_len < 1)
      return make_error(ErrorCode::invalid_argument, "simulate: prompt and output lengths must be >= 1");
  if (options.max_batch < 1 || options.max_num_batched_tokens < 1 || options.block_size < 1)
    return make_error(ErrorCode::invalid_argument, "simulate: max_batch, max_num_batched_tokens, block_size >= 1");
  if (pc.tp < 1 || pc.pp < 1 || pc.sp < 1 || pc.dp < 1)
    return make_error(ErrorCode::invalid_argument, "simulate: parallel degrees must be >= 1");
  if (pc.world_size() > cluster.num_devices)
    return make_error(ErrorCode::invalid_argument, "simulate: " + pc.to_string() + " needs " +
                                                       std::to_string(pc.world_size()) + " devices; cluster " +
                                                       cluster.name + " has " + std::to_string(cluster.num_devices));
  return Status::ok_status();
}

/// The cost models a run prices its steps with: one group's, its large
/// steps' (prefill efficiency), and Shift's shift-config steps on the
/// device's Shift curve, where it has one.
struct CostModels {
  sim::CostModel model;
  sim::CostModel large_model;
  std::optional<sim::CostModel> shift_model;
};

Result<CostModels> make_cost_models(const model::ModelConfig& config, const ClusterSpec& cluster,
                                    const Strategy& strategy) {
  const engine::ParallelConfig& pc = strategy.parallel;
  const int active_per_node = std::min(pc.world_size(), cluster.devices_per_node());
  auto model = sim::CostModel::create(sim::ModelShape::from_config(config), element_sizes(cluster.device),
                                      group_hardware(cluster, pc.group_size(), active_per_node));
  if (!model) return model.error();
  auto large_model = sim::CostModel::create(
      sim::ModelShape::from_config(config), element_sizes(cluster.device),
      group_hardware(cluster, pc.group_size(), active_per_node, /*large_steps=*/true));
  if (!large_model) return large_model.error();
  CostModels out{std::move(model).value(), std::move(large_model).value(), std::nullopt};
  if (strategy.shift) {
    auto m = sim::CostModel::create(
        sim::ModelShape::from_config(config), element_sizes(cluster.device),
        group_hardware(cluster, pc.group_size(), active_per_node, /*large_steps=*/false, /*shift_steps=*/true));
    if (!m) return m.error();
    out.shift_model.emplace(std::move(m).value());
  }
  return out;
}

/// A failure injection the simulator can run (DéjàVu §4.2.3).
Status check_failures(const Strategy& strategy) {
  if (!strategy.failures) return Status::ok_status();
  const FailureInjection& f = *strategy.failures;
  if (strategy.seesaw)
    return make_error(ErrorCode::invalid_argument, "simulate: failures are not injected into Seesaw strategies");
  if (f.group < 0 || f.group >= strategy.parallel.dp)
    return make_error(ErrorCode::invalid_argument, "simulate: the failing group " + std::to_string(f.group) +
                                                       " is not one of the " + std::to_string(strategy.parallel.dp) +
                                                       " DP groups");
  if (!(f.detect_s >= 0) || f.at_token < 0 || !(f.mtbf_s >= 0) || !std::isfinite(f.mtbf_s))
    return make_error(ErrorCode::invalid_argument,
                      "simulate: failure detection time, token and mean time between failures must be >= 0");
  for (std::size_t i = 0; i < f.at_s.size(); ++i)
    if (!(f.at_s[i] >= 0) || (i > 0 && f.at_s[i] < f.at_s[i - 1]))
      return make_error(ErrorCode::invalid_argument, "simulate: failure times must be >= 0 and ascending");
  if (f.at_s.empty() && f.at_token == 0 && f.mtbf_s == 0)
    return make_error(ErrorCode::invalid_argument,
                      "simulate: a failure injection needs times, a token or a mean time between failures");
  return Status::ok_status();
}

/// The KV each group's engine gets: blocks per group (one block count per
/// run) and the cluster's KV capacity in tokens.
struct KvPlan {
  int num_kv_blocks = 0;
  long long kv_capacity_tokens = 0;
};

/// SiDP's ranks: each holds the attention side, its own FFN layers and the
/// cache slots, and the KV gets the rest (engine/sidp_memory.hpp); every
/// rank's engine gets the least. Fills in b* (resolved->sidp->switch_batch)
/// from the cost model when the strategy leaves it to the simulator.
Status plan_sidp_kv(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                    const SimOptions& options, const sim::CostModel& model, KvPlan& plan, Strategy& resolved) {
  const engine::ParallelConfig& pc = strategy.parallel;
  const SidpStrategy& sd = *strategy.sidp;
  if (pc.tp != 1 || pc.pp != 1 || pc.sp != 1 || pc.dp < 2 || strategy.shift || strategy.seesaw || strategy.failures)
    return make_error(ErrorCode::invalid_argument,
                      "simulate: SiDP runs dp >= 2 single-device ranks (no tp, pp, sp, Shift, Seesaw or failures); got " +
                          pc.to_string());
  if (sd.cache_slots < 1) return make_error(ErrorCode::invalid_argument, "simulate: SiDP needs >= 1 cache slot");
  const DeviceSpec& d = cluster.device;
  int least = std::numeric_limits<int>::max();
  plan.kv_capacity_tokens = 0;
  for (int r = 0; r < pc.dp; ++r) {
    const int owned = engine::sidp_owned_ffn_layer_count(config.num_hidden_layers, pc.dp, r);
    const RankMemory m = rank_memory(
        config, d, static_cast<double>(engine::sidp_weight_bytes_for(config, d.weight_dtype, owned, sd.cache_slots)),
        1.0, config.num_hidden_layers, config.num_key_value_heads, options);
    if (m.left < m.per_block)
      return make_error(ErrorCode::out_of_memory, "on " + d.name + " (" + fixed2(gib(m.usable)) +
                                                      " GiB usable per device) SiDP rank " + std::to_string(r) +
                                                      "'s weights (" + fixed2(gib(m.weights)) + " GiB) and activations (" +
                                                      fixed2(gib(m.activation)) + " GiB) leave no KV");
    const int rank_blocks = m.blocks();
    least = std::min(least, rank_blocks);
    plan.kv_capacity_tokens += static_cast<long long>(rank_blocks) * options.block_size;
  }
  plan.num_kv_blocks = least;
  if (sd.switch_batch <= 0) {
    auto b = model.sidp_switch_batch_overlapped(
        sim::LinkSpec{d.intra_node_bw_bytes_per_s.value, d.intra_node_latency_s.value}, pc.dp);
    if (!b) return b.error();
    resolved.sidp->switch_batch = pc.dp * b->switch_batch;
  }
  return Status::ok_status();
}

/// Seesaw's cp and cd on the same devices: one block table serves both
/// configs, so the fewer blocks of the two.
Status plan_seesaw_kv(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                      const SimOptions& options, KvPlan& plan) {
  const engine::ParallelConfig& pc = strategy.parallel;
  if (strategy.shift) return make_error(ErrorCode::invalid_argument, "simulate: Seesaw does not go with Shift");
  engine::ParallelConfig cd = strategy.seesaw->decode;
  cd.dp = pc.dp;
  if (cd.group_size() != pc.group_size())
    return make_error(ErrorCode::invalid_argument, "simulate: Seesaw's cp " + pc.to_string() + " and cd " +
                                                       cd.to_string() + " must use the same devices");
  if (Status st = strategy.seesaw->policy.validate(); !st.ok()) return st.error();
  if (!(strategy.seesaw->host_buffer_bytes_per_device > 0))
    return make_error(ErrorCode::invalid_argument, "simulate: Seesaw's host KV buffer must be > 0 bytes");
  auto cd_blocks = kv_blocks_per_group(config, cluster, cd, options);
  if (!cd_blocks) return cd_blocks.error();
  plan.num_kv_blocks = std::min(plan.num_kv_blocks, *cd_blocks);
  plan.kv_capacity_tokens = static_cast<long long>(plan.num_kv_blocks) * options.block_size * pc.dp;
  return Status::ok_status();
}

/// The KV plan of a run: the checks of its strategy's failures, SiDP and
/// Seesaw, in that order, and room for the longest request.
Result<KvPlan> plan_kv(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                       const std::vector<SimRequest>& workload, const SimOptions& options,
                       const sim::CostModel& model, Strategy& resolved) {
  const engine::ParallelConfig& pc = strategy.parallel;
  auto blocks = kv_blocks_per_group(config, cluster, pc, options);
  if (!blocks) return blocks.error();
  if (Status st = check_failures(strategy); !st.ok()) return st.error();
  KvPlan plan{*blocks, static_cast<long long>(*blocks) * options.block_size * pc.dp};
  if (strategy.sidp)
    if (Status st = plan_sidp_kv(config, cluster, strategy, options, model, plan, resolved); !st.ok())
      return st.error();
  if (strategy.seesaw)
    if (Status st = plan_seesaw_kv(config, cluster, strategy, options, plan); !st.ok()) return st.error();
  int longest = 0;
  for (const SimRequest& r : workload) longest = std::max(longest, r.prompt_len + r.output_len);
  const long long group_tokens = static_cast<long long>(plan.num_kv_blocks) * options.block_size;
  if (group_tokens < longest)
    return make_error(ErrorCode::out_of_memory, "simulate: " + pc.to_string() + " on " + cluster.device.name +
                                                    " leaves KV for " + std::to_string(group_tokens) +
                                                    " tokens per group; the longest request needs " +
                                                    std::to_string(longest));
  return plan;
}

/// The figures of a full run, read from its executors' records: time in
/// prefill and decode, TTFT and TPOT, the decode step at the largest batch,
/// Shift's and Seesaw's counters, KV peaks and pipeline bubbles.
void summarize_full_run(const RunOutcome& full, const model::ModelConfig& config, const Strategy& strategy,
                        int num_kv_blocks, SimResult& res) {
  const engine::ParallelConfig& pc = strategy.parallel;
  std::vector<double> ttft, tpot, decode_intervals;
  long long shifted = 0;
  double bubble_sum = 0;
  for (const Replica& r : full.replicas) {
    // After failures a group ran on several executors, oldest first.
    std::vector<const SimulatedExecutor*> executors;
    for (const auto& f : r.failed) executors.push_back(f.get());
    executors.push_back(r.executor.get());
    std::map<std::uint64_t, TokenTimes> times;
    for (const SimulatedExecutor* e : executors)
      for (const auto& [id, t] : e->token_times()) {
        TokenTimes& m = times[id];
        if (m.first_ms < 0) m.first_ms = t.first_ms;
        m.last_ms = t.last_ms;
        m.num_tokens += t.num_tokens;
      }
    for (const auto& [id, t] : times) {
      ttft.push_back(t.first_ms);
      if (t.num_tokens > 1) tpot.push_back((t.last_ms - t.first_ms) / (t.num_tokens - 1));
    }
    double prev_end = 0;
    for (const SimulatedExecutor* e : executors) {
      const auto& recs = e->records();
      for (std::size_t k = 0; k < recs.size(); ++k) {
        const MicroBatchRecord& m = recs[k];
        const double interval = m.end_ms - prev_end;
        prev_end = std::max(prev_end, m.end_ms);
        (m.num_prefill_tokens > 0 ? res.prefill_time_s : res.decode_time_s) += interval / 1e3;
        // A step that waited for KV on a link, or the first after a restart
        // (its interval holds the downtime), is not a decode step's time.
        const bool stalled = m.kv_wait_ms > 0 || (k == 0 && e != executors.front());
        if (m.num_prefill_tokens == 0 && m.num_decode_tokens > 0 && !stalled) {
          if (m.num_decode_tokens > res.decode_batch) {
            res.decode_batch = m.num_decode_tokens;
            decode_intervals.clear();
          }
          if (m.num_decode_tokens == res.decode_batch) decode_intervals.push_back(interval);
        }
        if (m.shifted) ++shifted;
      }
      res.num_micro_batches += static_cast<long long>(recs.size());
      res.shift_switches += e->shift_switches();
      const SimulatedExecutor::LinkStats& st = e->link_stats();
      if (strategy.seesaw) {
        res.seesaw_transitions += st.transitions;
        res.seesaw_transition_s += st.transition_ms / 1e3;
        res.seesaw_reload_s += st.reload_ms / 1e3;
        res.seesaw_offload_bytes += st.bytes_to_host;
        res.seesaw_onboard_bytes += st.bytes_to_device;
        res.seesaw_onboard_wait_s += st.onboard_wait_ms / 1e3;
      }
      res.replicated_bytes += st.replicated_bytes;
      if (strategy.failures) res.restored_bytes += st.bytes_to_device;
    }
    res.num_preemptions += r.preemptions;
    const engine::SeesawPhases* phases = engine::seesaw_phases_of(*r.engine);
    res.seesaw_host_peak_bytes = std::max(
        res.seesaw_host_peak_bytes, static_cast<double>(phases != nullptr ? phases->stats().host_peak_tokens : 0) *
                                        static_cast<double>(kvstore::chunk_bytes(
                                            r.executor->kv_model_shape(), kvstore::KvRange{0, config.num_hidden_layers, 0, 1})));
    res.kv_peak_fraction = std::max(res.kv_peak_fraction, double(r.peak_blocks_used) / std::max(1, num_kv_blocks));
    if (pc.pp > 1 && r.executor->now_ms() > 0) {
      double busy = 0;
      for (const SimulatedExecutor* e : executors)
        for (const double b : e->stage_busy_ms()) busy += b;
      bubble_sum += 1.0 - busy / (pc.pp * r.executor->now_ms());
    }
  }
  res.ttft_ms = percentiles(ttft);
  res.tpot_ms = percentiles(tpot);
  res.decode_step_ms = median(decode_intervals);
  // (Seesaw's phases run different stage counts: no single bubble figure.)
  res.bubble_fraction = pc.pp > 1 && !strategy.seesaw ? bubble_sum / pc.dp : 0.0;
  if (res.num_micro_batches > 0) res.shift_step_fraction = double(shifted) / double(res.num_micro_batches);
}

/// DéjàVu's figures of a run with failures, beside the same run without
/// them: how much later the requests the first failure hit finished
/// (DéjàVu Fig. 10's latency increase). (Replication, and its streaming,
/// stay on: only the failures go.)
Status add_failure_figures(const RunOutcome& full, const model::ModelConfig& config, const ClusterSpec& cluster,
                           const Strategy& strategy, const std::vector<SimRequest>& workload,
                           const SimOptions& options, const CostModels& models, int num_kv_blocks, SimResult& res) {
  res.num_failures = full.num_failures;
  res.failure_downtime_s = full.downtime_ms / 1e3;
  res.failure_recomputed_tokens = full.recomputed_tokens;
  res.num_failure_hit_requests = static_cast<int>(full.hit_by_first_failure.size());
  res.first_failure_s = full.first_failure_ms / 1e3;
  Strategy clean = strategy;
  clean.failures->at_s.clear();
  clean.failures->at_token = 0;
  clean.failures->mtbf_s = 0;
  auto ref = run_once(config, cluster, clean, workload, options, models.model, models.large_model,
                      models.shift_model ? &*models.shift_model : nullptr, num_kv_blocks, /*prefill_only=*/false);
  if (!ref) return ref.error();
  res.failure_free_elapsed_s = ref->elapsed_ms / 1e3;
  double ratio_sum = 0;
  for (const std::size_t i : full.hit_by_first_failure)
    if (ref->finish_ms[i] > 0) ratio_sum += full.finish_ms[i] / ref->finish_ms[i];
  if (!full.hit_by_first_failure.empty())
    res.failure_latency_ratio = ratio_sum / static_cast<double>(full.hit_by_first_failure.size());
  return Status::ok_status();
}

/// The prefill-only run: prefill throughput, and decode's as the rest of
/// the full run's time.
Status add_prefill_figures(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& resolved,
                           const std::vector<SimRequest>& workload, const SimOptions& options,
                           const CostModels& models, int num_kv_blocks, SimResult& res) {
  auto pre = run_once(config, cluster, resolved, workload, options, models.model, models.large_model,
                      models.shift_model ? &*models.shift_model : nullptr, num_kv_blocks, /*prefill_only=*/true);
  if (!pre) return pre.error();
  res.prefill_elapsed_s = pre->elapsed_ms / 1e3;
  if (res.prefill_elapsed_s > 0) res.prefill_tok_s = static_cast<double>(res.prompt_tokens) / res.prefill_elapsed_s;
  const double decode_s = res.elapsed_s - res.prefill_elapsed_s;
  if (decode_s > 0) res.decode_tok_s = static_cast<double>(res.generated_tokens - res.num_requests) / decode_s;
  return Status::ok_status();
}

}  // namespace

Result<SimResult> simulate(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                           const std::vector<SimRequest>& workload, const SimOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const engine::ParallelConfig& pc = strategy.parallel;
  if (Status st = check_run(cluster, pc, workload, options); !st.ok()) return st.error();
  auto models = make_cost_models(config, cluster, strategy);
  if (!models) return models.error();
  Strategy resolved = strategy;  // with SiDP's b* filled in
  auto kv = plan_kv(config, cluster, strategy, workload, options, models->model, resolved);
  if (!kv) return kv.error();
  const int blocks = kv->num_kv_blocks;

  SimResult res;
  res.strategy = strategy.label();
  res.parallel = pc.to_string();
  res.token_budget = strategy.token_budget;
  res.num_devices = pc.world_size();
  res.num_requests = static_cast<int>(workload.size());
  res.num_kv_blocks = blocks;
  res.kv_capacity_tokens = kv->kv_capacity_tokens;
  for (const SimRequest& r : workload) {
    res.prompt_tokens += r.prompt_len;
    res.generated_tokens += r.output_len;
  }
  const sim::CostModel* shift_model = models->shift_model ? &*models->shift_model : nullptr;
  auto full = run_once(config, cluster, resolved, workload, options, models->model, models->large_model, shift_model,
                       blocks, /*prefill_only=*/false);
  if (!full) return full.error();
  res.elapsed_s = full->elapsed_ms / 1e3;
  if (res.elapsed_s > 0) res.total_tok_s = static_cast<double>(res.prompt_tokens + res.generated_tokens) / res.elapsed_s;
  summarize_full_run(*full, config, strategy, blocks, res);
  if (resolved.sidp) {
    res.sidp_switches = full->sidp_switches;
    res.sidp_switch_batch = resolved.sidp->switch_batch;
    if (full->sidp_rank_steps > 0)
      res.sidp_cas_step_fraction = double(full->sidp_cas_rank_steps) / double(full->sidp_rank_steps);
  }
  if (strategy.failures)
    if (Status st = add_failure_figures(*full, config, cluster, strategy, workload, options, *models, blocks, res);
        !st.ok())
      return st.error();
  if (options.prefill_run)
    if (Status st = add_prefill_figures(config, cluster, resolved, workload, options, *models, blocks, res); !st.ok())
      return st.error();
  res.sim_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace shardline::sim
