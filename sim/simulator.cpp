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

Result<RunOutcome> run_once(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                            const std::vector<SimRequest>& workload, const SimOptions& options,
                            const sim::CostModel& model, const sim::CostModel& large_model,
                            const sim::CostModel* shift_model, int num_kv_blocks, bool prefill_only) {
  const engine::ParallelConfig& pc = strategy.parallel;
  const std::optional<FailureInjection>& failures = strategy.failures;
  int max_len = 1;
  for (const SimRequest& r : workload) max_len = std::max(max_len, r.prompt_len + (prefill_only ? 1 : r.output_len));
  RunOutcome out;
  out.tokenizer = std::make_unique<text::IdTokenizer>(config.vocab_size, -1, -1);
  out.finish_ms.assign(workload.size(), -1.0);
  out.tokens_before.assign(workload.size(), 0);
  const kvstore::KvModelShape kv_shape{config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                       cluster.device.weight_dtype == DType::f32 ? DType::f32 : DType::bf16};
  const double weight_bytes = static_cast<double>(engine::weight_bytes_for(config, cluster.device.weight_dtype));
  SimulatedExecutorOptions eo;
  eo.config = pc;
  eo.config.dp = 1;
  if (strategy.seesaw) {
    eo.decode_config = strategy.seesaw->decode;
    eo.kv_shape = kv_shape;
    eo.weight_bytes = weight_bytes;
    eo.kv_link_bw_bytes_per_s = cluster.device.host_link_bw_bytes_per_s.value;
    eo.kv_link_latency_ms = kHostLinkLatencyMs;
  }
  if (failures && failures->replicate_kv) {
    // The replicas live on another node: KV streams out, and comes back
    // after a failure, over the inter-node network.
    eo.kv_shape = kv_shape;
    eo.weight_bytes = weight_bytes;
    eo.kv_link_bw_bytes_per_s = cluster.device.inter_node_bw_bytes_per_s.value;
    eo.kv_link_latency_ms = cluster.device.inter_node_latency_s.value * 1e3;
    eo.replicate_kv = true;
  }
  if (strategy.shift) {
    engine::ParallelConfig shifted;
    shifted.tp = pc.tp * pc.sp;
    eo.shift_config = shifted;
    eo.shift = *strategy.shift;
    eo.shift_model = shift_model;
  }
  eo.vocab_size = config.vocab_size;
  eo.num_kv_blocks = num_kv_blocks;
  eo.block_size = options.block_size;
  // The engine's own time as fitted for this many busy devices.
  const DeviceSpec& priced = device_for(cluster, std::min(pc.world_size(), cluster.devices_per_node()));
  eo.step_overhead_ms = priced.step_overhead_ms.value;
  eo.seq_overhead_ms = priced.seq_overhead_ms.value;
  engine::EngineConfig ec;
  ec.max_num_seqs = options.max_batch;
  ec.max_num_batched_tokens = options.max_num_batched_tokens;
  ec.max_model_len = max_len;
  auto budget = engine::make_token_budget_policy(strategy.token_budget, options.max_num_batched_tokens);
  if (!budget) return budget.error();
  ec.token_budget = std::shared_ptr<const engine::TokenBudgetPolicy>(std::move(budget).value());
  if (strategy.seesaw) {
    ec.seesaw = strategy.seesaw->policy;
    ec.seesaw_async_kv = false;  // the executor's virtual links overlap the copies
    ec.swap_space_bytes = static_cast<std::uint64_t>(strategy.seesaw->host_buffer_bytes_per_device * pc.group_size());
  }
  // SiDP: each rank prices its steps in the group's current mode.
  SidpRun sidp_run;
  const sim::LinkSpec sidp_link{cluster.device.intra_node_bw_bytes_per_s.value,
                                         cluster.device.intra_node_latency_s.value};
  if (strategy.sidp) {
    engine::SidpModePolicyOptions po;
    po.setting = strategy.sidp->mode;
    po.switch_batch = strategy.sidp->switch_batch;
    po.hysteresis = strategy.sidp->hysteresis;
    po.min_dwell_s = strategy.sidp->min_dwell_s;
    po.num_ranks = pc.dp;
    auto policy = engine::SidpModePolicy::create(po);
    if (!policy) return policy.error();
    sidp_run.policy.emplace(std::move(policy).value());
    sidp_run.mode = sidp_run.policy->mode();
  }
  auto options_for = [&](std::size_t rank) {
    SimulatedExecutorOptions o = eo;
    if (!strategy.sidp) return o;
    const int layers = config.num_hidden_layers;
    const int owned = engine::sidp_owned_ffn_layer_count(layers, pc.dp, static_cast<int>(rank));
    const double fetch_ms = (layers - owned) * model.sidp_weight_fetch_ms(sidp_link);
    // On a device that shares one memory bus with its peers (CPU devices),
    // a fetch is a copy that a core makes while the cores compute: the
    // calibrated part of it adds to the step. A GPU's copy engine overlaps
    // it (the paper's setting, §4.1).
    const double copy_ms = sidp_was_copy_ms(cluster.device, model, pc.dp, layers - owned);
    const double row_bytes = static_cast<double>(config.hidden_size) * model.sizes().activation_bytes;
    o.price = [&model, &large_model, &sidp_run, &priced, sidp_link, layers, fetch_ms, copy_ms, row_bytes](
                  const sim::StepShape& shape, const sim::StepCost& cost) {
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
  };
  // A group's executor and engine, its clock at `start_ms`.
  auto start_group = [&](Replica& r, double start_ms) -> Status {
    auto ex = SimulatedExecutor::create(model, options_for(static_cast<std::size_t>(&r - out.replicas.data())), &large_model,
                                        kLargeStepTokens);
    if (!ex) return ex.error();
    r.engine.reset();
    if (r.executor) r.failed.push_back(std::move(r.executor));
    r.executor = std::move(ex).value();
    r.executor->advance_to(start_ms);
    auto eng = engine::LlmEngine::create(*r.executor, *out.tokenizer, ec);
    if (!eng) return eng.error();
    r.engine = std::move(eng).value();
    return Status::ok_status();
  };
  out.replicas.resize(static_cast<std::size_t>(pc.dp));  // (never resized again: start_group takes indices from it)
  for (Replica& r : out.replicas)
    if (Status st = start_group(r, 0); !st.ok()) return st.error();

  auto params_of = [&](std::size_t i) {
    sampling::SamplingParams params;
    params.temperature = 0;
    params.ignore_eos = true;
    params.max_tokens = prefill_only ? 1 : workload[i].output_len;
    return params;
  };
  const bool round_robin = options.dispatch == SimOptions::Dispatch::round_robin;
  const std::size_t queue_capacity = round_robin ? workload.size() : 2 * static_cast<std::size_t>(options.max_batch);
  std::size_t next = 0;
  auto add = [&](Replica& r, std::size_t i) -> Status {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(workload[i].prompt_len), 3);
    if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i)); !st.ok()) return st;
    r.live.insert(i);
    return Status::ok_status();
  };
  auto fill = [&](Replica& r) -> Status {
    if (round_robin) return Status::ok_status();  // all dealt at t = 0
    while (r.live.size() < queue_capacity && next < workload.size())
      if (Status st = add(r, next++); !st.ok()) return st;
    return Status::ok_status();
  };
  if (round_robin) {
    for (std::size_t i = 0; i < workload.size(); ++i)
      if (Status st = add(out.replicas[i % out.replicas.size()], i); !st.ok()) return st.error();
  } else {
    // WorkerPool::dispatch: one request per replica with room per round.
    for (bool dealt = true; dealt && next < workload.size();) {
      dealt = false;
      for (Replica& r : out.replicas) {
        if (r.live.size() >= queue_capacity || next >= workload.size()) continue;
        if (Status st = add(r, next++); !st.ok()) return st.error();
        dealt = true;
      }
    }
  }

  // Tokens request i of `r` has generated so far (resumed ones included).
  auto generated = [&](const Replica& r, std::size_t i) {
    const auto& times = r.executor->token_times();
    const auto it = times.find(i);
    return out.tokens_before[i] + (it == times.end() ? 0 : it->second.num_tokens);
  };
  // DéjàVu §4.2.3: the group of `r` fails now. Its in-flight requests come
  // back on a restarted group once the failure is noticed and the weights
  // are loaded again: from their last token with their KV restored from the
  // replicas, or (no replication) from scratch.
  auto fail = [&](Replica& r) -> Status {
    const double fail_ms = r.executor->now_ms();
    const double reload_ms = weight_bytes / static_cast<double>(pc.tp * pc.pp) /
                             cluster.device.host_link_bw_bytes_per_s.value * 1e3;
    const double downtime_ms = failures->detect_s * 1e3 + reload_ms;
    std::vector<std::pair<std::size_t, int>> lost;
    for (const std::size_t i : r.live) lost.emplace_back(i, generated(r, i));
    if (out.num_failures == 0) {
      out.first_failure_ms = fail_ms;
      for (const auto& l : lost) out.hit_by_first_failure.push_back(l.first);
    }
    ++out.num_failures;
    out.downtime_ms += downtime_ms;
    if (Status st = start_group(r, fail_ms + downtime_ms); !st.ok()) return st;
    for (const auto& [i, gen] : lost) {
      std::vector<std::int32_t> prompt(static_cast<std::size_t>(workload[i].prompt_len), 3);
      if (failures->replicate_kv && gen > 0) {
        engine::ResumeState resume;
        resume.output_ids.assign(static_cast<std::size_t>(gen), 3);
        resume.num_kv_tokens = workload[i].prompt_len + gen - 1;
        if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i), std::move(resume)); !st.ok()) return st;
        out.tokens_before[i] = gen;
      } else {
        if (Status st = r.engine->add_request(i, std::move(prompt), params_of(i)); !st.ok()) return st;
        out.recomputed_tokens += workload[i].prompt_len + std::max(0, gen - 1);
        out.tokens_before[i] = 0;
      }
    }
    return Status::ok_status();
  };
  std::size_t next_failure_at = 0;
  bool token_failure_done = false;
  Replica* failing =
      failures && !prefill_only ? &out.replicas[static_cast<std::size_t>(failures->group)] : nullptr;
  // Failures at a rate: exponential gaps of mean mtbf_s, each from the last.
  std::mt19937_64 failure_rng(failures ? failures->seed : 0);
  const auto next_gap_ms = [&] {
    return std::exponential_distribution<double>(1.0 / failures->mtbf_s)(failure_rng) * 1e3;
  };
  double next_rate_failure_ms =
      failures && failures->mtbf_s > 0 ? next_gap_ms() : std::numeric_limits<double>::infinity();

  std::size_t num_finished = 0;
  for (;;) {
    // Who steps next: the replica furthest behind; in SiDP's CaS, every rank
    // with work, in one lockstep round from a common start.
    std::vector<Replica*> round;
    const bool cas = strategy.sidp && sidp_run.mode == engine::SidpMode::cas;
    if (cas) {
      double barrier = 0;
      for (Replica& r : out.replicas)
        if (r.engine->has_unfinished()) {
          barrier = std::max(barrier, r.executor->now_ms());
          round.push_back(&r);
        }
      for (Replica* r : round) r->executor->advance_to(barrier);
      sidp_run.round_ranks = static_cast<int>(round.size());
    } else {
      Replica* pick = nullptr;
      for (Replica& r : out.replicas)
        if (r.engine->has_unfinished() && (pick == nullptr || r.executor->now_ms() < pick->executor->now_ms()))
          pick = &r;
      if (pick != nullptr) round.push_back(pick);
    }
    if (round.empty()) break;
    double round_end_ms = 0;
    for (Replica* pick : round) {
      auto finished = pick->engine->step();
      if (!finished) return finished.error();
      for (const engine::StepStats& s : pick->engine->step_stats()) pick->preemptions += s.num_preemptions;
      pick->engine->clear_step_stats();
      if (strategy.sidp) {
        ++out.sidp_rank_steps;
        if (cas) ++out.sidp_cas_rank_steps;
        const int rank = static_cast<int>(pick - out.replicas.data());
        if (Status st = sidp_run.policy->observe(virtual_time(pick->executor->now_ms()), rank,
                                                 pick->engine->scheduler().num_running(),
                                                 pick->engine->scheduler().num_waiting());
            !st.ok())
          return st.error();
        round_end_ms = std::max(round_end_ms, pick->executor->now_ms());
      }
      const auto& blocks = pick->engine->scheduler().block_manager();
      pick->peak_blocks_used = std::max(pick->peak_blocks_used, num_kv_blocks - blocks.num_free_blocks());
      // Every request ends with exactly its tokens (ignore_eos): anything else
      // is an engine bug the simulation would hide.
      for (const engine::RequestOutput& f : *finished) {
        const std::size_t want = prefill_only ? 1 : static_cast<std::size_t>(workload[f.request_id].output_len);
        if (f.token_ids.size() != want)
          return make_error(ErrorCode::internal, "simulate: request " + std::to_string(f.request_id) + " ended with " +
                                                     std::to_string(f.token_ids.size()) + " tokens, not " +
                                                     std::to_string(want));
        pick->live.erase(f.request_id);
        out.finish_ms[f.request_id] = pick->executor->now_ms();
      }
      num_finished += finished->size();
      if (pick == failing && !pick->live.empty()) {
        bool hit = false;
        if (next_failure_at < failures->at_s.size() && pick->executor->now_ms() >= failures->at_s[next_failure_at] * 1e3) {
          ++next_failure_at;
          hit = true;
        } else if (pick->executor->now_ms() >= next_rate_failure_ms) {
          next_rate_failure_ms = pick->executor->now_ms() + next_gap_ms();
          hit = true;
        } else if (failures->at_token > 0 && !token_failure_done) {
          for (const std::size_t i : pick->live)
            if (generated(*pick, i) >= failures->at_token) {
              hit = token_failure_done = true;
              break;
            }
        }
        if (hit)
          if (Status st = fail(*pick); !st.ok()) return st.error();
      }
      if (Status st = fill(*pick); !st.ok()) return st.error();
    }
    if (strategy.sidp) {
      // The orchestrator's policy, on the ranks' running and waiting counts.
      if (const auto sw = sidp_run.policy->decide(virtual_time(round_end_ms)); sw) {
        sidp_run.mode = sw->to;
        ++out.sidp_switches;
      }
    }
  }
  if (num_finished != workload.size())
    return make_error(ErrorCode::internal, "simulate: " + std::to_string(num_finished) + " of " +
                                               std::to_string(workload.size()) + " requests finished");
  for (const Replica& r : out.replicas) out.elapsed_ms = std::max(out.elapsed_ms, r.executor->now_ms());
  return out;
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

