#pragma once
/// \file
/// Wires a device: loads a model folder (or dummy weights of a shape) and its
/// tokenizer, builds the runner -- a CpuModelRunner (or an engine group of
/// CPU ranks) with a KV cache sized from a byte budget, or a CUDA runner with
/// a KV cache sized by engine/gpu_memory_plan.hpp -- and an LlmEngine over
/// it. Used by the CLI (`run`, `generate`, `bench`), the workers and the
/// golden tests.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/group/parallel_executor.hpp"
#include "engine/group/tcp_group.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "engine/policies/token_budget.hpp"
#include "model/device_executor.hpp"
#include "model/executor.hpp"
#include "model/ffn_executor.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"
#include "sampling/structured_output/grammar.hpp"

namespace shardline::model {
class CudaFfnExecutor;  // model/cuda/cuda_runner.hpp (CUDA builds)
}  // namespace shardline::model

namespace shardline::engine {

struct EngineOptions {
  std::string model_dir;  ///< HF model folder, or a shape folder with --load-format dummy
  model::LoadFormat load_format = model::LoadFormat::safetensors;
  DType dtype = DType::f32;       ///< weight storage: f32 or bf16 (cuda also f16)
  /// `--dtype auto`: a GGUF file's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrices stay
  /// quantized on CPU devices (model::LoadOptions::keep_quantized; the
  /// others in `dtype`), also in SiDP's owners and WaS fetches. The CUDA
  /// runner and CUDA SiDP owners dequantize them.
  bool keep_quantized = false;
  /// `--quantization`: every matrix quantized on load to this type
  /// (model::LoadOptions::quantization); unset: as stored.
  std::optional<kernels::GgmlType> quantization;
  model::DeviceKind device = model::DeviceKind::cpu;
  int device_index = 0;           ///< cuda:N
  /// cuda, an engine group (tp * pp * sp > 1): group rank r's GPU
  /// (`--devices cuda:0,1 --parallel tp=2`: {0, 1}, the ranks talk over
  /// NCCL). Empty: every rank shares device_index (`cuda:0x2`).
  std::vector<int> group_devices;
  /// cuda: fraction of the device's total memory this engine may take
  /// (weights + activations + KV cache), vLLM's --gpu-memory-utilization.
  double gpu_memory_utilization = 0.9;
  /// cuda: batch-invariant GEMMs, so a request's logits do not depend on its
  /// batch (the CPU kernels always are).
  bool deterministic = false;
  bool cuda_graphs = true;        ///< cuda: capture decode steps as CUDA graphs
  DType kv_cache_dtype = DType::f32;  ///< KV cache storage: f32 (exact) or bf16
  /// cpu: how a step's phases overlap, and the KV bytes one attention's
  /// prefetch covers at most (model/shard_runner.hpp's StepOverlap).
  model::StepOverlap step_overlap = model::StepOverlap::none;
  std::size_t overlap_prefetch_bytes = std::size_t{12} << 20;
  std::uint64_t seed = 0;         ///< dummy weights and default request seeds
  int num_layers_override = 0;    ///< > 0: first N layers only (smoke tests)
  int block_size = 16;            ///< tokens per KV block
  std::uint64_t kv_cache_bytes = 0;        ///< KV budget; 0 = fraction of free memory
  /// cpu: bytes of the emulated device (`--device-memory`); 0 = off (the KV
  /// cache is sized from kv_cache_bytes / kv_cache_memory_fraction). When
  /// set, plan_cpu_memory (engine/gpu_memory_plan.hpp) carves the weights,
  /// the activation workspace and the KV blocks out of it; kv_cache_bytes,
  /// when also given, caps the KV cache further. Single-device engines only.
  std::uint64_t device_memory_bytes = 0;
  /// SiDP weight sharing as the device memory plan counts it
  /// (engine/sidp_memory.hpp; used only by the memory plans and
  /// EngineInstance::weight_bytes): FFN layers this rank owns (-1 = all,
  /// plain DP) and WaS cache slots.
  int sidp_owned_ffn_layers = -1;
  int sidp_cache_slots = 0;
  double kv_cache_memory_fraction = 0.5;   ///< of MemAvailable after loading weights
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;          ///< 0 = config max_position_embeddings
  int num_threads = 0;            ///< OpenMP threads for kernels (per rank); 0 = all cores (split over ranks)
  /// tp/sp/pp of one engine group (dp must be 1: a replica is one EngineInstance).
  /// Anything but all-1 builds an in-process InProcEngineGroup.
  ParallelConfig parallel;
  /// Non-empty: the group's other ranks are `shardline shard serve`
  /// processes joining over TCP at this "host:port" (this process is rank 0
  /// and binds it); empty: all ranks run in this process.
  std::string group_master;
  std::string group_key;  ///< shared secret of the TCP group (e.g. the cluster key)
  int group_timeout_ms = 60'000;  ///< TCP rendezvous and per-call timeout
  /// Shift Parallelism (seed 001; engine/group/parallel_executor.hpp): the group
  /// also holds the shift config TP = sp*tp over the same devices and KV
  /// cache, and each step runs in the config the policy picks. CPU groups
  /// with pp = 1 only, in this process or over TCP (every `shard serve`
  /// rank then needs --shift too); nullopt = off.
  std::optional<ShiftOptions> shift;
  /// Per-micro-batch token budget (engine/policies/token_budget_policies.hpp);
  /// null = fixed budget of max_num_batched_tokens. Shared, not copied.
  std::shared_ptr<const TokenBudgetPolicy> token_budget;
  bool capture_logits = false;
  bool check_integrity = false;
  /// What a preemption does with the victim's KV (engine/scheduler.hpp).
  PreemptionMode preemption_mode = PreemptionMode::recompute;
  std::uint64_t swap_space_bytes = 4ull << 30;  ///< host memory for swapped-out KV
  /// Automatic prefix caching (EngineConfig::prefix_cache). Off here; the job
  /// commands' flags turn it on unless `--no-prefix-caching`.
  bool enable_prefix_caching = false;
  /// With prefix caching: bytes of a host-memory prefix tier below the
  /// device cache (engine/prefix_tier.hpp: evicted prefix blocks spill
  /// there and come back instead of being computed); 0: none.
  std::uint64_t prefix_tier_bytes = 0;
  /// Seesaw phases (engine/seesaw/seesaw_phases.hpp); the host KV buffer is the swap space.
  std::optional<SeesawPolicyOptions> seesaw;
  /// Seesaw's decode config cd (seed 000 §4.1, dynamic model re-sharding):
  /// with `seesaw`, prefill phases run in `parallel` (cp) and decode phases
  /// in this config over the same devices (same group size, dp = 1); each
  /// rank holds its weight shard of both (see reshard_weights) and one KV
  /// memory that each config lays out its own way, and the KV is re-sharded
  /// as it passes through the host buffer. An
  /// in-process CPU group, a TCP group or a CUDA group (not SiDP or --shift).
  /// nullopt or equal to `parallel`: one config for both phases.
  std::optional<ParallelConfig> parallel_decode;
  /// With parallel_decode: keep both shards packed on every rank
  /// (`resident`), or free the inactive one and repack it from the host
  /// weights at each transition (`reload`, §4.1; on CUDA the host copy of
  /// the matrices is then kept, and uploaded at each switch).
  ReshardWeights reshard_weights = ReshardWeights::resident;
  /// Seesaw's KV copies on a prefetcher thread (SeesawOptions::async_kv, §5.2).
  bool seesaw_async_kv = true;
  /// Seesaw: an emulated host link per device (SeesawOptions::host_link).
  std::optional<comm::LinkSpec> host_link;
  /// An in-process CPU engine group's devices talk over this emulated
  /// interconnect (comm/paced.hpp): pipeline sends and TP / SP collectives
  /// are paced to it (InProcEngineGroup::create). None: shared memory.
  /// Not for one device, TCP, SiDP or CUDA (invalid_argument).
  std::optional<comm::LinkSpec> group_link;
  /// Already-loaded weights to use instead of loading model_dir again (the
  /// ranks of an in-process group share one load); null = load. model_dir
  /// still names the tokenizer folder.
  std::shared_ptr<const model::ModelWeights> weights;
  /// CPU, single device: the FFN of every layer runs through this (a SiDP
  /// rank, engine/sidp/sidp_group.hpp); the runner packs no FFN weights.
  std::shared_ptr<model::FfnExecutor> ffn;
  /// The same on one CUDA device (a SiDP rank on a GPU,
  /// model/cuda/sidp/cuda_sidp_ffn.hpp); the runner uploads no FFN weights.
  std::shared_ptr<model::CudaFfnExecutor> cuda_ffn;
};

/// A ready engine. Member order matters: the engine refers to the executor
/// and tokenizer, so it is declared (and destroyed) last.
struct EngineInstance {
  /// The weights (CPU devices); on a CUDA device only the config and dtype
  /// (the matrices were uploaded and their host copy freed).
  std::shared_ptr<const model::ModelWeights> weights;
  std::unique_ptr<text::Tokenizer> tokenizer;
  /// The folder the tokenizer came from (EngineOptions::model_dir): where
  /// its chat template is looked up (text/chat_template.hpp).
  std::string tokenizer_dir;
  /// What runs the steps: one device's runner (model::make_device_executor),
  /// an InProcEngineGroup, or rank 0 of a TCP group (a ParallelExecutor).
  std::unique_ptr<model::ModelExecutor> executor;
  /// EngineOptions::prefix_tier_bytes > 0: the engine's prefix tier (it
  /// outlives the engine: declared before it).
  std::unique_ptr<HostPrefixTier> prefix_tier;
  std::unique_ptr<LlmEngine> engine;
  std::uint64_t kv_cache_bytes = 0;  ///< what was allocated
  int num_kv_blocks = 0;
  /// Bytes of the weights this engine holds as the memory plan counts them
  /// (with device_memory_bytes: the plan's, SiDP-aware; a SiDP rank
  /// (sidp_owned_ffn_layers >= 0): sidp_weight_bytes_for its share;
  /// a Seesaw group with two configs: the packed bytes its ranks hold at
  /// start, both shards with resident weights, the prefill shards with
  /// reload; otherwise weight_bytes_for the loaded config and dtype, the
  /// whole model over a group's ranks).
  std::uint64_t weight_bytes = 0;

