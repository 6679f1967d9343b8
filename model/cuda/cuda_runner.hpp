#pragma once
/// \file
/// The Llama / Qwen2 / Qwen3 forward pass on one NVIDIA GPU over a paged KV
/// cache: the `model::ModelExecutor` a `cuda:N` device runs. The same
/// forward as model/shard_runner.hpp's whole-model shard (and the same KV
/// layout, step contract and sampling rules), built from the kernels of
/// kernels/cuda/:
///
///   embedding -> per layer: RMSNorm -> QKV GEMM (+bias) -> [Qwen3 q/k
///   RMSNorm] -> RoPE -> KV scatter -> paged attention (FlashAttention-2
///   prefill / Flash-Decoding decode) -> o_proj GEMM accumulated into the
///   residual -> RMSNorm -> gate_up GEMM -> SwiGLU -> down GEMM accumulated
///   into the residual; then the final RMSNorm of the rows whose logits are
///   needed -> lm_head GEMM -> logits [num_logits, vocab] F32 -> optionally
///   batched sampling on the device (kernels/cuda/sampling.hpp).
///
/// Device memory (all cudaMalloc, sized once at create()):
///  - weights: one arena, matrices in `weight_dtype` (F32 / BF16 / F16;
///    converted on the host while uploading), norms and biases F32; a tied
///    lm_head is the embedding table;
///  - KV cache: [layers, 2, num_kv_blocks, ...] in the layout of
///    cpu::KvCacheLayer, `kv_cache_dtype` F32 or BF16;
///  - activations for max(max_num_batched_tokens, largest graph batch) rows,
///    logits for max_num_seqs rows, the decode split workspace;
///  - step metadata at fixed addresses (so captured graphs can replay it),
///    written each step from a pinned host mirror.
/// engine/gpu_memory_plan.hpp decides num_kv_blocks from what is free.
///
/// CUDA graphs: decode-only steps (every sequence has one new token and
/// needs its logits) whose batch fits a captured size run as one graph
/// launch (vLLM's approach: the batch is padded to the next captured size;
/// padded rows write no KV and their logits are dropped). Mixed and prefill
/// steps run eagerly (their GEMMs dominate the launch overhead).
///
/// Determinism: with `deterministic`, every GEMM uses
/// kernels::cuda::GemmMode::batch_invariant; every other kernel is
/// batch-invariant already (one CTA per row / per (split, head, sequence)
/// with fixed reduction orders, splits a function of the context length
/// only). A request's logits are then bit-identical alone or in any batch,
/// eager or through a graph. Without it, cuBLASLt chooses algorithms by
/// shape, so logits can differ in the last bits with the batch size.
///
/// Threading: not thread-safe; one caller (the worker) at a time. The runner
/// owns a non-blocking CUDA stream; execute() returns after the step's
/// results are on the host.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "model/cuda/cuda_kv_copier.hpp"
#include "model/executor.hpp"
#include "model/shard_runner.hpp"
#include "model/weights.hpp"

struct CUstream_st;

