#include "bench/throughput.hpp"

#include "engine/policies/prefix_order.hpp"

#include <omp.h>

#include <algorithm>
#include <optional>
#include <map>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/stopwatch.hpp"
#include "sim/calibration/hardware.hpp"
#include "bench/kv_streaming.hpp"
#include "sim/calibration/workload.hpp"
#include "sim/calibration/roofline.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant_linear.hpp"
#include "sampling/structured_output/grammar.hpp"

namespace shardline::bench {

// The measurement pieces the benchmarks share with the simulator's calibration.
using sim::calibration::StepCost;
using sim::calibration::measure_fma_peak_gflops;
using sim::calibration::measure_linear_gflops;
using sim::calibration::measure_sgemm_gflops;
using sim::calibration::measure_triad_bandwidth_gbs;
using sim::calibration::median;
using sim::calibration::random_prompts;
using sim::calibration::step_cost;

namespace {

using Clock = std::chrono::steady_clock;

/// Per-step record of the measuring executor.
struct StepRecord {
  int num_tokens = 0;
  int num_prefill_tokens = 0;  ///< tokens at positions < input_len
  int num_seqs = 0;
  double model_ms = 0;
  StepCost cost;
  model::StepProfile profile;
};

/// A ModelExecutor decorator that times every step, prices it, and keeps the
/// runner's per-op profile.
class MeasuringExecutor final : public model::ModelExecutor {
 public:
  MeasuringExecutor(model::CpuModelRunner& inner, double weight_elem_bytes, double kv_elem_bytes,
                    int input_len)
      : inner_(inner), config_(inner.config()), weight_elem_bytes_(weight_elem_bytes),
        kv_elem_bytes_(kv_elem_bytes), input_len_(input_len) {
    inner_.set_profiling(true);
  }

  Result<model::StepOutput> execute(const model::StepInput& in) override {
    StepRecord r;
    r.num_tokens = in.num_tokens();
    r.num_seqs = static_cast<int>(in.seqs.size());
    for (std::int32_t p : in.positions) r.num_prefill_tokens += p < input_len_ ? 1 : 0;
    r.cost = step_cost(config_, weight_elem_bytes_, kv_elem_bytes_, in);
    const auto t0 = Clock::now();
    auto out = inner_.execute(in);
    r.model_ms = ms_since(t0);
    r.profile = inner_.last_profile();
    records_.push_back(r);
    return out;
  }
  int vocab_size() const override { return inner_.vocab_size(); }
  int num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int block_size() const override { return inner_.block_size(); }
  kvstore::KvModelShape kv_model_shape() const override { return inner_.kv_model_shape(); }
  std::vector<kvstore::KvCacheView> kv_cache_views() override { return inner_.kv_cache_views(); }
  bool supports_layer_kv_hook() const override { return inner_.supports_layer_kv_hook(); }
  void set_layer_kv_hook(LayerKvHook hook) override { inner_.set_layer_kv_hook(std::move(hook)); }
  const std::vector<StepRecord>& records() const { return records_; }

