#pragma once
/// \file
/// `shardline bench --parallel ...`: throughput of each parallel config
/// (TP/PP/SP/DP on in-process CPU devices) on the same workload, with the
/// communication volume, the pipeline bubble under each token budget policy
/// (gLLM Token Throttling vs a Sarathi-style fixed budget), and the step
/// time the cost model (sim/cost_model.hpp, seed 000 App. A)
/// predicts from hardware limits measured in the same run.
///
/// Per config and policy, with the same seeded random prompts:
///  1. a prefill run (max_tokens = 1): prefill_tok_s = prompt tokens / wall;
///  2. the full run (output_len tokens, ignore_eos): total_tok_s =
///     (prompt + generated) / wall; decode_tok_s = (generated - num_prompts)
///     / (full wall - prefill wall).
///  decode_step_ms is the median wall time of the engine's step() over
///  pure-decode micro-batches at the largest decode batch (with PP one step()
///  returns one micro-batch: in steady state that is the slowest stage's time);
///  decode_round_ms = pp * decode_step_ms is the time for every running
///  sequence to advance one token. bubble_fraction (PP) = 1 - sum over stages
///  of busy time / (pp * wall) over the full run.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/sidp/sidp_group.hpp"

namespace shardline::sim::calibration {

struct ParallelBenchOptions {
  engine::EngineOptions engine;  ///< model / shape, dtype, KV; num_threads = per rank (0: cores / devices)
  std::vector<engine::ParallelConfig> configs;  ///< run in order
  /// Policies for configs with pp > 1 ("fixed", "throttle"); pp == 1 runs "fixed" only.
  std::vector<std::string> token_budgets = {"fixed", "throttle"};
  int num_prompts = 32;
  int input_len = 64;
  int output_len = 64;
  int max_batch = 32;  ///< running sequences at most per replica
  std::uint64_t prompt_seed = 1;
  /// Measure triad, the linear's GFLOP/s and the all-reduce first (a few
  /// seconds; the report's membw_gbs ... comm_latency_us and the
  /// predictions); false leaves them 0 (a caller that only wants the runs).
  bool measure_hardware = true;
  /// Run the prefill-only run first (prefill_tok_s, decode_tok_s); false
  /// leaves those 0 and runs the full run only.
  bool prefill_run = true;
  /// SiDP (seed 002, engine/sidp/sidp_group.hpp): each config must be dp >= 2
  /// single-device ranks, which run as one SidpGroup with these options
  /// (its dp is the config's) instead of independent replicas; nullopt = off.
  std::optional<engine::SidpOptions> sidp;
};

struct ParallelConfigResult {
  std::string parallel;      ///< ParallelConfig::to_string()
  std::string token_budget;  ///< "fixed" or "throttle"
  int num_devices = 0;       ///< world_size()
  int threads_per_rank = 0;
  double prefill_elapsed_s = 0, elapsed_s = 0;
  double total_tok_s = 0, prefill_tok_s = 0, decode_tok_s = 0;
  double decode_step_ms = 0;   ///< measured, per micro-batch
  /// The engine's own time in those steps (step wall minus the executor's
  /// time: scheduling, sampling), median, ms.
  double decode_own_ms = 0;
  int decode_batch = 0;        ///< sequences in those micro-batches
  double decode_round_ms = 0;  ///< measured, pp * decode_step_ms
  double bubble_fraction = 0;  ///< measured (PP), 0 otherwise
  double comm_bytes_per_step = 0;  ///< rank 0's collective payload + activations sent, median over decode steps
  // Cost model (seed 000 App. A) with the hardware measured in this run:
  double predicted_decode_step_ms = 0;  ///< steady state t_max for decode_batch * pp sequences in pp micro-batches
  double predicted_decode_round_ms = 0;
  double predicted_prefill_tok_s = 0;   ///< micro-batches of max_num_batched_tokens prompt tokens, steady state
  double predicted_comm_bytes_per_step = 0;  ///< per rank, per micro-batch (TP + SP + PP)
  double predicted_bubble_fraction = 0;      ///< stage imbalance in steady state: 1 - sum t_s / (pp t_max)
};

struct ParallelBenchReport {
  std::string model;
  int num_prompts = 0, input_len = 0, output_len = 0, max_batch = 0, cores = 0;
  double membw_gbs = 0;         ///< STREAM triad, all cores
  double gemm_gflops = 0;       ///< Shardline linear on 2048^3, all cores
  double comm_gbs = 0;          ///< in-process all-reduce, bytes one rank sends per second (ring-equivalent volume)
  double comm_latency_us = 0;   ///< one small all-reduce
  std::vector<ParallelConfigResult> results;
  /// One JSON object (a single line when dumped).
  [[nodiscard]] std::string to_json() const;
  /// A fixed-width table for people.
  [[nodiscard]] std::string to_table() const;
};

/// Errors: invalid_argument (no configs, non-positive sizes, unknown policy),
/// engine build errors (e.g. a config that does not shard the model).
[[nodiscard]] Result<ParallelBenchReport> run_parallel_bench(const ParallelBenchOptions& options);

}  // namespace shardline::sim::calibration
