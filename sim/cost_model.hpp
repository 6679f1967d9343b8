#pragma once
/// \file
/// Runtime cost model of one engine step under a parallel configuration, after
/// Seesaw's performance model (seed 000, Appendix A; Table 2 notation: L
/// layers, W parameters of one layer, h_q heads, h_kv KV heads, d head
/// dimension, b batch, s sequence length). The planner compares parallel
/// configurations with it; the hardware numbers are measured at run time
/// (sim/calibration/hardware.hpp: STREAM bandwidth, GEMM FLOP/s) so the model is
/// calibrated to the machine it plans for.
///
/// Per decoder layer and rank (App. A.1, "Runtime Break-Down"):
///
///   T_L = max(T_dm^linear, T_comp^linear) + max(T_dm^attn, T_comp^attn) + T_nw
///
///  - T_dm^linear = weight bytes of the rank's shard / B_mem. App. A: "2W
///    bytes" (fp16); here W_rank * weight_bytes, with
///      W_rank = hidden*d*(h_q/tp + 2*kv_tp) + (h_q/tp)*d*hidden + 3*hidden*I/tp,
///      kv_tp = max(h_kv/tp, 1) (KV projections replicated when tp > h_kv).
///    With tp <= h_kv, W_rank = W/tp ("T_dm^linear reduced to 1/TP", A.3).
///  - T_comp^linear = 2 * W_rank * tokens_rank / FLOPS (App. A: "2Wbs in
///    prefilling and 2Wb in decoding"); tokens_rank = ceil(tokens / sp), the
///    rows of one SP chunk (the runner pads the last chunk: at small steps
///    this padding is why the shift config of Shift Parallelism wins).
///  - T_dm^attn = (KV cache read + Q,K,V of the new tokens) / B_mem:
///      kv_bytes * 2 * kv_attn * d * context_tokens   (App. A decode: 4bs h_kv d)
///    + act_bytes * (h_q_attn + 2*kv_attn) * d * tokens (App. A prefill: 2bs(h_q+2h_kv)d)
///    with h_q_attn = h_q/(tp*sp), kv_attn = max(h_kv/(tp*sp), 1) the heads one
///    rank attends (after SP's all-to-all); context_tokens are the cached
///    tokens read (StepShape::num_context_tokens).
///  - T_comp^attn = 4 * h_q_attn * d * attention_pairs / FLOPS (App. A:
///    "b h_q s^2 d 2" = 2 b h_q s^2 d causal prefill, "2 b h_q s d 2" = 4 b h_q s d
///    decode; both are 4 h_q d per (query, attended key) pair).
///  - T_nw: communication, each collective costing latency + bytes this rank
///    sends / comm bandwidth:
///     * TP (App. A.1: T_nw(TP) = b * A / B_ar(TP), A = activation of one
///       request): 2 all-reduces per layer (after o_proj and after down_proj)
///       of [tokens_rank, hidden] activations; a ring all-reduce sends
///       2 (tp-1)/tp of the payload per rank. The paper measures the all-reduce
///       bandwidth B_ar(TP) (tensor size / time) per TP degree; with a ring
///       over links of comm_bw, B_ar(TP) = comm_bw * tp / (2 (tp-1)), which
///       is how this model reproduces its "T_nw increases with TP".
///     * SP (Ulysses, seed 001 Alg. 2; App. A does not cover SP, derived
///       here): 2 all-to-alls per layer, before attention of the rank's
///       [tokens_rank, (h_q/tp + 2 kv_tp) d] Q,K,V and after it of the
///       [tokens_rank, (h_q/tp) d] attention output; an all-to-all sends
///       (sp-1)/sp of what a rank holds. The extra K,V copies of Alg. 1's KV
///       replication (when h_kv/tp < sp) are not counted.
///     * PP: each rank of a stage other than the last sends its
///       [tokens_rank, hidden] activations to the next stage once per
///       micro-batch. App. A omits this ("negligible compared to the
///       all-reduce"); it is counted here because it is cheap to.
///
/// The last pipeline stage also runs lm_head for the step's sequences (one
/// logits row each), max(vocab*hidden/tp * weight_bytes / B_mem,
/// 2*vocab*hidden/tp * sequences / FLOPS), as model/shard_runner.cpp does it:
/// with SP the ranks first all-gather the residual ((sp-1) * tokens_rank *
/// hidden activations sent per rank) and each computes every logits row of
/// its vocabulary shard; with TP the shards are all-gathered ((tp-1) *
/// sequences * ceil(vocab/tp) sent per rank). App. A is per layer and leaves
/// lm_head out, but for small models it is a large share of the weights and
/// its gather dominates TP's traffic. Embedding lookup, norms and RoPE are
/// not modelled.
///
/// Pipeline (App. A.3, "Pipeline parallelism"): stage s holds the layers of
/// model/shard_runner.hpp's stage_layer_range (the first L % pp stages get
/// one layer more). The step's work is split evenly over M micro-batches
/// (StepShape::num_micro_batches; balanced, as Token Throttling aims for).
/// One micro-batch takes t_s on stage s (its layers' T_L, lm_head on the last
/// stage, the send on the others); M micro-batches through pp stages take
///
///   total = sum_s t_s + (M - 1) * max_s t_s = M * t_max + bubble,
///   bubble = sum_s t_s - t_max  (= (pp - 1) * t for equal stages),
///
/// i.e. the App. A.3 steady state (one micro-batch finished per t_max) plus
/// the fill / drain bubble of a step that starts with an empty pipeline.
///
/// DP: the step is one engine group's (one DP replica's); dp replicas run in
/// parallel on their own steps (App. A.3: micro-batch b / (PP * DP)), so dp
/// only scales StepCost::tokens_per_s.
///
/// SiDP weight fetch (seed 002, §4.2-4.3; not in Seesaw's model). Under SiDP
/// a DP rank holds only the FFN weights of the layers it owns; in WaS it
/// fetches every other layer's FFN weights from the owner over a link while
/// it computes (the housekeeper prefetches). Per layer, with F = 3*hidden*I
/// FFN parameters (gate, up, down; not sharded: SiDP is DP):
///
///   T_fetch     = latency_link + F * weight_bytes / B_link
///   T_ffn(b)    = max(F * weight_bytes / B_mem, 2 * F * b / FLOPS)
///                 (T_dm / T_comp of the FFN GEMMs of b rows, as above)
///   b*          = the least integer b >= 1 with T_ffn(b) >= T_fetch
///               = 1                                  if F*weight_bytes/B_mem >= T_fetch
///               = ceil(T_fetch * FLOPS / (2 F))      otherwise
///               = ceil(FLOPS * (latency_link / (2F) + weight_bytes / (2 B_link)))
///
/// i.e. the batch from which one rank's FFN GEMM of a layer hides the fetch of
/// one layer's weights (the issue's "b* is where the FFN GEMM time of a batch
/// equals the time to fetch that layer's FFN weights"; §4.3: "the minimum
/// batch size at which forward time can fully hide the cost of weight
/// fetching"). Without latency, b* = FLOPS * weight_bytes / (2 B_link) does
/// not depend on the model's shape. Conservative: attention, which also
/// overlaps the fetch, is left out, and so is a lookahead of more than one
/// layer. b* is per rank (each WaS rank runs the GEMM of its own rows); a
/// group of dp balanced ranks reaches it at a total of dp * b* sequences.
///
/// The overlapped b* (sidp_switch_batch_overlapped) counts what the
/// housekeeper's prefetch really overlaps: §4.3 asks for "the minimum batch
/// size at which forward time can fully hide the cost of weight fetching",
/// and the prefetch runs during the whole forward pass (attention
/// projections too), while with dp balanced owners a rank fetches only
/// (dp - 1) of every dp layers. With W = ModelShape::layer_params() (q, k, v,
/// o and the FFN):
///
///   T_layer(b)  = max(W * weight_bytes / B_mem, 2 * W * b / FLOPS)
///   b*_overlap  = the least integer b >= 1 with dp * T_layer(b) >= (dp - 1) * T_fetch
///
/// Still left out: attention over the KV cache (it grows with the context)
/// and the slots' lookahead. b*_overlap <= b*.