 private:
  model::CpuModelRunner& inner_;
  const model::ModelConfig& config_;
  double weight_elem_bytes_;
  double kv_elem_bytes_;
  int input_len_;
  std::vector<StepRecord> records_;
};

}  // namespace

std::string ThroughputReport::to_json() const {
  nlohmann::json j{{"model", model},
                   {"dtype", dtype},
                   {"quant_kernels", quant_kernels},
                   {"linear_kernel", linear_kernel},
                   {"attention_kernel", attention_kernel},
                   {"ops_kernel", ops_kernel},
                   {"kv_cache_dtype", kv_cache_dtype},
                   {"step_overlap", step_overlap},
                   {"num_prompts", num_prompts},
                   {"input_len", input_len},
                   {"output_len", output_len},
                   {"max_batch", max_batch},
                   {"threads", threads},
                   {"elapsed_s", elapsed_s},
                   {"total_tok_s", total_tok_s},
                   {"prefill_tok_s", prefill_tok_s},
                   {"decode_tok_s", decode_tok_s},
                   {"decode_step_ms", decode_step_ms},
                   {"roofline_step_ms", roofline_step_ms},
                   {"decode_gemm_ms", decode_gemm_ms},
                   {"decode_gemm_limit_ms", decode_gemm_limit_ms},
                   {"decode_attention_ms", decode_attention_ms},
                   {"decode_attention_limit_ms", decode_attention_limit_ms},
                   {"decode_attention_gbs", decode_attention_gbs},
                   {"decode_logits_ms", decode_logits_ms},
                   {"decode_logits_limit_ms", decode_logits_limit_ms},
                   {"decode_other_ms", decode_other_ms},
                   {"decode_sample_ms", decode_sample_ms},
                   {"guided_json", guided_json},
                   {"grammar_compile_ms", grammar_compile_ms},
                   {"decode_grammar_wait_ms", decode_grammar_wait_ms},
                   {"decode_grammar_fill_ms", decode_grammar_fill_ms},
                   {"decode_schedule_ms", decode_schedule_ms},
                   {"decode_engine_other_ms", decode_engine_other_ms},
                   {"roofline_ratio", roofline_ratio},
                   {"roofline_total_tok_s", roofline_total_tok_s},
                   {"prefill_gflops", prefill_gflops},
                   {"prefill_gemm_ratio", prefill_gemm_ratio},
                   {"prefill_peak_ratio", prefill_peak_ratio},
                   {"prefill_gemm_phase_gflops", prefill_gemm_phase_gflops},
                   {"prefill_gemm_phase_ratio", prefill_gemm_phase_ratio},
                   {"prefill_gemm_s", prefill_gemm_s},
                   {"prefill_attention_s", prefill_attention_s},
                   {"prefill_logits_s", prefill_logits_s},
                   {"prefill_other_s", prefill_other_s},
                   {"membw_gbs", membw_gbs},
                   {"gemm_gflops", gemm_gflops},
                   {"openblas_gflops", openblas_gflops},
                   {"linear_gflops", linear_gflops},
                   {"quant_linear_gflops", quant_linear_gflops},
                   {"gemm_format", gemm_format},
                   {"fma_peak_gflops", fma_peak_gflops},
                   {"num_steps", num_steps},
                   {"model_s", model_s},
                   {"num_decode_steps", num_decode_steps},
                   {"num_preemptions", num_preemptions},
                   {"preemption_mode", preemption_mode},
                   {"num_swap_outs", num_swap_outs},
                   {"num_swap_fallbacks", num_swap_fallbacks},
                   {"swapped_out_bytes", swapped_out_bytes},
                   {"computed_tokens", computed_tokens},
                   {"shared_prefix_len", shared_prefix_len},
                   {"few_shot", few_shot},
                   {"few_shot_pool", few_shot_pool},
                   {"few_shot_len", few_shot_len},
                   {"n", n},
                   {"prefix_order", prefix_order},
                   {"prefill_computed_tokens", prefill_computed_tokens},
                   {"prefix_tree_tokens", prefix_tree_tokens},
                   {"prefill_over_ideal", prefill_over_ideal},
                   {"prefix_caching", prefix_caching},
                   {"prefix_query_tokens", prefix_query_tokens},
                   {"prefix_hit_tokens", prefix_hit_tokens},
                   {"kv_cache_bytes", kv_cache_bytes},
                   {"weight_bytes", weight_bytes},
                   {"step_wall_ms", num_steps > 0 ? elapsed_s * 1e3 / num_steps : 0.0},
                   {"kv_stream", kv_stream}};
  if (kv_stream != "off") {
    j["kv_sync"] = kv_sync;
    j["kv_streamed_bytes"] = kv_streamed_bytes;
    j["kv_flush_batches"] = kv_flush_batches;
    j["kv_acked_tokens"] = kv_acked_tokens;
    j["kv_max_queued_bytes"] = kv_max_queued_bytes;
    j["kv_drain_s"] = kv_drain_s;
  }
  return j.dump();
}

Result<ThroughputReport> run_throughput(const ThroughputOptions& o) {
  if (o.num_prompts <= 0 || o.input_len <= 0 || o.output_len <= 0 || o.max_batch <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "bench: --num-prompts, --input-len, --output-len and --max-batch must be > 0");
  if (o.shared_prefix_len < 0 || o.shared_prefix_len >= o.input_len)
    return make_error(ErrorCode::invalid_argument, "bench: --shared-prefix-len must be in [0, --input-len), got " +
                                                       std::to_string(o.shared_prefix_len));
  if (o.few_shot < 0 || (o.few_shot > 0 && (o.few_shot_pool < o.few_shot || o.few_shot_len <= 0 ||
                                            static_cast<long>(o.few_shot) * o.few_shot_len >= o.input_len ||
                                            o.shared_prefix_len > 0)))
    return make_error(ErrorCode::invalid_argument,
                      "bench: --few-shot K needs K <= --few-shot-pool, K * --few-shot-len < --input-len and no "
                      "--shared-prefix-len");
  if (o.n < 1) return make_error(ErrorCode::invalid_argument, "bench: --n must be >= 1");
  if (o.prefix_order != "input" && o.prefix_order != "sorted")
    return make_error(ErrorCode::invalid_argument,
                      "bench: --prefix-order must be input or sorted, got '" + o.prefix_order + "'");
  if (o.engine.device != model::DeviceKind::cpu)
    return make_error(ErrorCode::invalid_argument,
                      "bench: run_throughput measures CPU devices only; a cuda:N device goes through "
                      "run_gpu_throughput (bench/gpu_throughput.hpp)");
  ThroughputReport rep;
  rep.num_prompts = o.num_prompts;
  rep.input_len = o.input_len;
  rep.output_len = o.output_len;
  rep.max_batch = o.max_batch;
  rep.model = o.engine.model_dir;
  rep.dtype = dtype_name(o.engine.dtype);
  rep.linear_kernel = kernels::cpu::linear_kernel_name(kernels::cpu::LinearKernel::automatic);
  rep.attention_kernel = kernels::cpu::attention_kernel_name(kernels::cpu::AttentionKernel::automatic);
  rep.ops_kernel = kernels::cpu::ops_kernel_name(kernels::cpu::OpsKernel::automatic);
  rep.kv_cache_dtype = dtype_name(o.engine.kv_cache_dtype);
  rep.step_overlap = model::step_overlap_name(o.engine.step_overlap);
  const int threads = o.engine.num_threads > 0 ? o.engine.num_threads : omp_get_num_procs();
  rep.threads = threads;

  // Hardware limits, measured on this machine before and after the run; the
  // best of the two is the limit (a neighbour's load can only lower a reading).
  const DType weight_dtype = o.engine.dtype;
  std::optional<kernels::GgmlType> quant_format;  // the quantized format holding most weights
  const auto measure_limits = [&] {
    rep.membw_gbs = std::max(rep.membw_gbs, measure_triad_bandwidth_gbs(threads));
    rep.openblas_gflops = std::max(rep.openblas_gflops, measure_sgemm_gflops(threads));
    omp_set_num_threads(threads);
    rep.linear_gflops = std::max(rep.linear_gflops, measure_linear_gflops(2048, 3, weight_dtype));
    rep.fma_peak_gflops = std::max(rep.fma_peak_gflops, measure_fma_peak_gflops(threads, weight_dtype));
    // OpenBLAS' sgemm is an F32 GEMM: a peak for F32 weights only.
    rep.gemm_gflops = weight_dtype == DType::f32 ? std::max(rep.openblas_gflops, rep.linear_gflops) : rep.linear_gflops;
    rep.gemm_format = dtype_name(weight_dtype);
    if (quant_format) {
      rep.quant_linear_gflops =
          std::max(rep.quant_linear_gflops, sim::calibration::measure_quant_linear_gflops(*quant_format));
      rep.gemm_gflops = rep.quant_linear_gflops;
      rep.gemm_format = kernels::ggml_type_name(static_cast<std::uint32_t>(*quant_format));
    }
  };

  engine::EngineOptions eo = o.engine;
  eo.num_threads = threads;
  eo.max_num_seqs = o.max_batch;
  eo.max_model_len = o.input_len + o.output_len;
  auto built = engine::build_engine(eo);
  if (!built) return std::move(built).error();
  engine::EngineInstance& e = *built;
  rep.kv_cache_bytes = e.kv_cache_bytes;
  // The matrices' bytes per weight as held (a quantized file's blocks:
  // Q4_1 0.625, Q8_0 1.0625), and their formats, e.g. "Q4_1+Q8_0".
  double matrix_bytes = 0, matrix_elems = 0;
  std::vector<std::string> formats;
  std::map<kernels::GgmlType, double> quant_elems;
  const auto count = [&](const model::Matrix& m) {
    if (m.empty()) return;
    matrix_bytes += static_cast<double>(m.bytes());
    matrix_elems += static_cast<double>(m.rows) * m.cols;
    // A mixed matrix (a Q4_K_M file's attn_qkv) counts each run of rows
    // under its own type.
    for (const model::RowRun& run : m.runs()) {
      const std::optional<kernels::GgmlType>& type = run.type;
      if (type) quant_elems[*type] += static_cast<double>(run.rows) * m.cols;
      const std::string name = type ? kernels::ggml_type_name(static_cast<std::uint32_t>(*type)) : m.format_name();
      if (std::find(formats.begin(), formats.end(), name) != formats.end()) continue;
      formats.push_back(name);
      if (type)
        rep.quant_kernels += std::string(rep.quant_kernels.empty() ? "" : "+") + name + ":" +
                             kernels::cpu::quant_kernel_name(*type);
    }
  };
  count(e.weights->embed_tokens);
  if (e.weights->lm_head.data != e.weights->embed_tokens.data) count(e.weights->lm_head);
  for (const model::LayerWeights& l : e.weights->layers)
    for (const model::Matrix* m : {&l.qkv, &l.o_proj, &l.gate_up, &l.down_proj}) count(*m);
  if (!formats.empty()) {
    rep.dtype = formats.front();
    for (std::size_t i = 1; i < formats.size(); ++i) rep.dtype += "+" + formats[i];
  }
  const double elem_bytes =
      matrix_elems > 0 ? matrix_bytes / matrix_elems : static_cast<double>(dtype_size(o.engine.dtype));
  for (const auto& [type, elems] : quant_elems)
    if (!quant_format || elems > quant_elems[*quant_format]) quant_format = type;
  measure_limits();

  // The engine must run on the measuring executor: build a second engine over it.
  auto* cpu_runner = e.executor_as<model::CpuModelRunner>();
  if (cpu_runner == nullptr) return make_error(ErrorCode::internal, "bench: the CPU engine has no CpuModelRunner");
  MeasuringExecutor measuring(*cpu_runner, elem_bytes,
                              static_cast<double>(dtype_size(o.engine.kv_cache_dtype)), o.input_len);
  engine::EngineConfig ec = e.engine->config();
  auto eng = engine::LlmEngine::create(measuring, *e.tokenizer, ec);
  if (!eng) return std::move(eng).error();

  // Random prompts (seeded, fixed), avoiding special ids.
  auto prompts = random_prompts(o.num_prompts, o.input_len, e.weights->config.vocab_size, o.prompt_seed);
  // A shared head: prompt 0's first tokens on every prompt.
  for (std::size_t i = 1; i < prompts.size(); ++i)
    std::copy(prompts[0].begin(), prompts[0].begin() + o.shared_prefix_len, prompts[i].begin());
  if (o.few_shot > 0) {
    // K examples of the pool per prompt, distinct, in a seeded random order.
    const auto pool = random_prompts(o.few_shot_pool, o.few_shot_len, e.weights->config.vocab_size, o.prompt_seed + 1);
    std::mt19937_64 rng(o.prompt_seed + 2);
    std::vector<int> ids(static_cast<std::size_t>(o.few_shot_pool));
    std::iota(ids.begin(), ids.end(), 0);
    for (auto& p : prompts) {
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int k = 0; k < o.few_shot; ++k)
        std::copy(pool[static_cast<std::size_t>(ids[static_cast<std::size_t>(k)])].begin(),
                  pool[static_cast<std::size_t>(ids[static_cast<std::size_t>(k)])].end(),
                  p.begin() + static_cast<long>(k) * o.few_shot_len);
    }
  }
  // n samples of each prompt: its copies follow it.
  if (o.n > 1) {
    std::vector<std::vector<std::int32_t>> copies;
    for (const auto& p : prompts) copies.insert(copies.end(), static_cast<std::size_t>(o.n), p);
    prompts = std::move(copies);
  }
  const engine::PrefixOrder tree = engine::prefix_order(prompts);
  if (o.prefix_order == "sorted") {
    std::vector<std::vector<std::int32_t>> sorted;
    sorted.reserve(prompts.size());
    for (std::size_t i : tree.order) sorted.push_back(std::move(prompts[i]));
    prompts = std::move(sorted);
  }
  rep.shared_prefix_len = o.shared_prefix_len;
  rep.few_shot = o.few_shot;
  rep.few_shot_pool = o.few_shot > 0 ? o.few_shot_pool : 0;
  rep.few_shot_len = o.few_shot > 0 ? o.few_shot_len : 0;
  rep.n = o.n;
  rep.prefix_order = o.prefix_order;
  rep.prefix_tree_tokens = static_cast<long long>(tree.tree_tokens);
  rep.prefix_caching = ec.prefix_cache.enabled;
  sampling::SamplingParams sp;
  sp.temperature = o.n > 1 ? 0.8f : 0.0f;  // n > 1: n different samples (a seed per request id)
  sp.max_tokens = o.output_len;
  sp.ignore_eos = true;

