#include "cli/engine_flags.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <limits>

namespace shardline::cli {

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  const auto bad = [text](const std::string& why) {
    return make_error(ErrorCode::invalid_argument, "size '" + std::string(text) + "': " + why +
                                                       " (bytes, or a number with K, M, G or T, e.g. 512M, 1.5GiB)");
  };
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string_view whole = s.substr(0, i);
  std::string_view fraction;
  if (i < s.size() && s[i] == '.') {
    const std::size_t start = ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    fraction = s.substr(start, i - start);
    if (fraction.empty()) return bad("no digits after the point");
  }
  if (whole.empty()) return bad("no number");
  std::string_view unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  std::string lower;
  for (const char c : unit) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));

  std::uint64_t factor = 0;
  if (lower.empty() || lower == "b") {
    factor = 1;
  } else {
    constexpr std::array<char, 4> kPrefixes{'k', 'm', 'g', 't'};
    for (std::size_t p = 0; p < kPrefixes.size(); ++p) {
      const std::string k(1, kPrefixes[p]);
      if (lower == k || lower == k + "b" || lower == k + "ib") factor = 1ull << (10 * (p + 1));
    }
    if (factor == 0) return bad("unknown unit '" + std::string(unit) + "'");
  }
  if (factor == 1 && !fraction.empty()) return bad("a fraction of a byte");

  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), n);
  if (ec != std::errc() || end != whole.data() + whole.size() || n > kMax / factor) return bad("too large");
  std::uint64_t bytes = n * factor;
  // The fraction, exactly: floor(0.f * factor) with f of at most 12 digits
  // (factor <= 2^40, so f * factor stays below 2^80 -- split to stay in 64 bits).
  if (!fraction.empty()) {
    const std::string_view digits = fraction.substr(0, 12);
    std::uint64_t f = 0;
    std::uint64_t scale = 1;
    for (const char c : digits) {
      f = f * 10 + static_cast<std::uint64_t>(c - '0');
      scale *= 10;
    }
    // factor = 2^e: floor(f * 2^e / scale) computed as (f * 2^a) * 2^(e-a) / scale in two steps.
    const std::uint64_t hi = factor >> 20 ? factor >> 20 : 1;  // up to 2^20
    const std::uint64_t lo = factor / hi;                       // up to 2^20
    // No overflow: n <= kMax / factor leaves at least factor - 1 above n * factor, and part < factor.
    bytes += (f * lo / scale) * hi + ((f * lo % scale) * hi) / scale;
  }
  return bytes;
}

void add_engine_flags(CLI::App& cmd, EngineFlags& f) {
  cmd.add_option("--dtype", f.dtype,
                 "Weights in memory: f32 or bf16 (CUDA also f16); the linear layers compute in the weight "
                 "dtype with F32 accumulation (CPU BF16: activations rounded to BF16, VDPBF16PS). auto: a GGUF "
                 "file's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrices stay quantized on CPU (integer dot products on Q8 "
                 "activations, llama.cpp's integer sums), the rest in bf16; CUDA dequantizes them (SiDP on CPU "
                 "keeps them)")
      ->capture_default_str();
  cmd.add_option("--quantization", f.quantization,
                 "CPU: quantize every matrix on load to q8_0, q4_0 or q4_1 (llama-quantize's rounding, from the "
                 "source values in F32), computed with integer dot products as under --dtype auto")
      ->check(CLI::IsMember({"q8_0", "q4_0", "q4_1"}));
  cmd.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "KV cache storage: f32 (exact) or bf16 (half the bytes; attention math stays F32)")
      ->capture_default_str();
  cmd.add_option("--step-overlap", f.step_overlap,
                 "CPU: how a step's phases overlap: none, kv-prefetch (each layer's QKV GEMM prefetches the KV "
                 "its attention reads next) or nano-batch (two half-batches offset by half a layer, NanoFlow-style); the same "
                 "results either way (docs/performance.md)")
      ->capture_default_str();
  cmd.add_option("--overlap-prefetch-mib", f.overlap_prefetch_mib,
                 "CPU, with --step-overlap: KV MiB one attention's prefetch covers at most (0: all)")
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
  cmd.add_option("--device-memory", f.device_memory,
                 "CPU devices: memory of each emulated device for weights, activations and KV cache, as the GPU "
                 "memory plan carves it (0: off, the KV cache takes --kv-cache-bytes or a fraction of free memory); "
                 "bytes, or with a binary unit: 512M, 1.5G, 8GiB (K = KB = KiB = 1024)")
      ->type_name("SIZE")
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
  cmd.add_flag("--enable-prefix-caching", f.enable_prefix_caching,
               "Automatic prefix caching (the default, but for bench): a request's leading full KV blocks that another "
               "request computed are shared, not computed again; the output is the same either way "
               "(docs/prefix-caching.md)");
  cmd.add_option("--prefix-tier-mib", f.prefix_tier_mib,
                 "Host memory (MiB) for a prefix tier below the KV cache: prefix blocks the cache evicts are copied "
                 "there and restored instead of computed again (docs/prefix-caching.md); 0: none")
      ->capture_default_str();
  cmd.add_flag("--no-prefix-caching", f.no_prefix_caching,
               "Turn automatic prefix caching off: every request computes its whole prompt (wins over "
               "--enable-prefix-caching)");
}

