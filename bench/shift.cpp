#include "bench/shift.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "sim/calibration/hardware.hpp"
#include "sim/calibration/workload.hpp"
#include "engine/group/parallel_executor.hpp"
#include "engine/policies/shift_policy.hpp"
#include "sim/cost_model.hpp"

namespace shardline::bench {

// The measurement pieces the benchmarks share with the simulator's calibration.
using sim::calibration::Clock;
using sim::calibration::measure_inproc_allreduce_bytes_per_s;
using sim::calibration::measure_inproc_allreduce_latency_s;
using sim::calibration::measure_linear_gflops;
using sim::calibration::measure_triad_bandwidth_gbs;
using sim::calibration::median;
using sim::calibration::random_prompts;
using sim::calibration::seconds_since;

namespace {

/// The q-quantile (nearest rank) of `v`; 0 when empty.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(v.size() - 1, i)];
}

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, "bench --shift: " + m)); }

/// The group under test: one engine over an in-process group with a shift
/// config, whose policy each run forces.
struct Group {
  engine::EngineInstance instance;
  engine::ParallelExecutor* executor = nullptr;
  std::uint64_t next_request_id = 1;

  Status force(long long threshold, double hysteresis) {
    auto policy = engine::ShiftPolicy::create({threshold, hysteresis});
    if (!policy) return policy.error();
    return executor->set_shift_policy(std::move(policy).value());
  }

  /// Runs `prompts` (max_tokens each) to completion; returns the step stats.
  Result<std::vector<engine::StepStats>> run(const std::vector<std::vector<std::int32_t>>& prompts, int max_tokens) {
    engine::LlmEngine& e = *instance.engine;
    e.clear_step_stats();
    sampling::SamplingParams params;
    params.temperature = 0.0f;
    params.ignore_eos = true;
    params.max_tokens = max_tokens;
    for (const auto& p : prompts)
      if (Status st = e.add_request(next_request_id++, p, params); !st) return st.error();
    while (e.has_unfinished())
      if (auto out = e.step(); !out) return std::move(out).error();
    return e.step_stats();
  }
};

/// Median step_ms of the steps `pick` selects.
template <class Pick>
double median_step_ms(const std::vector<engine::StepStats>& stats, const Pick& pick) {
  std::vector<double> ms;
  for (const engine::StepStats& s : stats)
    if (pick(s)) ms.push_back(s.step_ms);
  return median(ms);
}

/// The crossover sweep (table 1), configs alternating within each repeat.
Result<std::vector<ShiftSweepRow>> sweep(Group& g, const ShiftBenchOptions& o, long long budget, int vocab,
                                         const sim::CostModel& model, const engine::ParallelConfig& base) {
  std::vector<ShiftSweepRow> rows;
  engine::ParallelConfig shift = base;
  shift.tp = base.sp * base.tp;
  shift.sp = 1;
  constexpr int kDecodePromptLen = 16, kDecodeSteps = 4;
  for (const int n : o.sweep_tokens) {
    ShiftSweepRow row;
    row.num_tokens = n;
    std::vector<double> db, ds, pb, ps;
    for (int rep = 0; rep < o.repeats; ++rep) {
      for (const bool shifted : {false, true}) {
        if (Status st = g.force(shifted ? budget : 0, o.hysteresis); !st) return st.error();
        if (n <= o.max_decode_sweep) {
          const auto prompts = random_prompts(n, kDecodePromptLen, vocab, o.seed + 1000 + static_cast<unsigned>(rep));
          auto stats = g.run(prompts, kDecodeSteps);
          if (!stats) return std::move(stats).error();
          const double ms = median_step_ms(
              *stats, [&](const engine::StepStats& s) { return s.num_prefill_tokens == 0 && s.num_decode_tokens == n; });
          (shifted ? ds : db).push_back(ms);
        }
        if (n <= budget) {
          const auto prompt = random_prompts(1, n, vocab, o.seed + 2000 + static_cast<unsigned>(rep));
          auto stats = g.run(prompt, 1);
          if (!stats) return std::move(stats).error();
          const double ms = median_step_ms(*stats, [&](const engine::StepStats& s) { return s.num_prefill_tokens == n; });
          (shifted ? ps : pb).push_back(ms);
        }
      }
    }
    spdlog::info("bench --shift: n = {}: decode {:.2f} / {:.2f} ms, prefill {:.2f} / {:.2f} ms (base / shift)", n,
                 median(db), median(ds), median(pb), median(ps));
    row.decode_base_ms = median(db);
    row.decode_shift_ms = median(ds);
    row.prefill_base_ms = median(pb);
    row.prefill_shift_ms = median(ps);
    sim::StepShape step;
    for (int i = 0; i < n; ++i) step.add_sequence(kDecodePromptLen + kDecodeSteps / 2, 1);
    if (auto c = model.estimate(base, step); c.ok()) row.predicted_base_ms = c->total_ms;
    if (auto c = model.estimate(shift, step); c.ok()) row.predicted_shift_ms = c->total_ms;
    rows.push_back(row);
  }
  return rows;
}

