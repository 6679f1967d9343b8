#pragma once
/// \file
/// One rank's share of the Llama / Qwen2 / Qwen3 forward pass on CPU under a
/// shard spec (TP x SP x PP); with the trivial spec it is the whole model and
/// CpuModelRunner is a thin wrapper around it.
///
/// Sharding (ranks of one engine group; see engine/group/parallel_config.hpp):
///  - TP (Megatron-LM, Shoeybi et al. 2019): rank t holds query heads
///    [t*H/tp, (t+1)*H/tp) and the KV heads they read (a KV head is replicated
///    on several ranks when tp > kv_heads), the matching o_proj columns, and
///    FFN columns [t*I/tp, (t+1)*I/tp) of gate and up plus those rows of down.
///    o_proj and down produce partial sums, all-reduced over the TP group
///    (rank-order sums: deterministic, within float rounding of one device).
///    lm_head is split by vocabulary rows and all-gathered: logits are
///    bit-identical to one device's.
///  - SP (Ulysses, seed 001 §3, Algorithm 2): the step's num_tokens rows are
///    split into sp chunks of chunk_rows() = ceil(num_tokens / sp) rows; rank s
///    owns rows [s*chunk, (s+1)*chunk) (the last chunks padded). Norms, QKV,
///    o_proj and the FFN run on the chunk; an all-to-all before attention turns
///    [chunk, heads_t] into [num_tokens, heads_t / sp] and one after it turns
///    it back. When the heads a rank attends need fewer KV heads than there are
///    ranks, KV heads are replicated in the all-to-all (Algorithm 1's KV
///    replication): each rank gets the KV heads its query heads read. With
///    tp = 1 the logits are bit-identical to one device's (every kernel is
///    row-independent and batch-invariant).
///  - PP: stage s holds layers stage_layer_range(L, pp, s); stage 0 embeds,
///    the last stage computes logits. Moving the residual stream between
///    stages is the caller's job (engine/group/parallel_executor.hpp): receive into
///    residual(), run_stage(), send residual().
///
/// The KV cache of a rank holds only the KV heads it attends, for every
/// token, in its stage's layers: [layers_t, 2, num_kv_blocks, kv_heads_attn,
/// block_size, head_dim]. Block tables are shared by the whole group.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "common/memory.hpp"
#include "common/result.hpp"
#include "model/executor.hpp"
#include "model/ffn_executor.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/weight_linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kvstore/kv_stream.hpp"
#include "model/weights.hpp"