#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "engine/group/parallel_config.hpp"
#include "model/config.hpp"

namespace shardline::sim {

/// Shape numbers of a decoder-only model (Llama / Qwen: gated FFN).
struct ModelShape {
  int num_layers = 0;         ///< L
  int hidden_size = 0;        ///< residual width
  int num_heads = 0;          ///< h_q
  int num_kv_heads = 0;       ///< h_kv
  int head_dim = 0;           ///< d
  int intermediate_size = 0;  ///< FFN width I (gate, up, down)
  int vocab_size = 0;

  [[nodiscard]] static ModelShape from_config(const model::ModelConfig& c);
  /// W: parameters of one decoder layer's matrices (q, k, v, o, gate, up,
  /// down; biases and norm weights left out):
  /// hidden*(h_q + 2 h_kv)*d + h_q*d*hidden + 3*hidden*I.
  [[nodiscard]] double layer_params() const;
  /// ok, or invalid_argument naming the first non-positive field (or heads
  /// not a multiple of KV heads).
  [[nodiscard]] Status validate() const;
};

/// Bytes per element (App. A assumes float16 throughout: 2).
struct ElementSizes {
  double weight_bytes = 2;      ///< weight matrices (4 for F32, 2 for BF16)
  double kv_bytes = 2;          ///< KV cache
  double activation_bytes = 2;  ///< activations: Q, K, V and what collectives / sends move
};

/// One device and its links, measured at run time.
struct HardwareSpec {
  double memory_bw_bytes_per_s = 0;  ///< B_HBM: device memory bandwidth, bytes/s (> 0)
  double flops_per_s = 0;            ///< FLOPS: achievable GEMM rate at the weight dtype, FLOP/s (> 0)
  double comm_bw_bytes_per_s = 0;    ///< bytes/s one rank sends in a collective or send (> 0)
  double comm_latency_s = 0;         ///< fixed time per collective or send, seconds (>= 0)
  /// The achievable GEMM rate by the rows a rank's GEMMs have in a step
  /// (one micro-batch's tokens on one rank), as points {rows, FLOP/s}
  /// ascending in rows: linear between points, held flat beyond the ends.
  /// Empty: flops_per_s at every row count. A calibrated CPU device fills
  /// it (sim::DeviceSpec::gemm_efficiency_by_rows): at a few dozen rows a
  /// decode step is neither memory- nor compute-bound, and the engine
  /// overlaps its weight reads with its FLOPs only in part.
  std::vector<std::pair<double, double>> flops_by_rows;
  /// The same for a rank of a tensor-parallel group (tp > 1), in the same
  /// form; empty: flops_by_rows. TP ranks run in lockstep (an all-reduce
  /// after o_proj and after down_proj of every layer): each collective
  /// waits for the slower rank, and the ranks' bandwidth-bound phases
  /// (attention, weight reads) fall at the same time on a shared memory bus,
  /// where the ranks of a DP group drift apart and overlap one's attention
  /// with another's GEMMs. A calibrated CPU device fits it to real tp=2
  /// decode steps (sim::DeviceSpec::tp_gemm_efficiency_by_rows); the
  /// collectives themselves stay priced apart (T_nw).
  std::vector<std::pair<double, double>> tp_flops_by_rows;

