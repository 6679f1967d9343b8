#include "sim/planner.hpp"

#include <algorithm>
#include <cstdio>

#include "model/shard_runner.hpp"

namespace shardline::sim {
namespace {

std::string fmt(const char* f, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

}  // namespace

std::vector<Strategy> candidate_strategies(const model::ModelConfig& config, int num_devices,
                                           const PlanOptions& options) {
  std::vector<Strategy> out;
  for (int tp = 1; tp <= num_devices; ++tp) {
    if (num_devices % tp != 0) continue;
    for (int pp = 1; pp <= num_devices / tp; ++pp) {
      if ((num_devices / tp) % pp != 0) continue;
      for (int sp = 1; sp <= num_devices / (tp * pp); ++sp) {
        if ((num_devices / (tp * pp)) % sp != 0) continue;
        const int dp = num_devices / (tp * pp * sp);
        if (!model::check_shardable(config, tp, sp, pp).ok()) continue;
        Strategy s;
        s.parallel.tp = tp;
        s.parallel.pp = pp;
        s.parallel.sp = sp;
        s.parallel.dp = dp;
        std::vector<std::string> budgets = options.token_budgets;
        if (budgets.empty()) budgets = {"fixed"};
        if (pp == 1) budgets.resize(1);
        for (const std::string& b : budgets) {
          s.token_budget = b;
          s.shift.reset();
          out.push_back(s);
          if (sp > 1 && pp == 1 && options.shift_threshold > 0) {
            s.shift = engine::ShiftPolicyOptions{options.shift_threshold, options.shift_hysteresis};
            out.push_back(s);
          }
        }
      }
    }
  }
  const std::string first_budget = options.token_budgets.empty() ? "fixed" : options.token_budgets.front();
  if (options.seesaw)
    for (int g = 2; g <= num_devices; ++g) {
      if (num_devices % g != 0 || !model::check_shardable(config, g, 1, 1).ok() ||
          !model::check_shardable(config, 1, 1, g).ok())
        continue;
      Strategy s;
      s.parallel.pp = g;
      s.parallel.dp = num_devices / g;
      s.token_budget = first_budget;
      SeesawStrategy seesaw;
      seesaw.decode.tp = g;
      seesaw.host_buffer_bytes_per_device = options.seesaw_host_buffer_bytes_per_device;
      s.seesaw = seesaw;
      out.push_back(s);
    }
  if (options.sidp && num_devices >= 2) {
    Strategy s;
    s.parallel.dp = num_devices;
    s.token_budget = first_budget;
    s.sidp = SidpStrategy{};
    out.push_back(s);
  }
  return out;
}

Result<Plan> plan(const model::ModelConfig& config, const ClusterSpec& cluster,
                  const std::vector<SimRequest>& workload, const PlanOptions& options) {
  const int n = options.num_devices > 0 ? options.num_devices : cluster.num_devices;
  if (n < 1 || n > cluster.num_devices)
    return make_error(ErrorCode::invalid_argument, "plan: " + std::to_string(n) + " devices; cluster " +
                                                       cluster.name + " has " + std::to_string(cluster.num_devices));
  if (workload.empty()) return make_error(ErrorCode::invalid_argument, "plan: an empty workload");
  Plan p;
  for (const Strategy& s : candidate_strategies(config, n, options)) {
    PlanEntry e;
    e.strategy = s;
    auto r = simulate(config, cluster, s, workload, options.sim);
    if (r) {
      e.result = std::move(r).value();
      p.ranked.push_back(std::move(e));
    } else {
      e.error = r.error().to_string();
      p.infeasible.push_back(std::move(e));
    }
  }
  if (p.ranked.empty()) {
    if (p.infeasible.empty())
      return make_error(ErrorCode::invalid_argument, "plan: the model cannot be sharded over " + std::to_string(n) +
                                                         " devices");
    return make_error(ErrorCode::out_of_memory, "plan: no strategy fits; e.g. " + p.infeasible.front().strategy.label() +
                                                    ": " + p.infeasible.front().error);
  }
  std::stable_sort(p.ranked.begin(), p.ranked.end(), [](const PlanEntry& a, const PlanEntry& b) {
    if (a.result.total_tok_s != b.result.total_tok_s) return a.result.total_tok_s > b.result.total_tok_s;
    const int ga = a.strategy.parallel.group_size(), gb = b.strategy.parallel.group_size();
    if (ga != gb) return ga < gb;
    return a.strategy.label() < b.strategy.label();
  });
  const SimResult& best = p.ranked.front().result;
  p.why = best.strategy + fmt(": %.0f tok/s", best.total_tok_s);
  if (p.ranked.size() > 1) {
    const SimResult& next = p.ranked[1].result;
    p.why += fmt(", %.2fx the runner-up ", best.total_tok_s / std::max(next.total_tok_s, 1e-9)) + next.strategy +
             fmt(" (%.0f tok/s). ", next.total_tok_s);
    p.why += fmt("Prefill %.0f vs %.0f tok/s", best.prefill_tok_s, next.prefill_tok_s) +
             fmt(", decode step %.2f vs %.2f ms", best.decode_step_ms, next.decode_step_ms) +
             fmt(" at batch %.0f vs %.0f", best.decode_batch, next.decode_batch) +
             fmt(", KV peak %.0f%% vs %.0f%%", 100 * best.kv_peak_fraction, 100 * next.kv_peak_fraction);
    if (best.bubble_fraction > 0 || next.bubble_fraction > 0)
      p.why += fmt(", pipeline bubble %.0f%% vs %.0f%%", 100 * best.bubble_fraction, 100 * next.bubble_fraction);
    p.why += ".";
  } else {
    p.why += " (the only strategy that fits).";
  }
  if (!p.infeasible.empty())
    p.why += " " + std::to_string(p.infeasible.size()) + " strateg" + (p.infeasible.size() == 1 ? "y does" : "ies do") +
             " not fit the devices' memory.";
  return p;
}

}  // namespace shardline::sim