namespace shardline::model {

/// Where a step's time went (ms), accumulated while profiling is on.
struct StepProfile {
  double gemm_ms = 0;       ///< QKV, o_proj, gate_up, down_proj
  double attention_ms = 0;  ///< KV scatter + paged attention
  double logits_ms = 0;     ///< final norm + lm_head
  double other_ms = 0;      ///< embedding, norms, RoPE, SwiGLU, residual adds
  double comm_ms = 0;       ///< waiting in collectives (TP all-reduce, SP all-to-all, gathers)
  /// Bytes this rank sent in collectives this step, ring-equivalent: an
  /// all-reduce 2 (n-1)/n of the payload, an all-to-all (n-1)/n of what the
  /// rank holds, an all-gather its share to each of the n-1 peers (the
  /// convention of sim/cost_model.hpp).
  std::uint64_t comm_bytes = 0;
  [[nodiscard]] double total_ms() const {
    return gemm_ms + attention_ms + logits_ms + other_ms + comm_ms;
  }
};

/// How a step's phases overlap (issue 17, item 3). Each keeps every result
/// bit for bit (the same kernels on the same rows; only the order of work
/// across rows and the cache state differ). docs/performance.md, "Overlap",
/// has what each measures on this machine.
enum class StepOverlap {
  /// Phases one after another: per layer QKV, attention, o_proj, FFN.
  none,
  /// Software prefetch of the next phase's bytes during the current GEMM:
  /// layer l's QKV GEMM, the one right before its attention, carries a
  /// LinePrefetchQueue of that attention's KV blocks (longest contexts
  /// first, up to overlap_prefetch_bytes; kernels/cpu/prefetch.hpp), so
  /// they move while the FMA units work and no other layer's weights pass
  /// through the cache before the attention reads them. (Spreading the
  /// queue over o_proj and the FFN of layer l - 1 as well measured worse:
  /// their 13 MB of BF16 weights evicted it; docs/performance.md.)
  kv_prefetch,
  /// NanoFlow-style nano-batches (Zhu et al., NanoFlow, arXiv:2408.12757:
  /// nano-batching to overlap compute- and memory-bound ops): the step's
  /// sequences split into two halves A and B (at the first sequence past
  /// half the rows), offset by half a layer, so that the bandwidth-bound
  /// attention of one half follows a QKV GEMM of the other that prefetched
  /// its KV:
  ///   QKV_A(0); QKV_B(0) [+KV of Attn_A(0)]; then per layer l:
  ///   Attn_A(l); o/FFN_A(l); QKV_A(l+1) [+KV of Attn_B(l)];
  ///   Attn_B(l); o/FFN_B(l); QKV_B(l+1) [+KV of Attn_A(l+1)].
  /// Both cores run both kinds of work (with two cores, giving one to the
  /// attention takes it from the GEMMs: docs/performance.md). Only on a
  /// rank with tp = sp = 1 and no FfnExecutor, for steps of two sequences
  /// or more; other steps run as kv_prefetch.
  nano_batch,
};

/// "none", "kv-prefetch" or "nano-batch".
[[nodiscard]] const char* step_overlap_name(StepOverlap overlap);
/// Parses step_overlap_name()'s names. Errors: invalid_argument naming them.
[[nodiscard]] Result<StepOverlap> parse_step_overlap(const std::string& name);

struct CpuRunnerOptions {
  int num_kv_blocks = 0;  ///< blocks in the paged KV cache (> 0)
  int block_size = 16;    ///< tokens per KV block
  int num_threads = 0;    ///< OpenMP threads for kernels; 0 = leave as is
  DType kv_cache_dtype = DType::f32;  ///< f32 (exact) or bf16 (half the KV bytes)
  StepOverlap overlap = StepOverlap::none;  ///< how the step's phases overlap
  /// KV bytes one attention's queue prefetches at most (StepOverlap): 12
  /// MiB, what this machine's L3 keeps for a core pair (a read of a
  /// buffer runs at L3 speed up to 16 MiB, docs/performance.md). 0: all.
  std::size_t overlap_prefetch_bytes = std::size_t{12} << 20;
};

/// Which part of the model one rank holds.
struct ShardSpec {
  int tp = 1;
  int tp_rank = 0;
  int sp = 1;
  int sp_rank = 0;
  int pp = 1;
  int stage = 0;
  [[nodiscard]] bool first_stage() const { return stage == 0; }
  [[nodiscard]] bool last_stage() const { return stage == pp - 1; }
  [[nodiscard]] bool is_whole_model() const { return tp == 1 && sp == 1 && pp == 1; }
};

/// Group rank `group_rank`'s shard of a tp x sp x pp engine group whose
/// ranks are ordered (stage * sp + sp_rank) * tp + tp_rank (the order of
/// engine::rank_coord and model::CudaShardGroup). Precondition: 0 <=
/// group_rank < tp * sp * pp.
[[nodiscard]] ShardSpec shard_spec_at(int tp, int sp, int pp, int group_rank);
/// Shift Parallelism (seed 001 §3.3.1): group rank `group_rank`'s shard of
/// the shift config TP' = sp x tp over a pp = 1 group of that order: TP rank
/// t's SP rank s attends query-head block t*sp + s, so it is TP' rank
/// t*sp + s and attends the same KV heads in both configs.
[[nodiscard]] ShardSpec shift_spec_at(int tp, int sp, int group_rank);

/// Layers [first, second) of `stage` when `num_layers` are split into `pp`
/// contiguous stages; the first num_layers % pp stages get one layer more.
[[nodiscard]] std::pair<int, int> stage_layer_range(int num_layers, int pp, int stage);

/// Checks that `config` can be split tp x sp x pp: heads divisible by tp*sp,
/// GQA groups aligned with the head split (group size divides the heads per
/// rank or the reverse), intermediate_size divisible by tp, pp <= layers.
/// Errors: invalid_argument naming the numbers.
[[nodiscard]] Status check_shardable(const ModelConfig& config, int tp, int sp, int pp);

/// One rank's share of the model under a ShardSpec: the head split and the
/// weight ranges that both runners (the CPU ShardRunner, the CUDA runner)
/// follow. TP is Megatron's: QKV and gate_up split by rows (heads, FFN
/// columns), o_proj and down_proj by columns, lm_head by vocabulary rows
/// (all-gathered); a KV head is replicated on every rank of its GQA group
/// when tp exceeds the KV heads. SP (Ulysses) splits the attended heads.
struct ShardLayout {
  struct Range {
    int begin = 0;
    int count = 0;
  };
  int layer_begin = 0, layer_end = 0;  ///< this stage's layers
  int hq_t = 0;        ///< query heads of this TP rank
  int kv_t = 0;        ///< KV heads its QKV produces
  int kv_begin_t = 0;  ///< the first of them
  int hq_attn = 0;     ///< query heads it attends (after SP's all-to-all)
  int kv_attn = 0;     ///< KV heads it attends (its KV cache's heads)
  int inter_t = 0;     ///< FFN columns of this TP rank
  int vocab_shard = 0;  ///< ceil(vocab / tp): the logits all-gather stride
  int vocab_begin = 0;  ///< lm_head rows [vocab_begin, vocab_begin + vocab_rows)
  int vocab_rows = 0;
  std::vector<Range> qkv_rows;      ///< rows of qkv (and of its bias): Q, K, V blocks
  std::vector<Range> gate_up_rows;  ///< rows of gate_up: gate, up blocks
  Range o_proj_cols;                ///< columns of o_proj
  Range down_cols;                  ///< columns of down_proj
};

/// The layout of rank `spec` of `config`. Precondition: check_shardable
/// passed for spec's tp, sp and pp, and its coordinates lie inside them.
[[nodiscard]] ShardLayout shard_layout(const ModelConfig& config, const ShardSpec& spec);

/// RoPE parameters of a model (theta, llama3 scaling) for
/// kernels::cpu::rope_inv_freq; shared by the CPU and CUDA runners.
[[nodiscard]] kernels::cpu::RopeParams rope_params_for(const ModelConfig& config);

/// The group communicators a rank's forward pass uses (null when size 1).
/// Not owned; they must outlive the runner's steps.
struct ShardComms {
  comm::Communicator* tp = nullptr;  ///< the ranks of this stage with this sp_rank
  comm::Communicator* sp = nullptr;  ///< the ranks of this stage with this tp_rank
  /// The ranks with this (tp_rank, sp_rank) over the stages (rank = stage).
  /// The CUDA runner sends its residual to the next stage over it; the CPU
  /// ShardRunner leaves that to its executor and takes none.
  comm::Communicator* pp = nullptr;
};

/// check_shardable for spec's tp, sp and pp, the rank coordinates inside
/// them, and a communicator of the group's size and the rank's index for
/// each group (TP, SP) of more than one rank. Shared by the CPU and CUDA
/// runners. Errors: invalid_argument ("shard: ...", naming the numbers).
[[nodiscard]] Status check_shard_spec(const ModelConfig& config, const ShardSpec& spec, const ShardComms& comms);


class ShardRunner {
 public:
  /// Slices and packs this rank's weights and allocates its KV cache.
  /// With `ffn` (whole model only: tp = sp = pp = 1), every layer's FFN runs
  /// through it and the runner packs no FFN weights (SiDP,
  /// model/sidp/sidp_ffn.hpp).
  /// Quantized matrices (Matrix::quant) are packed quantized and computed
  /// with integer dot products (kernels/cpu/quant_linear.hpp); so are an
  /// `ffn`'s (SiDP's layer owners keep them quantized).
  /// Errors: invalid_argument (bad spec or options, see check_shardable;
  /// a communicator missing or of the wrong size; an ffn with a sharded
  /// spec; a TP shard of a quantized o_proj or
  /// down_proj that would split a block, naming the tensor), out_of_memory.
  [[nodiscard]] static Result<std::unique_ptr<ShardRunner>> create(
      std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec,
      const CpuRunnerOptions& options, ShardComms comms = {}, std::shared_ptr<FfnExecutor> ffn = nullptr);