  /// flops_per_s, or flops_by_rows at `rows` when it is given.
  [[nodiscard]] double flops_at(double rows) const;
  /// The GEMM rate of a rank of a group of `tp` tensor-parallel ranks at
  /// `rows`: tp_flops_by_rows when tp > 1 and it is given, else flops_at.
  [[nodiscard]] double flops_at(double rows, int tp) const;
};

/// `points` ({x, y} ascending in x, not empty) at `x`: linear between
/// points, held flat beyond the ends (the form of the by-rows curves here
/// and in sim::DeviceSpec).
[[nodiscard]] double interpolate_by_rows(const std::vector<std::pair<double, double>>& points, double x);

/// The link a SiDP rank fetches non-owned FFN weights over (NVLink on a GPU
/// node; the communicator's paced link on CPU devices).
struct LinkSpec {
  double bandwidth_bytes_per_s = 0;  ///< B_link, bytes/s one fetch gets (> 0)
  double latency_s = 0;              ///< fixed time per fetch, seconds (>= 0)

  /// From `--link-gbps` (gigabytes/s, 1e9 bytes/s) and `--link-latency-us`.
  [[nodiscard]] static LinkSpec from_gbps(double gigabytes_per_s, double latency_us) {
    return LinkSpec{gigabytes_per_s * 1e9, latency_us * 1e-6};
  }
};

/// b* and the two times it balances (see the file comment).
struct SidpSwitchPoint {
  long long switch_batch = 0;  ///< b*, per rank; max_batch when capped
  bool capped = false;         ///< no b <= max_batch hides the fetch (T_ffn(max_batch) < T_fetch)
  double fetch_ms = 0;         ///< T_fetch of one layer's FFN weights
  double ffn_weight_read_ms = 0;  ///< F * weight_bytes / B_mem: T_ffn's floor
  double ffn_gemm_ms = 0;      ///< T_ffn(switch_batch)
  /// The overlapped model only (else 0): the group size it assumed and
  /// T_layer(switch_batch), one layer's forward matrices.
  int dp = 0;
  double layer_ms = 0;
};

/// T of Shift Parallelism's per-step switch (seed 001, Alg. 3) as the model
/// predicts it (CostModel::shift_threshold).
struct ShiftThresholdPoint {
  long long threshold = 0;  ///< T: steps of at most T batched tokens run in the shift config
  bool capped = false;      ///< the shift config is no slower at every n <= max_tokens (T = max_tokens)
  /// Predicted step times at n = max(T, 1) tokens, ms.
  double base_ms = 0;
  double shift_ms = 0;
  /// ... and at n = T + 1 (the first step the base config wins; 0 when capped).
  double base_next_ms = 0;
  double shift_next_ms = 0;
};

/// The work of one engine step of one engine group: totals over its sequences.
struct StepShape {
  long long num_prefill_tokens = 0;   ///< prompt (chunk) tokens computed this step
  long long num_decode_tokens = 0;    ///< decode tokens (one per decoding sequence)
  long long num_sequences = 0;        ///< sequences in the step = logits rows
  long long num_context_tokens = 0;   ///< KV cache tokens read: sum over sequences of tokens cached before the step
  long long num_attention_pairs = 0;  ///< sum over new tokens of keys attended (cached + new up to and including itself)
  int num_micro_batches = 1;          ///< M: micro-batches the step is split into (PP), >= 1

