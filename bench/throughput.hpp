#pragma once
/// \file
/// Offline throughput benchmark (the setting of vLLM's `benchmark_throughput`):
/// N prompts of random token ids x (input_len in, output_len out, ignore_eos),
/// all submitted at once, run to completion by the engine. The machine's
/// memory bandwidth and GEMM peak are measured in the same run, and every
/// model step is timed and compared with its roofline (sim/calibration/roofline.hpp).

#include <cstdint>
#include <string>

#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"

namespace shardline::bench {

struct ThroughputOptions {
  engine::EngineOptions engine;  ///< model / shape, dtype, KV, threads, token budget
  int num_prompts = 64;
  int input_len = 128;   ///< prompt tokens per request
  int output_len = 128;  ///< generated tokens per request (ignore_eos)
  int max_batch = 64;    ///< running sequences at most (engine max_num_seqs)
  std::uint64_t prompt_seed = 1;  ///< seed of the random prompt ids
  /// `--shared-prefix-len`: the first this many tokens of every prompt are
  /// the same (a system prompt; issue 42's prefix caching workload), the
  /// rest random. 0: every prompt random. At most input_len - 1.
  int shared_prefix_len = 0;
  /// `--few-shot K --few-shot-pool P --few-shot-len L` (issue 42's workload
  /// (b)): each prompt starts with K examples of L tokens drawn without
  /// repeats from a pool of P (seeded, in a random order per prompt); the
  /// rest of its input_len tokens is a random question. 0: none.
  /// K * L < input_len, K <= P. Not with shared_prefix_len.
  int few_shot = 0;
  int few_shot_pool = 32;
  int few_shot_len = 100;
  /// `--n`: each prompt is sampled this many times (temperature 0.8, a seed
  /// per request; workload (c)); prompt tokens count once per prompt.
  int n = 1;
  /// `--prefix-order`: "input" (the prompts in their order) or "sorted"
  /// (engine/policies/prefix_order.hpp: prompts sharing a prefix together,
  /// as a prefix-aware job scheduler hands them out).
  std::string prefix_order = "input";
  /// `--kv-stream`: "off", "store" (stream each step's KV to a KV-store
  /// actor) or "replicated" (and on to its ring successor); bench/kv_streaming.hpp.
  std::string kv_stream = "off";
  std::string kv_sync = "none";  ///< `--kv-sync` of the stores (none, wal, fsync)
  /// `--guided-json FILE`'s text: every request's output constrained to this
  /// JSON schema (structured outputs, issue 43; compact whitespace), ending
  /// with its grammar (not ignore_eos). "": unconstrained. Needs a model
  /// with a tokenizer.
  std::string guided_json;
};

struct ThroughputReport {
  int num_prompts = 0, input_len = 0, output_len = 0, max_batch = 0, threads = 0;
  std::string model;
  std::string dtype;           ///< weight storage
  /// The kernel each quantized format runs on this CPU, e.g.
  /// "Q4_1:avx512_vnni+Q8_0:avx512_vnni" (kernels/cpu/quant_linear.hpp's
  /// quant_kernel_name); empty for dense weights.
  std::string quant_kernels;
  /// The instruction path of the dense linear layers (F32/BF16 weights) on
  /// this CPU: kernels/cpu/linear.hpp's linear_kernel_name, e.g.
  /// "avx512_bf16" or "avx2" (SHARDLINE_LINEAR_KERNEL can pick a narrower one).
  std::string linear_kernel;
  /// The instruction path of paged attention on this CPU:
  /// kernels/cpu/attention.hpp's attention_kernel_name ("avx512", "avx2",
  /// "portable").
  std::string attention_kernel;
  /// The instruction path of RMSNorm and SiLU on this CPU:
  /// kernels/cpu/ops.hpp's ops_kernel_name ("avx512", "avx2", "portable").
  std::string ops_kernel;
  std::string kv_cache_dtype;  ///< KV cache storage
  std::string step_overlap = "none";  ///< --step-overlap (model/shard_runner.hpp's StepOverlap)
  double elapsed_s = 0;          ///< wall time of the whole run (scheduling + sampling included)
  double total_tok_s = 0;        ///< (prompt + generated tokens) / elapsed_s
  double prefill_tok_s = 0;      ///< prompt tokens / model time of steps that carry prefill
  double decode_tok_s = 0;       ///< decode tokens / model time of pure-decode steps
  double decode_step_ms = 0;     ///< median model time of pure-decode steps at full batch
  double roofline_step_ms = 0;   ///< median roofline of those steps
  double roofline_ratio = 0;     ///< decode_step_ms / roofline_step_ms
  /// The whole run's limit: (prompt + generated tokens) / the sum over all
  /// its model steps (prefill and decode) of their rooflines. total_tok_s
  /// cannot pass it at this run's membw_gbs and gemm_gflops, except with
  /// prefix hits (prefix_hit_tokens > 0): those prompt tokens are counted
  /// but no step computed them.
  double roofline_total_tok_s = 0;
  // Per phase, medians over the same decode steps: the time (the runner's
  // per-op profile, the engine's step stats) and the phase's own limit at
  // membw_gbs and gemm_gflops (sim/calibration/roofline.hpp), so a reader sees where
  // the step goes and how far each phase is from what the machine allows.
  double decode_gemm_ms = 0;       ///< QKV, o_proj, gate_up, down_proj
  double decode_gemm_limit_ms = 0; ///< max(their weight bytes / bw, their FLOPs / gemm peak)
  double decode_attention_ms = 0;  ///< KV scatter + paged attention
  double decode_attention_limit_ms = 0;  ///< KV bytes read + written / bw
  double decode_attention_gbs = 0; ///< KV bytes / decode_attention_ms (achieved bandwidth)
  double decode_logits_ms = 0;     ///< final norm + lm_head
  double decode_logits_limit_ms = 0;  ///< max(lm_head bytes / bw, lm_head FLOPs / gemm peak)
  double decode_other_ms = 0;      ///< norms, RoPE, SwiGLU, residual adds (no limit computed)
  double decode_sample_ms = 0;     ///< host sampling of the step's rows (engine)
  /// Structured outputs (--guided-json): the schema's compile time, and per
  /// full-batch decode step the time sampling waited for the grammar masks
  /// and the time the mask thread filled them (beside the forward pass).
  bool guided_json = false;
  double grammar_compile_ms = 0;
  double decode_grammar_wait_ms = 0;
  double decode_grammar_fill_ms = 0;
  double decode_schedule_ms = 0;   ///< the scheduler's plan of the step (engine)
  double decode_engine_other_ms = 0;  ///< step wall - schedule - execute - sample (outputs, bookkeeping)
  double prefill_gflops = 0;     ///< achieved FLOP rate of prefill-carrying steps
  /// The GEMM phase of those steps alone: their layers' and lm_head's FLOPs
  /// / the time of the gemm and logits ops (the runner's profile).
  double prefill_gemm_phase_gflops = 0;
  double prefill_gemm_phase_ratio = 0;  ///< prefill_gemm_phase_gflops / gemm_gflops
  // Time of the prefill-carrying steps by phase, summed (s).
  double prefill_gemm_s = 0, prefill_attention_s = 0, prefill_logits_s = 0, prefill_other_s = 0;
  double prefill_gemm_ratio = 0; ///< prefill_gflops / gemm_gflops
  double prefill_peak_ratio = 0; ///< prefill_gflops / fma_peak_gflops
  double membw_gbs = 0;          ///< STREAM triad, best of before and after the run
  /// The GEMM peak of the run's weight dtype, best of before/after: F32:
  /// max(OpenBLAS sgemm, Shardline linear) on 2048^3; BF16: Shardline's BF16
  /// linear on 2048^3 (Debian's OpenBLAS has no sbgemm).
  double gemm_gflops = 0;
  double openblas_gflops = 0;    ///< OpenBLAS sgemm on 2048^3
  double linear_gflops = 0;      ///< Shardline's batch-invariant linear on 2048^3, the run's dtype
  /// Quantized weights: the linear layer on 2048^3 weights of the format
  /// holding most of the model's weights (`gemm_format`), which is then
  /// the GEMM limit (`gemm_gflops`); 0 for dense weights.
  double quant_linear_gflops = 0;
  std::string gemm_format;       ///< the format gemm_gflops was measured in
  /// Register-only FMA / VDPBF16PS throughput of the run's dtype on the run's
  /// threads (sim/calibration/hardware.hpp): the instruction ceiling above any GEMM.
  double fma_peak_gflops = 0;
  int num_steps = 0, num_decode_steps = 0, num_preemptions = 0;
  double model_s = 0;  ///< model time of every step summed (elapsed_s - model_s: the engine's own time)
  std::string preemption_mode;     ///< "recompute" or "swap"
  int num_swap_outs = 0;           ///< preemptions whose KV went to the swap space
  int num_swap_fallbacks = 0;      ///< swap preemptions that recomputed (swap space full)
  double swapped_out_bytes = 0;    ///< KV bytes copied to the swap space
  /// Token positions the model computed (prompt + generated - 1 per request
  /// without preemption; more when preemptions recompute).
  long long computed_tokens = 0;
  int shared_prefix_len = 0;
  int few_shot = 0, few_shot_pool = 0, few_shot_len = 0, n = 1;
  std::string prefix_order = "input";
  /// Prompt tokens the steps computed (positions < input_len, every request).
  long long prefill_computed_tokens = 0;
  /// The prompts' prefix tree (engine/policies/prefix_order.hpp): the fewest
  /// prompt tokens any run computes (each distinct prefix once).
  long long prefix_tree_tokens = 0;
  /// prefill_computed_tokens / prefix_tree_tokens - 1: how far over the ideal.
  double prefill_over_ideal = 0;
  bool prefix_caching = false;       ///< --enable-prefix-caching
  long long prefix_query_tokens = 0;  ///< prefix caching: tokens looked up
  long long prefix_hit_tokens = 0;    ///< of them, found cached (not computed)
  // KV streaming (kv_stream != "off"):
  std::string kv_stream = "off";
  std::string kv_sync;
  double kv_streamed_bytes = 0;    ///< chunk bytes the store accepted
  long long kv_flush_batches = 0;  ///< flushes (one message each)
  long long kv_acked_tokens = 0;   ///< positions acknowledged, summed over requests
  double kv_max_queued_bytes = 0;  ///< the streamer's queue at its fullest
  double kv_drain_s = 0;           ///< after the last step until the queue was empty (not in elapsed_s)
  std::uint64_t kv_cache_bytes = 0;
  double weight_bytes = 0;

  /// One JSON object (a single line when dumped).
  [[nodiscard]] std::string to_json() const;
};

/// Runs the benchmark on CPU devices. Errors: engine build errors,
/// invalid_argument for non-positive sizes or a CUDA device (see
/// bench/gpu_throughput.hpp).
[[nodiscard]] Result<ThroughputReport> run_throughput(const ThroughputOptions& options);

}  // namespace shardline::bench
