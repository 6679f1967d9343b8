#include "cli/parallel_auto.hpp"
#include "model/tokenizer_loader.hpp"

#include <omp.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <iostream>

#include "sim/calibration/calibrate.hpp"
#include "cli/devices.hpp"
#include "model/config.hpp"
#include "text/tokenizer.hpp"
#include "sim/planner.hpp"
#include "sim/workload.hpp"

namespace shardline::cli {

std::string default_cpu_calibration() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.shardline/cpu-calibration.json";
}

Result<sim::ClusterSpec> load_cluster_or_measure(const std::string& name, const std::string& calibration,
                                                 int threads) {
  Result<sim::ClusterSpec> cluster = sim::load_cluster(name, calibration);
  const bool cpu = name == "cpu" || name.rfind("cpux", 0) == 0;
  if (cluster || !cpu || std::filesystem::exists(calibration)) return cluster;
  std::cerr << "note: no CPU calibration at " << calibration
            << "; using limits measured now, uncalibrated (run `shardline simulate --calibrate --shape DIR`)\n";
  sim::ClusterSpec c;
  c.device = sim::calibration::measure_cpu_device(threads);
  c.name = name;
  const auto x = name.find('x');
  c.num_devices = x == std::string::npos ? 1 : std::max(1, std::atoi(name.c_str() + x + 1));
  return c;
}

Result<AutoParallel> plan_parallel_auto(const std::string& model_dir, const std::vector<std::string>& inputs,
                                        const std::string& devices, const std::string& token_budget,
                                        int max_batch) {
  int n = omp_get_num_procs();
  if (!devices.empty()) {
    auto list = parse_devices(devices);
    if (!list) return list.error();
    if (list->kind != model::DeviceKind::cpu)
      return make_error(ErrorCode::invalid_argument, "--parallel auto plans CPU devices (cpu:N), not " + devices);
    n = static_cast<int>(list->indices.size());
  }
  auto config = model::load_model_config(model_dir);
  if (!config) return config.error();
  auto tokenizer = model::load_tokenizer(model_dir);
  sim::SimOptions so;
  so.max_batch = max_batch;
  std::vector<sim::SimRequest> workload;
  for (const std::string& path : inputs) {
    auto w = sim::workload_from_jsonl(path, tokenizer ? tokenizer->get() : nullptr, 256);
    if (!w) return w.error();
    workload.insert(workload.end(), w->requests.begin(), w->requests.end());
  }
  if (workload.empty()) return make_error(ErrorCode::invalid_argument, "--parallel auto: the input has no request lines");

  auto cluster_or = load_cluster_or_measure("cpux" + std::to_string(n), default_cpu_calibration(), 0);
  if (!cluster_or) return cluster_or.error();
  const sim::ClusterSpec& cluster = *cluster_or;
  sim::PlanOptions po;
  po.num_devices = n;
  po.shift_threshold = 0;  // Shift needs --shift on the real group
  po.seesaw = false;       // and Seesaw and SiDP their own flags
  po.sidp = false;
  po.token_budgets = {token_budget.empty() ? std::string("fixed") : token_budget};
  po.sim = so;
  po.sim.dispatch = sim::SimOptions::Dispatch::orchestrator;
  auto p = sim::plan(*config, cluster, workload, po);
  if (!p) return p.error();
  const sim::PlanEntry& best = p->ranked.front();
  AutoParallel out;
  out.parallel = best.strategy.parallel.to_string();
  out.devices = "cpu:" + std::to_string(n);
  out.why = p->why + " (simulated on " + cluster.device.name + ", " + std::to_string(workload.size()) +
            " requests from the input)";
  return out;
}

}  // namespace shardline::cli
