#include "bench/seesaw.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "sim/calibration/hardware.hpp"
#include "sim/calibration/workload.hpp"
#include "engine/data_parallel.hpp"
#include "engine/group/parallel_executor.hpp"
#include "engine/policies/token_budget_policies.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "model/cpu_runner.hpp"

namespace shardline::bench {

// The measurement pieces the benchmarks share with the simulator's calibration.
using sim::calibration::Clock;
using sim::calibration::measure_linear_gflops;
using sim::calibration::measure_triad_bandwidth_gbs;
using sim::calibration::median;
using sim::calibration::random_prompts;
using sim::calibration::seconds_since;

namespace {

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, "bench --seesaw: " + m)); }

/// "pp=2", "tp=2,pp=2": the sizes that are not 1 ("single" when none is).
std::string short_config(const engine::ParallelConfig& pc) {
  std::string s;
  for (const auto& [name, n] : {std::pair<const char*, int>{"tp", pc.tp}, {"pp", pc.pp}, {"sp", pc.sp}, {"dp", pc.dp}})
    if (n != 1) s += (s.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(n);
  return s.empty() ? "single" : s;
}

/// One way of serving the batch: a static config (replicas > 1: dp) or
/// Seesaw cp -> cd under a schedule.
struct Plan {
  std::string table, config, parallel, token_budget, schedule;
  engine::ParallelConfig pc;  ///< of each replica (dp = 1)
  int replicas = 1;
  std::optional<engine::ParallelConfig> cd;
  std::optional<engine::SeesawPolicyOptions> seesaw;
  bool async_kv = true;  ///< seesaw: the KV copies on the prefetcher thread
};

Plan static_plan(const std::string& config, const engine::ParallelConfig& pc) {
  Plan p;
  p.table = "configs";
  p.config = config;
  p.parallel = short_config(pc);
  p.token_budget = pc.pp > 1 ? "throttle" : "fixed";
  p.pc = pc;
  return p;
}

Plan seesaw_plan(const SeesawBenchOptions& o, const std::string& table, engine::SeesawSchedule schedule) {
  Plan p;
  p.table = table;
  p.config = "seesaw";
  p.parallel = short_config(o.cp) + "->" + short_config(o.cd);
  p.token_budget = o.cp.pp > 1 || o.cd.pp > 1 ? "throttle" : "fixed";  // as static cp / cd with pp
  p.schedule = engine::to_string(schedule);
  p.pc = o.cp;
  p.cd = o.cd;
  p.seesaw = o.seesaw;
  p.seesaw->schedule = schedule;
  p.async_kv = o.engine.seesaw_async_kv;
  return p;
}

Plan copy_plan(const SeesawBenchOptions& o, bool async) {
  Plan p = seesaw_plan(o, "copies", engine::SeesawSchedule::transition_minimizing);
  p.async_kv = async;
  return p;
}

/// Builds the plan's engine(s), serves `prompts` once and reads the stats.
Result<SeesawRun> serve(const SeesawBenchOptions& o, const Plan& p, const SeesawRatio& ratio, int repeat,
                        const std::shared_ptr<const model::ModelWeights>& weights,
                        const std::vector<std::vector<std::int32_t>>& prompts, int threads_per_rank) {
  SeesawRun r;
  r.table = p.table;
  r.ratio = ratio;
  r.repeat = repeat;
  r.config = p.config;
  r.parallel = p.parallel;
  r.token_budget = p.token_budget;
  r.schedule = p.schedule;
  if (p.seesaw) r.kv_copy = p.async_kv ? "async" : "sync";

  engine::EngineOptions eo = o.engine;
  eo.weights = weights;
  eo.parallel = p.pc;
  eo.parallel_decode = p.cd;
  eo.seesaw = p.seesaw;
  eo.seesaw_async_kv = p.async_kv;
  if (!p.seesaw) eo.host_link.reset();  // a static config moves no KV to the host
  if (p.replicas > 1 || p.pc.group_size() == 1) eo.group_link.reset();  // dp replicas do not talk
  eo.shift.reset();
  eo.num_threads = threads_per_rank;
  eo.max_model_len = ratio.input_len + ratio.output_len;
  eo.max_num_seqs = (o.num_requests + p.replicas - 1) / p.replicas;
  eo.kv_cache_bytes = o.engine.kv_cache_bytes / static_cast<std::uint64_t>(p.replicas);
  if (o.engine.kv_cache_bytes > 0 && eo.kv_cache_bytes == 0) return bad("--kv-cache-bytes too small to split").error();
  auto policy = engine::make_token_budget_policy(p.token_budget, eo.max_num_batched_tokens);
  if (!policy) return std::move(policy).error();
  eo.token_budget = std::shared_ptr<const engine::TokenBudgetPolicy>(std::move(policy).value());

  std::vector<engine::EngineInstance> instances;
  std::vector<engine::LlmEngine*> engines;
  for (int i = 0; i < p.replicas; ++i) {
    omp_set_num_threads(threads_per_rank);
    auto built = engine::build_engine(eo);
    if (!built) return std::move(built).error();
    instances.push_back(std::move(built).value());
    engines.push_back(instances.back().engine.get());
  }
  engine::EngineInstance& first = instances.front();
  if (auto* group = first.executor_as<engine::InProcEngineGroup>(); group != nullptr) {
    r.weight_bytes = group->executor().runner().packed_weight_bytes();
    if (model::ShardRunner* cd = group->executor().decode_runner(); cd != nullptr)
      r.decode_weight_bytes = cd->packed_weight_bytes();
  } else if (auto* runner = first.executor_as<model::CpuModelRunner>(); runner != nullptr) {
    r.weight_bytes = runner->packed_weight_bytes();
  }
  r.num_kv_blocks = first.num_kv_blocks;

  sampling::SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;
  params.max_tokens = ratio.output_len;
  const Clock::time_point t0 = Clock::now();
  auto out = engine::generate_data_parallel(engines, prompts, params, threads_per_rank);
  r.elapsed_s = seconds_since(t0);
  if (!out) return std::move(out).error();

  for (const engine::RequestOutput& x : *out) {
    ++r.num_requests;
    r.num_generated += static_cast<long long>(x.token_ids.size());
  }
  const double prompt_tokens = static_cast<double>(prompts.size()) * ratio.input_len;
  r.total_tok_s = (prompt_tokens + static_cast<double>(r.num_generated)) / r.elapsed_s;
  r.output_tok_s = static_cast<double>(r.num_generated) / r.elapsed_s;
  long long decode_tokens = 0;
  for (const engine::LlmEngine* e : engines) {
    for (const engine::StepStats& s : e->step_stats()) {
      r.preemptions += s.num_preemptions;
      if (s.num_prefill_tokens > 0) {
        ++r.prefill_steps;
      } else if (s.num_decode_tokens > 0) {
        ++r.decode_steps;
        decode_tokens += s.num_decode_tokens;
      }
    }
    const engine::SeesawStats ss = engine::seesaw_stats_of(*e);
    r.transitions += static_cast<long long>(ss.transitions);
    r.transition_ms += ss.transition_ms;
    r.switch_ms += ss.switch_ms;
    r.host_peak_tokens = std::max(r.host_peak_tokens, ss.host_peak_tokens);
    const engine::KvIoStats& io = e->kv_io().stats();
    r.offloads += static_cast<long long>(io.offloads);
    r.onboards += static_cast<long long>(io.onboards);
    r.offload_fallbacks += static_cast<long long>(io.offload_fallbacks);
    const engine::KvMoverStats mv = e->kv_mover_stats();
    r.kv_copy_ms += mv.transfer_ms;
    r.kv_wait_ms += mv.wait_ms;
  }
  r.hidden_share = r.kv_copy_ms > 0 ? std::clamp(1.0 - r.kv_wait_ms / r.kv_copy_ms, 0.0, 1.0) : 0.0;
  if (r.decode_steps > 0) r.mean_decode_batch = static_cast<double>(decode_tokens) / static_cast<double>(r.decode_steps);
  spdlog::info("bench --seesaw: {} {} {} {}: {:.2f} s, {:.1f} tok/s, {} transitions", r.ratio.to_string(), r.config,
               r.parallel, r.schedule, r.elapsed_s, r.total_tok_s, r.transitions);
  return r;
}

/// Medians per (table, ratio, config, schedule), in the order first run.
std::vector<SeesawSummary> summarize(const std::vector<SeesawRun>& runs) {
  std::vector<SeesawSummary> rows;
  std::vector<std::vector<const SeesawRun*>> groups;
  for (const SeesawRun& r : runs) {
    std::size_t i = 0;
    for (; i < rows.size(); ++i)
      if (rows[i].table == r.table && rows[i].ratio == r.ratio && rows[i].config == r.config &&
          rows[i].schedule == r.schedule && rows[i].kv_copy == r.kv_copy)
        break;
    if (i == rows.size()) {
      SeesawSummary s;
      s.table = r.table;
      s.ratio = r.ratio;
      s.config = r.config;
      s.parallel = r.parallel;
      s.token_budget = r.token_budget;
      s.schedule = r.schedule;
      s.kv_copy = r.kv_copy;
      rows.push_back(s);
      groups.emplace_back();
    }
    groups[i].push_back(&r);
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SeesawSummary& s = rows[i];
    const auto med = [&](auto field) {
      std::vector<double> v;
      for (const SeesawRun* r : groups[i]) v.push_back(field(*r));
      return median(v);
    };
    s.runs = static_cast<int>(groups[i].size());
    s.total_tok_s = med([](const SeesawRun& r) { return r.total_tok_s; });
    s.total_tok_s_min = s.total_tok_s_max = groups[i].front()->total_tok_s;
    for (const SeesawRun* r : groups[i]) {
      s.total_tok_s_min = std::min(s.total_tok_s_min, r->total_tok_s);
      s.total_tok_s_max = std::max(s.total_tok_s_max, r->total_tok_s);
    }
    s.output_tok_s = med([](const SeesawRun& r) { return r.output_tok_s; });
    s.transitions = med([](const SeesawRun& r) { return static_cast<double>(r.transitions); });
    s.transition_ms_per =
        med([](const SeesawRun& r) { return r.transitions > 0 ? r.transition_ms / static_cast<double>(r.transitions) : 0; });
    s.switch_ms_per =
        med([](const SeesawRun& r) { return r.transitions > 0 ? r.switch_ms / static_cast<double>(r.transitions) : 0; });
    s.offloads = med([](const SeesawRun& r) { return static_cast<double>(r.offloads); });
    s.onboards = med([](const SeesawRun& r) { return static_cast<double>(r.onboards); });
    s.host_peak_tokens = med([](const SeesawRun& r) { return static_cast<double>(r.host_peak_tokens); });
    s.mean_decode_batch = med([](const SeesawRun& r) { return r.mean_decode_batch; });
    s.kv_copy_ms = med([](const SeesawRun& r) { return r.kv_copy_ms; });
    s.kv_wait_ms = med([](const SeesawRun& r) { return r.kv_wait_ms; });
    s.hidden_share = med([](const SeesawRun& r) { return r.hidden_share; });
  }
  for (SeesawSummary& s : rows) {
    if (s.table != "configs" || s.config != "seesaw") continue;
    const SeesawSummary* best = nullptr;
    for (const SeesawSummary& t : rows)
      if (t.table == "configs" && t.ratio == s.ratio && t.config != "seesaw" &&
          (best == nullptr || t.total_tok_s > best->total_tok_s))
        best = &t;
    if (best != nullptr && best->total_tok_s > 0) {
      s.speedup_vs_best_static = s.total_tok_s / best->total_tok_s;
      s.best_static = best->parallel;
    }
  }
  return rows;
}

}  // namespace