  // Structured outputs: every request under the schema's grammar.
  std::shared_ptr<const sampling::CompiledGrammar> grammar;
  if (!o.guided_json.empty()) {
    auto compiler = engine::make_grammar_compiler(e);
    if (!compiler) return make_error(ErrorCode::invalid_argument, "bench --guided-json: " + compiler.error().message);
    const auto tc = Clock::now();
    auto g = (*compiler)->compile(
        sampling::GrammarSpec{sampling::GrammarKind::json_schema, o.guided_json, {}, /*any_whitespace=*/false});
    rep.grammar_compile_ms = ms_since(tc);
    if (!g) return make_error(ErrorCode::invalid_argument, "bench --guided-json: " + g.error().message);
    grammar = std::move(g).value();
    rep.guided_json = true;
    sp.ignore_eos = false;  // a constrained output ends with its grammar
  }

  auto stream_mode = parse_kv_stream_mode(o.kv_stream);
  if (!stream_mode) return std::move(stream_mode).error();
  std::unique_ptr<KvStreaming> streaming;
  rep.kv_stream = kv_stream_mode_name(*stream_mode);
  if (*stream_mode != KvStreamMode::off) {
    auto sync = kvstore::parse_kv_sync_policy(o.kv_sync);
    if (!sync) return std::move(sync).error();
    rep.kv_sync = o.kv_sync;
    if (!(*eng)->kv_io().can_move_kv())
      return make_error(ErrorCode::unsupported, "bench: --kv-stream needs host-addressable KV caches");
    auto started = KvStreaming::start(*stream_mode, (*eng)->kv_io().shape(), *sync);
    if (!started) return std::move(started).error();
    streaming = std::move(started).value();
    (*eng)->set_kv_sink(streaming->sink());
    (*eng)->set_stream_prompt_by_layer(true);
  }

