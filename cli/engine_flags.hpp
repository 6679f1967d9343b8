#pragma once
/// \file
/// Flags shared by every command that builds an engine (run, node start,
/// generate, bench): model loading, KV cache budget, batching limits,
/// threads, and the CUDA options.

#include <CLI/CLI.hpp>

#include <string>

#include "common/result.hpp"
#include "engine/engine_builder.hpp"

namespace shardline::cli {

struct EngineFlags {
  std::string dtype = "f32";
  std::string kv_cache_dtype = "f32";
  std::string load_format = "auto";
  long long kv_cache_bytes = 0;
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
  std::string device;  ///< --device of generate / bench ("" = cpu); run / node use --devices
};

/// Registers the flags on `cmd`.
void add_engine_flags(CLI::App& cmd, EngineFlags& f);
/// Registers --device (cpu or cuda:N) for single-engine commands (generate, bench).
void add_device_flag(CLI::App& cmd, EngineFlags& f);

/// Fills engine options from the flags (model_dir set by the caller).
/// Errors: invalid_argument for an unknown --dtype / --load-format / --device.
[[nodiscard]] Result<engine::EngineOptions> to_engine_options(const EngineFlags& f,
                                                                const std::string& model_dir);

}  // namespace shardline::cli