struct Arrival {
  double at_s = 0;
  bool is_long = false;
  std::vector<std::int32_t> prompt;
  int output_len = 0;
};

std::vector<Arrival> mixed_workload(const ShiftBenchOptions& o, int vocab) {
  std::vector<Arrival> a;
  const auto longs = random_prompts(o.long_requests.count, o.long_requests.input_len, vocab, o.seed);
  const auto shorts = random_prompts(o.short_requests.count, o.short_requests.input_len, vocab, o.seed + 1);
  for (const auto& p : longs) a.push_back({0, true, p, o.long_requests.output_len});
  for (const auto& p : shorts) a.push_back({0, false, p, o.short_requests.output_len});
  std::mt19937_64 rng(o.seed);
  std::shuffle(a.begin(), a.end(), rng);
  if (o.arrival_rate > 0) {
    std::exponential_distribution<double> gap(o.arrival_rate);
    double t = 0;
    for (Arrival& x : a) {
      x.at_s = t;
      t += gap(rng);
    }
  }
  return a;
}

/// Serves the mixed workload once under threshold T (table 2).
Result<ShiftMixedRun> serve_mixed(Group& g, const std::vector<Arrival>& work, const std::string& name, long long threshold,
                                  double hysteresis) {
  ShiftMixedRun r;
  r.config = name;
  r.threshold = threshold;
  if (Status st = g.force(threshold, hysteresis); !st) return st.error();
  const engine::ShiftStats before = g.executor->shift_stats();
  engine::LlmEngine& e = *g.instance.engine;
  e.clear_step_stats();
  struct Track {
    double arrival_s = 0, first_s = -1, finish_s = -1;
    int generated = 0;
    bool is_long = false;
  };
  std::map<std::uint64_t, Track> track;
  std::size_t next = 0;
  const auto t0 = Clock::now();
  while (next < work.size() || e.has_unfinished()) {
    const double now = seconds_since(t0);
    for (; next < work.size() && work[next].at_s <= now; ++next) {
      sampling::SamplingParams params;
      params.temperature = 0.0f;
      params.ignore_eos = true;
      params.max_tokens = work[next].output_len;
      const std::uint64_t id = g.next_request_id++;
      if (Status st = e.add_request(id, work[next].prompt, params); !st) return st.error();
      track[id] = Track{work[next].at_s, -1, -1, 0, work[next].is_long};
    }
    if (!e.has_unfinished()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(work[next].at_s - now));
      continue;
    }
    auto out = e.step();
    if (!out) return std::move(out).error();
    const double t = seconds_since(t0);
    for (auto& [id, tr] : track) {
      if (tr.first_s >= 0 || tr.finish_s >= 0) continue;
      const engine::Sequence* seq = e.scheduler().find(id);
      if (seq != nullptr && seq->num_output_tokens() > 0) tr.first_s = t;
    }
    for (const engine::RequestOutput& x : *out) {
      Track& tr = track[x.request_id];
      if (tr.first_s < 0) tr.first_s = t;
      tr.finish_s = t;
      tr.generated = static_cast<int>(x.token_ids.size());
    }
  }
  r.elapsed_s = seconds_since(t0);
  double prompt_tokens = 0, generated = 0;
  for (const Arrival& x : work) prompt_tokens += static_cast<double>(x.prompt.size());
  std::vector<double> ttft, tpot, ttft_long, ttft_short;
  for (const auto& [id, tr] : track) {
    generated += tr.generated;
    if (tr.finish_s >= 0) ++r.num_requests;
    const double first_ms = (tr.first_s - tr.arrival_s) * 1e3;
    ttft.push_back(first_ms);
    (tr.is_long ? ttft_long : ttft_short).push_back(first_ms);
    if (tr.generated > 1) tpot.push_back((tr.finish_s - tr.first_s) * 1e3 / (tr.generated - 1));
  }
  r.num_generated = static_cast<long long>(generated);
  r.total_tok_s = (prompt_tokens + generated) / r.elapsed_s;
  r.output_tok_s = generated / r.elapsed_s;
  r.ttft_ms_median = median(ttft);
  r.ttft_ms_p90 = quantile(ttft, 0.9);
  r.tpot_ms_median = median(tpot);
  r.tpot_ms_p90 = quantile(tpot, 0.9);
  r.ttft_long_ms_median = median(ttft_long);
  r.ttft_short_ms_median = median(ttft_short);
  const engine::ShiftStats after = g.executor->shift_stats();
  r.base_steps = after.base_steps - before.base_steps;
  r.shift_steps = after.shift_steps - before.shift_steps;
  r.switches = after.switches - before.switches;
  return r;
}

}  // namespace