  const auto t0 = Clock::now();
  auto outputs = (*eng)->generate(prompts, sp, grammar);
  rep.elapsed_s = ms_since(t0) / 1e3;
  if (!outputs) return std::move(outputs).error();
  if (streaming) {
    auto ks = streaming->finish();
    if (!ks) return std::move(ks).error();
    rep.kv_streamed_bytes = static_cast<double>(ks->streamed_bytes);
    rep.kv_flush_batches = static_cast<long long>(ks->batches);
    rep.kv_acked_tokens = static_cast<long long>(ks->acked_tokens);
    rep.kv_max_queued_bytes = static_cast<double>(ks->max_queued_bytes);
    rep.kv_drain_s = ks->drain_s;
    (*eng)->set_kv_sink(nullptr);
    streaming.reset();
  }
  measure_limits();

  long generated = 0;
  for (const auto& out : *outputs) generated += static_cast<long>(out.token_ids.size());
  // Prompt tokens count once per prompt, whatever n (vLLM's convention).
  rep.total_tok_s = (static_cast<double>(o.num_prompts) * o.input_len + generated) / rep.elapsed_s;
  for (const auto& s : (*eng)->step_stats()) {
    rep.num_preemptions += s.num_preemptions;
    rep.computed_tokens += s.num_prefill_tokens + s.num_decode_tokens;
    rep.prefill_computed_tokens += s.num_prefill_tokens;
  }
  if (rep.prefix_tree_tokens > 0)
    rep.prefill_over_ideal =
        static_cast<double>(rep.prefill_computed_tokens) / static_cast<double>(rep.prefix_tree_tokens) - 1.0;
  rep.preemption_mode = engine::preemption_mode_name(ec.preemption_mode);
  rep.prefix_query_tokens = (*eng)->scheduler().prefix_query_tokens();
  rep.prefix_hit_tokens = (*eng)->scheduler().prefix_hit_tokens();
  rep.num_swap_outs = static_cast<int>((*eng)->kv_io().stats().swap_outs);
  rep.num_swap_fallbacks = static_cast<int>((*eng)->kv_io().stats().swap_fallbacks);
  rep.swapped_out_bytes = static_cast<double>((*eng)->kv_io().stats().swapped_out_bytes);