namespace shardline::model {

struct CudaRunnerOptions {
  int device_index = 0;              ///< cuda:N
  int num_kv_blocks = 0;             ///< blocks of the paged KV cache (> 0)
  int block_size = 16;               ///< tokens per KV block
  DType weight_dtype = DType::bf16;  ///< matrices on the device: f32 (golden tests), bf16 or f16
  DType kv_cache_dtype = DType::bf16;  ///< f32 or bf16
  int max_num_batched_tokens = 2048;  ///< rows of one step at most
  int max_num_seqs = 256;             ///< sequences (and logits rows) of one step at most
  int max_model_len = 4096;           ///< tokens of one sequence at most
  bool deterministic = false;         ///< batch-invariant GEMMs (see the file comment)
  bool cuda_graphs = true;            ///< capture decode steps
  /// Decode batch sizes to capture; empty = 1, 2, 4, 8, 16, 24, ... (steps
  /// of 8) up to max_num_seqs, as vLLM does.
  std::vector<int> cuda_graph_batch_sizes;
  /// Device memory of another runner's KV cache on this device, used as this
  /// runner's cache instead of allocating one (Shift Parallelism's two
  /// configs share one cache, seed 001 §3.3): it must hold at least this
  /// runner's cache (kv_cache_bytes()) in the same layout, and it must
  /// outlive the runner. Not zeroed. Null: the runner allocates its own.
  void* kv_memory = nullptr;
  std::size_t kv_memory_bytes = 0;
  /// False: create() uploads no weights (weight_bytes() is 0 and no decode
  /// graph is captured) until load_weights(): Seesaw's `--reshard-weights
  /// reload` makes the inactive config's runners so, so that a rank's GPU
  /// never holds both configs' weights at once.
  bool upload_weights = true;
  /// A sharded runner binds its device communicators to its stream
  /// (comm::Communicator::bind_stream): collectives (and NCCL's send / recv)
  /// are queued behind its kernels with no host synchronisation between a
  /// GEMM and its all-reduce; each step then waits once, at its end
  /// (wait_stream, bounded by the communicators' timeouts). False: every
  /// collective and send waits for the stream on the host first (the older
  /// contract; the fake-device tests compare the two).
  bool stream_ordered_comms = true;
};

/// Where a step went on the device, for benchmarks (ms of host wall time).
struct CudaStepStats {
  bool used_graph = false;  ///< the step replayed a captured decode graph
  int padded_batch = 0;     ///< rows the graph ran (>= the step's rows)
  double upload_ms = 0;     ///< host packing + metadata copy enqueue
  double forward_ms = 0;    ///< forward + logits (enqueue to the end of the D2H copy)
};

/// One decoder layer's FFN weights on the device, in the runner's layout:
/// gate_up [2 * intermediate, hidden] and down [hidden, intermediate], row
/// major, in the runner's weight dtype.
struct CudaFfnLayerWeights {
  const void* gate_up = nullptr;
  const void* down = nullptr;
};

/// The CUDA runner's FFN math, lent to its CudaFfnExecutor (bind): one
/// decoder layer's FFN GEMMs and SwiGLU on the runner's stream, with its
/// workspaces. Used from the runner's stepping thread.
class CudaFfnCompute {
 public:
  virtual ~CudaFfnCompute() = default;
  /// The runner's CUDA device.
  [[nodiscard]] virtual int device() const = 0;
  /// The runner's stream (a cudaStream_t).
  [[nodiscard]] virtual CUstream_st* stream() const = 0;
  /// Enqueues out[rows, hidden] F32 = (or, with accumulate, +=)
  /// down(silu(x gate^T) * (x up^T)) of x[rows, hidden] F32 with weights
  /// `w`, all device memory. Any number of rows: they run in chunks of the
  /// runner's activation rows (max_num_batched_tokens), each a GEMM chain of
  /// its own (row results are the same: the kernels are batch-invariant in
  /// deterministic mode). Errors: internal (a kernel or GEMM failed).
  [[nodiscard]] virtual Status ffn(const CudaFfnLayerWeights& w, const float* x, int rows, float* out,
                                   bool accumulate) = 0;
  /// Enqueues out[count] += in[count] (device F32). Errors: internal.
  [[nodiscard]] virtual Status add(float* out, const float* in, long count) = 0;
  /// Waits for the stream's work. Errors: internal.
  [[nodiscard]] virtual Status sync() = 0;
};

/// What runs a CUDA runner's FFNs when it holds no FFN weights of its own
/// (SiDP, seed 002 §4.1: "treats each Transformer FFN as a pluggable
/// module"; model/cuda/sidp/cuda_sidp_ffn.hpp): WaS brings the weights and
/// runs the runner's FFN math on them; CaS sends the rows to the layer's
/// owner. Called from the runner's stepping thread.
class CudaFfnExecutor {
 public:
  virtual ~CudaFfnExecutor() = default;
  /// The runner lends its FFN math when it is made, and takes it back (null)
  /// when it is destroyed. The executor may use it between steps too (a
  /// CaS owner's dummy steps) from the same thread.
  virtual void bind(CudaFfnCompute* compute) = 0;
  /// Before a step's first layer, with the step's token rows on this rank.
  /// Errors: io (a peer of a synchronised group is gone).
  [[nodiscard]] virtual Status begin_step(int num_rows) = 0;
  /// residual[rows, hidden] += the FFN of decoder layer `layer` of
  /// x[rows, hidden] (device F32: the post-attention RMSNorm's output, still
  /// being written by the stream's work), enqueued on the compute's stream
  /// or done. Memory the executor lends to the GEMMs (a cache slot, a
  /// staging buffer) is reused only after it waited for the stream.
  /// Errors: io (an owner or a peer is gone past its timeout), internal.
  [[nodiscard]] virtual Status forward(int layer, const float* x, int rows, float* residual) = 0;
  /// After a step's last layer (begin_step and every forward succeeded).
  virtual void end_step() = 0;
  /// A step failed part-way: drop whatever it left in flight.
  virtual void abort_step() = 0;
};

class CudaModelRunner final : public model::ModelExecutor {
 public:
  /// Uploads the weights, allocates the KV cache and workspaces on device
  /// `options.device_index`, and captures the decode graphs.
  ///
  /// With a tensor-parallel `spec` (tp > 1; issue 41 item 1) it holds rank
  /// spec.tp_rank's share of the model as the CPU ShardRunner lays it out
  /// (model::shard_layout: Megatron's column / row split, KV heads
  /// replicated when tp exceeds them, lm_head split by vocabulary): its KV
  /// cache holds its KV heads, o_proj's and down_proj's partial sums are
  /// all-reduced over comms.tp (device buffers: comms.tp->on_device()), and
  /// the vocabulary slices of the logits are all-gathered, so every rank
  /// ends a step with the whole logits (and samples the same ids). The
  /// communicators are bound to the runner's stream
  /// (options.stream_ordered_comms; one that cannot be bound makes each
  /// collective wait for the stream on the host first), and a step ends
  /// with each bound communicator's wait_stream().
  ///
  /// With a pipeline `spec` (pp > 1) it holds stage spec.stage's layers
  /// (model::stage_layer_range) and their KV cache; stage 0 holds the
  /// embedding, the last stage the final norm and lm_head (its own copy of
  /// a tied one unless it is also stage 0). Each step a later stage first
  /// receives the residual [num_tokens, hidden] F32 from the previous stage
  /// over comms.pp (device buffers), and every stage but the last sends its
  /// residual on and returns an output without logits or ids: the last
  /// stage's output is the step's. Logits are bit-identical to one device's
  /// in deterministic mode (the residual is copied, not recomputed).
  ///
  /// With a sequence-parallel `spec` (sp > 1; Ulysses, seed 001 §3,
  /// Algorithm 2) it runs the step's rows [sp_rank * ch, (sp_rank + 1) * ch),
  /// ch = ceil(num_tokens / sp) (the last chunks padded with zero rows), for
  /// everything but attention; two all-to-alls over comms.sp (device
  /// buffers) give attention every row for this rank's hq_attn heads and
  /// bring the output back, and its KV cache holds the KV heads those heads
  /// read (replicated across SP ranks when fewer than them: Algorithm 1).
  /// The last stage all-gathers the chunks before the logits. With tp = 1
  /// the logits are one device's, bit for bit, in deterministic mode.
  /// Graphs are not captured under TP, SP or PP (the in-process device
  /// communicator meets its peers on the host at every collective).
  /// Errors: invalid_argument (non-positive sizes, dtypes not supported:
  /// weight f32/bf16/f16, KV f32/bf16; head_dim outside 1..256);
  /// not_found (no such device, or no driver: with the CUDA message);
  /// out_of_memory (a device allocation failed: names what and how many
  /// bytes); internal (a CUDA or cuBLAS call failed); invalid_argument for
  /// a spec the model cannot be split by (check_shardable), coordinates
  /// outside it, or a TP, SP or PP communicator that is missing, of
  /// another size or rank, on host memory, or bound to another stream.
  ///
  /// With `ffn` (SiDP's ranks: the whole model, one device each) the runner
  /// uploads no FFN weights: every layer's FFN runs through `ffn` (see
  /// CudaFfnExecutor; bound to this runner's FFN math until it is
  /// destroyed), and no decode graph is captured (the executor works on the
  /// host between layers). invalid_argument with a sharded spec.
  [[nodiscard]] static Result<std::unique_ptr<CudaModelRunner>> create(
      std::shared_ptr<const ModelWeights> weights, const CudaRunnerOptions& options, const ShardSpec& spec = {},
      ShardComms comms = {}, std::shared_ptr<CudaFfnExecutor> ffn = nullptr);
  ~CudaModelRunner() override;
  CudaModelRunner(const CudaModelRunner&) = delete;
  CudaModelRunner& operator=(const CudaModelRunner&) = delete;