  /// Shift Parallelism (seed 001 §3.3): a runner for another config of the
  /// same devices (the shift config TP' = SP×TP, `spec`) that owns no KV
  /// cache but reads and writes `kv_owner`'s: it packs its own weights for
  /// `spec` and takes the owner's KV options. The two must attend the same
  /// KV heads in the same local slots over the same layers (the §3.3.1 head
  /// order: engine::shift_spec_of). Errors: invalid_argument (as create, or
  /// the KV layouts differ, naming both head lists), out_of_memory.
  [[nodiscard]] static Result<std::unique_ptr<ShardRunner>> create_sharing_kv(
      std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec, ShardComms comms, ShardRunner& kv_owner);

  /// Seesaw (seed 000 §4.1): a runner for the group's other parallel config
  /// on the same device whose KV cache, in its own layout (`spec`'s layers
  /// and heads), lives in `owner`'s KV memory: one pool for both configs, as
  /// on a GPU. Valid because no KV stays on a device across a config switch
  /// (it goes through the host buffer), and a block is always written before
  /// it is read. Takes the owner's KV options (blocks, block size, dtype).
  /// If this layout needs more bytes than the owner allocated, both move to
  /// one new allocation of that size (call it before any step). Errors: as
  /// create().
  [[nodiscard]] static Result<std::unique_ptr<ShardRunner>> create_on_kv_memory(
      std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec, ShardComms comms, ShardRunner& owner);
  /// Bytes of KV memory this runner's cache lives in (>= kv_cache_bytes();
  /// shared with the other config's runner under create_on_kv_memory).
  [[nodiscard]] std::size_t kv_memory_bytes() const { return kv_alloc_bytes_; }