Result<SimResult> simulate(const model::ModelConfig& config, const ClusterSpec& cluster, const Strategy& strategy,
                           const std::vector<SimRequest>& workload, const SimOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (workload.empty()) return make_error(ErrorCode::invalid_argument, "simulate: an empty workload");
  for (const SimRequest& r : workload)
    if (r.prompt_len < 1 || r.output_len < 1)
      return make_error(ErrorCode::invalid_argument, "simulate: prompt and output lengths must be >= 1");
  if (options.max_batch < 1 || options.max_num_batched_tokens < 1 || options.block_size < 1)
    return make_error(ErrorCode::invalid_argument, "simulate: max_batch, max_num_batched_tokens, block_size >= 1");
  const engine::ParallelConfig& pc = strategy.parallel;
  if (pc.tp < 1 || pc.pp < 1 || pc.sp < 1 || pc.dp < 1)
    return make_error(ErrorCode::invalid_argument, "simulate: parallel degrees must be >= 1");
  if (pc.world_size() > cluster.num_devices)
    return make_error(ErrorCode::invalid_argument, "simulate: " + pc.to_string() + " needs " +
                                                       std::to_string(pc.world_size()) + " devices; cluster " +
                                                       cluster.name + " has " + std::to_string(cluster.num_devices));
  const int active_per_node = std::min(pc.world_size(), cluster.devices_per_node());
  auto model = sim::CostModel::create(sim::ModelShape::from_config(config),
                                               element_sizes(cluster.device),
                                               group_hardware(cluster, pc.group_size(), active_per_node));
  if (!model) return model.error();
  auto large_model = sim::CostModel::create(
      sim::ModelShape::from_config(config), element_sizes(cluster.device),
      group_hardware(cluster, pc.group_size(), active_per_node, /*large_steps=*/true));
  if (!large_model) return large_model.error();
  // Shift's shift-config steps on the device's Shift curve, where it has one.
  std::optional<sim::CostModel> shift_model_storage;
  if (strategy.shift) {
    auto m = sim::CostModel::create(
        sim::ModelShape::from_config(config), element_sizes(cluster.device),
        group_hardware(cluster, pc.group_size(), active_per_node, /*large_steps=*/false, /*shift_steps=*/true));
    if (!m) return m.error();
    shift_model_storage.emplace(std::move(m).value());
  }
  const sim::CostModel* shift_model = shift_model_storage ? &*shift_model_storage : nullptr;
  auto blocks = kv_blocks_per_group(config, cluster, pc, options);
  if (!blocks) return blocks.error();
  if (strategy.failures) {
    const FailureInjection& f = *strategy.failures;
    if (strategy.seesaw)
      return make_error(ErrorCode::invalid_argument, "simulate: failures are not injected into Seesaw strategies");
    if (f.group < 0 || f.group >= pc.dp)
      return make_error(ErrorCode::invalid_argument, "simulate: the failing group " + std::to_string(f.group) +
                                                         " is not one of the " + std::to_string(pc.dp) + " DP groups");
    if (!(f.detect_s >= 0) || f.at_token < 0 || !(f.mtbf_s >= 0) || !std::isfinite(f.mtbf_s))
      return make_error(ErrorCode::invalid_argument,
                        "simulate: failure detection time, token and mean time between failures must be >= 0");
    for (std::size_t i = 0; i < f.at_s.size(); ++i)
      if (!(f.at_s[i] >= 0) || (i > 0 && f.at_s[i] < f.at_s[i - 1]))
        return make_error(ErrorCode::invalid_argument, "simulate: failure times must be >= 0 and ascending");
    if (f.at_s.empty() && f.at_token == 0 && f.mtbf_s == 0)
      return make_error(ErrorCode::invalid_argument,
                        "simulate: a failure injection needs times, a token or a mean time between failures");
  }
  long long kv_capacity_tokens = static_cast<long long>(*blocks) * options.block_size * pc.dp;
  Strategy resolved = strategy;  // with SiDP's b* filled in
  if (strategy.sidp) {
    const SidpStrategy& sd = *strategy.sidp;
    if (pc.tp != 1 || pc.pp != 1 || pc.sp != 1 || pc.dp < 2 || strategy.shift || strategy.seesaw || strategy.failures)
      return make_error(ErrorCode::invalid_argument,
                        "simulate: SiDP runs dp >= 2 single-device ranks (no tp, pp, sp, Shift, Seesaw or failures); got " +
                            pc.to_string());
    if (sd.cache_slots < 1) return make_error(ErrorCode::invalid_argument, "simulate: SiDP needs >= 1 cache slot");
    // Each rank holds the attention side, its own FFN layers and the slots:
    // the KV gets the rest (engine/sidp_memory.hpp).
    const DeviceSpec& d = cluster.device;
    int least = std::numeric_limits<int>::max();
    kv_capacity_tokens = 0;
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
      kv_capacity_tokens += static_cast<long long>(rank_blocks) * options.block_size;
    }
    // Every rank's engine gets the least (one block count per run).
    *blocks = least;
    if (sd.switch_batch <= 0) {
      auto b = model->sidp_switch_batch_overlapped(
          sim::LinkSpec{d.intra_node_bw_bytes_per_s.value, d.intra_node_latency_s.value}, pc.dp);
      if (!b) return b.error();
      resolved.sidp->switch_batch = pc.dp * b->switch_batch;
    }
  }
  if (strategy.seesaw) {
    if (strategy.shift) return make_error(ErrorCode::invalid_argument, "simulate: Seesaw does not go with Shift");
    engine::ParallelConfig cd = strategy.seesaw->decode;
    cd.dp = pc.dp;
    if (cd.group_size() != pc.group_size())
      return make_error(ErrorCode::invalid_argument, "simulate: Seesaw's cp " + pc.to_string() + " and cd " +
                                                         cd.to_string() + " must use the same devices");
    if (Status st = strategy.seesaw->policy.validate(); !st.ok()) return st.error();
    if (!(strategy.seesaw->host_buffer_bytes_per_device > 0))
      return make_error(ErrorCode::invalid_argument, "simulate: Seesaw's host KV buffer must be > 0 bytes");
    // One block table serves both configs: the fewer blocks of the two.
    auto cd_blocks = kv_blocks_per_group(config, cluster, cd, options);
    if (!cd_blocks) return cd_blocks.error();
    *blocks = std::min(*blocks, *cd_blocks);
    kv_capacity_tokens = static_cast<long long>(*blocks) * options.block_size * pc.dp;
  }
  int longest = 0;
  for (const SimRequest& r : workload) longest = std::max(longest, r.prompt_len + r.output_len);
  if (static_cast<long long>(*blocks) * options.block_size < longest)
    return make_error(ErrorCode::out_of_memory, "simulate: " + pc.to_string() + " on " + cluster.device.name +
                                                    " leaves KV for " +
                                                    std::to_string(static_cast<long long>(*blocks) * options.block_size) +
                                                    " tokens per group; the longest request needs " +
                                                    std::to_string(longest));

  SimResult res;
  res.strategy = strategy.label();
  res.parallel = pc.to_string();
  res.token_budget = strategy.token_budget;
  res.num_devices = pc.world_size();
  res.num_requests = static_cast<int>(workload.size());
  res.num_kv_blocks = *blocks;
  res.kv_capacity_tokens = kv_capacity_tokens;
  for (const SimRequest& r : workload) {
    res.prompt_tokens += r.prompt_len;
    res.generated_tokens += r.output_len;
  }
  auto full = run_once(config, cluster, resolved, workload, options, *model, *large_model, shift_model, *blocks, /*prefill_only=*/false);
  if (!full) return full.error();
  res.elapsed_s = full->elapsed_ms / 1e3;
  if (res.elapsed_s > 0) res.total_tok_s = static_cast<double>(res.prompt_tokens + res.generated_tokens) / res.elapsed_s;

  std::vector<double> ttft, tpot, decode_intervals;
  long long shifted = 0;
  double bubble_sum = 0;
  for (const Replica& r : full->replicas) {
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
    res.seesaw_host_peak_bytes = std::max(
        res.seesaw_host_peak_bytes, static_cast<double>(r.engine->seesaw_stats().host_peak_tokens) *
                                        static_cast<double>(kvstore::chunk_bytes(
                                            r.executor->kv_model_shape(), kvstore::KvRange{0, config.num_hidden_layers, 0, 1})));
    res.kv_peak_fraction = std::max(res.kv_peak_fraction, double(r.peak_blocks_used) / std::max(1, *blocks));
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

  if (resolved.sidp) {
    res.sidp_switches = full->sidp_switches;
    res.sidp_switch_batch = resolved.sidp->switch_batch;
    if (full->sidp_rank_steps > 0)
      res.sidp_cas_step_fraction = double(full->sidp_cas_rank_steps) / double(full->sidp_rank_steps);
  }
  if (strategy.failures) {
    res.num_failures = full->num_failures;
    res.failure_downtime_s = full->downtime_ms / 1e3;
    res.failure_recomputed_tokens = full->recomputed_tokens;
    res.num_failure_hit_requests = static_cast<int>(full->hit_by_first_failure.size());
    res.first_failure_s = full->first_failure_ms / 1e3;
    // The same run without failures: how much later the requests the first
    // failure hit finished (DéjàVu Fig. 10's latency increase).
    // (Replication, and its streaming, stay on: only the failures go.)
    Strategy clean = strategy;
    clean.failures->at_s.clear();
    clean.failures->at_token = 0;
    clean.failures->mtbf_s = 0;
    auto ref = run_once(config, cluster, clean, workload, options, *model, *large_model, shift_model, *blocks, /*prefill_only=*/false);
    if (!ref) return ref.error();
    res.failure_free_elapsed_s = ref->elapsed_ms / 1e3;
    double ratio_sum = 0;
    for (const std::size_t i : full->hit_by_first_failure)
      if (ref->finish_ms[i] > 0) ratio_sum += full->finish_ms[i] / ref->finish_ms[i];
    if (!full->hit_by_first_failure.empty())
      res.failure_latency_ratio = ratio_sum / static_cast<double>(full->hit_by_first_failure.size());
  }
  if (options.prefill_run) {
    auto pre = run_once(config, cluster, resolved, workload, options, *model, *large_model, shift_model, *blocks, /*prefill_only=*/true);
    if (!pre) return pre.error();
    res.prefill_elapsed_s = pre->elapsed_ms / 1e3;
    if (res.prefill_elapsed_s > 0) res.prefill_tok_s = static_cast<double>(res.prompt_tokens) / res.prefill_elapsed_s;
    const double decode_s = res.elapsed_s - res.prefill_elapsed_s;
    if (decode_s > 0)
      res.decode_tok_s = static_cast<double>(res.generated_tokens - res.num_requests) / decode_s;
  }
  res.sim_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace shardline::sim
