#include "cli/shift_threshold.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "sim/calibration/hardware.hpp"
#include "model/config.hpp"
#include "sim/cost_model.hpp"

namespace shardline::cli {

Status resolve_shift_threshold(const EngineFlags& f, const engine::ParallelConfig& parallel,
                               engine::EngineOptions& o) {
  if (!f.shift || f.shift_threshold != "auto" || !o.shift) return Status::ok_status();
  const auto fail = [](const std::string& m) {
    return Status(make_error(ErrorCode::invalid_argument, "--shift-threshold auto: " + m));
  };
  auto config = model::load_model_config(o.model_dir);
  if (!config) return fail(config.error().message);
  if (o.num_layers_override > 0) config->num_hidden_layers = std::min(config->num_hidden_layers, o.num_layers_override);
  const int devices = parallel.group_size();
  const int threads = std::max(1, o.num_threads) * devices;
  const double membw_gbs = sim::calibration::measure_triad_bandwidth_gbs(threads, 64L << 20, 3);
  const double gemm_gflops = sim::calibration::measure_linear_gflops(512, 2, o.dtype);  // the weights' compute
  const double comm_bytes_per_s = sim::calibration::measure_inproc_allreduce_bytes_per_s(devices, 1L << 20, 5);
  const double comm_latency_s = sim::calibration::measure_inproc_allreduce_latency_s(devices, 200);
  const sim::LinkSpec link{comm_bytes_per_s, comm_latency_s};
  auto cost = sim::CostModel::for_cpu_devices(*config, o.dtype, o.kv_cache_dtype, membw_gbs * 1e9,
                                                       gemm_gflops * 1e9, devices, link);
  if (!cost) return fail(cost.error().message);
  engine::ParallelConfig base = parallel;
  base.dp = 1;
  auto t = cost->shift_threshold(base, sim::CostModel::kShiftThresholdContextTokens, std::max(1, o.max_num_batched_tokens));
  if (!t) return fail(t.error().message);
  o.shift->policy.threshold = t->threshold;
  spdlog::info("shift: T = {} tokens from the cost model{} ({} vs tp={}: {:.3f} vs {:.3f} ms at {} tokens; measured "
               "{:.1f} GB/s, {:.0f} GFLOP/s, all-reduce {:.2f} GB/s per rank and {:.1f} us among {} devices{})",
               t->threshold, t->capped ? " (capped: the shift config is never slower)" : "", base.to_string(),
               devices, t->base_ms, t->shift_ms, std::max(1LL, t->threshold), membw_gbs, gemm_gflops,
               comm_bytes_per_s / 1e9, comm_latency_s * 1e6, devices,
               o.group_master.empty() ? "" : "; in-process collectives: a TCP group's are slower, pass --shift-threshold N");
  return Status::ok_status();
}

}  // namespace shardline::cli
