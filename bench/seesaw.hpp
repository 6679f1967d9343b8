#pragma once
/// \file
/// `shardline bench --seesaw pp=2:tp=2`: Seesaw (seed 000) on in-process CPU
/// devices against the static configs of the same devices, the two
/// measurements of the paper's evaluation in the shapes they take here:
///  1. configs (the shape of Fig. 13): for each input/output ratio, an
///     offline batch of N requests (fixed lengths, ignore_eos, greedy) served
///     as static cd alone, static cp alone (gLLM Token Throttling when it has
///     pp > 1, else the fixed budget), static dp (dp = group size replicas of
///     one device each, each on its own thread) and Seesaw cp -> cd with the
///     transition-minimizing schedule (Token Throttling when cp or cd has
///     pp > 1, as static cp, else the fixed budget). Total and output
///     tokens/s, transitions, time in transitions and in the config switch,
///     offloads / onboards through the host KV buffer, its peak, the mean
///     decode micro-batch and rank 0's packed weights;
///  2. schedules (Fig. 2): transition-minimizing vs prefill-prioritizing vs
///     decode-prioritizing on the same cp -> cd pair, for the ratios asked;
///  3. copies (§5.2): Seesaw with its KV copies on the engine's thread (sync)
///     against the prefetcher thread (async), over the emulated host link
///     of engine.host_link when set: tok/s, the copies' time, the time the
///     engine waited for them and the share hidden behind steps.
/// Each run builds its engine(s) from one shared load of the weights (not
/// timed); the wall time covers adding the requests to the last token. The
/// configs run alternately within each repeat, every run is reported, and
/// the summary rows give the median and range over the repeats.
///
/// Memory: every config gets the same KV budget for its devices: with
/// `engine.kv_cache_bytes` = 0 each engine holds its requests at full length
/// (max_num_seqs = requests per engine), so no static config is KV-bound;
/// with a budget B a group gets B (sized as for one device, build_engine)
/// and each dp replica B / dp. Seesaw's cd cache has the same block count
/// and lives in cp's KV memory (one pool per device, docs/seesaw.md). The
/// host KV buffer is engine.swap_space_bytes; engine.reshard_weights picks
/// resident or reload weights.
///
/// Links: with engine.group_link, every group's pipeline sends and TP / SP
/// collectives are paced to that emulated interconnect (comm/paced.hpp; the
/// dp replicas do not talk). Without it they are in-process memcpy on the
/// one shared memory bus, and the paper's reason to prefill under PP --
/// avoiding TP's all-reduces over a slow link -- is mostly absent: expect
/// Seesaw at or below static tp. The ranks share the cores either way. KV copies to and from the host buffer are paced when
/// engine.host_link is set (PCIe emulation, engine/seesaw/kv_mover.hpp), and run on
/// the prefetcher thread when engine.seesaw_async_kv (the configs and
/// schedules tables use that setting; the copies table runs both).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/policies/seesaw_policy.hpp"

namespace shardline::bench {

/// One workload shape: every request has input_len prompt tokens and
/// generates output_len tokens.
struct SeesawRatio {
  int input_len = 0;
  int output_len = 0;
  /// "1024/256".
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const SeesawRatio&, const SeesawRatio&) = default;
};

/// "2048/64,1024/256" -> {{2048, 64}, {1024, 256}}; "" -> {} (nothing asked).
/// Errors: invalid_argument naming the bad item ("a ratio is INPUT/OUTPUT
/// with positive numbers (e.g. 1024/256), got '...'").
[[nodiscard]] Result<std::vector<SeesawRatio>> parse_seesaw_ratios(const std::string& text);

/// "pp=2:tp=2" -> {cp, cd} (each as parse_parallel_config reads it, e.g.
/// "pp=4:tp=2,pp=2"). Errors: invalid_argument naming the text when there is
/// not exactly one ':' or a side does not parse.
[[nodiscard]] Result<std::pair<engine::ParallelConfig, engine::ParallelConfig>> parse_seesaw_pair(
    const std::string& text);

struct SeesawBenchOptions {
  /// Model / shape, dtype, KV dtype and budget, block size, step budget,
  /// preemption mode, host KV buffer (swap_space_bytes); num_threads per
  /// rank (0: cores / devices). parallel, parallel_decode, seesaw,
  /// max_model_len, max_num_seqs and token_budget are set per run.
  engine::EngineOptions engine;
  engine::ParallelConfig cp;  ///< prefill config (dp = 1)
  engine::ParallelConfig cd;  ///< decode config (dp = 1, same group size, != cp)
  /// Seesaw's knobs (min_prefill_prompts, decode_drain_fraction); the
  /// schedule is set per row.
  engine::SeesawPolicyOptions seesaw;
  std::vector<SeesawRatio> ratios = {{2048, 64}, {1024, 256}, {256, 256}, {128, 1024}};
  /// Ratios of the schedules table (empty: skip it).
  std::vector<SeesawRatio> schedule_ratios = {{1024, 256}};
  /// Ratios of the copies table, sync vs async (empty: skip it).
  std::vector<SeesawRatio> copy_ratios = {{1024, 256}};
  int num_requests = 16;  ///< per ratio and run
  int repeats = 3;
  std::uint64_t seed = 1;       ///< prompts
  bool measure_hardware = true;  ///< STREAM triad and GEMM rate in the header (a few seconds)
};

