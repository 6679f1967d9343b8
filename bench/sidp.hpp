#pragma once
/// \file
/// `shardline bench --weight-sharing sidp`: SiDP (seed 002) on in-process
/// CPU devices, the four measurements of the paper's evaluation in the
/// shapes they take here:
///  1. capacity: KV tokens per device at a fixed --device-memory, plain DP vs
///     SiDP at dp = 2, 4, 8 (Fig. 5's shape; arithmetic of the memory plan,
///     no compute);
///  2. crossover: decode step time vs batch size per rank for plain DP, WaS
///     and CaS at dp (Fig. 11's shape), the measured b* (smallest batch at
///     which WaS is no slower than CaS) beside the cost model's prediction
///     (sim/cost_model.hpp sidp_switch_batch, hardware measured in
///     this run);
///  3. e2e: a long-tailed job (output lengths log-uniform in [min, max]) at a
///     tight --device-memory: plain DP, SiDP WaS only and SiDP auto, with the
///     time spent in the tail (Figs. 13-14's shape);
///  4. peak: WaS decode throughput with peak shifting on vs off at dp = 4
///     (Fig. 10's shape).
/// Link emulation (comm/paced.hpp) paces weight gets and CaS sends to
/// link_ratio x the measured memory bandwidth per rank unless a link is
/// given: CPU devices share one memory bus, so without it a "remote" read
/// costs a local memcpy.

#include <cstdint>
#include <string>
#include <vector>

#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"

namespace shardline::bench {

struct SidpBenchOptions {
  engine::EngineOptions engine;  ///< model / shape, dtype; num_threads = per rank (0: cores / dp)
  int dp = 2;
  comm::LinkSpec link{0.0, 2.0};  ///< gbps 0: link_ratio x measured triad bandwidth / dp
  double link_ratio = 0.19;      ///< H200: NVLink 900 GB/s / HBM 4.8 TB/s
  int cache_slots = 2;
  std::vector<std::string> tables = {"capacity", "crossover", "e2e", "peak"};
  // crossover
  std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64, 128};
  int context_len = 32;   ///< prompt tokens per sequence of a decode point
  int decode_steps = 6;   ///< measured decode steps per point (median)
  // capacity
  std::vector<int> capacity_dps = {2, 4, 8};
  std::uint64_t device_memory_bytes = 0;  ///< capacity and e2e budget; 0: plain weights + 8 sequences' KV
  // e2e
  int e2e_prompts = 32;
  int e2e_input_len = 32;
  int e2e_min_output = 16;
  int e2e_max_output = 512;
  long long switch_batch = 0;  ///< group b* for auto; 0: the cost model's (x dp)
  double min_dwell_s = 1.0;
  // peak
  int peak_dp = 4;
  int peak_batch = 8;
  std::uint64_t seed = 1;
};

struct SidpCapacityRow {
  int dp = 0;
  std::uint64_t plain_kv_tokens = 0, sidp_kv_tokens = 0;  ///< per rank (rank 0 / the least rank)
  std::uint64_t plain_weight_bytes = 0, sidp_weight_bytes = 0;  ///< rank 0
};

struct SidpCrossoverRow {
  int batch = 0;  ///< sequences per rank
  double plain_ms = 0, was_ms = 0, cas_ms = 0;  ///< median decode step of rank 0
};

struct SidpE2eRow {
  std::string config;  ///< "plain", "sidp-was", "sidp-auto"
  int kv_blocks = 0;   ///< per rank (rank 0)
  double elapsed_s = 0, output_tok_s = 0, tail_s = 0;
  int switches = 0;
};

struct SidpPeakRow {
  bool peak_shifting = false;
  double step_ms = 0, tok_s = 0;
  double link_wait_ms_per_step = 0;  ///< rank 0's housekeeper time in gets, per step
};

struct SidpBenchReport {
  std::string model;
  int dp = 0, cores = 0, threads_per_rank = 0;
  double membw_gbs = 0, gemm_gflops = 0;  ///< measured, whole machine (a quantized FFN: its kernel's rate)
  double weight_bytes = 0;  ///< per weight, what the cost model prices (a quantized FFN: its regions' bytes)
  std::string gemm_format;  ///< what gemm_gflops measured: the weights' dtype or quantized type
  double link_gbs = 0, link_latency_us = 0;
  std::uint64_t device_memory_bytes = 0;
  std::vector<SidpCapacityRow> capacity;
  std::vector<SidpCrossoverRow> crossover;
  int measured_switch_batch = 0;       ///< per rank; 0 when WaS never caught up
  long long predicted_switch_batch = 0;  ///< per rank, cost model, FFN GEMM only (conservative)
  long long predicted_overlapped_switch_batch = 0;  ///< per rank, cost model counting the forward pass and dp
  double predicted_fetch_ms = 0;
  std::vector<SidpE2eRow> e2e;
  long long e2e_switch_batch = 0;  ///< group b* the auto run used
  std::vector<SidpPeakRow> peak;
  [[nodiscard]] std::string to_json() const;
  [[nodiscard]] std::string to_table() const;
};

/// Errors: invalid_argument (dp < 2, empty batches, unknown table), engine
/// build errors.
[[nodiscard]] Result<SidpBenchReport> run_sidp_bench(const SidpBenchOptions& options);

}  // namespace shardline::bench