  /// Adds one sequence with `cached_tokens` already in the KV cache and
  /// `new_tokens` computed now (new_tokens <= 0: nothing). It counts as a
  /// decode when cached_tokens > 0 and new_tokens == 1, else as prefill;
  /// attention pairs += new * cached + new * (new + 1) / 2.
  void add_sequence(long long cached_tokens, long long new_tokens);
  [[nodiscard]] long long num_tokens() const { return num_prefill_tokens + num_decode_tokens; }
};

/// One pipeline stage, per rank: times for ONE micro-batch, bytes for the step.
struct StageCost {
  int num_layers = 0;
  double micro_batch_ms = 0;         ///< t_s: one micro-batch through this stage
  double weight_read_ms = 0;         ///< T_dm^linear over the stage's layers (+ lm_head weights on the last)
  double kv_read_ms = 0;             ///< T_dm^attn over the stage's layers
  double linear_compute_ms = 0;      ///< T_comp^linear (+ lm_head on the last)
  double attention_compute_ms = 0;   ///< T_comp^attn
  double tp_comm_ms = 0, sp_comm_ms = 0, pp_comm_ms = 0;
  double tp_bytes = 0, sp_bytes = 0, pp_bytes = 0;  ///< bytes one rank sends in the whole step
};

/// Predicted cost of a step. The component times are raw (bytes / bandwidth,
/// FLOPs / FLOPS, communication) for one rank of the bottleneck stage over
/// all M micro-batches; `total_ms` takes the roofline max per part, so
/// max(data, compute) + comm + bubble <= total <= sum of components + bubble.
struct StepCost {
  double total_ms = 0;            ///< predicted wall time of the step
  double weight_read_ms = 0;
  double kv_read_ms = 0;
  double compute_ms = 0;          ///< linear + attention
  double linear_compute_ms = 0;
  double attention_compute_ms = 0;
  double comm_ms = 0;             ///< tp + sp + pp
  double tp_comm_ms = 0, sp_comm_ms = 0, pp_comm_ms = 0;
  double bubble_ms = 0;           ///< pipeline fill / drain: sum_s t_s - max_s t_s
  int bottleneck_stage = 0;       ///< argmax_s t_s (lowest index on ties)
  double memory_bytes = 0;        ///< bytes one rank of the bottleneck stage reads (weights + attention)
  double flops = 0;               ///< FLOPs one rank of the bottleneck stage computes
  /// Bytes one rank of stage 0 sends in the step, per kind (stage 0 has the
  /// most layers and sends activations when pp > 1, so no rank sends more).
  double tp_bytes_per_rank = 0, sp_bytes_per_rank = 0, pp_bytes_per_rank = 0;
  double tokens_per_s = 0;        ///< dp * step tokens / total (0 for an empty step)
  std::vector<StageCost> stages;  ///< one per pipeline stage
};

/// App. A cost model for one model on one kind of device.
class CostModel {
 public:
  /// Errors: invalid_argument naming the bad field (non-positive shape
  /// numbers, heads not a multiple of KV heads, element sizes <= 0,
  /// bandwidths or FLOPS <= 0, latency < 0, any of them not finite).
  [[nodiscard]] static Result<CostModel> create(const ModelShape& shape, const ElementSizes& sizes,
                                                const HardwareSpec& hw);
  /// The model of one rank of a SiDP group of `dp` CPU devices sharing one
  /// machine: each rank gets 1/dp of the machine's measured memory bandwidth
  /// and GEMM rate (bytes/s, FLOP/s); weights and KV cache in the given
  /// dtypes, F32 activations; sends over `link`. Errors: as create().
  [[nodiscard]] static Result<CostModel> for_sidp_rank(const model::ModelConfig& config, DType weight_dtype,
                                                       DType kv_cache_dtype, double machine_memory_bw_bytes_per_s,
                                                       double machine_flops_per_s, int dp, const LinkSpec& link);
  /// As above with the weights at `weight_bytes` per element instead of a
  /// dtype's size: weights held in their own formats, e.g. a quantized
  /// file's FFN regions as WaS moves them (engine::sidp_ffn_format: Q4_1
  /// 0.75), with `machine_flops_per_s` the GEMM rate of their kernel.
  /// Errors: as create() (weight_bytes <= 0 or not finite among them).
  [[nodiscard]] static Result<CostModel> for_sidp_rank(const model::ModelConfig& config, double weight_bytes,
                                                       DType kv_cache_dtype, double machine_memory_bw_bytes_per_s,
                                                       double machine_flops_per_s, int dp, const LinkSpec& link);