std::string SeesawRatio::to_string() const { return std::to_string(input_len) + "/" + std::to_string(output_len); }

Result<std::vector<SeesawRatio>> parse_seesaw_ratios(const std::string& text) {
  std::vector<SeesawRatio> out;
  if (text.empty()) return out;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    SeesawRatio r;
    const std::size_t slash = item.find('/');
    const auto number = [&](std::size_t b, std::size_t e, int& v) {
      const auto [p, ec] = std::from_chars(item.data() + b, item.data() + e, v);
      return b < e && ec == std::errc() && p == item.data() + e && v > 0;
    };
    if (slash == std::string::npos || !number(0, slash, r.input_len) ||
        !number(slash + 1, item.size(), r.output_len))
      return make_error(ErrorCode::invalid_argument,
                        "a ratio is INPUT/OUTPUT with positive numbers (e.g. 1024/256), got '" + item + "'");
    out.push_back(r);
  }
  return out;
}

Result<std::pair<engine::ParallelConfig, engine::ParallelConfig>> parse_seesaw_pair(const std::string& text) {
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos || text.find(':', colon + 1) != std::string::npos)
    return make_error(ErrorCode::invalid_argument,
                      "--seesaw wants CP:CD, the prefill and decode configs (e.g. pp=2:tp=2), got '" + text + "'");
  auto cp = engine::parse_parallel_config(text.substr(0, colon));
  auto cd = engine::parse_parallel_config(text.substr(colon + 1));
  for (auto* side : {&cp, &cd})
    if (!*side)
      return make_error(ErrorCode::invalid_argument, "--seesaw '" + text + "': " + side->error().message);
  return std::pair{*cp, *cd};
}