  /// The executor as a T (e.g. InProcEngineGroup, model::CpuModelRunner), or
  /// null when it is another kind.
  template <class T>
  [[nodiscard]] T* executor_as() const {
    return dynamic_cast<T*>(executor.get());
  }
};

/// Builds it. With a parallel config, every rank gets the same number of KV
/// blocks, sized as for one device (each rank stores its heads' and layers'
/// share of a block). The KV cache gets min(budget, what max_num_seqs sequences of
/// max_model_len tokens can use) blocks. A model folder without tokenizer
/// files gets an IdTokenizer (ids as text). On a CUDA device the budget is
/// plan_gpu_memory's KV space (or kv_cache_bytes when given, if smaller) and
/// the engine group must be a single device; likewise on a CPU device with
/// device_memory_bytes, with plan_cpu_memory's KV space (checked before the
/// weights are loaded). Errors: whatever loading
/// returns (each names the file / tensor), invalid_argument for bad options
/// (device_memory_bytes on a CUDA device), out_of_memory when the budget
/// cannot hold one max_model_len sequence (with a memory plan: also when the
/// model does not fit, with the sizes in GiB); not_found (no such CUDA
/// device); unsupported (a CUDA device in a build without CUDA, a parallel
/// group on CUDA, or device_memory_bytes for an engine group).
[[nodiscard]] Result<EngineInstance> build_engine(const EngineOptions& options);

/// What build_engine() would refuse, found without loading weights (issue
/// 46, item 14): the option checks, the model's config.json (a missing or
/// bad folder), whether `parallel` (and a Seesaw decode config, a Shift
/// config) shards this model (model::check_shardable: tp*sp must divide the
/// attention heads, ...), and on a CUDA device that the device exists and
/// the memory plan fits. A node runs it for every worker before it creates
/// its data dir or a job's output, so a bad start leaves nothing behind and
/// its cause is the error. Errors: as build_engine's.
[[nodiscard]] Status preflight_engine(const EngineOptions& options);

/// The weights `options` names: options.weights when set, else model_dir
/// loaded with its load_format, dtype (F16 as F32), seed and layer override.
/// Errors: what model::load_model returns.
[[nodiscard]] Result<std::shared_ptr<const model::ModelWeights>> load_weights(const EngineOptions& options);

/// A structured-output grammar compiler for `instance`'s model: its
/// tokenizer, its logits' width, and its engine's EOS ids as the stop
/// tokens a constrained output ends on. Errors: what
/// sampling::GrammarCompiler::create returns.
[[nodiscard]] Result<std::shared_ptr<sampling::GrammarCompiler>> make_grammar_compiler(const EngineInstance& instance);

}  // namespace shardline::engine