  /// The model of one of `num_devices` CPU devices of one machine (an
  /// in-process engine group or a SiDP group): each gets 1/num_devices of the
  /// machine's measured memory bandwidth and GEMM rate (bytes/s, FLOP/s) —
  /// they share one memory bus —, weights and KV cache in the given dtypes,
  /// F32 activations, and collectives / sends over `link`. Errors: as
  /// create(), and invalid_argument for num_devices < 1.
  [[nodiscard]] static Result<CostModel> for_cpu_devices(const model::ModelConfig& config, DType weight_dtype,
                                                         DType kv_cache_dtype, double machine_memory_bw_bytes_per_s,
                                                         double machine_flops_per_s, int num_devices,
                                                         const LinkSpec& link);

  /// Context tokens per sequence `--shift-threshold auto` computes T at
  /// (attention is the same work in both configs, so T hardly depends on it).
  static constexpr long long kShiftThresholdContextTokens = 512;

  /// Shift Parallelism's threshold T (seed 001, §3 and Alg. 3) for an engine
  /// group whose base config is `base` (sp*tp > 1, pp = 1) and whose shift
  /// config is tp' = sp*tp on the same devices: the model's crossover. A step
  /// of n tokens is taken as n decoding sequences with
  /// `context_tokens_per_seq` cached tokens each (attention is the same work
  /// in both configs: same heads per rank, same KV read; they differ in the
  /// weight bytes each rank reads, SP's padded chunk, the collectives and
  /// lm_head). T = (the least n in [1, max_tokens] with base faster than
  /// shift) - 1; `capped` with T = max_tokens when there is none; T = 0 when
  /// the base config wins at n = 1. Errors: invalid_argument for pp != 1,
  /// sp*tp < 2, context_tokens_per_seq < 0 or max_tokens < 1.
  [[nodiscard]] Result<ShiftThresholdPoint> shift_threshold(const engine::ParallelConfig& base,
                                                            long long context_tokens_per_seq,
                                                            long long max_tokens) const;