Result<SeesawBenchReport> run_seesaw_bench(const SeesawBenchOptions& o) {
  if (o.cp.dp != 1 || o.cd.dp != 1) return bad("cp and cd are one group's configs (dp = 1)").error();
  if (o.cp.group_size() != o.cd.group_size() || o.cp.group_size() < 2)
    return bad("cp and cd must use the same number of devices, at least 2; got " + short_config(o.cp) + " and " +
               short_config(o.cd))
        .error();
  if (o.cp == o.cd) return bad("cp and cd must differ, got " + short_config(o.cp) + " twice").error();
  if (o.ratios.empty()) return bad("no ratios").error();
  if (o.num_requests < 1 || o.repeats < 1) return bad("the requests and the repeats must be >= 1").error();
  if (Status st = o.seesaw.validate(); !st) return st.error();

  SeesawBenchReport rep;
  rep.model = o.engine.model_dir;
  rep.cp = short_config(o.cp);
  rep.cd = short_config(o.cd);
  rep.dtype = dtype_name(o.engine.dtype);
  rep.kv_cache_dtype = dtype_name(o.engine.kv_cache_dtype);
  rep.devices = o.cp.group_size();
  rep.num_requests = o.num_requests;
  rep.repeats = o.repeats;
  rep.host_kv_bytes = o.engine.swap_space_bytes;
  if (o.engine.host_link) {
    rep.host_link_gbps = o.engine.host_link->gbps;
    rep.host_link_latency_us = o.engine.host_link->latency_us;
  }
  rep.kv_copy = o.engine.seesaw_async_kv ? "async" : "sync";
  if (o.engine.group_link) {
    rep.link_gbps = o.engine.group_link->gbps;
    rep.link_latency_us = o.engine.group_link->latency_us;
  }
  const int cores = std::max(1, omp_get_num_procs());
  rep.cores = cores;
  rep.threads_per_rank = o.engine.num_threads > 0 ? o.engine.num_threads : std::max(1, cores / rep.devices);
  if (o.measure_hardware) {
    omp_set_num_threads(cores);
    rep.membw_gbs = measure_triad_bandwidth_gbs(cores);
    rep.gemm_gflops = measure_linear_gflops(2048, 3, o.engine.dtype);  // the weights' compute
  }

  auto weights = engine::load_weights(o.engine);
  if (!weights) return std::move(weights).error();
  const int vocab = (*weights)->config.vocab_size;

  std::vector<Plan> configs = {static_plan("static-cd", o.cd), static_plan("static-cp", o.cp)};
  Plan dp = static_plan("static-dp", engine::ParallelConfig{});
  dp.replicas = rep.devices;
  dp.parallel = "dp=" + std::to_string(rep.devices);
  configs.push_back(dp);
  configs.push_back(seesaw_plan(o, "configs", engine::SeesawSchedule::transition_minimizing));
  std::vector<Plan> schedules;
  for (const engine::SeesawSchedule s :
       {engine::SeesawSchedule::transition_minimizing, engine::SeesawSchedule::prefill_prioritizing,
        engine::SeesawSchedule::decode_prioritizing})
    schedules.push_back(seesaw_plan(o, "schedules", s));
  std::vector<Plan> copies = {copy_plan(o, false), copy_plan(o, true)};

  for (const auto& [ratios, plans] : {std::pair{&o.ratios, &configs}, std::pair{&o.schedule_ratios, &schedules},
                                      std::pair{&o.copy_ratios, &copies}}) {
    for (const SeesawRatio& ratio : *ratios) {
      if (ratio.input_len < 1 || ratio.output_len < 1) return bad("ratios need positive lengths").error();
      const auto prompts = random_prompts(o.num_requests, ratio.input_len, vocab, o.seed);
      for (int repeat = 0; repeat < o.repeats; ++repeat)
        for (const Plan& p : *plans) {
          auto run = serve(o, p, ratio, repeat, *weights, prompts, rep.threads_per_rank);
          if (!run) return std::move(run).error();
          rep.runs.push_back(std::move(run).value());
        }
    }
  }
  rep.summary = summarize(rep.runs);
  return rep;
}

