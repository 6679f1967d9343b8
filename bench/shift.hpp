#pragma once
/// \file
/// `shardline bench --shift --parallel sp=2` (or sp=2,tp=2): Shift
/// Parallelism (seed 001, §3 and Alg. 3) on in-process CPU devices, the two
/// measurements of the paper's evaluation in the shapes they take here:
///  1. crossover: the wall time of one step of n batched tokens in the base
///     config (SP×TP) and in the shift config (TP' = SP×TP), both on the same
///     engine group and KV cache, for a decode step of n sequences and for a
///     prefill step of one n-token prompt; the measured crossover (the least n
///     from which the base is faster) beside the cost model's prediction
///     (sim/cost_model.hpp CostModel::shift_threshold, hardware
///     measured in this run), which is what `--shift-threshold auto` uses;
///  2. mixed: a stream of long prompts with short outputs mixed with short
///     prompts and long outputs (the paper's §4 mixed workload), served three
///     ways on the same group: static base (T = 0: static SP), static TP'
///     (T = step budget: every step shifted, bit-identical to a static tp =
///     sp*tp group) and Shift (T from the cost model, or --shift-threshold N):
///     total and output tokens/s, time to first token and time per output
///     token (medians and p90 over requests), steps per config and switches.
/// The configs run alternately, `repeats` times each, and every number is
/// reported per run with the median, so neighbours' noise is visible.
///
/// Emulation: none. The ranks are threads sharing one memory bus; an SP rank
/// re-reads the whole TP shard of the weights (SP replicates them), which on a
/// GPU costs each device its own HBM time but here costs the one shared bus
/// sp times; collectives are in-process copies. docs/parallel.md says what
/// that changes against the paper's GPUs.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"

namespace shardline::bench {

/// One class of requests of the mixed workload.
struct RequestClass {
  int count = 0;
  int input_len = 0;   ///< prompt tokens
  int output_len = 0;  ///< generated tokens (ignore_eos)
};

/// "8x1024/16" -> {8, 1024, 16}. Errors: invalid_argument naming the text.
[[nodiscard]] Result<RequestClass> parse_request_class(const std::string& text);

struct ShiftBenchOptions {
  /// Model / shape, dtype, KV; `parallel` is the base config (pp = 1, sp*tp
  /// >= 2, dp = 1); `shift` is set by the bench; num_threads per rank (0:
  /// cores / devices).
  engine::EngineOptions engine;
  long long threshold = -1;  ///< T of the Shift runs; < 0: the cost model's (auto)
  double hysteresis = 0.25;
  RequestClass long_requests{8, 1024, 16};
  RequestClass short_requests{24, 64, 256};
  /// Requests per second of a Poisson arrival stream in a seeded random
  /// order of the two classes; 0: all arrive at once (an offline batch).
  double arrival_rate = 0;
  int max_batch = 32;  ///< running sequences at most (raised to the decode sweep's largest n)
  /// Tokens per step of the crossover sweep (empty: skip it); decode steps
  /// go up to max_decode_sweep sequences.
  std::vector<int> sweep_tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  int max_decode_sweep = 256;
  int repeats = 3;
  std::uint64_t seed = 1;
};

/// Crossover table: one row per n.
struct ShiftSweepRow {
  int num_tokens = 0;
  double decode_base_ms = 0, decode_shift_ms = 0;    ///< median step; 0 when n > max_decode_sweep
  double prefill_base_ms = 0, prefill_shift_ms = 0;  ///< median step
  double predicted_base_ms = 0, predicted_shift_ms = 0;  ///< cost model, n decodes
};

/// One served run of the mixed workload.
struct ShiftMixedRun {
  std::string config;         ///< "base", "tp" or "shift"
  long long threshold = 0;    ///< T it ran with
  double elapsed_s = 0;
  long long num_requests = 0, num_generated = 0;  ///< requests finished, tokens they generated
  double total_tok_s = 0;     ///< (prompt + generated) / elapsed
  double output_tok_s = 0;    ///< generated / elapsed
  double ttft_ms_median = 0, ttft_ms_p90 = 0;  ///< arrival -> first token, over requests
  double tpot_ms_median = 0, tpot_ms_p90 = 0;  ///< (last - first token) / (generated - 1)
  double ttft_long_ms_median = 0, ttft_short_ms_median = 0;
  std::uint64_t base_steps = 0, shift_steps = 0, switches = 0;
};

struct ShiftBenchReport {
  std::string model, base;
  int devices = 0, threads_per_rank = 0, cores = 0;
  double membw_gbs = 0, gemm_gflops = 0, comm_gbs = 0, comm_latency_us = 0;
  std::uint64_t base_weight_bytes = 0;   ///< rank 0's packed weights, base config
  std::uint64_t shift_weight_bytes = 0;  ///< rank 0's packed weights, shift config (held separately)
  long long predicted_threshold = 0;     ///< the cost model's T (capped at the step budget)
  bool predicted_capped = false;
  int measured_decode_crossover = 0;     ///< least swept n with base faster (0: none)
  int measured_prefill_crossover = 0;
  std::vector<ShiftSweepRow> sweep;
  RequestClass long_requests, short_requests;
  double arrival_rate = 0;
  std::vector<ShiftMixedRun> runs;  ///< in the order run
  [[nodiscard]] std::string to_json() const;
  [[nodiscard]] std::string to_table() const;
};

/// Errors: invalid_argument (pp != 1, a group of one device, dp != 1,
/// non-positive sizes), engine build errors.
[[nodiscard]] Result<ShiftBenchReport> run_shift_bench(const ShiftBenchOptions& options);

}  // namespace shardline::bench