  /// Predicted cost of `step` under `pc` (a step without tokens runs no
  /// forward pass and costs 0). Errors: invalid_argument for a degree < 1,
  /// pp > num_layers, negative step counts or num_micro_batches < 1.
  [[nodiscard]] Result<StepCost> estimate(const engine::ParallelConfig& pc, const StepShape& step) const;

  /// Default cap of sidp_switch_batch.
  static constexpr long long kSidpMaxSwitchBatch = 4096;

  /// F * weight_bytes: bytes of one layer's FFN weights (gate, up, down).
  [[nodiscard]] double ffn_layer_bytes() const;
  /// T_fetch in ms: time to fetch one layer's FFN weights over `link`.
  /// Precondition: link.bandwidth_bytes_per_s > 0 (else +inf).
  [[nodiscard]] double sidp_weight_fetch_ms(const LinkSpec& link) const;
  /// T_ffn(b) in ms: one layer's FFN GEMMs (gate, up, down) of `batch` rows on
  /// one rank (batch < 0 read as 0).
  [[nodiscard]] double sidp_ffn_gemm_ms(long long batch) const;
  /// b*: the least batch b >= 1 with T_ffn(b) >= T_fetch, capped at
  /// max_batch (then `capped`). Errors: invalid_argument for a link bandwidth
  /// <= 0, a latency < 0 (either not finite) or max_batch < 1.
  [[nodiscard]] Result<SidpSwitchPoint> sidp_switch_batch(const LinkSpec& link,
                                                          long long max_batch = kSidpMaxSwitchBatch) const;
  /// T_layer(b) in ms: one decoder layer's matrices (q, k, v, o, gate, up,
  /// down) for `batch` rows on one rank (batch < 0 read as 0).
  [[nodiscard]] double sidp_layer_ms(long long batch) const;
  /// b*_overlap (file comment): the least batch b >= 1 with dp * T_layer(b)
  /// >= (dp - 1) * T_fetch, capped at max_batch. Errors: as
  /// sidp_switch_batch, and invalid_argument for dp < 2.
  [[nodiscard]] Result<SidpSwitchPoint> sidp_switch_batch_overlapped(const LinkSpec& link, int dp,
                                                                     long long max_batch = kSidpMaxSwitchBatch) const;

  [[nodiscard]] const ModelShape& shape() const { return shape_; }
  [[nodiscard]] const ElementSizes& sizes() const { return sizes_; }
  [[nodiscard]] const HardwareSpec& hardware() const { return hw_; }

 private:
  CostModel(const ModelShape& shape, const ElementSizes& sizes, const HardwareSpec& hw)
      : shape_(shape), sizes_(sizes), hw_(hw) {}
  ModelShape shape_;
  ElementSizes sizes_;
  HardwareSpec hw_;
};

}  // namespace shardline::sim
