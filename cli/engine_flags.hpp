#pragma once
/// \file
/// Flags shared by every command that builds an engine (run, node start,
/// generate, bench): model loading, KV cache budget, the emulated device
/// memory of CPU devices, batching limits, threads, and the CUDA options.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"

namespace shardline::cli {

struct EngineFlags {
  std::string dtype = "f32";
  std::string quantization;  ///< "", q8_0, q4_0 or q4_1
  std::string kv_cache_dtype = "f32";
  std::string step_overlap = "none";  ///< --step-overlap
  double overlap_prefetch_mib = 12;   ///< --overlap-prefetch-mib
  std::string load_format = "auto";
  long long kv_cache_bytes = 0;
  std::string device_memory = "0";  ///< --device-memory as given (parse_byte_size)
  double kv_cache_memory_fraction = 0.5;
  int block_size = 16;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;
  int threads = 0;
  int num_layers = 0;
  unsigned long long seed = 0;
  double gpu_memory_utilization = 0.9;
  bool deterministic = false;
  bool enforce_eager = false;
  std::string preemption_mode = "swap";  // measured faster (docs/kv-recovery.md)
  double swap_space_gib = 4.0;
  bool enable_prefix_caching = false;  ///< --enable-prefix-caching (caching is on unless --no-prefix-caching)
  std::uint64_t prefix_tier_mib = 0;   ///< --prefix-tier-mib: host-memory prefix tier (0: none)
  bool no_prefix_caching = false;      ///< --no-prefix-caching
  std::string device;  ///< --device of generate / bench ("" = cpu); run / node use --devices
  bool shift = false;               ///< --shift (run, node start)
  /// --shift-threshold: batched tokens, or "auto" (the cost model's
  /// crossover, cli/shift_threshold.hpp; ArcticInference's fixed default is 512)
  std::string shift_threshold = "auto";
  double shift_hysteresis = 0.25;   ///< --shift-hysteresis
  /// Seesaw (run, node start): --parallel-decode, the decode config cd of
  /// each engine group ("" = none); --seesaw-policy ("" = off unless
  /// --parallel-decode is given: then transition-minimizing);
  /// --host-kv-bytes ("" = --swap-space); --seesaw-min-prefill-prompts.
  std::string parallel_decode;
  std::string seesaw_policy;
  std::string host_kv_bytes;
  int seesaw_min_prefill_prompts = 1;
  std::string reshard_weights = "resident";  ///< --reshard-weights resident | reload
  /// --seesaw-kv-copy async | sync: Seesaw's KV copies on a prefetcher
  /// thread (seed 000 §5.2) or on the engine's thread.
  std::string seesaw_kv_copy = "async";
  /// --host-link-gbps / --host-link-latency-us: an emulated host link (PCIe)
  /// per device for Seesaw's KV copies ("0": none).
  std::string host_link_gbps = "0";
  std::string host_link_latency_us = "0";
};

/// `--shift`, `--shift-threshold` and `--shift-hysteresis` (Shift
/// Parallelism on `run` and `node start`; docs/parallel.md).
void add_shift_flags(CLI::App& cmd, EngineFlags& f);

/// `--parallel-decode`, `--seesaw-policy`, `--host-kv-bytes`,
/// `--seesaw-min-prefill-prompts`, `--reshard-weights`, `--seesaw-kv-copy`,
/// `--host-link-gbps` and `--host-link-latency-us` (Seesaw on `run` and `node start`;
/// docs/seesaw.md). `--parallel-prefill` is another name of `--parallel`.
void add_seesaw_flags(CLI::App& cmd, EngineFlags& f);

/// The value of --seesaw-kv-copy: true for async, false for sync. Errors:
/// invalid_argument naming the flag and the two choices.
[[nodiscard]] Result<bool> parse_seesaw_kv_copy(const std::string& mode);

/// The values of --host-link-gbps and --host-link-latency-us: none for a
/// bandwidth of 0 (then the latency must be 0 too). Errors: invalid_argument
/// naming the flags (not a number, negative, a latency without a link).
[[nodiscard]] Result<std::optional<comm::LinkSpec>> parse_host_link(const std::string& gbps,
                                                                    const std::string& latency_us);

/// Parses a size in bytes: a decimal number with an optional binary unit,
/// case-insensitive, spaces allowed between: none or B (bytes), K / KB / KiB
/// (1024), M / MB / MiB (2^20), G / GB / GiB (2^30), T / TB / TiB (2^40).
/// With a unit the number may have a fraction ("1.5G" = 1610612736; the
/// bytes are rounded down). No sign, hex or exponent.
/// Errors: invalid_argument naming the text (empty, malformed, unknown
/// unit, fractional bytes, or more than 2^64 - 1 bytes).
[[nodiscard]] Result<std::uint64_t> parse_byte_size(std::string_view text);

/// Registers the flags on `cmd`.
void add_engine_flags(CLI::App& cmd, EngineFlags& f);
/// Registers --device (cpu or cuda:N) for single-engine commands (generate, bench).
void add_device_flag(CLI::App& cmd, EngineFlags& f);

/// Fills engine options from the flags (model_dir set by the caller).
/// Errors: invalid_argument for an unknown --dtype / --load-format / --device
/// or a malformed --device-memory.
[[nodiscard]] Result<engine::EngineOptions> to_engine_options(const EngineFlags& f,
                                                                const std::string& model_dir);

}  // namespace shardline::cli