  /// Runs one step. With input.sampling (one entry per logits row) it samples
  /// on the device and returns sampled_token_ids; otherwise the logits.
  /// Errors: invalid_argument (model::validate_step's checks; more tokens,
  /// sequences or context than the options allow); internal (CUDA).
  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override;

  [[nodiscard]] int vocab_size() const override { return config_.vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return options_.num_kv_blocks; }
  [[nodiscard]] int block_size() const override { return options_.block_size; }
  [[nodiscard]] bool samples_on_device() const override { return true; }
  /// The model's KV geometry (all layers and KV heads, the cache dtype).
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override;
  /// DéjàVu on CUDA: this runner's KV cache through a CudaKvCopier (made on
  /// the first call; null if it cannot be made). Only between steps.
  [[nodiscard]] kvstore::KvCopier* kv_copier() override;
  /// True for a whole-model runner: set_layer_kv_hook's hook is then called
  /// on the stepping thread during an eager step, right after each layer's
  /// KV write is QUEUED on the runner's stream (not done): read it only
  /// through kv_copier()'s begin_copy_out, which orders its copies after
  /// that write on the device (DéjàVu's layer-by-layer prompt streaming,
  /// seed 003 §4.1.1 (3)). A decode step replayed from a graph calls no hook.
  [[nodiscard]] bool supports_layer_kv_hook() const override;
  void set_layer_kv_hook(LayerKvHook hook) override;
  /// This rank's KV cache on the device and its layout (its stage's layers,
  /// the model KV heads of its slots): what a group's copier copies.
  [[nodiscard]] DeviceKvCache device_kv_cache() const;

