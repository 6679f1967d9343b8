#pragma once
/// \file
/// Offline throughput benchmark on one CUDA device, the setting of vLLM's
/// `benchmark_throughput` (for which vLLM publishes about 12.5k total
/// tokens/s on one H100 with llama-3.1-8b, 1,000 prompts x 256 in / 256 out):
/// N prompts of random token ids x (input_len in, output_len out, ignore_eos,
/// greedy), all submitted at once, run to completion by the engine over a
/// model::CudaModelRunner (`--device cuda:N`), or over a model::CudaShardGroup
/// of ranks sharing the GPU (`--device cuda:N --parallel tp=2`: one config;
/// the steps report rank 0's statistics, the weights are every rank's).
///
/// The device's two ceilings are measured in the same run, before the engine
/// is built and again after it is destroyed (the better reading of the two is
/// kept: a neighbour's load can only lower one):
///  - HBM bandwidth: a 2 GiB device-to-device copy, bytes read + written,
///    median of 10 (kernels::cuda::measure_d2d_bandwidth_gbs);
///  - BF16 GEMM peak: cuBLASLt 8192^3, median of 10
///    (kernels::cuda::measure_gemm_tflops).
/// Every engine step is timed by a decorator around the runner (host wall
/// time of ModelExecutor::execute, which returns once the step's sampled ids
/// are on the host) and priced by sim/calibration/roofline.hpp's step_cost:
///  - decode: the median time of pure-decode steps at batch >= 64 against the
///    HBM roofline of the same steps, (weights in the device dtype + KV read
///    and written) / measured bandwidth;
///  - prefill: the FLOP rate of prefill-carrying steps against the BF16 GEMM
///    peak.
/// Whether each decode step replayed a CUDA graph comes from the runner's
/// CudaStepStats.
///
/// Built without CUDA (SHARDLINE_HAVE_CUDA unset), run_gpu_throughput
/// returns ErrorCode::unsupported.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/throughput.hpp"
#include "common/result.hpp"

namespace shardline::bench {

/// vLLM's published offline throughput for llama-3.1-8b, 1,000 x (256 in,
/// 256 out), BF16, one H100 (total tokens/s).
inline constexpr double kVllmH100TotalTokS = 12500.0;
/// Target of the decode step against its HBM roofline at batch >= 64.
inline constexpr double kTargetRooflineRatio = 1.3;
/// Pure-decode steps of at least this many sequences are compared with the roofline.
inline constexpr int kRooflineMinBatch = 64;

struct GpuThroughputReport {
  // ---- setting ----
  std::string device_name;  ///< e.g. "NVIDIA H100 80GB HBM3"
  int device_index = 0;
  std::string parallel = "tp=1,pp=1,sp=1,dp=1";  ///< the engine group's config (ranks sharing the GPU)
  std::string model;           ///< model / shape folder
  int num_layers = 0;          ///< layers actually run (after --num-layers)
  std::string dtype;           ///< weight storage on the device
  std::string kv_cache_dtype;  ///< KV cache storage
  int num_prompts = 0, input_len = 0, output_len = 0;
  int max_batch = 0;               ///< running sequences at most
  int max_num_batched_tokens = 0;  ///< tokens per step at most
  bool deterministic = false;      ///< batch-invariant GEMMs
  bool cuda_graphs = false;        ///< decode graphs requested
  /// The setting vLLM's figure is for (1000 x 256/256, whole model, BF16 weights).
  bool vllm_setting = false;

  // ---- throughput ----
  double setup_s = 0;      ///< engine build: dummy weights, upload, KV cache, graph capture
  double elapsed_s = 0;    ///< wall time of generate() (scheduling + sampling included)
  long prompt_tokens = 0;
  long generated_tokens = 0;
  double total_tok_s = 0;    ///< (prompt + generated tokens) / elapsed_s
  double prefill_tok_s = 0;  ///< prompt tokens / time of steps that carry prefill
  double decode_tok_s = 0;   ///< decode tokens / time of pure-decode steps
  double model_time_fraction = 0;  ///< sum of step times / elapsed_s (the rest: host-side engine work)

  // ---- decode vs the HBM roofline (pure-decode steps at batch >= kRooflineMinBatch) ----
  int num_roofline_steps = 0;    ///< steps in the medians below
  double decode_step_ms = 0;     ///< median step time
  double decode_upload_ms = 0;   ///< median CudaStepStats::upload_ms
  double decode_forward_ms = 0;  ///< median CudaStepStats::forward_ms
  double decode_batch_median = 0;
  int decode_batch_min = 0, decode_batch_max = 0;
  std::map<int, int> decode_batch_hist;  ///< batch size -> pure-decode steps (all batch sizes)
  double decode_bytes = 0;       ///< median bytes of a step (weights + KV)
  double roofline_step_ms = 0;   ///< median decode_bytes / hbm_gbs of the same steps
  double roofline_compute_ms = 0;  ///< median FLOPs / gemm_tflops of the same steps (for reference)
  double roofline_ratio = 0;     ///< decode_step_ms / roofline_step_ms

  // ---- prefill vs the GEMM peak ----
  double prefill_tflops = 0;      ///< achieved FLOP rate of prefill-carrying steps (all their tokens)
  double prefill_gemm_ratio = 0;  ///< prefill_tflops / gemm_tflops

  // ---- device ceilings, measured in this run ----
  double hbm_gbs = 0;      ///< D2D copy, read + written bytes, 2 GiB, median of 10
  double gemm_tflops = 0;  ///< cuBLASLt BF16 8192^3, median of 10

  // ---- CUDA graphs ----
  int num_graph_steps = 0;       ///< pure-decode steps that replayed a graph
  double graph_fraction = 0;     ///< num_graph_steps / num_decode_steps
  std::vector<int> captured_batch_sizes;
  std::string graph_capture_error;  ///< "" when the capture worked (or graphs were off)

  // ---- steps and memory ----
  int num_steps = 0, num_prefill_steps = 0, num_decode_steps = 0, num_preemptions = 0;
  std::uint64_t kv_cache_bytes = 0;
  int num_kv_blocks = 0;
  double weight_bytes = 0;  ///< on the device (matrices in dtype, vectors F32)

  // ---- targets ----
  bool meets_throughput_target = false;  ///< total_tok_s >= kVllmH100TotalTokS
  bool meets_roofline_target = false;    ///< 0 < roofline_ratio <= kTargetRooflineRatio

  /// One JSON object (a single line when dumped).
  [[nodiscard]] std::string to_json() const;
  /// A readable multi-line table (for stderr).
  [[nodiscard]] std::string to_table() const;
};

/// Runs the benchmark on options.engine's CUDA device (options.engine.device
/// must be DeviceKind::cuda; dtype / kv_cache_dtype / cuda_graphs /
/// deterministic / max_num_batched_tokens / num_layers_override are taken
/// from options.engine, max_num_seqs from options.max_batch and
/// max_model_len = input_len + output_len). Progress goes to stderr.
/// Errors: invalid_argument (non-positive sizes, a CPU device); unsupported
/// (a build without CUDA); whatever building the engine or the probes return.
[[nodiscard]] Result<GpuThroughputReport> run_gpu_throughput(const ThroughputOptions& options);

}  // namespace shardline::bench