Result<RequestClass> parse_request_class(const std::string& text) {
  RequestClass c;
  const auto fail = [&] {
    return make_error(ErrorCode::invalid_argument,
                      "a request class is COUNTxINPUT/OUTPUT with positive numbers (e.g. 8x1024/16), got '" + text + "'");
  };
  const std::size_t x = text.find('x'), slash = text.find('/');
  if (x == std::string::npos || slash == std::string::npos || slash < x) return fail();
  const auto number = [&](std::size_t b, std::size_t e, int& v) {
    const auto [p, ec] = std::from_chars(text.data() + b, text.data() + e, v);
    return ec == std::errc() && p == text.data() + e && v > 0;
  };
  if (!number(0, x, c.count) || !number(x + 1, slash, c.input_len) || !number(slash + 1, text.size(), c.output_len))
    return fail();
  return c;
}

Result<ShiftBenchReport> run_shift_bench(const ShiftBenchOptions& o) {
  const engine::ParallelConfig base = o.engine.parallel;
  if (base.pp != 1 || base.dp != 1 || base.group_size() < 2)
    return bad("--parallel must be sp=N or sp=N,tp=M (pp = 1, dp = 1, at least 2 devices), got " + base.to_string())
        .error();
  for (const RequestClass& c : {o.long_requests, o.short_requests})
    if (c.count < 0 || c.input_len < 1 || c.output_len < 1) return bad("request classes need positive lengths").error();
  if (o.max_batch < 1 || o.repeats < 1 || o.arrival_rate < 0 || o.max_decode_sweep < 0)
    return bad("--max-batch and the repeats must be >= 1, the arrival rate and decode sweep >= 0").error();
  for (const int n : o.sweep_tokens)
    if (n < 1) return bad("sweep token counts must be >= 1").error();

  ShiftBenchReport rep;
  rep.model = o.engine.model_dir;
  rep.base = base.to_string();
  rep.devices = base.group_size();
  rep.long_requests = o.long_requests;
  rep.short_requests = o.short_requests;
  rep.arrival_rate = o.arrival_rate;
  const int cores = std::max(1, omp_get_num_procs());
  rep.cores = cores;
  rep.threads_per_rank = o.engine.num_threads > 0 ? o.engine.num_threads : std::max(1, cores / rep.devices);
  omp_set_num_threads(cores);
  rep.membw_gbs = measure_triad_bandwidth_gbs(cores);
  rep.gemm_gflops = measure_linear_gflops(2048, 3, o.engine.dtype);  // the weights' compute
  rep.comm_gbs = measure_inproc_allreduce_bytes_per_s(rep.devices) / 1e9;
  rep.comm_latency_us = measure_inproc_allreduce_latency_s(rep.devices) * 1e6;

  auto config = model::load_model_config(o.engine.model_dir);
  if (!config) return std::move(config).error();
  if (o.engine.num_layers_override > 0)
    config->num_hidden_layers = std::min(config->num_hidden_layers, o.engine.num_layers_override);
  auto cost = sim::CostModel::for_cpu_devices(
      *config, o.engine.dtype, o.engine.kv_cache_dtype, rep.membw_gbs * 1e9, rep.gemm_gflops * 1e9, rep.devices,
      sim::LinkSpec{rep.comm_gbs * 1e9, rep.comm_latency_us * 1e-6});
  if (!cost) return std::move(cost).error();
  const long long budget = o.engine.max_num_batched_tokens;
  auto predicted = cost->shift_threshold(base, sim::CostModel::kShiftThresholdContextTokens, budget);
  if (!predicted) return std::move(predicted).error();
  rep.predicted_threshold = predicted->threshold;
  rep.predicted_capped = predicted->capped;

  engine::EngineOptions eo = o.engine;
  eo.num_threads = rep.threads_per_rank;
  int max_sweep = 0;
  for (const int n : o.sweep_tokens) max_sweep = std::max(max_sweep, n);
  eo.max_num_seqs = std::max(o.max_batch, std::min(max_sweep, o.max_decode_sweep));
  eo.max_model_len = std::max({o.long_requests.input_len + o.long_requests.output_len,
                               o.short_requests.input_len + o.short_requests.output_len, max_sweep + 1, 32});
  eo.shift = engine::ShiftOptions{{0, o.hysteresis}};
  omp_set_num_threads(rep.threads_per_rank);
  auto built = engine::build_engine(eo);
  if (!built) return std::move(built).error();
  Group g{std::move(built).value()};
  auto* group = g.instance.executor_as<engine::InProcEngineGroup>();
  if (group == nullptr || !group->executor().has_shift())
    return bad("the engine has no in-process group with a shift config").error();
  g.executor = &group->executor();
  rep.base_weight_bytes = g.executor->runner().packed_weight_bytes();
  rep.shift_weight_bytes = g.executor->shift_runner()->packed_weight_bytes();
  const int vocab = g.instance.weights->config.vocab_size;

  if (!o.sweep_tokens.empty()) {
    auto rows = sweep(g, o, budget, vocab, *cost, base);
    if (!rows) return std::move(rows).error();
    rep.sweep = std::move(rows).value();
    for (const ShiftSweepRow& r : rep.sweep) {
      if (rep.measured_decode_crossover == 0 && r.decode_base_ms > 0 && r.decode_base_ms < r.decode_shift_ms)
        rep.measured_decode_crossover = r.num_tokens;
      if (rep.measured_prefill_crossover == 0 && r.prefill_base_ms > 0 && r.prefill_base_ms < r.prefill_shift_ms)
        rep.measured_prefill_crossover = r.num_tokens;
    }
  }

  if (o.long_requests.count + o.short_requests.count > 0) {
    const std::vector<Arrival> work = mixed_workload(o, vocab);
    const long long shift_t = o.threshold >= 0 ? o.threshold : rep.predicted_threshold;
    for (int rep_i = 0; rep_i < o.repeats; ++rep_i) {
      for (const auto& [name, t] : {std::pair<std::string, long long>{"base", 0}, {"tp", budget}, {"shift", shift_t}}) {
        auto run = serve_mixed(g, work, name, t, o.hysteresis);
        if (!run) return std::move(run).error();
        spdlog::info("bench --shift: mixed {} (T = {}): {:.2f} s, {:.1f} tok/s", name, t, run->elapsed_s,
                     run->total_tok_s);
        rep.runs.push_back(std::move(run).value());
      }
    }
  }
  return rep;
}

