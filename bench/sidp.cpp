#include "bench/sidp.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "sim/calibration/hardware.hpp"
#include "sim/calibration/workload.hpp"
#include "engine/data_parallel.hpp"
#include "engine/gpu_memory_plan.hpp"
#include "engine/kv_budget.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "engine/sidp_memory.hpp"
#include "sim/cost_model.hpp"

namespace shardline::bench {

// The measurement pieces the benchmarks share with the simulator's calibration.
using sim::calibration::decode_median_ms;
using sim::calibration::measure_linear_gflops;
using sim::calibration::measure_quant_linear_gflops;
using sim::calibration::measure_triad_bandwidth_gbs;
using sim::calibration::random_prompts;

namespace {

using engine::EngineOptions;
using engine::LlmEngine;
using model::sidp::SidpMode;
using Clock = std::chrono::steady_clock;

sampling::SamplingParams greedy(int max_tokens) {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

/// (time, rank, running sequences) of every step of every rank.
struct BatchTrace {
  std::mutex mu;
  std::vector<std::tuple<double, int, int>> points;
  Clock::time_point t0 = Clock::now();
  void attach(LlmEngine& e, int rank) {
    e.set_step_callback([this, rank](const engine::StepStats& s) {
      std::lock_guard lk(mu);
      points.emplace_back(std::chrono::duration<double>(Clock::now() - t0).count(), rank, s.num_seqs);
    });
  }
  /// Seconds from the last moment the group ran >= threshold sequences (sum
  /// of each rank's latest step) to the end.
  double tail_s(int dp, long long threshold, double end_s) {
    std::lock_guard lk(mu);
    std::sort(points.begin(), points.end());
    std::vector<int> latest(static_cast<std::size_t>(dp), 0);
    double last_above = 0;
    for (const auto& [t, r, n] : points) {
      latest[static_cast<std::size_t>(r)] = n;
      long long sum = 0;
      for (int v : latest) sum += v;
      if (sum >= threshold) last_above = t;
    }
    return std::max(0.0, end_s - last_above);
  }
};

struct Hardware {
  double membw_gbs = 0, gemm_gflops = 0;
};

Result<std::unique_ptr<engine::SidpGroup>> make_group(const EngineOptions& eo, int dp, SidpMode mode,
                                                      const comm::LinkSpec& link, int slots, bool peak) {
  engine::SidpOptions so;
  so.dp = dp;
  so.initial_mode = mode;
  so.link = link;
  so.cache_slots = slots;
  so.peak_shifting = peak;
  return engine::SidpGroup::create(eo, so);
}

/// Rank 0's median decode step at `batch` sequences per rank, plain DP.
Result<double> plain_point(std::vector<engine::EngineInstance>& reps, int batch, const SidpBenchOptions& o,
                           int threads) {
  std::vector<LlmEngine*> engines;
  for (auto& r : reps) {
    r.engine->clear_step_stats();
    engines.push_back(r.engine.get());
  }
  const auto prompts = random_prompts(batch * static_cast<int>(reps.size()), o.context_len,
                                      reps[0].weights->config.vocab_size, o.seed + static_cast<std::uint64_t>(batch));
  auto out = engine::generate_data_parallel(engines, prompts, greedy(o.decode_steps + 2), threads);
  if (!out) return std::move(out).error();
  return decode_median_ms(*reps[0].engine, batch);
}

Result<double> sidp_point(engine::SidpGroup& g, int batch, const SidpBenchOptions& o, int threads) {
  for (int r = 0; r < g.dp(); ++r) g.engine(r).clear_step_stats();
  const auto prompts = random_prompts(batch * g.dp(), o.context_len, g.instance(0).weights->config.vocab_size,
                                      o.seed + static_cast<std::uint64_t>(batch));
  auto out = engine::generate_sidp(g, prompts, greedy(o.decode_steps + 2), threads);
  if (!out) return std::move(out).error();
  return decode_median_ms(g.engine(0), batch);
}

/// Output lengths log-uniform in [lo, hi] (a long tail), seeded.
std::vector<sampling::SamplingParams> long_tail_params(int n, int lo, int hi, std::uint64_t seed) {
  std::vector<sampling::SamplingParams> out;
  std::uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
    const int len = static_cast<int>(std::lround(std::exp(std::log(lo) + u * (std::log(hi) - std::log(lo)))));
    out.push_back(greedy(std::clamp(len, lo, hi)));
  }
  return out;
}

}  // namespace

Result<SidpBenchReport> run_sidp_bench(const SidpBenchOptions& o) {
  if (o.dp < 2) return make_error(ErrorCode::invalid_argument, "bench --weight-sharing sidp needs dp >= 2");
  for (const std::string& t : o.tables)
    if (t != "capacity" && t != "crossover" && t != "e2e" && t != "peak")
      return make_error(ErrorCode::invalid_argument, "unknown SiDP table '" + t + "' (capacity, crossover, e2e, peak)");
  const auto wants = [&](const char* t) { return std::find(o.tables.begin(), o.tables.end(), t) != o.tables.end(); };
  SidpBenchReport rep;
  rep.model = o.engine.model_dir;
  rep.dp = o.dp;
  rep.cores = std::max(1, omp_get_num_procs());
  const int threads = o.engine.num_threads > 0 ? o.engine.num_threads : std::max(1, rep.cores / o.dp);
  rep.threads_per_rank = threads;
  omp_set_num_threads(rep.cores);
  rep.membw_gbs = measure_triad_bandwidth_gbs(rep.cores);
  rep.gemm_gflops = measure_linear_gflops(2048, 3, o.engine.dtype);  // the weights' compute
  rep.gemm_format = dtype_name(o.engine.dtype);
  comm::LinkSpec link = o.link;
  if (link.gbps <= 0) link = comm::LinkSpec{o.link_ratio * rep.membw_gbs / o.dp, o.link.latency_us};
  rep.link_gbs = link.gbps;
  rep.link_latency_us = link.latency_us;

  auto weights = engine::load_weights(o.engine);
  if (!weights) return std::move(weights).error();
  const model::ModelConfig& config = (*weights)->config;
  EngineOptions eo = o.engine;
  eo.weights = *weights;
  eo.num_threads = threads;

  // The cost model's b*, per rank, with each rank's share of the machine;
  // a quantized FFN at its regions' bytes and its kernel's GEMM rate.
  auto ffn = engine::sidp_ffn_format(**weights);
  if (!ffn) return std::move(ffn).error();
  double weight_bytes = static_cast<double>(dtype_size(o.engine.dtype));
  if (ffn->quant_type) {
    weight_bytes = ffn->region_bytes_per_weight;
    rep.gemm_gflops = measure_quant_linear_gflops(*ffn->quant_type);
    rep.gemm_format = kernels::ggml_type_name(static_cast<std::uint32_t>(*ffn->quant_type));
  }
  rep.weight_bytes = weight_bytes;
  const auto link_spec = sim::LinkSpec::from_gbps(link.gbps, link.latency_us);
  auto cost = sim::CostModel::for_sidp_rank(config, weight_bytes, o.engine.kv_cache_dtype, rep.membw_gbs * 1e9,
                                            rep.gemm_gflops * 1e9, o.dp, link_spec);
  if (!cost) return std::move(cost).error();
  auto bstar = cost->sidp_switch_batch(link_spec);
  if (!bstar) return std::move(bstar).error();
  rep.predicted_switch_batch = bstar->switch_batch;
  auto overlapped = cost->sidp_switch_batch_overlapped(link_spec, o.dp);
  if (!overlapped) return std::move(overlapped).error();
  rep.predicted_overlapped_switch_batch = overlapped->switch_batch;
  rep.predicted_fetch_ms = bstar->fetch_ms;

  const int max_out = o.e2e_max_output;
  // K and V of one token over all layers (a block of one token).
  const std::uint64_t kv_per_token = engine::kv_bytes_per_block(
      config.num_hidden_layers, config.num_key_value_heads, config.head_dim, 1,
      static_cast<int>(dtype_size(eo.kv_cache_dtype)));
  const std::uint64_t activation = engine::activation_bytes_for(config, eo.max_num_batched_tokens, eo.max_num_seqs);
  std::uint64_t budget = o.device_memory_bytes;
  if (budget == 0) {
    budget = engine::weight_bytes_for(config, eo.dtype) + activation +
             8ull * static_cast<std::uint64_t>(o.e2e_input_len + max_out + eo.block_size) * kv_per_token;
  }
  rep.device_memory_bytes = budget;

  if (wants("capacity")) {
    for (int dp : o.capacity_dps) {
      engine::KvCapacityInput in;
      in.config = config;
      in.weight_dtype = eo.dtype;
      in.kv_dtype = eo.kv_cache_dtype;
      in.block_size = eo.block_size;
      in.device_memory_bytes = budget;
      in.activation_bytes = activation;
      in.dp = dp;
      in.cache_slots = std::max(o.cache_slots, dp - 1);  // peak shifting holds dp - 1 remote layers
      auto cap = engine::kv_capacity_plain_vs_sidp(in);
      if (!cap) return std::move(cap).error();
      SidpCapacityRow row;
      row.dp = dp;
      row.plain_kv_tokens = cap->plain[0].kv_tokens;
      row.sidp_kv_tokens = cap->sidp[0].kv_tokens;
      for (const auto& r : cap->sidp) row.sidp_kv_tokens = std::min(row.sidp_kv_tokens, r.kv_tokens);
      row.plain_weight_bytes = cap->plain[0].weight_bytes;
      row.sidp_weight_bytes = cap->sidp[0].weight_bytes;
      rep.capacity.push_back(row);
    }
  }

  if (wants("crossover")) {
    EngineOptions co = eo;
    const int max_b = *std::max_element(o.batches.begin(), o.batches.end());
    co.max_num_seqs = std::max(co.max_num_seqs, max_b);
    co.max_model_len = o.context_len + o.decode_steps + 4;
    co.device_memory_bytes = 0;
    co.kv_cache_bytes = static_cast<std::uint64_t>(max_b) * (co.max_model_len + co.block_size) * kv_per_token;
    std::vector<engine::EngineInstance> reps;
    for (int r = 0; r < o.dp; ++r) {
      auto e = engine::build_engine(co);
      if (!e) return std::move(e).error();
      reps.push_back(std::move(e).value());
    }
    auto was = make_group(co, o.dp, SidpMode::was, link, o.cache_slots, true);
    if (!was) return std::move(was).error();
    auto cas = make_group(co, o.dp, SidpMode::cas, link, o.cache_slots, true);
    if (!cas) return std::move(cas).error();
    for (int b : o.batches) {
      SidpCrossoverRow row;
      row.batch = b;
      auto p = plain_point(reps, b, o, threads);
      if (!p) return std::move(p).error();
      auto w = sidp_point(**was, b, o, threads);
      if (!w) return std::move(w).error();
      auto c = sidp_point(**cas, b, o, threads);
      if (!c) return std::move(c).error();
      row.plain_ms = *p;
      row.was_ms = *w;
      row.cas_ms = *c;
      rep.crossover.push_back(row);
      std::fprintf(stderr, "  crossover b=%d: plain %.2f ms  WaS %.2f ms  CaS %.2f ms\n", b, *p, *w, *c);
      if (rep.measured_switch_batch == 0 && *w <= *c) rep.measured_switch_batch = b;
    }
  }

  if (wants("e2e")) {
    EngineOptions e2 = eo;
    e2.device_memory_bytes = budget;
    e2.kv_cache_bytes = 0;
    e2.max_model_len = o.e2e_input_len + max_out + 1;
    const auto prompts = random_prompts(o.e2e_prompts, o.e2e_input_len, config.vocab_size, o.seed);
    const auto params = long_tail_params(o.e2e_prompts, o.e2e_min_output, max_out, o.seed);
    long long out_tokens = 0;
    for (const auto& p : params) out_tokens += p.max_tokens;
    rep.e2e_switch_batch = o.switch_batch > 0 ? o.switch_batch : overlapped->switch_batch * o.dp;
    const auto finish = [&](SidpE2eRow row, BatchTrace& trace, Clock::time_point t0) {
      row.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
      row.output_tok_s = static_cast<double>(out_tokens) / row.elapsed_s;
      row.tail_s = trace.tail_s(o.dp, rep.e2e_switch_batch, std::chrono::duration<double>(Clock::now() - trace.t0).count());
      std::fprintf(stderr, "  e2e %-10s %.1f s, %.1f tok/s, tail %.1f s, %d switches\n", row.config.c_str(),
                   row.elapsed_s, row.output_tok_s, row.tail_s, row.switches);
      rep.e2e.push_back(row);
    };
    {  // plain DP
      std::vector<engine::EngineInstance> reps;
      std::vector<LlmEngine*> engines;
      BatchTrace trace;
      for (int r = 0; r < o.dp; ++r) {
        auto e = engine::build_engine(e2);
        if (!e) return std::move(e).error();
        reps.push_back(std::move(e).value());
      }
      for (int r = 0; r < o.dp; ++r) {
        trace.attach(*reps[static_cast<std::size_t>(r)].engine, r);
        engines.push_back(reps[static_cast<std::size_t>(r)].engine.get());
      }
      SidpE2eRow row;
      row.config = "plain";
      row.kv_blocks = reps[0].num_kv_blocks;
      const auto t0 = Clock::now();
      trace.t0 = t0;
      auto out = engine::generate_data_parallel(engines, prompts, params, threads);
      if (!out) return std::move(out).error();
      finish(row, trace, t0);
    }
    for (const bool automatic : {false, true}) {
      auto g = make_group(e2, o.dp, SidpMode::was, link, o.cache_slots, true);
      if (!g) return std::move(g).error();
      BatchTrace trace;
      for (int r = 0; r < o.dp; ++r) trace.attach((*g)->engine(r), r);
      engine::SidpModePolicyOptions po;
      po.setting = automatic ? engine::SidpModeSetting::automatic : engine::SidpModeSetting::was;
      po.switch_batch = rep.e2e_switch_batch;
      po.min_dwell_s = o.min_dwell_s;
      po.num_ranks = o.dp;
      auto policy = engine::SidpModePolicy::create(po);
      if (!policy) return std::move(policy).error();
      engine::SidpAutoSwitcher switcher(**g, std::move(policy).value());
      SidpE2eRow row;
      row.config = automatic ? "sidp-auto" : "sidp-was";
      row.kv_blocks = (*g)->instance(0).num_kv_blocks;
      const auto t0 = Clock::now();
      trace.t0 = t0;
      auto out = engine::generate_sidp(**g, prompts, params, threads, switcher.observer());
      if (!out) return std::move(out).error();
      row.switches = static_cast<int>(switcher.switches().size());
      finish(row, trace, t0);
    }
  }

  if (wants("peak")) {
    EngineOptions po = eo;
    po.max_num_seqs = std::max(po.max_num_seqs, o.peak_batch);
    po.max_model_len = o.context_len + o.decode_steps + 4;
    po.device_memory_bytes = 0;
    po.kv_cache_bytes = static_cast<std::uint64_t>(o.peak_batch) * (po.max_model_len + po.block_size) * kv_per_token;
    po.num_threads = std::max(1, rep.cores / o.peak_dp);
    // The same slots either way: peak shifting needs dp - 1 of them.
    const int slots = std::max(o.cache_slots, o.peak_dp - 1);
    const comm::LinkSpec peak_link{o.link.gbps > 0 ? o.link.gbps : o.link_ratio * rep.membw_gbs / o.peak_dp,
                                   link.latency_us};
    for (const bool on : {false, true}) {
      auto g = make_group(po, o.peak_dp, SidpMode::was, peak_link, slots, on);
      if (!g) return std::move(g).error();
      auto ms = sidp_point(**g, o.peak_batch, o, po.num_threads);
      if (!ms) return std::move(ms).error();
      SidpPeakRow row;
      row.peak_shifting = on;
      row.step_ms = *ms;
      row.tok_s = *ms > 0 ? o.peak_dp * o.peak_batch * 1000.0 / *ms : 0;
      const auto st = (*g)->ffn(0).stats();
      const double steps = static_cast<double>(std::max<std::uint64_t>(1, st.was_steps));
      row.link_wait_ms_per_step = st.cache.compute_wait_ms / steps;
      rep.peak.push_back(row);
      std::fprintf(stderr, "  peak shifting %s: %.2f ms/step, %.1f tok/s, compute waited %.2f ms/step\n",
                   on ? "on " : "off", row.step_ms, row.tok_s, row.link_wait_ms_per_step);
    }
  }
  return rep;
}

std::string SidpBenchReport::to_json() const {
  nlohmann::json j;
  j["bench"] = "sidp";
  j["model"] = model;
  j["dp"] = dp;
  j["cores"] = cores;
  j["threads_per_rank"] = threads_per_rank;
  j["membw_gbs"] = membw_gbs;
  j["gemm_gflops"] = gemm_gflops;
  j["gemm_format"] = gemm_format;
  j["weight_bytes"] = weight_bytes;
  j["link_gbs"] = link_gbs;
  j["link_latency_us"] = link_latency_us;
  j["device_memory_bytes"] = device_memory_bytes;
  j["capacity"] = nlohmann::json::array();
  for (const auto& r : capacity)
    j["capacity"].push_back({{"dp", r.dp}, {"plain_kv_tokens", r.plain_kv_tokens}, {"sidp_kv_tokens", r.sidp_kv_tokens},
                             {"plain_weight_bytes", r.plain_weight_bytes}, {"sidp_weight_bytes", r.sidp_weight_bytes}});
  j["crossover"] = nlohmann::json::array();
  for (const auto& r : crossover)
    j["crossover"].push_back({{"batch", r.batch}, {"plain_ms", r.plain_ms}, {"was_ms", r.was_ms}, {"cas_ms", r.cas_ms}});
  j["measured_switch_batch"] = measured_switch_batch;
  j["predicted_switch_batch"] = predicted_switch_batch;
  j["predicted_overlapped_switch_batch"] = predicted_overlapped_switch_batch;
  j["predicted_fetch_ms"] = predicted_fetch_ms;
  j["e2e_switch_batch"] = e2e_switch_batch;
  j["e2e"] = nlohmann::json::array();
  for (const auto& r : e2e)
    j["e2e"].push_back({{"config", r.config}, {"kv_blocks", r.kv_blocks}, {"elapsed_s", r.elapsed_s},
                        {"output_tok_s", r.output_tok_s}, {"tail_s", r.tail_s}, {"switches", r.switches}});
  j["peak"] = nlohmann::json::array();
  for (const auto& r : peak)
    j["peak"].push_back({{"peak_shifting", r.peak_shifting}, {"step_ms", r.step_ms}, {"tok_s", r.tok_s},
                         {"compute_wait_ms_per_step", r.link_wait_ms_per_step}});
  return j.dump();
}

std::string SidpBenchReport::to_table() const {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "SiDP bench: %s, dp=%d, %d threads/rank; triad %.1f GB/s, linear %.1f GFLOP/s (%s, %.3f bytes a weight); "
                "emulated link %.2f GB/s + %.1f us per rank\n",
                model.c_str(), dp, threads_per_rank, membw_gbs, gemm_gflops, gemm_format.c_str(), weight_bytes, link_gbs,
                link_latency_us);
  s += line;
  if (!capacity.empty()) {
    std::snprintf(line, sizeof line, "\n1. KV capacity per device at --device-memory %.1f MiB\n%4s %14s %14s %7s\n",
                  static_cast<double>(device_memory_bytes) / (1 << 20), "dp", "plain tokens", "SiDP tokens", "ratio");
    s += line;
    for (const auto& r : capacity) {
      std::snprintf(line, sizeof line, "%4d %14llu %14llu %7.2f\n", r.dp,
                    static_cast<unsigned long long>(r.plain_kv_tokens), static_cast<unsigned long long>(r.sidp_kv_tokens),
                    r.plain_kv_tokens > 0 ? static_cast<double>(r.sidp_kv_tokens) / r.plain_kv_tokens : 0.0);
      s += line;
    }
  }
  if (!crossover.empty()) {
    std::snprintf(line, sizeof line, "\n2. decode step (ms, rank 0) vs batch per rank\n%6s %10s %10s %10s\n", "batch",
                  "plain", "WaS", "CaS");
    s += line;
    for (const auto& r : crossover) {
      std::snprintf(line, sizeof line, "%6d %10.2f %10.2f %10.2f\n", r.batch, r.plain_ms, r.was_ms, r.cas_ms);
      s += line;
    }
    std::snprintf(line, sizeof line,
                  "b* measured %d (0: WaS never caught up), cost model %lld counting the forward pass over dp ranks, "
                  "%lld FFN GEMM only (fetch %.2f ms/layer)\n",
                  measured_switch_batch, predicted_overlapped_switch_batch, predicted_switch_batch, predicted_fetch_ms);
    s += line;
  }
  if (!e2e.empty()) {
    std::snprintf(line, sizeof line, "\n3. long-tailed job (group b* %lld)\n%-10s %9s %9s %9s %8s %8s\n",
                  e2e_switch_batch, "config", "kv blocks", "wall s", "tok/s", "tail s", "switches");
    s += line;
    for (const auto& r : e2e) {
      std::snprintf(line, sizeof line, "%-10s %9d %9.1f %9.1f %8.1f %8d\n", r.config.c_str(), r.kv_blocks, r.elapsed_s,
                    r.output_tok_s, r.tail_s, r.switches);
      s += line;
    }
  }
  if (!peak.empty()) {
    s += "\n4. WaS peak shifting\n";
    for (const auto& r : peak) {
      std::snprintf(line, sizeof line, "  %-3s %8.2f ms/step %9.1f tok/s  compute waited %.2f ms/step\n",
                    r.peak_shifting ? "on" : "off", r.step_ms, r.tok_s, r.link_wait_ms_per_step);
      s += line;
    }
  }
  return s;
}

}  // namespace shardline::bench