  /// Rows of this rank's chunk of a num_tokens step: ceil(num_tokens / sp).
  [[nodiscard]] int chunk_rows(int num_tokens) const { return (num_tokens + spec_.sp - 1) / spec_.sp; }
  /// This rank's residual stream for a num_tokens step: [chunk_rows, hidden],
  /// valid until the next call with more tokens. Receive a stage's input here.
  [[nodiscard]] float* residual(int num_tokens);
  /// Checks a step against the cache and vocabulary (validate_step).
  /// Errors: invalid_argument.
  [[nodiscard]] Status validate(const model::StepInput& input) const;
  /// Runs this stage: embeds the chunk (stage 0) or takes residual() as
  /// input, then runs the stage's layers in place on residual().
  /// `input` must be validated. Errors: io from a collective.
  [[nodiscard]] Status run_stage(const model::StepInput& input);
  /// Last stage, after run_stage: logits [num_logits, vocab] of the rows in
  /// input.logits_rows, on every rank of the stage. Errors: io.
  [[nodiscard]] Result<model::StepOutput> run_logits(const model::StepInput& input);

  [[nodiscard]] const ShardSpec& spec() const { return spec_; }
  [[nodiscard]] const ModelConfig& config() const { return weights_->config; }
  [[nodiscard]] int layer_begin() const { return layer_begin_; }
  [[nodiscard]] int layer_end() const { return layer_end_; }
  [[nodiscard]] int num_kv_blocks() const { return options_.num_kv_blocks; }
  [[nodiscard]] int block_size() const { return options_.block_size; }
  [[nodiscard]] const CpuRunnerOptions& options() const { return options_; }
  /// KV heads this rank stores and attends (after TP/SP split and replication).
  [[nodiscard]] int kv_heads_attended() const { return kv_attn_; }
  /// The model's KV geometry with this runner's cache dtype.
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const;
  /// This rank's cache as a streamable view: its stage's layers and, per
  /// local head slot, the model KV head it holds.
  [[nodiscard]] kvstore::KvCacheView kv_cache_view();
  /// Called after each layer's KV write of a step (ModelExecutor::LayerKvHook,
  /// with the model layer index); empty: none.
  void set_layer_kv_hook(std::function<void(int)> hook) { layer_kv_hook_ = std::move(hook); }

