#include "bench/gpu_throughput.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/stopwatch.hpp"
#include "sim/calibration/roofline.hpp"
#include "sim/calibration/workload.hpp"

#if SHARDLINE_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/roofline.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/cuda_shard_group.hpp"
#endif

namespace shardline::bench {

// The measurement pieces the benchmarks share with the simulator's calibration.
using sim::calibration::StepCost;
using sim::calibration::median;
using sim::calibration::random_prompts;
using sim::calibration::step_cost;

std::string GpuThroughputReport::to_json() const {
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [batch, steps] : decode_batch_hist) hist[std::to_string(batch)] = steps;
  nlohmann::json j{{"device_name", device_name},
                   {"device_index", device_index},
                   {"parallel", parallel},
                   {"model", model},
                   {"num_layers", num_layers},
                   {"dtype", dtype},
                   {"kv_cache_dtype", kv_cache_dtype},
                   {"num_prompts", num_prompts},
                   {"input_len", input_len},
                   {"output_len", output_len},
                   {"max_batch", max_batch},
                   {"max_num_batched_tokens", max_num_batched_tokens},
                   {"deterministic", deterministic},
                   {"cuda_graphs", cuda_graphs},
                   {"vllm_setting", vllm_setting},
                   {"setup_s", setup_s},
                   {"elapsed_s", elapsed_s},
                   {"prompt_tokens", prompt_tokens},
                   {"generated_tokens", generated_tokens},
                   {"total_tok_s", total_tok_s},
                   {"prefill_tok_s", prefill_tok_s},
                   {"decode_tok_s", decode_tok_s},
                   {"model_time_fraction", model_time_fraction},
                   {"roofline_min_batch", kRooflineMinBatch},
                   {"num_roofline_steps", num_roofline_steps},
                   {"decode_step_ms", decode_step_ms},
                   {"decode_upload_ms", decode_upload_ms},
                   {"decode_forward_ms", decode_forward_ms},
                   {"decode_batch_median", decode_batch_median},
                   {"decode_batch_min", decode_batch_min},
                   {"decode_batch_max", decode_batch_max},
                   {"decode_batch_hist", hist},
                   {"decode_bytes", decode_bytes},
                   {"roofline_step_ms", roofline_step_ms},
                   {"roofline_compute_ms", roofline_compute_ms},
                   {"roofline_ratio", roofline_ratio},
                   {"prefill_tflops", prefill_tflops},
                   {"prefill_gemm_ratio", prefill_gemm_ratio},
                   {"hbm_gbs", hbm_gbs},
                   {"gemm_tflops", gemm_tflops},
                   {"num_graph_steps", num_graph_steps},
                   {"graph_fraction", graph_fraction},
                   {"captured_batch_sizes", captured_batch_sizes},
                   {"graph_capture_error", graph_capture_error},
                   {"num_steps", num_steps},
                   {"num_prefill_steps", num_prefill_steps},
                   {"num_decode_steps", num_decode_steps},
                   {"num_preemptions", num_preemptions},
                   {"kv_cache_bytes", kv_cache_bytes},
                   {"num_kv_blocks", num_kv_blocks},
                   {"weight_bytes", weight_bytes},
                   {"target_total_tok_s", kVllmH100TotalTokS},
                   {"target_roofline_ratio", kTargetRooflineRatio},
                   {"meets_throughput_target", meets_throughput_target},
                   {"meets_roofline_target", meets_roofline_target}};
  return j.dump();
}