std::string ShiftBenchReport::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const ShiftSweepRow& r : sweep)
    rows.push_back({{"num_tokens", r.num_tokens},
                    {"decode_base_ms", r.decode_base_ms},
                    {"decode_shift_ms", r.decode_shift_ms},
                    {"prefill_base_ms", r.prefill_base_ms},
                    {"prefill_shift_ms", r.prefill_shift_ms},
                    {"predicted_base_ms", r.predicted_base_ms},
                    {"predicted_shift_ms", r.predicted_shift_ms}});
  nlohmann::json mixed = nlohmann::json::array();
  for (const ShiftMixedRun& r : runs)
    mixed.push_back({{"config", r.config},
                     {"threshold", r.threshold},
                     {"elapsed_s", r.elapsed_s},
                     {"num_requests", r.num_requests},
                     {"num_generated", r.num_generated},
                     {"total_tok_s", r.total_tok_s},
                     {"output_tok_s", r.output_tok_s},
                     {"ttft_ms_median", r.ttft_ms_median},
                     {"ttft_ms_p90", r.ttft_ms_p90},
                     {"tpot_ms_median", r.tpot_ms_median},
                     {"tpot_ms_p90", r.tpot_ms_p90},
                     {"ttft_long_ms_median", r.ttft_long_ms_median},
                     {"ttft_short_ms_median", r.ttft_short_ms_median},
                     {"base_steps", r.base_steps},
                     {"shift_steps", r.shift_steps},
                     {"switches", r.switches}});
  const auto cls = [](const RequestClass& c) {
    return nlohmann::json{{"count", c.count}, {"input_len", c.input_len}, {"output_len", c.output_len}};
  };
  nlohmann::json j{{"model", model},
                   {"base", base},
                   {"devices", devices},
                   {"threads_per_rank", threads_per_rank},
                   {"cores", cores},
                   {"membw_gbs", membw_gbs},
                   {"gemm_gflops", gemm_gflops},
                   {"comm_gbs", comm_gbs},
                   {"comm_latency_us", comm_latency_us},
                   {"base_weight_bytes", base_weight_bytes},
                   {"shift_weight_bytes", shift_weight_bytes},
                   {"predicted_threshold", predicted_threshold},
                   {"predicted_capped", predicted_capped},
                   {"measured_decode_crossover", measured_decode_crossover},
                   {"measured_prefill_crossover", measured_prefill_crossover},
                   {"sweep", rows},
                   {"long_requests", cls(long_requests)},
                   {"short_requests", cls(short_requests)},
                   {"arrival_rate", arrival_rate},
                   {"mixed", mixed}};
  return j.dump();
}