  void set_profiling(bool on) { profiling_ = on; }
  /// This rank's profile of the last step (run_stage + run_logits); comm_bytes
  /// is counted whether or not profiling is on.
  [[nodiscard]] const StepProfile& last_profile() const { return profile_; }
  /// The FFN executor given to create(), or null.
  [[nodiscard]] FfnExecutor* ffn() const { return ffn_.get(); }
  /// Bytes of packed weights this rank streams per step (without the FFNs
  /// when an FfnExecutor runs them).
  [[nodiscard]] std::size_t packed_weight_bytes() const;
  /// Bytes of this rank's KV cache.
  [[nodiscard]] std::size_t kv_cache_bytes() const { return kv_cache_bytes_; }

  /// Seesaw's `--reshard-weights reload` (seed 000 §4.1): frees this rank's
  /// packed weights (packed_weight_bytes() becomes 0); the host
  /// ModelWeights, the KV cache and everything else stay. A step must not
  /// run until load_weights().
  void release_weights();
  /// Slices and packs the weights again from the host ModelWeights (a
  /// no-op when they are packed). Errors: as create()'s packing (out of
  /// memory aborts, as at create()).
  [[nodiscard]] Status load_weights();
  /// True unless release_weights() was called since the last pack.
  [[nodiscard]] bool weights_packed() const { return weights_packed_; }

 private:
  [[nodiscard]] static Result<std::unique_ptr<ShardRunner>> create_impl(
      std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec, const CpuRunnerOptions& options,
      ShardComms comms, std::shared_ptr<FfnExecutor> ffn, bool allocate_kv);
  /// Dense (F32 / BF16) or quantized (the GGUF file's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K
  /// blocks) as the host Matrix is.
  struct PackedLayer {
    kernels::cpu::PackedWeight qkv;      // [(hq_t + 2 kv_t) * hd, hidden]
    std::vector<float> qkv_bias;         // [(hq_t + 2 kv_t) * hd] or empty
    kernels::cpu::PackedWeight o_proj;   // [hidden, hq_t * hd]
    kernels::cpu::PackedWeight gate_up;  // [2 * inter_t, hidden] (empty with an FfnExecutor)
    kernels::cpu::PackedWeight down;     // [hidden, inter_t] (empty with an FfnExecutor)
  };

  ShardRunner(std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec,
              const CpuRunnerOptions& options, ShardComms comms, std::shared_ptr<FfnExecutor> ffn);
  class OpTimer;
  [[nodiscard]] Status run_layers(const model::StepInput& input);
  /// StepOverlap::nano_batch (its schedule is there): `seqs` are the step's
  /// attention sequences, `split` the first of half B.
  [[nodiscard]] Status run_layers_nano_batch(const model::StepInput& input,
                                             std::span<const kernels::cpu::AttentionSeq> seqs, std::size_t split);
  /// Rows [r0, r0 + rows) of the chunk (`real` of them tokens, at
  /// `positions`): input norm, QKV, Qwen3's q/k norms and RoPE, from
  /// residual_ into qkv_. `side` rides along the QKV GEMM.
  void qkv_rows(int layer, int r0, int rows, int real, const std::int32_t* positions,
                kernels::cpu::LinePrefetchQueue* side, OpTimer& timer);
  /// Rows [r0, r0 + rows) after attention (`o_in`: their attention output,
  /// hq_t * hd wide): o_proj (+ TP all-reduce), residual add and norm, the
  /// FFN (+ all-reduce), residual add. Errors: io from a collective or the
  /// FfnExecutor.
  [[nodiscard]] Status post_attention_rows(int layer, const float* o_in, int r0, int rows, OpTimer& timer);
  /// With a StepOverlap: assigns prefetch_ the KV runs of `seqs`'
  /// attention in model layer `layer` of this stage (up to
  /// overlap_prefetch_bytes) and returns it for the QKV GEMM before that
  /// attention to carry. Null when overlap is none or there is nothing.
  kernels::cpu::LinePrefetchQueue* plan_kv_prefetch(std::span<const kernels::cpu::AttentionSeq> seqs, int layer);
  /// Slices and packs layers_ and lm_head_ from weights_ (this rank's shard).
  /// Errors: invalid_argument (a quantized matrix whose shard would split a
  /// block, naming the tensor).
  [[nodiscard]] Status pack_weights();
  /// out [num_tokens, hidden] = the token table's rows of `token_ids`,
  /// widened (dense) or dequantized (quantized) to F32.
  void embed(const std::int32_t* token_ids, int num_tokens, float* out) const;
  /// Allocates (and faults in) `bytes` of KV memory as kv_cache_.
  [[nodiscard]] Status allocate_kv_memory(std::size_t bytes);
  [[nodiscard]] kernels::cpu::KvCacheLayer kv_layer(int local_layer);
  void ensure_scratch(int num_tokens);
  [[nodiscard]] Status all_reduce_tp(float* data, std::size_t count);