std::string SeesawBenchReport::to_json() const {
  std::string out = nlohmann::json{{"row", "setup"},
                                   {"model", model},
                                   {"cp", cp},
                                   {"cd", cd},
                                   {"dtype", dtype},
                                   {"kv_cache_dtype", kv_cache_dtype},
                                   {"devices", devices},
                                   {"threads_per_rank", threads_per_rank},
                                   {"cores", cores},
                                   {"num_requests", num_requests},
                                   {"repeats", repeats},
                                   {"host_kv_bytes", host_kv_bytes},
                                   {"link_gbps", link_gbps},
                                   {"link_latency_us", link_latency_us},
                                   {"host_link_gbps", host_link_gbps},
                                   {"host_link_latency_us", host_link_latency_us},
                                   {"kv_copy", kv_copy},
                                   {"membw_gbs", membw_gbs},
                                   {"gemm_gflops", gemm_gflops}}
                        .dump();
  for (const SeesawRun& r : runs)
    out += "\n" + nlohmann::json{{"row", "run"},
                                 {"table", r.table},
                                 {"ratio", r.ratio.to_string()},
                                 {"repeat", r.repeat},
                                 {"config", r.config},
                                 {"parallel", r.parallel},
                                 {"token_budget", r.token_budget},
                                 {"schedule", r.schedule},
                                 {"kv_copy", r.kv_copy},
                                 {"elapsed_s", r.elapsed_s},
                                 {"num_requests", r.num_requests},
                                 {"num_generated", r.num_generated},
                                 {"total_tok_s", r.total_tok_s},
                                 {"output_tok_s", r.output_tok_s},
                                 {"prefill_steps", r.prefill_steps},
                                 {"decode_steps", r.decode_steps},
                                 {"mean_decode_batch", r.mean_decode_batch},
                                 {"preemptions", r.preemptions},
                                 {"transitions", r.transitions},
                                 {"transition_ms", r.transition_ms},
                                 {"switch_ms", r.switch_ms},
                                 {"offloads", r.offloads},
                                 {"onboards", r.onboards},
                                 {"offload_fallbacks", r.offload_fallbacks},
                                 {"host_peak_tokens", r.host_peak_tokens},
                                 {"kv_copy_ms", r.kv_copy_ms},
                                 {"kv_wait_ms", r.kv_wait_ms},
                                 {"hidden_share", r.hidden_share},
                                 {"weight_bytes", r.weight_bytes},
                                 {"decode_weight_bytes", r.decode_weight_bytes},
                                 {"num_kv_blocks", r.num_kv_blocks}}
                      .dump();
  for (const SeesawSummary& s : summary)
    out += "\n" + nlohmann::json{{"row", "summary"},
                                 {"table", s.table},
                                 {"ratio", s.ratio.to_string()},
                                 {"config", s.config},
                                 {"parallel", s.parallel},
                                 {"token_budget", s.token_budget},
                                 {"schedule", s.schedule},
                                 {"kv_copy", s.kv_copy},
                                 {"runs", s.runs},
                                 {"total_tok_s", s.total_tok_s},
                                 {"total_tok_s_min", s.total_tok_s_min},
                                 {"total_tok_s_max", s.total_tok_s_max},
                                 {"output_tok_s", s.output_tok_s},
                                 {"speedup_vs_best_static", s.speedup_vs_best_static},
                                 {"best_static", s.best_static},
                                 {"transitions", s.transitions},
                                 {"transition_ms_per", s.transition_ms_per},
                                 {"switch_ms_per", s.switch_ms_per},
                                 {"offloads", s.offloads},
                                 {"onboards", s.onboards},
                                 {"host_peak_tokens", s.host_peak_tokens},
                                 {"mean_decode_batch", s.mean_decode_batch},
                                 {"kv_copy_ms", s.kv_copy_ms},
                                 {"kv_wait_ms", s.kv_wait_ms},
                                 {"hidden_share", s.hidden_share}}
                      .dump();
  return out;
}