/// One served run.
struct SeesawRun {
  std::string table;     ///< "configs", "schedules" or "copies"
  SeesawRatio ratio;
  int repeat = 0;        ///< 0-based
  std::string config;    ///< "static-cd", "static-cp", "static-dp" or "seesaw"
  std::string parallel;  ///< e.g. "tp=2", "pp=2", "dp=2", "pp=2->tp=2"
  std::string token_budget;  ///< "fixed" or "throttle"
  std::string schedule;  ///< seesaw rows: the schedule's name; "" otherwise
  std::string kv_copy;   ///< seesaw rows: "async" or "sync"; "" otherwise
  double elapsed_s = 0;
  long long num_requests = 0, num_generated = 0;  ///< finished requests, tokens they generated
  double total_tok_s = 0;   ///< (prompt + generated) / elapsed
  double output_tok_s = 0;  ///< generated / elapsed
  long long prefill_steps = 0, decode_steps = 0;  ///< micro-batches with / without prompt tokens
  double mean_decode_batch = 0;  ///< decode tokens / decode_steps (over all replicas)
  long long preemptions = 0;
  // Seesaw (0 for static configs): SeesawStats and KvIoStats of the engine.
  long long transitions = 0;
  double transition_ms = 0;  ///< total time in transitions (offloads + config switch)
  double switch_ms = 0;      ///< of which switching cp <-> cd
  long long offloads = 0, onboards = 0, offload_fallbacks = 0;
  long long host_peak_tokens = 0;
  /// The KV mover (KvMoverStats): copies' time (copy + emulated link), the
  /// time the engine waited for them, and the share hidden (1 - wait / copy).
  double kv_copy_ms = 0, kv_wait_ms = 0, hidden_share = 0;
  std::uint64_t weight_bytes = 0;         ///< rank 0's packed weights (cp's for seesaw)
  std::uint64_t decode_weight_bytes = 0;  ///< seesaw: rank 0's cd shard besides
  int num_kv_blocks = 0;                  ///< per engine (rank)
};

/// Median and range of one (table, ratio, config, schedule) over the repeats.
struct SeesawSummary {
  std::string table;
  SeesawRatio ratio;
  std::string config, parallel, token_budget, schedule, kv_copy;
  int runs = 0;
  double total_tok_s = 0, total_tok_s_min = 0, total_tok_s_max = 0;  ///< median, min, max
  double output_tok_s = 0;         ///< median
  /// configs table, seesaw row: its median total tok/s over the best static
  /// config's median; 0 elsewhere.
  double speedup_vs_best_static = 0;
  std::string best_static;         ///< that config (configs table, seesaw row)
  double transitions = 0;          ///< median
  double transition_ms_per = 0;    ///< median of transition_ms / transitions
  double switch_ms_per = 0;        ///< median of switch_ms / transitions
  double offloads = 0, onboards = 0, host_peak_tokens = 0, mean_decode_batch = 0;  ///< medians
  double kv_copy_ms = 0, kv_wait_ms = 0, hidden_share = 0;                         ///< medians
};

struct SeesawBenchReport {
  std::string model, cp, cd, dtype, kv_cache_dtype;
  int devices = 0, threads_per_rank = 0, cores = 0, num_requests = 0, repeats = 0;
  std::uint64_t host_kv_bytes = 0;
  double host_link_gbps = 0, host_link_latency_us = 0;  ///< the emulated host link (0: unpaced)
  double link_gbps = 0, link_latency_us = 0;  ///< the emulated link between a group's devices (0: unpaced)
  std::string kv_copy;                    ///< the configs and schedules tables' "async" / "sync"
  double membw_gbs = 0, gemm_gflops = 0;  ///< 0 when not measured
  std::vector<SeesawRun> runs;            ///< in the order run
  std::vector<SeesawSummary> summary;     ///< per table, ratio, then config / schedule
  /// One JSON object per line: the setup ("row": "setup"), every run
  /// ("row": "run") and every summary row ("row": "summary").
  [[nodiscard]] std::string to_json() const;
  /// The three tables (medians) and the runs, fixed width, for people.
  [[nodiscard]] std::string to_table() const;
};

/// Errors: invalid_argument prefixed "bench --seesaw:" (cp or cd with dp !=
/// 1, of other group sizes, a group of one device, cp == cd, no ratios,
/// non-positive lengths, requests or repeats); engine build and run errors
/// (e.g. a config that does not shard the model, a host KV buffer below one
/// input + output sequence).
[[nodiscard]] Result<SeesawBenchReport> run_seesaw_bench(const SeesawBenchOptions& options);

}  // namespace shardline::bench