  std::shared_ptr<const ModelWeights> weights_;
  ShardSpec spec_;
  CpuRunnerOptions options_;
  ShardComms comms_;
  std::shared_ptr<FfnExecutor> ffn_;  ///< runs the FFNs when set (SiDP)
  int layer_begin_ = 0;
  int layer_end_ = 0;
  // Head split (counts per rank).
  int hq_t_ = 0;        ///< query heads of this TP rank
  int kv_t_ = 0;        ///< KV heads this TP rank's QKV produces
  int hq_attn_ = 0;     ///< query heads this rank attends (hq_t / sp)
  int kv_attn_ = 0;     ///< KV heads this rank attends and caches
  int inter_t_ = 0;     ///< FFN columns of this TP rank
  int vocab_begin_ = 0;  ///< lm_head rows of this TP rank: [vocab_begin, vocab_begin + vocab_rows)
  int vocab_rows_ = 0;
  int vocab_shard_ = 0;  ///< ceil(vocab / tp): the all-gather stride
  bool weights_packed_ = false;
  std::vector<int> sp_kv_begin_;  ///< [sp] first local KV head (of kv_t) sent to each SP rank

  std::vector<PackedLayer> layers_;  ///< this stage's layers
  kernels::cpu::PackedWeight lm_head_;  // [vocab_rows, hidden] (last stage)
  std::vector<float> inv_freq_;          // [head_dim / 2]
  /// [layers_t, 2, num_kv_blocks, kv_attn, block_size, head_dim]; shared with
  /// the runner of the group's other config under Shift Parallelism.
  std::shared_ptr<void> kv_cache_;
  std::size_t kv_cache_bytes_ = 0;  ///< this layout's bytes
  std::size_t kv_alloc_bytes_ = 0;  ///< bytes of the memory kv_cache_ points to
  std::size_t kv_layer_bytes_ = 0;

  bool profiling_ = false;
  StepProfile profile_;

  // Scratch, grown to the largest step seen (rows: c = chunk rows, n = sp * c).
  int scratch_tokens_ = 0;
  std::vector<float> residual_;   // [c, hidden]
  std::vector<float> normed_;     // [max(c, num_logits), hidden]
  std::vector<float> qkv_;        // [c, (hq_t + 2 kv_t) * hd]
  std::vector<float> a2a_send_;   // [sp, c, (hq_attn + 2 kv_attn) * hd]
  std::vector<float> a2a_recv_;   // [n, (hq_attn + 2 kv_attn) * hd]
  std::vector<float> attn_;       // [n, hq_attn * hd]
  std::vector<float> attn_back_;  // [sp, c, hq_attn * hd]
  std::vector<float> attn_t_;     // [c, hq_t * hd]
  std::vector<float> proj_;       // [c, hidden]
  std::vector<float> gate_up_;    // [c, 2 * inter_t]
  std::vector<float> act_;        // [c, inter_t]
  std::vector<float> gathered_;   // [n, hidden] (SP: the whole residual for logits)
  std::function<void(int)> layer_kv_hook_;  ///< set_layer_kv_hook
  kernels::cpu::LinePrefetchQueue prefetch_;  ///< StepOverlap's queue for the next QKV GEMM
};

}  // namespace shardline::model