  double prefill_ms = 0, prefill_flops = 0, prefill_gemm_flops = 0, decode_ms = 0;
  long prefill_tokens = 0, decode_tokens = 0;
  std::vector<double> full_decode_ms, full_decode_roof, gemm_ms, attention_ms, logits_ms, other_ms;
  std::vector<double> gemm_limit, attention_limit, attention_gbs, logits_limit;
  const auto& recs = measuring.records();
  rep.num_steps = static_cast<int>(recs.size());
  int max_decode_batch = 0;
  for (const StepRecord& r : recs)
    if (r.num_prefill_tokens == 0) max_decode_batch = std::max(max_decode_batch, r.num_tokens);
  double roofline_run_ms = 0;  // every step's roofline
  for (const StepRecord& r : recs) {
    rep.model_s += r.model_ms / 1e3;
    roofline_run_ms += r.cost.roofline_ms(rep.membw_gbs, rep.gemm_gflops);
    if (r.num_prefill_tokens > 0) {
      prefill_ms += r.model_ms;
      prefill_flops += r.cost.flops;
      prefill_tokens += r.num_prefill_tokens;
      prefill_gemm_flops += r.cost.gemm_flops + r.cost.lm_head_flops;
      rep.prefill_gemm_s += r.profile.gemm_ms / 1e3;
      rep.prefill_attention_s += r.profile.attention_ms / 1e3;
      rep.prefill_logits_s += r.profile.logits_ms / 1e3;
      rep.prefill_other_s += r.profile.other_ms / 1e3;
    } else {
      decode_ms += r.model_ms;
      decode_tokens += r.num_tokens;
      ++rep.num_decode_steps;
      if (r.num_tokens == max_decode_batch) {
        full_decode_ms.push_back(r.model_ms);
        full_decode_roof.push_back(r.cost.roofline_ms(rep.membw_gbs, rep.gemm_gflops));
        gemm_ms.push_back(r.profile.gemm_ms);
        attention_ms.push_back(r.profile.attention_ms);
        logits_ms.push_back(r.profile.logits_ms);
        other_ms.push_back(r.profile.other_ms);
        gemm_limit.push_back(r.cost.gemm_limit_ms(rep.membw_gbs, rep.gemm_gflops));
        attention_limit.push_back(r.cost.attention_limit_ms(rep.membw_gbs));
        if (r.profile.attention_ms > 0) attention_gbs.push_back(r.cost.kv_bytes / (r.profile.attention_ms * 1e6));
        logits_limit.push_back(r.cost.lm_head_limit_ms(rep.membw_gbs, rep.gemm_gflops));
      }
    }
  }
  if (prefill_ms > 0) {
    rep.prefill_tok_s = prefill_tokens / (prefill_ms / 1e3);
    rep.prefill_gflops = prefill_flops / (prefill_ms / 1e3) / 1e9;
    rep.prefill_gemm_ratio = rep.prefill_gflops / rep.gemm_gflops;
    if (rep.fma_peak_gflops > 0) rep.prefill_peak_ratio = rep.prefill_gflops / rep.fma_peak_gflops;
    const double gemm_phase_s = rep.prefill_gemm_s + rep.prefill_logits_s;
    if (gemm_phase_s > 0) {
      rep.prefill_gemm_phase_gflops = prefill_gemm_flops / gemm_phase_s / 1e9;
      rep.prefill_gemm_phase_ratio = rep.prefill_gemm_phase_gflops / rep.gemm_gflops;
    }
  }
  if (decode_ms > 0) rep.decode_tok_s = decode_tokens / (decode_ms / 1e3);
  rep.decode_step_ms = median(full_decode_ms);
  rep.decode_gemm_ms = median(gemm_ms);
  rep.decode_attention_ms = median(attention_ms);
  rep.decode_logits_ms = median(logits_ms);
  rep.decode_other_ms = median(other_ms);
  rep.decode_gemm_limit_ms = median(gemm_limit);
  rep.decode_attention_limit_ms = median(attention_limit);
  rep.decode_attention_gbs = median(attention_gbs);
  rep.decode_logits_limit_ms = median(logits_limit);
  // The engine's side of the same steps (full-batch pure decodes).
  std::vector<double> sample_ms, schedule_ms, engine_other_ms, grammar_wait_ms, grammar_fill_ms;
  for (const engine::StepStats& s : (*eng)->step_stats()) {
    if (s.num_prefill_tokens != 0 || s.num_decode_tokens != max_decode_batch) continue;
    sample_ms.push_back(s.sample_ms);
    grammar_wait_ms.push_back(s.grammar_wait_ms);
    grammar_fill_ms.push_back(s.grammar_fill_ms);
    schedule_ms.push_back(s.schedule_ms);
    engine_other_ms.push_back(std::max(0.0, s.step_ms - s.schedule_ms - s.execute_ms - s.sample_ms));
  }
  rep.decode_sample_ms = median(sample_ms);
  rep.decode_grammar_wait_ms = median(grammar_wait_ms);
  rep.decode_grammar_fill_ms = median(grammar_fill_ms);
  rep.decode_schedule_ms = median(schedule_ms);
  rep.decode_engine_other_ms = median(engine_other_ms);
  rep.roofline_step_ms = median(full_decode_roof);
  if (rep.roofline_step_ms > 0) rep.roofline_ratio = rep.decode_step_ms / rep.roofline_step_ms;
  if (roofline_run_ms > 0 && rep.elapsed_s > 0)
    rep.roofline_total_tok_s = rep.total_tok_s * rep.elapsed_s / (roofline_run_ms / 1e3);
  rep.weight_bytes = static_cast<double>(cpu_runner->packed_weight_bytes());
  return rep;
}

}  // namespace shardline::bench
