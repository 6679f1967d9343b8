#pragma once
/// \file
/// `--parallel auto` of `shardline run`: the planner (sim/planner.hpp)
/// picks the parallel config for this machine's CPU devices and the job's
/// own input lines, simulated on the calibrated CPU device
/// (~/.shardline/cpu-calibration.json, or this machine measured now when
/// there is none).

#include <string>
#include <vector>

#include "common/result.hpp"
#include "sim/hardware_spec.hpp"

namespace shardline::cli {

/// ~/.shardline/cpu-calibration.json: where `simulate --calibrate` writes
/// this machine's CPU device.
[[nodiscard]] std::string default_cpu_calibration();

/// The cluster `name` (sim::load_cluster with `calibration`). A `cpu` /
/// `cpuxN` cluster whose calibration file does not exist yet is this
/// machine measured now with `threads` threads, uncalibrated
/// (sim::calibration::measure_cpu_device), said in a note on stderr; plain `cpu` then
/// has one device. Errors: sim::load_cluster's.
[[nodiscard]] Result<sim::ClusterSpec> load_cluster_or_measure(const std::string& name,
                                                               const std::string& calibration, int threads);

struct AutoParallel {
  std::string parallel;      ///< the chosen config, ParallelConfig::to_string()
  std::string devices;       ///< "cpu:N"
  std::string why;           ///< the planner's reason, for the user
};

/// Plans over `devices` ("cpu:N"; "" = every core) for the lines of
/// `inputs`, under the job's `token_budget` policy. `max_batch` is the
/// workers' batch. Shift and Seesaw are not candidates (they need their own
/// flags). Errors: invalid_argument (cuda devices, a bad --devices, no
/// request lines), the planner's and the workload reader's.
[[nodiscard]] Result<AutoParallel> plan_parallel_auto(const std::string& model_dir,
                                                      const std::vector<std::string>& inputs,
                                                      const std::string& devices, const std::string& token_budget,
                                                      int max_batch);

}  // namespace shardline::cli
