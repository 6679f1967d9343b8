#include "cli/engine_flags.hpp"

#include <charconv>
#include <filesystem>

namespace shardline::cli {

void add_engine_flags(CLI::App& cmd, EngineFlags& f) {
  cmd.add_option("--dtype", f.dtype,
                 "Weight storage in memory: f32 or bf16 (CUDA also f16); CPU compute is F32, CUDA GEMMs run in "
                 "the weight dtype with F32 accumulation")
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "KV cache storage: f32 (exact) or bf16 (half the bytes; attention math stays F32)")
      ->capture_default_str();
  cmd.add_option("--load-format", f.load_format,
                 "auto (safetensors if present), safetensors, or dummy (seeded random weights with "
                 "config.json's shapes)")
      ->capture_default_str();
  cmd.add_option("--kv-cache-bytes", f.kv_cache_bytes,
                 "KV cache budget in bytes (0: --kv-cache-memory-fraction of free memory)");
  cmd.add_option("--kv-cache-memory-fraction", f.kv_cache_memory_fraction,
                 "Fraction of MemAvailable for the KV cache when --kv-cache-bytes is 0")
      ->capture_default_str();
  cmd.add_option("--block-size", f.block_size, "Tokens per KV block")->capture_default_str();
  cmd.add_option("--max-num-seqs", f.max_num_seqs, "Running sequences per step at most")
      ->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", f.max_num_batched_tokens,
                 "Tokens per step at most (prefill chunks + decodes)")
      ->capture_default_str();
  cmd.add_option("--max-model-len", f.max_model_len,
                 "Prompt + output tokens at most (0: config max_position_embeddings)");
  cmd.add_option("--threads", f.threads, "Compute threads (0: all cores)");
  cmd.add_option("--num-layers", f.num_layers, "Keep only the first N layers (smoke tests; 0: all)");
  cmd.add_option("--seed", f.seed, "Seed of dummy weights and of requests without their own seed")
      ->capture_default_str();
  cmd.add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                 "CUDA: fraction of each GPU's memory for weights, activations and KV cache")
      ->capture_default_str();
  cmd.add_flag("--deterministic", f.deterministic,
               "CUDA: batch-invariant GEMMs, so a request's output does not depend on its batch (slower)");
  cmd.add_flag("--enforce-eager", f.enforce_eager, "CUDA: no CUDA graphs for decode steps");
  cmd.add_option("--preemption-mode", f.preemption_mode,
                 "When KV blocks run out: recompute (drop the victim's KV, re-prefill it later) or swap (copy "
                 "it to host memory and back, DéjàVu's microbatch swapping; CPU devices and in-process groups; other "
                 "executors recompute)")
      ->capture_default_str();
  cmd.add_option("--swap-space", f.swap_space_gib, "Host memory for swapped-out KV, GiB (per engine)")
      ->capture_default_str();
}

void add_device_flag(CLI::App& cmd, EngineFlags& f) {
  cmd.add_option("--device", f.device, "cpu, or cuda:N (one GPU)")->capture_default_str();
}

Result<engine::EngineOptions> to_engine_options(const EngineFlags& f, const std::string& model_dir) {
  engine::EngineOptions o;
  o.model_dir = model_dir;
  if (f.dtype == "f32" || f.dtype == "float32") {
    o.dtype = DType::f32;
  } else if (f.dtype == "bf16" || f.dtype == "bfloat16") {
    o.dtype = DType::bf16;
  } else if (f.dtype == "f16" || f.dtype == "float16") {
    o.dtype = DType::f16;
  } else {
    return make_error(ErrorCode::invalid_argument, "--dtype must be f32, bf16 or f16, got '" + f.dtype + "'");
  }
  if (f.device.empty() || f.device == "cpu" || f.device == "cpu:0") {
    o.device = model::DeviceKind::cpu;
  } else {
    int index = -1;
    const char* b = f.device.data() + 5;
    const char* e = f.device.data() + f.device.size();
    const bool cuda_prefix = f.device.rfind("cuda:", 0) == 0;
    const auto [p, ec] = cuda_prefix ? std::from_chars(b, e, index) : std::from_chars_result{b, std::errc::invalid_argument};
    if (!cuda_prefix || ec != std::errc() || p != e || index < 0)
      return make_error(ErrorCode::invalid_argument, "--device must be cpu or cuda:N, got '" + f.device + "'");
    o.device = model::DeviceKind::cuda;
    o.device_index = index;
  }
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.deterministic = f.deterministic;
  o.cuda_graphs = !f.enforce_eager;
  if (f.kv_cache_dtype == "f32" || f.kv_cache_dtype == "float32") {
    o.kv_cache_dtype = DType::f32;
  } else if (f.kv_cache_dtype == "bf16" || f.kv_cache_dtype == "bfloat16") {
    o.kv_cache_dtype = DType::bf16;
  } else {
    return make_error(ErrorCode::invalid_argument,
                      "--kv-cache-dtype must be f32 or bf16, got '" + f.kv_cache_dtype + "'");
  }
  if (f.load_format == "dummy") {
    o.load_format = model::LoadFormat::dummy;
  } else if (f.load_format == "safetensors" || f.load_format == "auto") {
    o.load_format = model::LoadFormat::safetensors;
  } else {
    return make_error(ErrorCode::invalid_argument,
                      "--load-format must be auto, safetensors or dummy, got '" + f.load_format + "'");
  }
  if (f.kv_cache_bytes < 0) return make_error(ErrorCode::invalid_argument, "--kv-cache-bytes must be >= 0");
  o.kv_cache_bytes = static_cast<std::uint64_t>(f.kv_cache_bytes);
  o.kv_cache_memory_fraction = f.kv_cache_memory_fraction;
  o.block_size = f.block_size;
  o.max_num_seqs = f.max_num_seqs;
  o.max_num_batched_tokens = f.max_num_batched_tokens;
  o.max_model_len = f.max_model_len;
  o.num_threads = f.threads;
  o.num_layers_override = f.num_layers;
  o.seed = f.seed;
  auto mode = engine::parse_preemption_mode(f.preemption_mode);
  if (!mode) return make_error(ErrorCode::invalid_argument, "--preemption-mode: " + mode.error().message);
  o.preemption_mode = *mode;
  if (!(f.swap_space_gib >= 0.0)) return make_error(ErrorCode::invalid_argument, "--swap-space must be >= 0");
  o.swap_space_bytes = static_cast<std::uint64_t>(f.swap_space_gib * static_cast<double>(1ull << 30));
  return o;
}

}  // namespace shardline::cli