std::string ShiftBenchReport::to_table() const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "# %s, base %s on %d devices x %d threads (%d cores): triad %.1f GB/s, GEMM %.0f GFLOP/s, in-process "
                "all-reduce %.2f GB/s + %.1f us; rank 0 packs %.1f MB (base) + %.1f MB (shift)\n",
                model.c_str(), base.c_str(), devices, threads_per_rank, cores, membw_gbs, gemm_gflops, comm_gbs,
                comm_latency_us, base_weight_bytes / 1e6, shift_weight_bytes / 1e6);
  out += line;
  if (!sweep.empty()) {
    std::snprintf(line, sizeof line,
                  "# crossover: cost model T = %lld%s; measured: decode base faster from n = %d, prefill from n = %d "
                  "(0: never in the sweep)\n",
                  predicted_threshold, predicted_capped ? " (capped)" : "", measured_decode_crossover,
                  measured_prefill_crossover);
    out += line;
    std::snprintf(line, sizeof line, "%6s %12s %12s %12s %12s %12s %12s\n", "n", "decode base", "decode shift",
                  "prefill base", "prefill shft", "pred base", "pred shift");
    out += line;
    for (const ShiftSweepRow& r : sweep) {
      std::snprintf(line, sizeof line, "%6d %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f\n", r.num_tokens,
                    r.decode_base_ms, r.decode_shift_ms, r.prefill_base_ms, r.prefill_shift_ms, r.predicted_base_ms,
                    r.predicted_shift_ms);
      out += line;
    }
  }
  if (!runs.empty()) {
    std::snprintf(line, sizeof line, "# mixed: %dx%d/%d + %dx%d/%d, arrivals %s\n", long_requests.count,
                  long_requests.input_len, long_requests.output_len, short_requests.count, short_requests.input_len,
                  short_requests.output_len,
                  arrival_rate > 0 ? (std::to_string(arrival_rate) + " req/s").c_str() : "all at once");
    out += line;
    std::snprintf(line, sizeof line, "%-6s %6s %8s %9s %9s %9s %9s %9s %9s %9s %7s %7s %6s\n", "config", "T", "wall s",
                  "total/s", "out/s", "TTFT md", "TTFT p90", "TTFT lng", "TTFT sht", "TPOT md", "base", "shift",
                  "switch");
    out += line;
    for (const ShiftMixedRun& r : runs) {
      std::snprintf(line, sizeof line,
                    "%-6s %6lld %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %7llu %7llu %6llu\n", r.config.c_str(),
                    r.threshold, r.elapsed_s, r.total_tok_s, r.output_tok_s, r.ttft_ms_median, r.ttft_ms_p90,
                    r.ttft_long_ms_median, r.ttft_short_ms_median, r.tpot_ms_median,
                    static_cast<unsigned long long>(r.base_steps), static_cast<unsigned long long>(r.shift_steps),
                    static_cast<unsigned long long>(r.switches));
      out += line;
    }
  }
  return out;
}

}  // namespace shardline::bench
