#pragma once
/// \file
/// The planner the design names (`shardline plan`, `--parallel auto`;
/// docs/simulator.md): every strategy a cluster of N devices can run a
/// model with, simulated on the workload, ranked by throughput.
///
/// Candidates: every (tp, pp, sp, dp) with tp * pp * sp * dp = N that the
/// model can be sharded into (model::check_shardable: tp*sp divides the
/// heads, tp the FFN width, pp <= layers); for pp > 1 each token budget
/// policy (fixed, gLLM's throttle); for sp > 1 and pp = 1 also Shift
/// Parallelism (steps of <= T tokens in tp*sp); with `seesaw`, for each
/// group size g > 1, Seesaw with prefill in pp=g and decode in tp=g (dp =
/// N / g; seed 000's pairing); with `sidp`, for dp = N single-device ranks,
/// SiDP switching automatically (seed 002, the orchestrator's b*). Each is simulated
/// (sim::simulate); those that do not fit the devices' memory are set aside
/// with their reason. The ranking is by total_tok_s (ties: fewer devices
/// per group, then the label), and `why` compares the best with the
/// runner-up in the terms that decide it (decode step, prefill rate, KV
/// use, bubbles, collectives).

#include <string>
#include <vector>

#include "common/result.hpp"
#include "model/config.hpp"
#include "sim/hardware_spec.hpp"
#include "sim/simulator.hpp"

namespace shardline::sim {

struct PlanOptions {
  int num_devices = 0;                 ///< devices to use; 0: every device of the cluster
  std::vector<std::string> token_budgets = {"fixed", "throttle"};  ///< tried for pp > 1 (pp = 1: the first)
  long long shift_threshold = 256;     ///< Shift candidates' T (0: no Shift candidates)
  double shift_hysteresis = 0.25;
  /// Seesaw candidates (cp = pp=g, cd = tp=g) and their host KV buffer per
  /// device, bytes (the paper's 80 GiB). `--parallel auto` leaves them out:
  /// a real run needs the Seesaw flags.
  bool seesaw = true;
  double seesaw_host_buffer_bytes_per_device = 80.0 * double(1ull << 30);
  /// A SiDP candidate (dp = N, `auto` mode). `--parallel auto` leaves it out.
  bool sidp = true;
  SimOptions sim;                      ///< max batch, step budget, dispatch
};

struct PlanEntry {
  Strategy strategy;
  SimResult result;   ///< when feasible
  std::string error;  ///< why it cannot run ("" when feasible)
};

struct Plan {
  std::vector<PlanEntry> ranked;      ///< feasible, best first
  std::vector<PlanEntry> infeasible;  ///< with their errors
  std::string why;                    ///< the best against the runner-up, in words
};

/// The candidates for `num_devices` devices (see the file comment), in a
/// fixed order.
[[nodiscard]] std::vector<Strategy> candidate_strategies(const model::ModelConfig& config, int num_devices,
                                                         const PlanOptions& options);

/// Simulates every candidate. Errors: invalid_argument (num_devices < 1 or
/// more than the cluster has, an empty workload), and when no candidate
/// fits: out_of_memory with the first candidate's reason.
[[nodiscard]] Result<Plan> plan(const model::ModelConfig& config, const ClusterSpec& cluster,
                                const std::vector<SimRequest>& workload, const PlanOptions& options);

}  // namespace shardline::sim