std::string SeesawBenchReport::to_table() const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "# %s %s (KV %s), cp %s -> cd %s on %d devices x %d threads (%d cores), %d requests per ratio, %d "
                "repeats, host KV buffer %.1f MiB, %s KV copies over a host link of %.2f GB/s + %.0f us, devices "
                "linked at %.2f GB/s + %.0f us (0: unpaced); triad %.1f GB/s, GEMM %.0f GFLOP/s (0: not measured)\n",
                model.c_str(), dtype.c_str(), kv_cache_dtype.c_str(), cp.c_str(), cd.c_str(), devices,
                threads_per_rank, cores, num_requests, repeats, static_cast<double>(host_kv_bytes) / (1 << 20),
                kv_copy.c_str(), host_link_gbps, host_link_latency_us, link_gbps, link_latency_us, membw_gbs,
                gemm_gflops);
  out += line;
  out += "# configs: medians over the repeats, total tok/s (min-max); speed-up = seesaw / best static\n";
  std::snprintf(line, sizeof line, "%-9s %-10s %-12s %-8s %9s %19s %8s %7s %6s %9s %9s %6s %6s %9s %7s\n", "ratio",
                "config", "parallel", "budget", "total/s", "(min-max)", "out/s", "speedup", "trans", "ms/trans",
                "switch ms", "offl", "onb", "host peak", "dec bat");
  out += line;
  for (const SeesawSummary& s : summary) {
    if (s.table != "configs") continue;
    char range[64];
    std::snprintf(range, sizeof range, "(%.0f-%.0f)", s.total_tok_s_min, s.total_tok_s_max);
    std::snprintf(line, sizeof line, "%-9s %-10s %-12s %-8s %9.1f %19s %8.1f %7s %6.0f %9.2f %9.3f %6.0f %6.0f %9.0f %7.1f\n",
                  s.ratio.to_string().c_str(), s.config.c_str(), s.parallel.c_str(), s.token_budget.c_str(),
                  s.total_tok_s, range, s.output_tok_s,
                  s.config == "seesaw" ? (std::to_string(s.speedup_vs_best_static).substr(0, 5) + "x").c_str() : "",
                  s.transitions, s.transition_ms_per, s.switch_ms_per, s.offloads, s.onboards, s.host_peak_tokens,
                  s.mean_decode_batch);
    out += line;
  }
  bool any_schedule = false;
  for (const SeesawSummary& s : summary) any_schedule = any_schedule || s.table == "schedules";
  if (any_schedule) {
    out += "# schedules (seesaw " + cp + " -> " + cd + "): medians over the repeats\n";
    std::snprintf(line, sizeof line, "%-9s %-22s %9s %19s %8s %6s %9s %6s %6s %9s %7s\n", "ratio", "schedule",
                  "total/s", "(min-max)", "out/s", "trans", "ms/trans", "offl", "onb", "host peak", "dec bat");
    out += line;
    for (const SeesawSummary& s : summary) {
      if (s.table != "schedules") continue;
      char range[64];
      std::snprintf(range, sizeof range, "(%.0f-%.0f)", s.total_tok_s_min, s.total_tok_s_max);
      std::snprintf(line, sizeof line, "%-9s %-22s %9.1f %19s %8.1f %6.0f %9.2f %6.0f %6.0f %9.0f %7.1f\n",
                    s.ratio.to_string().c_str(), s.schedule.c_str(), s.total_tok_s, range, s.output_tok_s,
                    s.transitions, s.transition_ms_per, s.offloads, s.onboards, s.host_peak_tokens,
                    s.mean_decode_batch);
      out += line;
    }
  }
  bool any_copies = false;
  for (const SeesawSummary& s : summary) any_copies = any_copies || s.table == "copies";
  if (any_copies) {
    out += "# copies (seesaw " + cp + " -> " + cd + ", transition-minimizing): KV copies on the engine's thread "
           "(sync) or the prefetcher thread (async, §5.2); medians over the repeats\n";
    std::snprintf(line, sizeof line, "%-9s %-6s %9s %19s %8s %6s %10s %10s %7s %9s\n", "ratio", "copies", "total/s",
                  "(min-max)", "out/s", "trans", "copy ms", "waited ms", "hidden", "ms/trans");
    out += line;
    for (const SeesawSummary& s : summary) {
      if (s.table != "copies") continue;
      char range[64];
      std::snprintf(range, sizeof range, "(%.0f-%.0f)", s.total_tok_s_min, s.total_tok_s_max);
      std::snprintf(line, sizeof line, "%-9s %-6s %9.1f %19s %8.1f %6.0f %10.1f %10.1f %6.0f%% %9.2f\n",
                    s.ratio.to_string().c_str(), s.kv_copy.c_str(), s.total_tok_s, range, s.output_tok_s,
                    s.transitions, s.kv_copy_ms, s.kv_wait_ms, 100 * s.hidden_share, s.transition_ms_per);
      out += line;
    }
  }
  out += "# runs\n";
  std::snprintf(line, sizeof line,
                "%-9s %-9s %3s %-10s %-12s %-21s %-5s %8s %9s %8s %6s %6s %7s %5s %5s %8s %8s %6s %4s %6s %9s %8s %4s "
                "%7s %7s\n",
                "table", "ratio", "rep", "config", "parallel", "schedule", "copy", "wall s", "total/s", "out/s", "p.step",
                "d.step", "dec bat", "preem", "trans", "trans ms", "swtch ms", "offl", "fb", "onb", "host peak",
                "copy ms", "hid%", "w MB", "cd MB");
  out += line;
  for (const SeesawRun& r : runs) {
    std::snprintf(line, sizeof line,
                  "%-9s %-9s %3d %-10s %-12s %-21s %-5s %8.2f %9.1f %8.1f %6lld %6lld %7.1f %5lld %5lld %8.2f %8.3f "
                  "%6lld %4lld %6lld %9lld %8.1f %4.0f %7.1f %7.1f\n",
                  r.table.c_str(), r.ratio.to_string().c_str(), r.repeat, r.config.c_str(), r.parallel.c_str(),
                  r.schedule.c_str(), r.kv_copy.c_str(), r.elapsed_s, r.total_tok_s, r.output_tok_s, r.prefill_steps,
                  r.decode_steps, r.mean_decode_batch, r.preemptions, r.transitions, r.transition_ms, r.switch_ms,
                  r.offloads, r.offload_fallbacks, r.onboards, r.host_peak_tokens, r.kv_copy_ms, 100 * r.hidden_share,
                  static_cast<double>(r.weight_bytes) / 1e6,
                  static_cast<double>(r.decode_weight_bytes) / 1e6);
    out += line;
  }
  return out;
}

}  // namespace shardline::bench
