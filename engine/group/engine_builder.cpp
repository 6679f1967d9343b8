#include "engine/group/engine_builder.hpp"
#include "model/tokenizer_loader.hpp"

#include "common/checksum.hpp"
#include "common/openmp_pool.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu_memory_plan.hpp"
#include "engine/kv_budget.hpp"
#include "engine/sidp_memory.hpp"
#include "model/model_fingerprint.hpp"
#include "text/id_tokenizer.hpp"
#include "model/shard_runner.hpp"
#include "text/tokenizer.hpp"
#include "model/cpu_runner.hpp"
#if SHARDLINE_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/cuda_shard_group.hpp"
#endif

namespace shardline::engine {

namespace {

/// The salt of the prefix cache's block names (PrefixCacheConfig::salt):
/// everything besides the tokens that changes a block's KV bits, so that a
/// tier that outlives this engine (the node's KV store,
/// worker/store_prefix_tier.hpp) never hands one model's, dtype's or
/// layout's KV to another: the model's fingerprint (and the seed of dummy
/// weights), the weight and KV dtypes, the device kind, the parallel
/// layout (a TP all-reduce sums in another order than one device; Seesaw's
/// decode config, Shift's TP config, SiDP) and batch-invariant GEMMs on
/// CUDA. A model whose fingerprint cannot be taken
/// gets a salt of its own (random): its names match only within this
/// process. The CPU kernels are this build's, so a store moved to another
/// build could hold other bits: the store is a node-local directory.
std::uint64_t prefix_cache_salt(const EngineOptions& o) {
  auto fingerprint = model::model_fingerprint(o.model_dir);
  std::string what = fingerprint ? *fingerprint : "unknown:" + std::to_string(std::random_device{}()) + ":" +
                                                      std::to_string(std::random_device{}());
  what += "|format=" + std::to_string(static_cast<int>(o.load_format));
  if (o.load_format == model::LoadFormat::dummy) what += "|seed=" + std::to_string(o.seed);
  what += std::string("|dtype=") + dtype_name(o.dtype) + (o.keep_quantized ? "+quantized" : "") +
          (o.quantization ? "|quantization=" + kernels::ggml_type_name(static_cast<std::uint32_t>(*o.quantization))
                          : std::string()) +
          "|kv=" + dtype_name(o.kv_cache_dtype);
  what += "|device=" + std::to_string(static_cast<int>(o.device)) + "|deterministic=" + std::to_string(o.deterministic);
  const ParallelConfig& p = o.parallel;
  what += "|tp=" + std::to_string(p.tp) + "|pp=" + std::to_string(p.pp) + "|sp=" + std::to_string(p.sp);
  what += "|layers=" + std::to_string(o.num_layers_override);
  // Steps that run in another config over the same KV: Seesaw's decode
  // config, Shift's TP config, SiDP's shared FFN layers.
  if (o.parallel_decode) {
    const ParallelConfig& d = *o.parallel_decode;
    what += "|cd=" + std::to_string(d.tp) + "," + std::to_string(d.pp) + "," + std::to_string(d.sp);
  }
  if (o.shift) what += "|shift=" + std::to_string(o.shift->policy.threshold);
  if (o.ffn || o.cuda_ffn) what += "|sidp";
  return fnv1a64(kFnv1a64Empty, what);
}

/// The GPU of group rank r: group_devices[r], or device_index for every rank.
int gpu_of_rank(const EngineOptions& o, int r) {
  return o.group_devices.empty() ? o.device_index : o.group_devices[static_cast<std::size_t>(r)];
}

/// The largest over the group's GPUs of the sum of per_rank(r) over the
/// ranks on each (all on one GPU: the sum over ranks; a GPU each: the most
/// any rank needs).
template <class T, class PerRank>
T most_on_one_gpu(const EngineOptions& o, PerRank per_rank) {
  std::map<int, T> by_gpu;
  for (int r = 0; r < o.parallel.group_size(); ++r) by_gpu[gpu_of_rank(o, r)] += per_rank(r);
  T most{};
  for (const auto& [gpu, total] : by_gpu) most = std::max(most, total);
  return most;
}

/// The KV heads whose cache one KV block holds in a layer on one GPU of
/// this engine: the model's, or, for a CUDA group, those of the ranks on
/// the most loaded of its GPUs (a KV head is replicated on each rank whose
/// heads read it when tp * sp exceeds the KV heads). With Seesaw's decode
/// config each rank's KV memory holds the larger of its two caches: the sum
/// over a GPU's ranks of max(layers x heads), per model layer, rounded up.
int kv_heads_held(const EngineOptions& o, const model::ModelConfig& c) {
  if (o.device != model::DeviceKind::cuda || o.parallel.group_size() <= 1) return c.num_key_value_heads;
  const auto units = [&](const ParallelConfig& pc, int r) {  // layers x KV heads of rank r's cache
    const model::ShardLayout lay = model::shard_layout(c, shard_spec_of(pc, r));
    return static_cast<long long>(lay.layer_end - lay.layer_begin) * lay.kv_attn;
  };
  const bool pair = o.parallel_decode && *o.parallel_decode != o.parallel;
  const long long total = most_on_one_gpu<long long>(o, [&](int r) {
    return pair ? std::max(units(o.parallel, r), units(*o.parallel_decode, r)) : units(o.parallel, r);
  });
  return static_cast<int>((total + c.num_hidden_layers - 1) / c.num_hidden_layers);
}

#if SHARDLINE_HAVE_CUDA
/// The CUDA runner's options for these engine options (num_kv_blocks left 0:
/// the memory plan decides it).
model::CudaRunnerOptions cuda_runner_options(const EngineOptions& o, int max_model_len) {
  model::CudaRunnerOptions co;
  co.device_index = o.device_index;
  co.block_size = o.block_size;
  co.weight_dtype = o.dtype;
  co.kv_cache_dtype = o.kv_cache_dtype;
  co.max_num_batched_tokens = o.max_num_batched_tokens;
  co.max_num_seqs = o.max_num_seqs;
  co.max_model_len = max_model_len;
  co.deterministic = o.deterministic;
  co.cuda_graphs = o.cuda_graphs;
  return co;
}

/// What a CUDA engine group puts on one GPU besides its KV cache.
struct GroupFootprint {
  std::uint64_t weight_bytes = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t workspace_bytes = 0;
};

/// A tp x sp x pp group's footprint on its most loaded GPU
/// (model::CudaShardGroup): every runner a rank holds (its shard, and its
/// Shift (TP') or Seesaw (cd) shard) has its weights (the norms on each, the
/// embedding on first stages), activations (`activation_per_runner`) and
/// workspaces (Ulysses' buffers too), summed over the ranks on each GPU;
/// each field at its largest over the GPUs (a bound). Seesaw's reload: one
/// config's weights on a GPU at a time.
GroupFootprint group_footprint(const EngineOptions& o, const model::ModelConfig& c, const model::CudaRunnerOptions& co,
                               std::uint64_t activation_per_runner) {
  const bool pair = o.parallel_decode && *o.parallel_decode != o.parallel;
  const bool one_at_a_time = pair && o.reshard_weights == ReshardWeights::reload;
  const auto runners_of = [&](int r) {
    std::vector<model::ShardSpec> runners{shard_spec_of(o.parallel, r)};
    if (o.shift) runners.push_back(shift_spec_of(o.parallel, r));
    if (pair) runners.push_back(shard_spec_of(*o.parallel_decode, r));
    return runners;
  };
  GroupFootprint f;
  f.weight_bytes = most_on_one_gpu<std::uint64_t>(o, [&](int r) {
    std::uint64_t weights = 0;
    for (const model::ShardSpec& spec : runners_of(r)) {
      const std::uint64_t w = model::cuda_runner_weight_bytes(c, o.dtype, spec);
      weights = one_at_a_time ? std::max(weights, w) : weights + w;
    }
    return weights;
  });
  f.workspace_bytes = most_on_one_gpu<std::uint64_t>(o, [&](int r) {
    std::uint64_t workspaces = 0;
    for (const model::ShardSpec& spec : runners_of(r)) workspaces += model::cuda_runner_workspace_bytes(c, co, spec);
    return workspaces;
  });
  f.activation_bytes = most_on_one_gpu<std::uint64_t>(
      o, [&](int r) { return activation_per_runner * static_cast<std::uint64_t>(runners_of(r).size()); });
  return f;
}

/// The KV bytes plan_gpu_memory leaves on the device for this model (checked
/// before the weights are loaded, so a model that cannot fit fails fast).
Result<std::uint64_t> plan_cuda_kv_bytes(const EngineOptions& o) {
  auto cfg = model::load_model_config(o.model_dir);
  if (!cfg) return std::move(cfg).error();
  model::ModelConfig c = std::move(cfg).value();
  if (o.num_layers_override > 0 && o.num_layers_override < c.num_hidden_layers)
    c.num_hidden_layers = o.num_layers_override;
  const int max_model_len = o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
  const kernels::cuda::DeviceQuery q = kernels::cuda::query_devices();
  // The GPUs this engine uses: each gets the most loaded GPU's footprint
  // (a bound); the KV cache is the smallest space any of them leaves.
  std::vector<int> used = o.group_devices.empty() ? std::vector<int>{o.device_index} : o.group_devices;
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  for (int index : used)
    if (index < 0 || index >= static_cast<int>(q.devices.size()))
      return make_error(ErrorCode::not_found,
                        "cuda:" + std::to_string(index) + ": " +
                            (q.devices.empty() ? "no CUDA device (" + q.error + ")"
                                               : "only " + std::to_string(q.devices.size()) + " CUDA device(s)"));
  GpuMemoryPlanInput pi;
  pi.gpu_memory_utilization = o.gpu_memory_utilization;
  // A SiDP rank holds the replicated weights, its owned FFN layers and its slots.
  pi.weight_bytes = sidp_weight_bytes_for(c, o.dtype, o.sidp_owned_ffn_layers, o.sidp_cache_slots);
  pi.activation_bytes = activation_bytes_for(c, std::max(o.max_num_batched_tokens, o.max_num_seqs), o.max_num_seqs);
  pi.num_layers = c.num_hidden_layers;
  pi.num_kv_heads = c.num_key_value_heads;
  const int ranks = o.parallel.group_size();
  std::uint64_t workspace_bytes = 0;
  const model::CudaRunnerOptions co = cuda_runner_options(o, max_model_len);
  if (ranks > 1) {
    // A tp x sp x pp group (group_footprint). The KV heads: kv_heads_held
    // (replicated ones; a shift runner uses its base runner's cache).
    if (Status s = model::check_shardable(c, o.parallel.tp, o.parallel.sp, o.parallel.pp); !s) return s.error();
    const GroupFootprint f = group_footprint(o, c, co, pi.activation_bytes);
    pi.weight_bytes = f.weight_bytes;
    pi.activation_bytes = f.activation_bytes;
    workspace_bytes = f.workspace_bytes;
    pi.num_kv_heads = kv_heads_held(o, c);  // with Seesaw's cd: each rank's larger cache
  } else {
    workspace_bytes = model::cuda_runner_workspace_bytes(c, co);
  }
  pi.head_dim = c.head_dim;
  pi.block_size = o.block_size;
  pi.kv_dtype = o.kv_cache_dtype;
  pi.max_model_len = max_model_len;
  // metadata, GEMM and attention workspaces
  pi.reserved_bytes += workspace_bytes;
  std::uint64_t kv_bytes = UINT64_MAX;
  for (int index : used) {
    const kernels::cuda::DeviceInfo& d = q.devices[static_cast<std::size_t>(index)];
    pi.total_bytes = d.total_memory_bytes;
    pi.free_bytes = d.free_memory_bytes;
    auto plan = plan_gpu_memory(pi);
    if (!plan)
      return make_error(plan.error().code, "cuda:" + std::to_string(d.index) + " (" + d.name + "): " +
                                               plan.error().message);
    kv_bytes = std::min(kv_bytes, plan->kv_bytes);
  }
  return kv_bytes;
}
#endif

/// The plan_cpu_memory of a CPU device with --device-memory (checked before
/// the weights are loaded, so a model that cannot fit fails fast). The
/// weights are SiDP's when sidp_owned_ffn_layers / sidp_cache_slots say so.
/// Errors: loading the config; invalid_argument (more owned FFN layers than
/// the model has); out_of_memory with the sizes.
Result<GpuMemoryPlan> plan_cpu_device_memory(const EngineOptions& o) {
  auto cfg = model::load_model_config(o.model_dir);
  if (!cfg) return std::move(cfg).error();
  model::ModelConfig c = std::move(cfg).value();
  if (o.num_layers_override > 0 && o.num_layers_override < c.num_hidden_layers)
    c.num_hidden_layers = o.num_layers_override;
  if (o.sidp_owned_ffn_layers > c.num_hidden_layers)
    return make_error(ErrorCode::invalid_argument,
                      "SiDP: this rank owns " + std::to_string(o.sidp_owned_ffn_layers) +
                          " FFN layers but the model has " + std::to_string(c.num_hidden_layers));
  CpuMemoryPlanInput pi;
  pi.device_memory_bytes = o.device_memory_bytes;
  pi.weight_bytes = sidp_weight_bytes_for(c, o.dtype, o.sidp_owned_ffn_layers, o.sidp_cache_slots);
  pi.activation_bytes = activation_bytes_for(c, std::max(o.max_num_batched_tokens, o.max_num_seqs), o.max_num_seqs);
  pi.num_layers = c.num_hidden_layers;
  pi.num_kv_heads = c.num_key_value_heads;
  pi.head_dim = c.head_dim;
  pi.block_size = o.block_size;
  pi.kv_dtype = o.kv_cache_dtype;
  pi.max_model_len = o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
  auto plan = plan_cpu_memory(pi);
  if (!plan) return make_error(plan.error().code, "cpu:" + std::to_string(o.device_index) + ": " +
                                                      plan.error().message);
  return plan;
}

/// The option checks that need no model. Errors: invalid_argument,
/// unsupported (cuda without the backend, or a group on cuda).
Status check_engine_options(const EngineOptions& o) {
  if (o.parallel.dp != 1)
    return make_error(ErrorCode::invalid_argument, "an EngineInstance is one replica: dp must be 1 (build dp engines)");
  if (o.block_size <= 0)
    return make_error(ErrorCode::invalid_argument, "--block-size must be > 0");
  if (o.kv_cache_bytes == 0 && !(o.kv_cache_memory_fraction > 0.0 && o.kv_cache_memory_fraction <= 1.0))
    return make_error(ErrorCode::invalid_argument, "--kv-cache-memory-fraction must be in (0, 1]");
  if (o.sidp_owned_ffn_layers < -1 || o.sidp_cache_slots < 0)
    return make_error(ErrorCode::invalid_argument,
                      "SiDP memory plan: owned FFN layers must be >= 0 (or -1 for all) and cache slots >= 0, got " +
                          std::to_string(o.sidp_owned_ffn_layers) + " and " + std::to_string(o.sidp_cache_slots));

  if (o.host_link && !o.seesaw)
    return make_error(ErrorCode::invalid_argument,
                      "engine config: a host link is emulated for Seesaw's KV copies only (set seesaw)");
  const bool cuda = o.device == model::DeviceKind::cuda;
  if (o.parallel_decode && *o.parallel_decode != o.parallel) {
    const ParallelConfig& cd = *o.parallel_decode;
    if (!o.seesaw)
      return make_error(ErrorCode::invalid_argument,
                        "a decode parallel config (" + cd.to_string() + ") needs Seesaw's phases (--seesaw-policy)");
    if (Status st = check_decode_config(o.parallel, cd); !st) return st;
    if (o.ffn || o.cuda_ffn || o.shift)
      return make_error(ErrorCode::unsupported,
                        "Seesaw's two parallel configs run on an engine group (CPU devices in one process or over "
                        "TCP, or CUDA ranks), not with SiDP or --shift");
  }
  if (o.device_memory_bytes > 0) {
    if (cuda)
      return make_error(ErrorCode::invalid_argument,
                        "--device-memory is for CPU devices; a CUDA device's plan takes --gpu-memory-utilization "
                        "of its real memory");
    if (o.parallel.group_size() != 1)
      return make_error(ErrorCode::unsupported, "--device-memory plans single-device engines; engine groups "
                                                "(tp/pp/sp > 1) are not planned yet");
  }
  if (cuda) {
#if !SHARDLINE_HAVE_CUDA
    return make_error(ErrorCode::unsupported, "cuda:" + std::to_string(o.device_index) +
                                                  ": this build has no CUDA backend (configure with SHARDLINE_CUDA=ON "
                                                  "where nvcc is installed)");
#endif
    if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
      return make_error(ErrorCode::invalid_argument, "--gpu-memory-utilization must be in (0, 1]");
    if (!o.group_devices.empty() && static_cast<int>(o.group_devices.size()) != o.parallel.group_size())
      return make_error(ErrorCode::invalid_argument, std::to_string(o.group_devices.size()) +
                                                         " GPUs for an engine group of " +
                                                         std::to_string(o.parallel.group_size()) + " ranks");
  }
  if (!cuda && o.dtype == DType::f16)
    return make_error(ErrorCode::invalid_argument, "--dtype f16 is for CUDA devices; CPU weights are f32 or bf16");
  return Status::ok_status();
}

/// Loads the weights and the tokenizer (an IdTokenizer for a folder without
/// tokenizer files) into a new instance.
Result<EngineInstance> load_model_and_tokenizer(const EngineOptions& o) {
  auto weights = load_weights(o);
  if (!weights) return std::move(weights).error();
  EngineInstance e;
  e.weights = std::move(weights).value();
  const model::ModelConfig& c = e.weights->config;

  namespace fs = std::filesystem;
  const fs::path dir(o.model_dir);
  e.tokenizer_dir = o.model_dir;
  if (model::has_tokenizer(dir)) {
    auto tok = model::load_tokenizer(dir);
    if (!tok) return std::move(tok).error();
    e.tokenizer = std::move(tok).value();
  } else {
    e.tokenizer = std::make_unique<text::IdTokenizer>(
        c.vocab_size, c.bos_token_id, c.eos_token_ids.empty() ? -1 : c.eos_token_ids.front());
  }
  return e;
}

/// Sizes the KV cache of `e` (num_kv_blocks, kv_cache_bytes): the budget
/// (cuda or --device-memory: the memory plan's KV space, capped by
/// --kv-cache-bytes when given; else --kv-cache-bytes or a fraction of
/// free memory), capped at what max_num_seqs sequences of max_model_len can
/// use. Errors: out_of_memory when one max_model_len sequence does not fit.
Status size_kv_cache(const EngineOptions& o, std::uint64_t plan_kv_bytes, int max_model_len, EngineInstance& e) {
  const model::ModelConfig& c = e.weights->config;
  const bool planned = o.device == model::DeviceKind::cuda || o.device_memory_bytes > 0;
  const int kv_elem_bytes = static_cast<int>(dtype_size(o.kv_cache_dtype));
  const int kv_heads = kv_heads_held(o, c);
  const std::uint64_t block_bytes = kv_bytes_per_block(c.num_hidden_layers, kv_heads, c.head_dim, o.block_size,
                                                       kv_elem_bytes);
  std::uint64_t budget = o.kv_cache_bytes;
  if (planned) {
    budget = budget == 0 ? plan_kv_bytes : std::min(budget, plan_kv_bytes);
  } else if (budget == 0) {
    auto avail = available_memory_bytes();
    if (!avail) return std::move(avail).error();
    budget = static_cast<std::uint64_t>(static_cast<double>(*avail) * o.kv_cache_memory_fraction);
  }
  const std::int64_t budget_blocks =
      num_kv_blocks_for_budget(budget, c.num_hidden_layers, kv_heads, c.head_dim, o.block_size, kv_elem_bytes);
  const std::int64_t blocks_per_seq = (max_model_len + o.block_size - 1) / o.block_size;
  const std::int64_t useful_blocks = blocks_per_seq * std::max(1, o.max_num_seqs);
  const std::int64_t num_blocks = std::min(budget_blocks, useful_blocks);
  if (num_blocks < blocks_per_seq)
    return make_error(ErrorCode::out_of_memory,
                      "KV cache budget of " + std::to_string(budget) + " bytes holds " +
                          std::to_string(budget_blocks) + " blocks of " + std::to_string(block_bytes) +
                          " bytes; one sequence of max_model_len " + std::to_string(max_model_len) +
                          " tokens needs " + std::to_string(blocks_per_seq) +
                          " (raise --kv-cache-bytes or lower --max-model-len)");
  e.num_kv_blocks = static_cast<int>(num_blocks);
  e.kv_cache_bytes = static_cast<std::uint64_t>(num_blocks) * block_bytes;
  return Status::ok_status();
}

/// The matrices now live on the GPU: keeps the config and dtype of the
/// weights, frees the host copy.
void drop_host_matrices(EngineInstance& e) {
  auto config_only = std::make_shared<model::ModelWeights>();
  config_only->config = e.weights->config;
  config_only->dtype = e.weights->dtype;
  e.weights = std::move(config_only);
}

/// The executor of `e`: one device's runner, rank 0 of a TCP group, or an
/// in-process engine group. On a CUDA device the host copy of the matrices
/// is freed once they are uploaded.
Status make_executor(const EngineOptions& o, int max_model_len, EngineInstance& e) {
  const model::ModelConfig c = e.weights->config;
  const bool cuda = o.device == model::DeviceKind::cuda;
  model::CpuRunnerOptions ro{e.num_kv_blocks, o.block_size, o.num_threads, o.kv_cache_dtype};
  ro.overlap = o.step_overlap;
  ro.overlap_prefetch_bytes = o.overlap_prefetch_bytes;
  if (o.shift && (o.ffn || o.cuda_ffn || o.parallel.group_size() == 1 || o.parallel.pp != 1))
    return make_error(ErrorCode::unsupported,
                      "--shift runs on an engine group of sp and / or tp > 1 and pp = 1 (CPU devices in one process "
                      "or over TCP, or CUDA ranks sharing a GPU), not on a single device or SiDP");
  if (o.group_link && (cuda || o.ffn || o.cuda_ffn || o.parallel.group_size() == 1 || !o.group_master.empty()))
    return make_error(ErrorCode::invalid_argument,
                      "an emulated group link paces an in-process CPU engine group of tp, pp or sp > 1, not a single "
                      "device, a TCP group, SiDP or CUDA");
  if (o.ffn) {
    if (cuda || o.parallel.group_size() != 1)
      return make_error(ErrorCode::unsupported, "SiDP weight sharing runs on single CPU devices (dp ranks)");
    auto exec = model::CpuModelRunner::create(e.weights, ro, o.ffn);
    if (!exec) return std::move(exec).error();
    e.executor = std::move(exec).value();
  } else if (o.cuda_ffn) {
    if (!cuda || o.parallel.group_size() != 1)
      return make_error(ErrorCode::unsupported, "SiDP weight sharing on CUDA runs on single GPUs (dp ranks)");
#if SHARDLINE_HAVE_CUDA
    // A SiDP rank on one GPU: the runner holds no FFN weights; the node's
    // group keeps the host copy (its owners upload from it).
    model::CudaRunnerOptions co = cuda_runner_options(o, max_model_len);
    co.num_kv_blocks = e.num_kv_blocks;
    auto exec = model::CudaModelRunner::create(e.weights, co, {}, {}, o.cuda_ffn);
    if (!exec) return std::move(exec).error();
    e.executor = std::move(exec).value();
    drop_host_matrices(e);
#endif
#if SHARDLINE_HAVE_CUDA
  } else if (cuda && o.parallel.group_size() > 1) {
    // A tp x sp x pp group of ranks sharing device_index, or on group_devices
    // (model::CudaShardGroup).
    model::CudaRunnerOptions co = cuda_runner_options(o, max_model_len);
    co.num_kv_blocks = e.num_kv_blocks;
    model::CudaShardGroup::ShiftChooser choose;
    if (o.shift) {
      // Shift Parallelism: the engine's ShiftPolicy picks each step's config.
      auto policy = ShiftPolicy::create(o.shift->policy);
      if (!policy) return std::move(policy).error();
      choose = [p = std::make_shared<ShiftPolicy>(std::move(policy).value())](const model::StepInput& in) {
        return p->decide(in.num_tokens()) == ShiftMode::shift;
      };
    }
    std::optional<model::ShardDims> decode;  // Seesaw's cd (seed 000 §4.1)
    if (o.parallel_decode && *o.parallel_decode != o.parallel)
      decode = model::ShardDims{o.parallel_decode->tp, o.parallel_decode->pp, o.parallel_decode->sp};
    // Seesaw's reload uploads a config's weights at each switch: the host
    // copy of the matrices stays.
    const bool reload = decode && o.reshard_weights == ReshardWeights::reload;
    auto group = model::CudaShardGroup::create(e.weights, co, o.parallel.tp, o.parallel.pp, o.parallel.sp,
                                               std::move(choose), decode, o.group_devices, reload);
    if (!group) return std::move(group).error();
    e.weight_bytes = (*group)->weight_bytes();
    e.executor = std::move(group).value();
    if (!reload) drop_host_matrices(e);
#endif
  } else if (cuda || o.parallel.group_size() == 1) {
    model::DeviceExecutorOptions dev;
    dev.device = o.device;
    dev.cpu = ro;
#if SHARDLINE_HAVE_CUDA
    dev.cuda = cuda_runner_options(o, max_model_len);
    dev.cuda.num_kv_blocks = e.num_kv_blocks;
#endif
    auto exec = model::make_device_executor(e.weights, dev);
    if (!exec) return std::move(exec).error();
    e.executor = std::move(exec).value();
    if (cuda) drop_host_matrices(e);
  } else if (!o.group_master.empty()) {
    TcpGroupOptions tcp;
    tcp.master = o.group_master;
    tcp.key = o.group_key;
    tcp.timeout = std::chrono::milliseconds(o.group_timeout_ms);
    std::optional<SeesawGroupOptions> seesaw;
    if (o.parallel_decode && *o.parallel_decode != o.parallel)
      seesaw = SeesawGroupOptions{*o.parallel_decode, o.reshard_weights};
    auto exec = create_tcp_group_executor(e.weights, o.parallel, ro, tcp, o.shift, seesaw);
    if (!exec) return std::move(exec).error();
    e.executor = std::move(exec).value();
  } else {
    std::optional<SeesawGroupOptions> seesaw;
    if (o.parallel_decode && *o.parallel_decode != o.parallel)
      seesaw = SeesawGroupOptions{*o.parallel_decode, o.reshard_weights};
    auto group = InProcEngineGroup::create(e.weights, o.parallel, ro, o.shift, seesaw, o.group_link);
    if (!group) return std::move(group).error();
    if (seesaw) {  // what the ranks hold: both configs' shards, or (reload) the active one's
      e.weight_bytes = 0;
      for (const std::size_t b : (*group)->packed_weight_bytes_per_rank()) e.weight_bytes += b;
    }
    e.executor = std::move(group).value();
  }
  return Status::ok_status();
}

}  // namespace

Result<std::shared_ptr<const model::ModelWeights>> load_weights(const EngineOptions& o) {
  if (o.weights) return o.weights;
  model::LoadOptions lo;
  lo.format = o.load_format;
  // F16 weights are loaded in F32 and rounded once, on upload to the device.
  lo.dtype = o.dtype == DType::f16 ? DType::f32 : o.dtype;
  lo.seed = o.seed;
  lo.num_layers_override = o.num_layers_override;
  lo.keep_quantized = o.keep_quantized;
  lo.quantization = o.quantization;
  auto weights = model::load_model(o.model_dir, lo);
  if (!weights) return std::move(weights).error();
  return std::make_shared<const model::ModelWeights>(std::move(weights).value());
}

Status preflight_engine(const EngineOptions& o) {
  if (Status s = check_engine_options(o); !s) return s;
  auto cfg = model::load_model_config(o.model_dir);
  if (!cfg) return cfg.error();
  model::ModelConfig c = std::move(cfg).value();
  if (o.num_layers_override > 0 && o.num_layers_override < c.num_hidden_layers)
    c.num_hidden_layers = o.num_layers_override;
  const ParallelConfig& pc = o.parallel;
  if (Status st = model::check_shardable(c, pc.tp, pc.sp, pc.pp); !st) return st;
  if (o.parallel_decode)
    if (Status st = model::check_shardable(c, o.parallel_decode->tp, o.parallel_decode->sp, o.parallel_decode->pp); !st)
      return st;
  if (o.shift)  // the shift config runs the whole group as one TP
    if (Status st = model::check_shardable(c, pc.group_size(), 1, 1); !st) return st;
#if SHARDLINE_HAVE_CUDA
  if (o.device == model::DeviceKind::cuda) {
    auto kv = plan_cuda_kv_bytes(o);  // the device exists and the model fits
    if (!kv) return kv.error();
  }
#endif
  if (o.device != model::DeviceKind::cuda && o.device_memory_bytes > 0) {
    auto plan = plan_cpu_device_memory(o);
    if (!plan) return plan.error();
  }
  return Status::ok_status();
}

Result<EngineInstance> build_engine(const EngineOptions& o) {
  if (Status s = check_engine_options(o); !s) return s.error();
  std::uint64_t plan_kv_bytes = 0;      // cuda or --device-memory: the plan's KV space
  std::uint64_t plan_weight_bytes = 0;  // --device-memory: the plan's (SiDP-aware) weights
#if SHARDLINE_HAVE_CUDA
  if (o.device == model::DeviceKind::cuda) {
    auto kv = plan_cuda_kv_bytes(o);
    if (!kv) return std::move(kv).error();
    plan_kv_bytes = *kv;
  }
#endif
  if (o.device != model::DeviceKind::cuda && o.device_memory_bytes > 0) {
    auto plan = plan_cpu_device_memory(o);
    if (!plan) return std::move(plan).error();
    plan_kv_bytes = plan->kv_bytes;
    plan_weight_bytes = plan->weight_bytes;
  }
  auto loaded = load_model_and_tokenizer(o);
  if (!loaded) return std::move(loaded).error();
  EngineInstance e = std::move(loaded).value();
  const model::ModelConfig c = e.weights->config;  // a copy: make_executor may free the host weights
  const int max_model_len = o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
  if (max_model_len <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "max_model_len unknown: config.json has no max_position_embeddings; pass --max-model-len");
  // A SiDP rank holds the replicated weights, its owned FFN layers and its
  // cache slots (engine/sidp_memory.hpp), not the whole model.
  // A quantized model on CPU counts its matrices' own bytes.
  const bool own_formats = (o.keep_quantized || o.quantization) && o.device == model::DeviceKind::cpu;
  e.weight_bytes = o.device_memory_bytes > 0 ? plan_weight_bytes
                   : o.sidp_owned_ffn_layers >= 0
                       ? (own_formats ? sidp_weight_bytes_of(*e.weights, o.sidp_owned_ffn_layers, o.sidp_cache_slots)
                                      : sidp_weight_bytes_for(c, o.dtype, o.sidp_owned_ffn_layers, o.sidp_cache_slots))
                   : own_formats ? e.weights->total_bytes()
                                 : weight_bytes_for(c, o.dtype);
  if (Status s = size_kv_cache(o, plan_kv_bytes, max_model_len, e); !s) return s.error();
  if (Status s = make_executor(o, max_model_len, e); !s) return s.error();

  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.max_model_len = max_model_len;
  ec.eos_token_ids = c.eos_token_ids;
  ec.seed = o.seed;
  ec.capture_logits = o.capture_logits;
  ec.check_integrity = o.check_integrity;
  ec.token_budget = o.token_budget;
  ec.preemption_mode = o.preemption_mode;
  ec.swap_space_bytes = o.swap_space_bytes;
  ec.prefix_cache.enabled = o.enable_prefix_caching;
  if (o.enable_prefix_caching) ec.prefix_cache.salt = prefix_cache_salt(o);
  if (o.seesaw) ec.step_phases = seesaw_phases(SeesawOptions{*o.seesaw, o.seesaw_async_kv, o.host_link});
  auto engine = LlmEngine::create(*e.executor, *e.tokenizer, ec);
  if (!engine) return std::move(engine).error();
  e.engine = std::move(engine).value();
  if (o.enable_prefix_caching && o.prefix_tier_bytes > 0) {
    e.prefix_tier = std::make_unique<HostPrefixTier>(o.prefix_tier_bytes);
    e.engine->set_prefix_tier(e.prefix_tier.get());
  }
  // Loading and packing the weights ran parallel regions on this thread; the
  // engine may step on another (a worker's, a DP replica's), and this
  // thread's idle pool would slow its team (common/openmp_pool.hpp). A pool
  // freed here is made again by the next region on this thread.
  (void)release_openmp_pool();
  return e;
}

Result<std::shared_ptr<sampling::GrammarCompiler>> make_grammar_compiler(const EngineInstance& instance) {
  const std::vector<int>& eos = instance.engine->config().eos_token_ids;
  return sampling::GrammarCompiler::create(*instance.tokenizer, instance.executor->vocab_size(),
                                           std::vector<std::int32_t>(eos.begin(), eos.end()));
}

}  // namespace shardline::engine