void add_shift_flags(CLI::App& cmd, EngineFlags& f) {
  cmd.add_flag("--shift", f.shift,
               "Shift Parallelism: each engine group (--parallel sp=N or sp=N,tp=M, pp=1) also holds the TP config "
               "over the same devices and KV cache; steps of at most --shift-threshold tokens run in it");
  cmd.add_option("--shift-threshold", f.shift_threshold,
                 "Batched tokens per step at or below which a step runs in the shift (TP) config; auto: where the "
                 "cost model, on this machine's measured bandwidth, GEMM rate and collectives, predicts the base "
                 "config becomes faster")
      ->capture_default_str();
  cmd.add_option("--shift-hysteresis", f.shift_hysteresis,
                 "h: a shifted group goes back to the base config only above threshold*(1+h) tokens")
      ->capture_default_str();
}

void add_seesaw_flags(CLI::App& cmd, EngineFlags& f) {
  cmd.add_option("--parallel-decode", f.parallel_decode,
                 "Seesaw: each engine group decodes in this config (tp=..,pp=..,sp=.., the same number of devices "
                 "as --parallel / --parallel-prefill, which prefill runs in); KV moves between them through the host "
                 "KV buffer. Turns on Seesaw's phases");
  cmd.add_option("--seesaw-policy", f.seesaw_policy,
                 "Seesaw's phase schedule: transition-minimizing (default with --parallel-decode), "
                 "prefill-prioritizing or decode-prioritizing. Alone: phases on one config");
  cmd.add_option("--host-kv-bytes", f.host_kv_bytes,
                 "Seesaw's host KV buffer per engine (bytes, or 512M, 4G ...; default: --swap-space); must hold one "
                 "--max-model-len sequence")
      ->type_name("SIZE");
  cmd.add_option("--reshard-weights", f.reshard_weights,
                 "Seesaw with --parallel-decode: resident (every rank keeps both configs' weight shards) or reload "
                 "(it frees the inactive shard and repacks it from host memory at each transition)")
      ->capture_default_str();
  cmd.add_option("--seesaw-min-prefill-prompts", f.seesaw_min_prefill_prompts,
                 "transition-minimizing: decode -> prefill needs this many waiting prompts while decodes remain")
      ->capture_default_str();
  cmd.add_option("--seesaw-kv-copy", f.seesaw_kv_copy,
                 "Seesaw's KV copies to and from the host buffer: async (a prefetcher thread overlaps them with the "
                 "steps, §5.2) or sync (on the engine's thread, before the step that needs them)")
      ->capture_default_str();
  cmd.add_option("--host-link-gbps", f.host_link_gbps,
                 "Seesaw: emulate a host link (PCIe) of this many GB/s per device for the KV copies; 0: unpaced "
                 "(a memcpy)")
      ->capture_default_str();
  cmd.add_option("--host-link-latency-us", f.host_link_latency_us,
                 "Seesaw: the emulated host link's fixed cost per copy, in microseconds")
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
  } else if (f.dtype == "auto") {
    o.dtype = DType::bf16;
    o.keep_quantized = true;
  } else {
    return make_error(ErrorCode::invalid_argument, "--dtype must be auto, f32, bf16 or f16, got '" + f.dtype + "'");
  }
  if (f.quantization == "q8_0") o.quantization = kernels::GgmlType::q8_0;
  if (f.quantization == "q4_0") o.quantization = kernels::GgmlType::q4_0;
  if (f.quantization == "q4_1") o.quantization = kernels::GgmlType::q4_1;
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
  auto overlap = model::parse_step_overlap(f.step_overlap);
  if (!overlap.ok()) return make_error(ErrorCode::invalid_argument, "--step-overlap: " + overlap.error().message);
  o.step_overlap = *overlap;
  if (!(f.overlap_prefetch_mib >= 0) || f.overlap_prefetch_mib > 1e6)
    return make_error(ErrorCode::invalid_argument,
                      "--overlap-prefetch-mib must be between 0 and 1e6, got " + std::to_string(f.overlap_prefetch_mib));
  o.overlap_prefetch_bytes = static_cast<std::size_t>(f.overlap_prefetch_mib * 1048576.0);
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
  auto device_memory = parse_byte_size(f.device_memory);
  if (!device_memory) return make_error(ErrorCode::invalid_argument, "--device-memory: " + device_memory.error().message);
  o.device_memory_bytes = *device_memory;
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
  o.enable_prefix_caching = !f.no_prefix_caching;
  o.prefix_tier_bytes = f.prefix_tier_mib << 20;
  if (!(f.swap_space_gib >= 0.0)) return make_error(ErrorCode::invalid_argument, "--swap-space must be >= 0");
  o.swap_space_bytes = static_cast<std::uint64_t>(f.swap_space_gib * static_cast<double>(1ull << 30));
  if (f.shift) {
    engine::ShiftOptions so;
    if (f.shift_threshold == "auto") {
      so.policy.threshold = 0;  // set by the caller once the group is known (resolve_shift_threshold)
    } else {
      const char* b = f.shift_threshold.data();
      const char* e = b + f.shift_threshold.size();
      const auto [p, ec] = std::from_chars(b, e, so.policy.threshold);
      if (ec != std::errc() || p != e || so.policy.threshold < 0)
        return make_error(ErrorCode::invalid_argument,
                          "--shift-threshold must be auto or a token count >= 0, got '" + f.shift_threshold + "'");
    }
    so.policy.hysteresis = f.shift_hysteresis;
    if (Status st = so.policy.validate(); !st) return st.error();
    o.shift = so;
  }
  if (!f.parallel_decode.empty() || !f.seesaw_policy.empty()) {
    engine::SeesawPolicyOptions so;
    if (!f.seesaw_policy.empty()) {
      auto schedule = engine::parse_seesaw_schedule(f.seesaw_policy);
      if (!schedule) return make_error(ErrorCode::invalid_argument, "--seesaw-policy: " + schedule.error().message);
      so.schedule = *schedule;
    }
    so.min_prefill_prompts = f.seesaw_min_prefill_prompts;
    if (Status st = so.validate(); !st)
      return make_error(ErrorCode::invalid_argument, "--seesaw-min-prefill-prompts: " + st.error().message);
    o.seesaw = so;
    if (!f.parallel_decode.empty()) {
      auto cd = engine::parse_parallel_config(f.parallel_decode);
      if (!cd) return make_error(ErrorCode::invalid_argument, "--parallel-decode: " + cd.error().message);
      if (cd->dp != 1)
        return make_error(ErrorCode::invalid_argument,
                          "--parallel-decode is one engine group's config (tp, pp, sp); dp comes from --parallel, got " +
                              f.parallel_decode);
      o.parallel_decode = *cd;
    }
    auto weights = engine::parse_reshard_weights(f.reshard_weights);
    if (!weights) return weights.error();
    o.reshard_weights = *weights;
    if (!f.host_kv_bytes.empty()) {
      auto bytes = parse_byte_size(f.host_kv_bytes);
      if (!bytes) return make_error(ErrorCode::invalid_argument, "--host-kv-bytes: " + bytes.error().message);
      o.swap_space_bytes = *bytes;  // the host KV buffer is the engine's swap space
    }
    auto async = parse_seesaw_kv_copy(f.seesaw_kv_copy);
    if (!async) return async.error();
    o.seesaw_async_kv = *async;
    auto link = parse_host_link(f.host_link_gbps, f.host_link_latency_us);
    if (!link) return link.error();
    o.host_link = *link;
  } else if (!f.host_kv_bytes.empty() || f.seesaw_kv_copy != "async" || f.host_link_gbps != "0" ||
             f.host_link_latency_us != "0") {
    return make_error(ErrorCode::invalid_argument, "--host-kv-bytes, --seesaw-kv-copy and --host-link-gbps are "
                                                   "Seesaw's: they need --parallel-decode or --seesaw-policy");
  }
  return o;
}

Result<bool> parse_seesaw_kv_copy(const std::string& mode) {
  if (mode != "async" && mode != "sync")
    return make_error(ErrorCode::invalid_argument, "--seesaw-kv-copy must be async or sync, got '" + mode + "'");
  return mode == "async";
}

Result<std::optional<comm::LinkSpec>> parse_host_link(const std::string& gbps, const std::string& latency_us) {
  if (gbps == "0" || gbps == "0.0") {
    if (latency_us != "0")
      return make_error(ErrorCode::invalid_argument, "--host-link-latency-us needs --host-link-gbps > 0");
    return std::optional<comm::LinkSpec>{};
  }
  auto spec = comm::parse_link_spec(gbps, latency_us);
  if (!spec)
    return make_error(ErrorCode::invalid_argument, "--host-link-gbps / --host-link-latency-us: " + spec.error().message);
  return std::optional<comm::LinkSpec>{*spec};
}

}  // namespace shardline::cli