std::string GpuThroughputReport::to_table() const {
  std::ostringstream s;
  char buf[256];
  const auto line = [&](const std::string& key, const std::string& value) {
    s << "  " << key << std::string(key.size() < 26 ? 26 - key.size() : 1, ' ') << value << "\n";
  };
  const auto num = [&](double v, const char* fmt) {
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  s << "GPU throughput benchmark\n";
  line("device", "cuda:" + std::to_string(device_index) + " " + device_name);
  line("engine group", parallel);
  line("model", model + " (" + std::to_string(num_layers) + " layers)");
  line("dtype / kv dtype", dtype + " / " + kv_cache_dtype);
  line("workload", std::to_string(num_prompts) + " prompts x (" + std::to_string(input_len) + " in, " +
                       std::to_string(output_len) + " out)" + (vllm_setting ? "  [vLLM's setting]" : ""));
  line("max batch / tokens", std::to_string(max_batch) + " seqs / " + std::to_string(max_num_batched_tokens) +
                                 " tokens per step" + (deterministic ? ", deterministic GEMMs" : ""));
  line("setup", num(setup_s, "%.1f s"));
  line("elapsed", num(elapsed_s, "%.2f s") + " (model time " + num(100.0 * model_time_fraction, "%.0f%%") + ")");
  line("total", num(total_tok_s, "%.0f tok/s") + "   (vLLM H100: " + num(kVllmH100TotalTokS, "%.0f") + ", " +
                    (meets_throughput_target ? "met" : "NOT met") + ")");
  line("prefill", num(prefill_tok_s, "%.0f tok/s") + "  " + num(prefill_tflops, "%.1f TFLOP/s") + " = " +
                      num(100.0 * prefill_gemm_ratio, "%.0f%%") + " of GEMM peak");
  line("decode", num(decode_tok_s, "%.0f tok/s"));
  line("decode step (batch>=" + std::to_string(kRooflineMinBatch) + ")",
       num(decode_step_ms, "%.2f ms") + " median of " + std::to_string(num_roofline_steps) + " steps, batch " +
           std::to_string(decode_batch_min) + ".." + std::to_string(decode_batch_max) + " (median " +
           num(decode_batch_median, "%.0f") + ")");
  line("  upload / forward", num(decode_upload_ms, "%.2f ms") + " / " + num(decode_forward_ms, "%.2f ms"));
  line("  HBM roofline", num(roofline_step_ms, "%.2f ms") + " (" + num(decode_bytes / 1e9, "%.2f GB") +
                             "; compute bound " + num(roofline_compute_ms, "%.2f ms") + ")");
  line("  ratio", num(roofline_ratio, "%.2fx") + "   (target <= " + num(kTargetRooflineRatio, "%.1f") + "x, " +
                      (meets_roofline_target ? "met" : "NOT met") + ")");
  line("HBM bandwidth (D2D)", num(hbm_gbs, "%.0f GB/s"));
  line("BF16 GEMM peak", num(gemm_tflops, "%.0f TFLOP/s"));
  std::string graphs = cuda_graphs ? num(100.0 * graph_fraction, "%.0f%%") + " of decode steps replayed a graph (" +
                                         std::to_string(captured_batch_sizes.size()) + " sizes captured)"
                                   : std::string("off (--enforce-eager)");
  line("CUDA graphs", graphs);
  if (!graph_capture_error.empty()) line("graph capture error", graph_capture_error);
  line("steps", std::to_string(num_steps) + " (" + std::to_string(num_prefill_steps) + " with prefill, " +
                    std::to_string(num_decode_steps) + " decode), " + std::to_string(num_preemptions) +
                    " preemptions");
  line("memory", num(weight_bytes / (1u << 30), "%.2f GiB weights, ") +
                     num(static_cast<double>(kv_cache_bytes) / (1u << 30), "%.2f GiB KV (") +
                     std::to_string(num_kv_blocks) + " blocks)");
  return s.str();
}

#if !SHARDLINE_HAVE_CUDA

Result<GpuThroughputReport> run_gpu_throughput(const ThroughputOptions&) {
  return make_error(ErrorCode::unsupported,
                    "bench --device cuda: this build has no CUDA backend (configure with SHARDLINE_CUDA=ON where "
                    "nvcc is installed)");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHbmProbeBytes = std::size_t{2} << 30;  // 2 GiB, well above the 50 MiB L2
constexpr int kProbeIters = 10;
constexpr int kGemmProbeSize = 8192;

/// One engine step as the decorator saw it.
struct StepRecord {
  int num_tokens = 0;
  int num_seqs = 0;
  int num_prompt_tokens = 0;  ///< tokens at positions < input_len
  bool pure_decode = false;   ///< every sequence has one new token past its prompt
  double ms = 0;              ///< host wall time of execute()
  StepCost cost;
  model::CudaStepStats stats;
};

/// Times every step, prices it, and keeps the runner's per-step statistics.
/// Forwards everything else (sampling on the device included) to the runner.
class TimingExecutor final : public model::ModelExecutor {
 public:
  /// `inner`: the engine's executor (a runner, or a group sharing the GPU);
  /// `stats`: the runner whose CudaStepStats each step reports (the runner,
  /// or the group's rank 0).
  TimingExecutor(model::ModelExecutor& inner, const model::CudaModelRunner& stats, double weight_elem_bytes,
                 double kv_elem_bytes, int input_len)
      : inner_(inner), stats_(stats), weight_elem_bytes_(weight_elem_bytes), kv_elem_bytes_(kv_elem_bytes),
        input_len_(input_len) {}

  Result<model::StepOutput> execute(const model::StepInput& in) override {
    StepRecord r;
    r.num_tokens = in.num_tokens();
    r.num_seqs = static_cast<int>(in.seqs.size());
    for (std::int32_t p : in.positions) r.num_prompt_tokens += p < input_len_ ? 1 : 0;
    r.pure_decode = r.num_prompt_tokens == 0 &&
                    std::all_of(in.seqs.begin(), in.seqs.end(),
                                [](const model::StepSeq& s) { return s.num_new_tokens == 1; });
    r.cost = step_cost(stats_.config(), weight_elem_bytes_, kv_elem_bytes_, in);
    const auto t0 = Clock::now();
    auto out = inner_.execute(in);
    r.ms = ms_since(t0);
    r.stats = stats_.last_step_stats();
    records_.push_back(r);
    return out;
  }
  int vocab_size() const override { return inner_.vocab_size(); }
  int num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int block_size() const override { return inner_.block_size(); }
  bool samples_on_device() const override { return inner_.samples_on_device(); }
  const std::vector<StepRecord>& records() const { return records_; }

 private:
  model::ModelExecutor& inner_;
  const model::CudaModelRunner& stats_;
  double weight_elem_bytes_;
  double kv_elem_bytes_;
  int input_len_;
  std::vector<StepRecord> records_;
};

/// HBM bandwidth and BF16 GEMM peak; each reading raises what `rep` holds.
Status measure_ceilings(GpuThroughputReport& rep) {
  auto bw = kernels::cuda::measure_d2d_bandwidth_gbs(kHbmProbeBytes, kProbeIters);
  if (!bw) return std::move(bw).error();
  auto tf = kernels::cuda::measure_gemm_tflops(DType::bf16, kGemmProbeSize, kGemmProbeSize, kGemmProbeSize,
                                               kProbeIters);
  if (!tf) return std::move(tf).error();
  rep.hbm_gbs = std::max(rep.hbm_gbs, *bw);
  rep.gemm_tflops = std::max(rep.gemm_tflops, *tf);
  return Status::ok_status();
}

}  // namespace

Result<GpuThroughputReport> run_gpu_throughput(const ThroughputOptions& o) {
  if (o.num_prompts <= 0 || o.input_len <= 0 || o.output_len <= 0 || o.max_batch <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "bench: --num-prompts, --input-len, --output-len and --max-batch must be > 0");
  if (o.engine.device != model::DeviceKind::cuda)
    return make_error(ErrorCode::invalid_argument, "bench: run_gpu_throughput needs --device cuda:N");
  if (o.engine.parallel.dp != 1)
    return make_error(ErrorCode::unsupported, "bench --device cuda: one engine (dp = 1)");

  GpuThroughputReport rep;
  rep.device_index = o.engine.device_index;
  rep.parallel = o.engine.parallel.to_string();
  rep.model = o.engine.model_dir;
  rep.dtype = dtype_name(o.engine.dtype);
  rep.kv_cache_dtype = dtype_name(o.engine.kv_cache_dtype);
  rep.num_prompts = o.num_prompts;
  rep.input_len = o.input_len;
  rep.output_len = o.output_len;
  rep.max_batch = o.max_batch;
  rep.max_num_batched_tokens = o.engine.max_num_batched_tokens;
  rep.deterministic = o.engine.deterministic;
  rep.cuda_graphs = o.engine.cuda_graphs;
  rep.vllm_setting = o.num_prompts == 1000 && o.input_len == 256 && o.output_len == 256 &&
                     o.engine.num_layers_override == 0 && o.engine.dtype == DType::bf16;

  const kernels::cuda::DeviceQuery q = kernels::cuda::query_devices();
  if (o.engine.device_index < 0 || o.engine.device_index >= static_cast<int>(q.devices.size()))
    return make_error(ErrorCode::not_found,
                      "bench --device cuda:" + std::to_string(o.engine.device_index) + ": " +
                          (q.devices.empty() ? "no CUDA device (" + q.error + ")"
                                             : "only " + std::to_string(q.devices.size()) + " CUDA device(s)"));
  rep.device_name = q.devices[static_cast<std::size_t>(o.engine.device_index)].name;

  // The ceilings, before the engine takes the device's memory...
  std::cerr << "gpu bench: measuring HBM bandwidth and BF16 GEMM peak on cuda:" << rep.device_index << " ("
            << rep.device_name << ")" << std::endl;
  if (Status s = measure_ceilings(rep); !s.ok()) return s.error();

  std::vector<StepRecord> recs;
  {
    engine::EngineOptions eo = o.engine;
    eo.max_num_seqs = o.max_batch;
    eo.max_model_len = o.input_len + o.output_len;
    std::cerr << "gpu bench: building the engine (" << rep.model << ", " << rep.dtype << " weights, "
              << rep.kv_cache_dtype << " KV)" << std::endl;
    const auto t_setup = Clock::now();
    auto built = engine::build_engine(eo);
    if (!built) return std::move(built).error();
    engine::EngineInstance& e = *built;
    // One runner, or a group of ranks sharing the GPU (steps report rank 0's statistics).
    const model::CudaModelRunner* runner = e.executor_as<model::CudaModelRunner>();
    double weight_bytes = runner != nullptr ? static_cast<double>(runner->weight_bytes()) : 0.0;
    if (auto* group = e.executor_as<model::CudaShardGroup>(); group != nullptr) {
      runner = &group->rank(0);
      weight_bytes = static_cast<double>(group->weight_bytes());
    }
    if (runner == nullptr)
      return make_error(ErrorCode::internal, "bench: the cuda engine has no CudaModelRunner or CudaShardGroup");
    rep.setup_s = ms_since(t_setup) / 1e3;
    rep.num_layers = e.weights->config.num_hidden_layers;
    rep.kv_cache_bytes = e.kv_cache_bytes;
    rep.num_kv_blocks = e.num_kv_blocks;
    rep.weight_bytes = weight_bytes;
    rep.captured_batch_sizes = runner->captured_batch_sizes();
    rep.graph_capture_error = runner->graph_capture_error();

    // The engine must run on the timing executor: a second engine over it.
    TimingExecutor timing(*e.executor, *runner, static_cast<double>(dtype_size(o.engine.dtype)),
                          static_cast<double>(dtype_size(o.engine.kv_cache_dtype)), o.input_len);
    auto eng = engine::LlmEngine::create(timing, *e.tokenizer, e.engine->config());
    if (!eng) return std::move(eng).error();

    const auto prompts = random_prompts(o.num_prompts, o.input_len, e.weights->config.vocab_size, o.prompt_seed);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    sp.max_tokens = o.output_len;
    sp.ignore_eos = true;

    // Progress on stderr every 10 s (a long run on a remote machine should show it is alive).
    const long total_tokens = static_cast<long>(o.num_prompts) * (o.input_len + o.output_len);
    long tokens_done = 0;
    auto last_report = Clock::now();
    const auto t0 = Clock::now();
    (*eng)->set_step_callback([&](const engine::StepStats& s) {
      tokens_done += s.num_prefill_tokens + s.num_decode_tokens;
      if (Clock::now() - last_report > std::chrono::seconds(10)) {
        last_report = Clock::now();
        std::fprintf(stderr, "gpu bench: %6.1f s  %ld / %ld tokens  (%d seqs in the last step)\n",
                     ms_since(t0) / 1e3, tokens_done, total_tokens, s.num_seqs);
      }
    });
    std::cerr << "gpu bench: setup " << rep.setup_s << " s; generating " << o.num_prompts << " x (" << o.input_len
              << " in, " << o.output_len << " out), max batch " << o.max_batch << std::endl;
    auto outputs = (*eng)->generate(prompts, sp);
    rep.elapsed_s = ms_since(t0) / 1e3;
    if (!outputs) return std::move(outputs).error();
    for (const auto& out : *outputs) rep.generated_tokens += static_cast<long>(out.token_ids.size());
    rep.prompt_tokens = static_cast<long>(o.num_prompts) * o.input_len;
    for (const auto& s : (*eng)->step_stats()) rep.num_preemptions += s.num_preemptions;
    recs = timing.records();
  }  // engine destroyed: the device memory is free again

  // ...and after it is gone (the better reading counts).
  if (Status s = measure_ceilings(rep); !s.ok())
    std::cerr << "gpu bench: warning: the second ceiling measurement failed: " << s.error().to_string() << std::endl;

  rep.total_tok_s = static_cast<double>(rep.prompt_tokens + rep.generated_tokens) / rep.elapsed_s;
  rep.num_steps = static_cast<int>(recs.size());
  double prefill_ms = 0, prefill_flops = 0, decode_ms = 0, all_ms = 0;
  long prefill_tokens = 0, decode_tokens = 0;
  std::vector<double> step_ms, upload_ms, forward_ms, batches, bytes, roof_ms, compute_ms;
  for (const StepRecord& r : recs) {
    all_ms += r.ms;
    if (!r.pure_decode) {
      ++rep.num_prefill_steps;
      prefill_ms += r.ms;
      prefill_flops += r.cost.flops;
      prefill_tokens += r.num_prompt_tokens;
      continue;
    }
    ++rep.num_decode_steps;
    decode_ms += r.ms;
    decode_tokens += r.num_tokens;
    rep.num_graph_steps += r.stats.used_graph ? 1 : 0;
    ++rep.decode_batch_hist[r.num_seqs];
    if (r.num_seqs < kRooflineMinBatch) continue;
    step_ms.push_back(r.ms);
    upload_ms.push_back(r.stats.upload_ms);
    forward_ms.push_back(r.stats.forward_ms);
    batches.push_back(r.num_seqs);
    bytes.push_back(r.cost.bytes());
    roof_ms.push_back(r.cost.bytes() / (rep.hbm_gbs * 1e9) * 1e3);
    compute_ms.push_back(r.cost.flops / (rep.gemm_tflops * 1e12) * 1e3);
    rep.decode_batch_min = rep.decode_batch_min == 0 ? r.num_seqs : std::min(rep.decode_batch_min, r.num_seqs);
    rep.decode_batch_max = std::max(rep.decode_batch_max, r.num_seqs);
  }
  if (rep.elapsed_s > 0) rep.model_time_fraction = all_ms / 1e3 / rep.elapsed_s;
  if (prefill_ms > 0) {
    rep.prefill_tok_s = static_cast<double>(prefill_tokens) / (prefill_ms / 1e3);
    rep.prefill_tflops = prefill_flops / (prefill_ms / 1e3) / 1e12;
    if (rep.gemm_tflops > 0) rep.prefill_gemm_ratio = rep.prefill_tflops / rep.gemm_tflops;
  }
  if (decode_ms > 0) rep.decode_tok_s = static_cast<double>(decode_tokens) / (decode_ms / 1e3);
  if (rep.num_decode_steps > 0)
    rep.graph_fraction = static_cast<double>(rep.num_graph_steps) / rep.num_decode_steps;
  rep.num_roofline_steps = static_cast<int>(step_ms.size());
  rep.decode_step_ms = median(step_ms);
  rep.decode_upload_ms = median(upload_ms);
  rep.decode_forward_ms = median(forward_ms);
  rep.decode_batch_median = median(batches);
  rep.decode_bytes = median(bytes);
  rep.roofline_step_ms = median(roof_ms);
  rep.roofline_compute_ms = median(compute_ms);
  if (rep.roofline_step_ms > 0) rep.roofline_ratio = rep.decode_step_ms / rep.roofline_step_ms;
  rep.meets_throughput_target = rep.total_tok_s >= kVllmH100TotalTokS;
  rep.meets_roofline_target = rep.roofline_ratio > 0 && rep.roofline_ratio <= kTargetRooflineRatio;
  return rep;
}

#endif  // SHARDLINE_HAVE_CUDA

}  // namespace shardline::bench