  [[nodiscard]] const ModelConfig& config() const { return config_; }
  [[nodiscard]] const CudaRunnerOptions& options() const { return options_; }
  [[nodiscard]] const ShardSpec& spec() const { return spec_; }
  /// Bytes of weights on the device (matrices in weight_dtype, vectors F32):
  /// this rank's share.
  [[nodiscard]] std::size_t weight_bytes() const { return weight_bytes_; }
  /// Bytes of the KV cache (K and V, all layers).
  [[nodiscard]] std::size_t kv_cache_bytes() const { return kv_cache_bytes_; }
  /// Decode batch sizes with a captured graph, ascending.
  [[nodiscard]] std::vector<int> captured_batch_sizes() const;
  /// Why decode graphs were not captured ("" when they were, or were off):
  /// a failed capture leaves the runner working eagerly.
  [[nodiscard]] const std::string& graph_capture_error() const;
  /// The last step's statistics.
  [[nodiscard]] const CudaStepStats& last_step_stats() const { return last_stats_; }

  /// Seesaw's `--reshard-weights reload` (seed 000 §4.1) on CUDA: frees this
  /// rank's weight arena (weight_bytes() becomes 0); the KV cache,
  /// workspaces and the host weights stay. A step fails (invalid_argument)
  /// until load_weights(). Errors: unsupported for a runner with captured
  /// decode graphs (they hold the arena's addresses).
  [[nodiscard]] Status release_weights();
  /// Uploads this rank's weights again from `host` (with its matrices in
  /// host memory: the model the runner was made from); a no-op when they are
  /// on the device. Errors: invalid_argument (`host` holds no matrices, or
  /// another model's), out_of_memory, internal (a copy failed).
  [[nodiscard]] Status load_weights(const ModelWeights& host);
  /// True unless the weights were released (or never uploaded) and not loaded since.
  [[nodiscard]] bool weights_on_device() const { return weight_bytes_ > 0; }

 private:
  struct Impl;
  friend std::uint64_t cuda_runner_workspace_bytes(const ModelConfig&, const CudaRunnerOptions&, const ShardSpec&);
  explicit CudaModelRunner(std::unique_ptr<Impl> impl, ModelConfig config, CudaRunnerOptions options,
                           ShardSpec spec);
  [[nodiscard]] Result<model::StepOutput> run_step(const model::StepInput& input);

  std::unique_ptr<Impl> impl_;
  ModelConfig config_;
  CudaRunnerOptions options_;
  ShardSpec spec_;
  std::size_t weight_bytes_ = 0;
  std::size_t kv_cache_bytes_ = 0;
  CudaStepStats last_stats_;
  std::unique_ptr<CudaKvCopier> kv_copier_;  ///< kv_copier()'s, made on demand
};

/// Device bytes the runner allocates beyond the weights, the KV cache and
/// engine::activation_bytes_for's activations: the step metadata, the GEMM
/// cast scratch, cuBLASLt's workspace, the split-decode workspace (which
/// grows with max_model_len) and the final-norm rows. The memory plan sets
/// this much aside. Not included: the id lists of rows sampled with
/// penalties or min_tokens, allocated on demand (64 KiB at least, twice the
/// largest step's lists: about 8 bytes per prompt + output token of those
/// rows), which the plan's fixed 512 MiB reserve absorbs. Rank `spec` of
/// an SP group adds Ulysses' buffers: the all-to-all's send and receive
/// rows, the attention output coming back, and the last stage's gathered
/// residual. 0 for non-positive sizes.
[[nodiscard]] std::uint64_t cuda_runner_workspace_bytes(const ModelConfig& config, const CudaRunnerOptions& options,
                                                        const ShardSpec& spec = {});

/// Uploads `layer`'s FFN matrices into device `region` (on the current
/// device; sidp::cuda_ffn_layout().bytes) in the runner's layout: gate_up at
/// 0, down at `down_offset`, both converted to `weight_dtype` (f32, bf16,
/// f16), and waits for the copies. Errors:
/// invalid_argument (a layer without those matrices), internal (a copy).
[[nodiscard]] Status upload_ffn_layer(const LayerWeights& layer, DType weight_dtype, std::size_t down_offset,
                                      void* region);

/// Device bytes of the weights rank `spec` of `config` uploads (its stage's
/// layers, the embedding on stage 0, lm_head and the final norm on the
/// last; matrices in `weight_dtype`, vectors F32, each 256-byte aligned):
/// what CudaModelRunner::weight_bytes() reports once created.
/// Precondition: the spec passes check_shardable.
[[nodiscard]] std::uint64_t cuda_runner_weight_bytes(const ModelConfig& config, DType weight_dtype,
                                                     const ShardSpec& spec = {});

/// Device bytes of the KV cache rank `spec` of `config` holds with
/// `options` (num_kv_blocks blocks of the KV heads it attends, its stage's
/// layers, K and V): what CudaModelRunner::kv_cache_bytes() reports.
/// Precondition: the spec passes check_shardable.
[[nodiscard]] std::size_t cuda_runner_kv_cache_bytes(const ModelConfig& config, const CudaRunnerOptions& options,
                                                     const ShardSpec& spec = {});

/// The default decode graph batch sizes for max_num_seqs (see
/// CudaRunnerOptions::cuda_graph_batch_sizes).
[[nodiscard]] std::vector<int> default_cuda_graph_batch_sizes(int max_num_seqs);

}  // namespace shardline::model
