#include "model/cuda/cuda_runner.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "common/stopwatch.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/sampling.hpp"
#include "model/cuda/penalty_cache.hpp"
#include "model/shard_runner.hpp"

namespace shardline::model {
namespace kcu = kernels::cuda;

namespace {

using Clock = std::chrono::steady_clock;

Status cuda_status(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return Status::ok_status();
  (void)cudaGetLastError();
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::internal;
  return make_error(code, std::string("cuda runner: ") + what + ": " + cudaGetErrorString(err));
}

constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/// Bump allocator over byte offsets (the arena is allocated once the total is known).
struct Layout {
  std::size_t bytes = 0;
  std::size_t take(std::size_t n) {
    const std::size_t off = bytes;
    bytes = align_up(bytes + n);
    return off;
  }
};

bool has_penalties(const sampling::SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

/// Converts `count` elements of `src` (F32 or BF16) to `dst_dtype` into dst.
void convert_matrix(const void* src, DType src_dtype, std::size_t count, DType dst_dtype, void* dst) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * dtype_size(src_dtype));
    return;
  }
  const auto* sf = static_cast<const float*>(src);
  const auto* sb = static_cast<const std::uint16_t*>(src);
  const auto elem = [&](std::size_t i) { return src_dtype == DType::f32 ? sf[i] : bf16_to_f32(sb[i]); };
  const auto n = static_cast<long>(count);
  if (dst_dtype == DType::f32) {
    auto* d = static_cast<float*>(dst);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) d[i] = elem(static_cast<std::size_t>(i));
  } else if (dst_dtype == DType::bf16) {
    auto* d = static_cast<std::uint16_t*>(dst);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) d[i] = f32_to_bf16(elem(static_cast<std::size_t>(i)));
  } else {
    auto* d = static_cast<std::uint16_t*>(dst);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) d[i] = f32_to_f16(elem(static_cast<std::size_t>(i)));
  }
}

}  // namespace

std::vector<int> default_cuda_graph_batch_sizes(int max_num_seqs) {
  std::vector<int> sizes;
  for (int b : {1, 2, 4})
    if (b <= max_num_seqs) sizes.push_back(b);
  for (int b = 8; b <= max_num_seqs; b += 8) sizes.push_back(b);
  if (max_num_seqs > 0 && (sizes.empty() || sizes.back() != max_num_seqs)) sizes.push_back(max_num_seqs);
  return sizes;
}

/// Device pointers of one layer's weights.
namespace {

/// The options checked against the model, with the graph batch sizes
/// defaulted, sorted and unique. Errors: invalid_argument.
Result<CudaRunnerOptions> checked_options(const ModelConfig& c, CudaRunnerOptions o) {
  const auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "cuda runner: " + m); };
  if (o.num_kv_blocks <= 0 || o.block_size <= 0) return bad("num_kv_blocks and block_size must be > 0");
  if (o.max_num_batched_tokens <= 0 || o.max_num_seqs <= 0 || o.max_model_len <= 0)
    return bad("max_num_batched_tokens, max_num_seqs and max_model_len must be > 0");
  if (o.kv_cache_dtype != DType::f32 && o.kv_cache_dtype != DType::bf16)
    return bad(std::string("KV cache dtype ") + dtype_name(o.kv_cache_dtype) + " not supported (f32 or bf16)");
  if (!kcu::attention_head_dim_supported(c.head_dim))
    return bad("head_dim " + std::to_string(c.head_dim) + " not supported by the CUDA attention (1 to 256)");
  if (c.num_attention_heads % c.num_key_value_heads != 0) return bad("num_heads is not a multiple of num_kv_heads");
  for (int b : o.cuda_graph_batch_sizes)
    if (b <= 0 || b > o.max_num_seqs) return bad("CUDA graph batch size " + std::to_string(b) + " outside [1, max_num_seqs]");
  if (o.cuda_graph_batch_sizes.empty()) o.cuda_graph_batch_sizes = default_cuda_graph_batch_sizes(o.max_num_seqs);
  std::sort(o.cuda_graph_batch_sizes.begin(), o.cuda_graph_batch_sizes.end());
  o.cuda_graph_batch_sizes.erase(std::unique(o.cuda_graph_batch_sizes.begin(), o.cuda_graph_batch_sizes.end()),
                                 o.cuda_graph_batch_sizes.end());
  return o;
}

/// The shard a CUDA runner can hold: a spec check_shard_spec accepts, and
/// TP / SP / PP communicators on device buffers. Errors: invalid_argument.
Status check_cuda_spec(const ModelConfig& c, const ShardSpec& spec, const ShardComms& comms) {
  const auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "cuda runner: " + m); };
  if (Status s = check_shard_spec(c, spec, comms); !s) return s;
  if (spec.tp > 1 && !comms.tp->on_device())
    return bad("the TP communicator works on host memory; the runner's tensors are on the device");
  if (spec.sp > 1 && !comms.sp->on_device())
    return bad("the SP communicator works on host memory; the runner's tensors are on the device");
  if (spec.pp > 1) {
    if (comms.pp == nullptr)
      return bad("pipeline of " + std::to_string(spec.pp) + " stages has no PP communicator");
    if (comms.pp->world_size() != spec.pp || comms.pp->rank() != spec.stage)
      return bad("PP communicator is rank " + std::to_string(comms.pp->rank()) + " of " +
                 std::to_string(comms.pp->world_size()) + ", expected stage " + std::to_string(spec.stage) + " of " +
                 std::to_string(spec.pp));
    if (!comms.pp->on_device())
      return bad("the PP communicator works on host memory; the runner's residual is on the device");
  }
  return Status::ok_status();
}

/// The tag of the residual a stage sends to the next (the PP communicator
/// carries nothing else).
constexpr int kResidualTag = 1;

/// Bytes of K (or V) of one layer of a rank's cache: num_kv_blocks blocks of
/// the KV heads it attends.
std::size_t kv_half_layer_bytes(const ModelConfig& c, const CudaRunnerOptions& o, const ShardLayout& lay) {
  return static_cast<std::size_t>(o.num_kv_blocks) * static_cast<std::size_t>(lay.kv_attn) *
         static_cast<std::size_t>(o.block_size) * static_cast<std::size_t>(c.head_dim) * dtype_size(o.kv_cache_dtype);
}

/// Makes device_index the current device. Errors: not_found (no driver or
/// device, with the CUDA message), internal.
Status select_device(int device_index) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::not_found, std::string("cuda:") + std::to_string(device_index) +
                                                ": no CUDA device (" + cudaGetErrorString(err) + ")");
  }
  if (device_index < 0 || device_index >= count)
    return make_error(ErrorCode::not_found, "cuda:" + std::to_string(device_index) + ": only " +
                                                std::to_string(count) + " CUDA device(s)");
  return cuda_status("set device", cudaSetDevice(device_index));
}

}  // namespace

struct DeviceLayer {
  const float* input_norm = nullptr;     // [hidden]
  const void* qkv = nullptr;             // [qkv_rows, hidden]
  const float* qkv_bias = nullptr;       // [qkv_rows] or null
  const float* q_norm = nullptr;         // [head_dim] or null
  const float* k_norm = nullptr;         // [head_dim] or null
  const void* o_proj = nullptr;          // [hidden, heads * head_dim]
  const float* post_attention_norm = nullptr;  // [hidden]
  const void* gate_up = nullptr;         // [2 * inter, hidden]
  const void* down = nullptr;            // [hidden, inter]
};

struct CudaModelRunner::Impl {
  ModelConfig c;
  CudaRunnerOptions o;
  ShardSpec spec;                       ///< this rank's share (whole model: the default)
  ShardLayout lay;                      ///< shard_layout(c, spec)
  comm::Communicator* tp_comm = nullptr;  ///< device buffers; null when tp == 1
  comm::Communicator* pp_comm = nullptr;  ///< device buffers, rank = stage; null when pp == 1
  comm::Communicator* sp_comm = nullptr;  ///< device buffers; null when sp == 1
  // True when the communicator is bound to `stream` (bind_stream): its
  // collectives (pp: its send / recv) queue behind this stream's kernels,
  // so no host synchronisation precedes them.
  bool tp_ordered = false, sp_ordered = false, pp_ordered = false;

  /// The communicators bound to this stream, each once.
  [[nodiscard]] std::vector<comm::Communicator*> bound_comms() const {
    std::vector<comm::Communicator*> out;
    for (comm::Communicator* c : {tp_comm, sp_comm, pp_comm})
      if (c != nullptr && c->collectives_in_stream_order() && std::find(out.begin(), out.end(), c) == out.end())
        out.push_back(c);
    return out;
  }

  /// Waits for the step's queued work: each bound communicator polls the
  /// stream up to its timeout (a dead NCCL peer is io, and aborts that
  /// communicator, releasing its kernels; with two NCCL communicators on
  /// the stream the first to time out is aborted even if the other's peer
  /// died, and the second then times out too: the group is broken either
  /// way), then a plain synchronisation. The first error wins.
  Status settle() {
    Status first = Status::ok_status();
    for (comm::Communicator* c : bound_comms())
      if (Status s = c->wait_stream(); !s && first) first = s;
    if (Status s = cuda_status("step", cudaStreamSynchronize(stream)); !s && first) first = s;
    return first;
  }

  /// Host synchronisation before a collective of a communicator that is not
  /// bound to this stream (it reads the buffer from its own stream).
  Status sync_unless(bool ordered, const char* what) {
    if (ordered) return Status::ok_status();
    return cuda_status(what, cudaStreamSynchronize(stream));
  }
  std::vector<int> sp_kv_begin;  ///< [sp] SP rank j's first KV head, among this TP rank's
  DType wdt = DType::bf16;
  cudaStream_t stream = nullptr;
  std::unique_ptr<kcu::GemmContext> gemm;
  kcu::GemmMode mode = kcu::GemmMode::fast;

  std::shared_ptr<CudaFfnExecutor> ffn;  // SiDP: runs every layer's FFN (null: the arena's weights)
  /// The FFN math this runner lends to `ffn`.
  struct FfnMath final : CudaFfnCompute {
    Impl* m = nullptr;
    [[nodiscard]] int device() const override { return m->o.device_index; }
    [[nodiscard]] CUstream_st* stream() const override { return m->stream; }
    [[nodiscard]] Status ffn(const CudaFfnLayerWeights& w, const float* x, int rows, float* out,
                             bool accumulate) override {
      return m->ffn_rows(w, x, rows, out, accumulate);
    }
    [[nodiscard]] Status add(float* out, const float* in, long count) override {
      return kcu::add_inplace(out, in, count, m->stream);
    }
    [[nodiscard]] Status sync() override { return cuda_status("FFN executor's sync", cudaStreamSynchronize(m->stream)); }
  };
  FfnMath ffn_math;
  kcu::DeviceBuffer weights;     // arena
  kcu::DeviceBuffer kv;          // [layers, 2, num_kv_blocks, kv_heads, ...] (empty with o.kv_memory)
  char* kv_data = nullptr;       // the cache: kv's memory or o.kv_memory
  kcu::DeviceBuffer act;         // activations arena
  kcu::DeviceBuffer meta;        // step metadata (fixed layout)
  kcu::DeviceBuffer workspace;   // attention split-decode partials
  kcu::DeviceBuffer sample_ids;  // penalty / masked id lists of the rows sampled
  void* meta_host = nullptr;     // pinned mirror of `meta`

  std::vector<DeviceLayer> layers;
  const void* embed = nullptr;       // [vocab, hidden]
  const void* lm_head = nullptr;     // [vocab, hidden]
  const float* final_norm = nullptr;  // [hidden]
  const float* inv_freq = nullptr;   // [head_dim / 2]
  std::size_t kv_layer_bytes = 0;    // one of K or V of one layer

  int rows_cap = 0;        // activation rows
  int seqs_cap = 0;        // sequences / logits rows
  int max_blocks = 0;      // block-table entries per sequence
  int qkv_rows = 0;
  // Activations.
  float* residual = nullptr;   // [rows_cap, hidden]
  float* normed = nullptr;     // [rows_cap, hidden]
  float* qkv = nullptr;        // [rows_cap, qkv_rows]
  float* attn = nullptr;       // [rows_cap, heads * head_dim]
  float* gate_up = nullptr;    // [rows_cap, 2 * inter]
  float* mlp = nullptr;        // [rows_cap, inter]
  float* logits_in = nullptr;  // [seqs_cap, hidden]
  float* logits = nullptr;     // [seqs_cap, vocab]
  float* proj = nullptr;       // tp > 1: [rows_cap, hidden], a partial sum of o_proj / down_proj
  float* logits_all = nullptr;  // tp > 1: [tp, seqs_cap, vocab_shard], the gathered vocabulary slices
  // SP (Ulysses) only, with ch = chunk_rows(rows): attn above is [sp * ch, hq_attn * head_dim].
  int attn_w_sp = 0;            // (hq_attn + 2 * kv_attn) * head_dim: a row of what attention reads
  float* a2a_send = nullptr;    // [sp, ch, attn_w_sp]: block j for SP rank j
  float* a2a_recv = nullptr;    // [sp * ch, attn_w_sp]: every row, this rank's attended heads
  float* attn_back = nullptr;   // [sp, ch, hq_attn * head_dim]: block j from SP rank j
  float* attn_t = nullptr;      // [ch, hq_t * head_dim]: this chunk's rows, this TP rank's heads
  float* gathered = nullptr;    // [sp * ch, hidden]: the last stage's residual, every chunk
  // Metadata offsets (bytes) in meta / meta_host.
  std::size_t off_tokens = 0, off_positions = 0, off_slots = 0, off_logits_rows = 0, off_seqs = 0,
              off_tables = 0, off_pad_table = 0, off_sample_rows = 0, off_sampled = 0;

  std::vector<std::int32_t> extra_host;  // penalty / masked ids of the last step (read by an async copy)
  PenaltyCache penalties;                // per-sequence penalty lists, updated step by step
  std::map<int, cudaGraphExec_t> graphs;  // decode batch size -> graph
  model::ModelExecutor::LayerKvHook layer_kv_hook;  // called by eager forwards after each layer's KV write is queued
  std::string graph_error;

  ~Impl() {
    for (auto& [b, g] : graphs) (void)cudaGraphExecDestroy(g);
    if (meta_host != nullptr) (void)cudaFreeHost(meta_host);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }

  /// Places the metadata regions (sets the off_* members); returns the total.
  Layout layout_metadata() {
    const auto rows = static_cast<std::size_t>(rows_cap);
    const auto seqs = static_cast<std::size_t>(seqs_cap);
    Layout ml;
    off_tokens = ml.take(rows * 4);
    off_positions = ml.take(rows * 4);
    off_slots = ml.take(rows * 4);
    off_logits_rows = ml.take(seqs * 4);
    off_seqs = ml.take(seqs * sizeof(kcu::AttentionSeq));
    off_tables = ml.take(seqs * static_cast<std::size_t>(max_blocks) * 4);
    off_pad_table = ml.take(4);
    off_sample_rows = ml.take(seqs * sizeof(kcu::SampleRow));
    off_sampled = ml.take(seqs * 4);
    return ml;
  }

  template <class T>
  T* host(std::size_t off) { return reinterpret_cast<T*>(static_cast<char*>(meta_host) + off); }
  template <class T>
  T* dev(std::size_t off) { return reinterpret_cast<T*>(meta.as<char>() + off); }

  [[nodiscard]] kernels::cpu::KvCacheLayer kv_layer(int l) {
    kernels::cpu::KvCacheLayer k;
    char* base = kv_data + static_cast<std::size_t>(l) * 2 * kv_layer_bytes;
    k.k = base;
    k.v = base + kv_layer_bytes;
    k.dtype = o.kv_cache_dtype;
    k.num_blocks = o.num_kv_blocks;
    k.block_size = o.block_size;
    k.num_kv_heads = lay.kv_attn;
    k.head_dim = c.head_dim;
    return k;
  }

  /// Sums a partial result over the TP group: queued behind the stream's
  /// work when the communicator is bound to it; otherwise that work is
  /// waited for first (the communicator reads the buffer from its own stream).
  Status all_reduce(float* data, std::size_t count) {
    if (Status s = sync_unless(tp_ordered, "sync before all_reduce"); !s) return s;
    return tp_comm->all_reduce_sum(data, count);
  }

  /// Rows of this rank's share of a step of num_rows tokens: SP's chunk,
  /// ceil(num_rows / sp) (every row without SP).
  [[nodiscard]] int chunk_rows(int num_rows) const { return (num_rows + spec.sp - 1) / spec.sp; }

  /// `height` rows of `width_floats` floats, device to device on the stream.
  Status copy_rows(float* dst, int dst_stride, const float* src, int src_stride, int width_floats, int height) {
    return cuda_status("row copy", cudaMemcpy2DAsync(dst, static_cast<std::size_t>(dst_stride) * 4, src,
                                                     static_cast<std::size_t>(src_stride) * 4,
                                                     static_cast<std::size_t>(width_floats) * 4,
                                                     static_cast<std::size_t>(height), cudaMemcpyDeviceToDevice,
                                                     stream));
  }

  /// Ulysses' first all-to-all (seed 001 §3, Algorithm 2): this chunk's QKV
  /// rows [ch, qkv_rows] become every row's attended heads [sp * ch,
  /// attn_w_sp] in a2a_recv. Block j of a2a_send holds SP rank j's query
  /// heads and the KV heads they read (a KV head goes to every rank whose
  /// heads read it: Algorithm 1's KV replication), as the CPU shard packs them.
  Status ulysses_scatter(int ch) {
    const int hd = c.head_dim;
    const int q_w = lay.hq_attn * hd, kv_w = lay.kv_attn * hd;
    for (int j = 0; j < spec.sp; ++j) {
      const int kv0 = sp_kv_begin[static_cast<std::size_t>(j)];
      float* dst = a2a_send + static_cast<std::size_t>(j) * ch * attn_w_sp;
      if (Status s = copy_rows(dst, attn_w_sp, qkv + j * q_w, qkv_rows, q_w, ch); !s) return s;
      if (Status s = copy_rows(dst + q_w, attn_w_sp, qkv + (lay.hq_t + kv0) * hd, qkv_rows, kv_w, ch); !s) return s;
      if (Status s = copy_rows(dst + q_w + kv_w, attn_w_sp, qkv + (lay.hq_t + lay.kv_t + kv0) * hd, qkv_rows, kv_w,
                               ch);
          !s)
        return s;
    }
    if (Status s = sync_unless(sp_ordered, "sync before all_to_all"); !s) return s;
    return sp_comm->all_to_all(a2a_send, a2a_recv, static_cast<std::size_t>(ch) * attn_w_sp);
  }

  /// Ulysses' second all-to-all: the attention output of every row, this
  /// rank's heads [sp * ch, hq_attn * head_dim] (rows from num_rows on
  /// zeroed), back to this chunk's rows with all of the TP rank's heads
  /// [ch, hq_t * head_dim] in attn_t.
  Status ulysses_gather(int num_rows, int ch) {
    const int width = lay.hq_attn * c.head_dim;
    const std::size_t pad_rows = static_cast<std::size_t>(spec.sp) * ch - static_cast<std::size_t>(num_rows);
    if (pad_rows > 0)
      if (Status s = cuda_status("zero padding rows", cudaMemsetAsync(attn + static_cast<std::size_t>(num_rows) * width,
                                                                      0, pad_rows * width * 4, stream));
          !s)
        return s;
    if (Status s = sync_unless(sp_ordered, "sync before all_to_all"); !s) return s;
    if (Status s = sp_comm->all_to_all(attn, attn_back, static_cast<std::size_t>(ch) * width); !s) return s;
    for (int j = 0; j < spec.sp; ++j)
      if (Status s = copy_rows(attn_t + j * width, lay.hq_t * c.head_dim,
                               attn_back + static_cast<std::size_t>(j) * ch * width, width, width, ch);
          !s)
        return s;
    return Status::ok_status();
  }

  /// The logits of a tensor-parallel rank: its vocabulary slice of every
  /// row into its slot of logits_all, all-gathered, then laid out as
  /// [num_logits, vocab] in `logits`.
  Status tp_logits(int num_logits) {
    const int hidden = c.hidden_size;
    const int vocab = c.vocab_size;
    const int vs = lay.vocab_shard;
    const auto slot = static_cast<std::size_t>(num_logits) * static_cast<std::size_t>(vs);
    float* mine = logits_all + static_cast<std::size_t>(spec.tp_rank) * slot;
    if (lay.vocab_rows > 0)
      if (Status s = gemm->linear(logits_in, hidden, num_logits, hidden, lm_head, wdt, lay.vocab_rows, mine, vs, false,
                                  mode, stream);
          !s)
        return s;
    if (Status s = sync_unless(tp_ordered, "sync before all_gather"); !s) return s;
    if (Status s = tp_comm->all_gather(mine, slot, logits_all); !s) return s;
    for (int t = 0; t < spec.tp; ++t) {
      const int cols = std::max(0, std::min(vs, vocab - t * vs));
      if (cols == 0) continue;
      const float* src = logits_all + static_cast<std::size_t>(t) * slot;
      if (Status s = cuda_status("logits layout", cudaMemcpy2DAsync(logits + static_cast<std::size_t>(t) * vs,
                                                                     static_cast<std::size_t>(vocab) * 4, src,
                                                                     static_cast<std::size_t>(vs) * 4,
                                                                     static_cast<std::size_t>(cols) * 4,
                                                                     static_cast<std::size_t>(num_logits),
                                                                     cudaMemcpyDeviceToDevice, stream));
          !s)
        return s;
    }
    return Status::ok_status();
  }

  Status copy_meta(std::size_t off, std::size_t bytes) {
    if (bytes == 0) return Status::ok_status();
    return cuda_status("metadata copy", cudaMemcpyAsync(meta.as<char>() + off, static_cast<char*>(meta_host) + off,
                                                        bytes, cudaMemcpyHostToDevice, stream));
  }

  /// The rows of one step: all of it, and this rank's share (SP's chunk).
  struct StepRows {
    int num_rows = 0, num_seqs = 0, max_num_q = 0, max_context_len = 0;
    int rows = 0;  ///< this rank's rows: [row0, row0 + rows) (num_rows without SP)
    int row0 = 0;
    int real = 0;  ///< of them, real tokens (the rest pad the last chunks)
    [[nodiscard]] std::size_t rows_x(int width) const {
      return static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
    }
  };

  /// Stage 0: this rank's rows of the embedding; padding rows zeroed (as on
  /// the CPU). A later stage's residual came from the previous stage.
  Status embed_rows(const StepRows& r) {
    const int hidden = c.hidden_size;
    if (r.real > 0)
      if (Status s = kcu::embedding(dev<std::int32_t>(off_tokens) + r.row0, r.real, embed, wdt, hidden, residual,
                                    stream);
          !s)
        return s;
    if (r.rows == r.real) return Status::ok_status();
    return cuda_status("zero padding rows",
                       cudaMemsetAsync(residual + static_cast<std::size_t>(r.real) * hidden, 0,
                                       static_cast<std::size_t>(r.rows - r.real) * hidden * 4, stream));
  }

  /// Layer `l`'s attention half: RMSNorm, QKV (+bias, Qwen3's q/k norms,
  /// RoPE on the real rows), under SP Ulysses' all-to-all, the KV write and
  /// paged attention over every row for this rank's heads, back under SP,
  /// then o_proj into the residual (all-reduced under TP) and the post
  /// attention RMSNorm into `normed`.
  Status attention_block(const DeviceLayer& w, int l, const StepRows& r) {
    const int hidden = c.hidden_size;
    const int hd = c.head_dim;
    const int heads = lay.hq_t;  // this TP rank's (all of them when tp == 1)
    const int kvh = lay.kv_t;
    const float eps = c.rms_norm_eps;
    const int rows = r.rows;
    if (Status s = kcu::rms_norm(residual, hidden, w.input_norm, normed, hidden, rows, hidden, eps, stream); !s)
      return s;
    if (Status s = gemm->linear(normed, hidden, rows, hidden, w.qkv, wdt, qkv_rows, qkv, qkv_rows, false, mode, stream);
        !s)
      return s;
    if (w.qkv_bias != nullptr)
      if (Status s = kcu::add_bias(qkv, qkv_rows, w.qkv_bias, rows, qkv_rows, stream); !s) return s;
    float* q = qkv;               // [rows, heads * hd], row stride qkv_rows
    float* k = qkv + heads * hd;  // [rows, kvh * hd]
    if (w.q_norm != nullptr) {    // Qwen3: RMSNorm per head before RoPE
      if (Status s = kcu::rms_norm_heads(q, rows, qkv_rows, heads, hd, w.q_norm, eps, stream); !s) return s;
      if (Status s = kcu::rms_norm_heads(k, rows, qkv_rows, kvh, hd, w.k_norm, eps, stream); !s) return s;
    }
    if (r.real > 0) {  // padding rows have no position (and are never attended)
      const auto* positions = dev<std::int32_t>(off_positions) + r.row0;
      if (Status s = kcu::rope(q, r.real, qkv_rows, heads, hd, positions, inv_freq, stream); !s) return s;
      if (Status s = kcu::rope(k, r.real, qkv_rows, kvh, hd, positions, inv_freq, stream); !s) return s;
    }
    // Attention reads every row of the step for its heads: this rank's QKV,
    // or under SP what the all-to-all brought.
    const bool sp = spec.sp > 1;
    const float* attn_in = qkv;
    int attn_in_w = qkv_rows;
    if (sp) {
      if (Status s = ulysses_scatter(rows); !s) return s;
      attn_in = a2a_recv;
      attn_in_w = attn_w_sp;
    }
    const int attn_heads = lay.hq_attn;  // the heads attention runs here (heads without SP)
    const float* ak = attn_in + attn_heads * hd;
    const float* av = ak + lay.kv_attn * hd;
    const kernels::cpu::KvCacheLayer cache = kv_layer(l);
    if (Status s = kcu::write_kv(ak, av, attn_in_w, r.num_rows, dev<std::int32_t>(off_slots), cache, stream); !s)
      return s;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (Status s = kcu::paged_attention(attn_in, attn_in_w, dev<kcu::AttentionSeq>(off_seqs), r.num_seqs, r.max_num_q,
                                        r.max_context_len, cache, attn_heads, scale, attn, attn_heads * hd,
                                        workspace.data(), workspace.size_bytes(), stream);
        !s)
      return s;
    const int o_w = heads * hd;  // o_proj's input width: this TP rank's heads
    const float* o_in = attn;    // [rows, o_w]
    if (sp) {
      if (Status s = ulysses_gather(r.num_rows, rows); !s) return s;
      o_in = attn_t;
    }
    if (spec.tp > 1) {
      // Row-parallel o_proj: this rank's partial sum, all-reduced, then
      // residual += it and normed = rms_norm(residual) (the CPU shard's order).
      if (Status s = gemm->linear(o_in, o_w, rows, o_w, w.o_proj, wdt, hidden, proj, hidden, false, mode, stream); !s)
        return s;
      if (Status s = all_reduce(proj, r.rows_x(hidden)); !s) return s;
      return kcu::add_rms_norm(residual, proj, w.post_attention_norm, normed, rows, hidden, eps, stream);
    }
    // residual += attn . o_proj^T (the GEMM adds into its output: one rounding, as a separate add)
    if (Status s = gemm->linear(o_in, o_w, rows, o_w, w.o_proj, wdt, hidden, residual, hidden, true, mode, stream); !s)
      return s;
    return kcu::rms_norm(residual, hidden, w.post_attention_norm, normed, hidden, rows, hidden, eps, stream);
  }

  /// out[rows, hidden] = (or +=) the FFN of x[rows, hidden] with weights
  /// `w`, in chunks of rows_cap rows (the gate_up / mlp workspaces' rows).
  Status ffn_rows(const CudaFfnLayerWeights& w, const float* x, int rows, float* out, bool accumulate) {
    const int hidden = c.hidden_size;
    const int inter = lay.inter_t;
    for (int r0 = 0; r0 < rows; r0 += rows_cap) {
      const int n = std::min(rows_cap, rows - r0);
      const float* xi = x + static_cast<std::size_t>(r0) * hidden;
      float* oi = out + static_cast<std::size_t>(r0) * hidden;
      if (Status s = gemm->linear(xi, hidden, n, hidden, w.gate_up, wdt, 2 * inter, gate_up, 2 * inter, false, mode,
                                  stream);
          !s)
        return s;
      if (Status s = kcu::silu_and_mul(gate_up, mlp, n, inter, stream); !s) return s;
      if (Status s = gemm->linear(mlp, inter, n, inter, w.down, wdt, hidden, oi, hidden, accumulate, mode, stream); !s)
        return s;
    }
    return Status::ok_status();
  }

  /// The FFN half: gate_up, SwiGLU, down into the residual (all-reduced
  /// under TP); a SiDP rank's through its executor.
  Status ffn_block(const DeviceLayer& w, int layer, const StepRows& r) {
    if (ffn) return ffn->forward(lay.layer_begin + layer, normed, r.rows, residual);
    const CudaFfnLayerWeights fw{w.gate_up, w.down};
    if (spec.tp == 1) return ffn_rows(fw, normed, r.rows, residual, true);
    if (Status s = ffn_rows(fw, normed, r.rows, proj, false); !s) return s;
    if (Status s = all_reduce(proj, r.rows_x(c.hidden_size)); !s) return s;
    return kcu::add_inplace(residual, proj, static_cast<long>(r.rows_x(c.hidden_size)), stream);
  }

  /// The last stage's logits of num_logits step rows (under SP, every
  /// chunk's residual gathered first) into `logits`.
  Status final_logits(const StepRows& r, int num_logits) {
    const int hidden = c.hidden_size;
    const float* final_rows = residual;
    if (spec.sp > 1) {
      if (Status s = sync_unless(sp_ordered, "sync before all_gather"); !s) return s;
      if (Status s = sp_comm->all_gather(residual, r.rows_x(hidden), gathered); !s) return s;
      final_rows = gathered;
    }
    if (Status s = kcu::rms_norm_rows(final_rows, hidden, dev<std::int32_t>(off_logits_rows), num_logits, final_norm,
                                      logits_in, hidden, hidden, c.rms_norm_eps, stream);
        !s)
      return s;
    if (spec.tp > 1) return tp_logits(num_logits);
    return gemm->linear(logits_in, hidden, num_logits, hidden, lm_head, wdt, c.vocab_size, logits, c.vocab_size,
                        false, mode, stream);
  }

  /// Enqueues the forward pass over the metadata in `meta`: num_rows token
  /// rows of num_seqs sequences, logits of num_logits rows into `logits`.
  /// Under SP this rank runs its chunk of rows (chunk_rows) except in
  /// attention, which runs every row for its share of the heads.
  Status forward(int num_rows, int num_seqs, int max_num_q, int max_context_len, int num_logits) {
    StepRows r;
    r.num_rows = num_rows;
    r.num_seqs = num_seqs;
    r.max_num_q = max_num_q;
    r.max_context_len = max_context_len;
    r.rows = chunk_rows(num_rows);
    r.row0 = spec.sp_rank * r.rows;
    r.real = std::clamp(num_rows - r.row0, 0, r.rows);
    if (spec.first_stage())
      if (Status s = embed_rows(r); !s) return s;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (Status s = attention_block(layers[l], static_cast<int>(l), r); !s) return s;
      // The layer's KV write is queued: a stream-ordered copier may take it
      // now, behind it on the device, while the next layers compute.
      if (layer_kv_hook) layer_kv_hook(lay.layer_begin + static_cast<int>(l));
      if (Status s = ffn_block(layers[l], static_cast<int>(l), r); !s) return s;
    }
    if (num_logits == 0 || !spec.last_stage()) return Status::ok_status();
    return final_logits(r, num_logits);
  }

  /// Writes padding rows [from, to) of a decode batch into the host mirror:
  /// token 0 at position 0, no KV slot, a one-token context on block 0.
  void pad_decode_rows(int from, int to) {
    auto* tok = host<std::int32_t>(off_tokens);
    auto* pos = host<std::int32_t>(off_positions);
    auto* slot = host<std::int32_t>(off_slots);
    auto* lrows = host<std::int32_t>(off_logits_rows);
    auto* seq = host<kcu::AttentionSeq>(off_seqs);
    for (int i = from; i < to; ++i) {
      tok[i] = 0;
      pos[i] = 0;
      slot[i] = -1;
      lrows[i] = i;
      seq[i] = kcu::AttentionSeq{i, 1, 1, dev<std::int32_t>(off_pad_table)};
    }
  }

  Status upload_decode_rows(int rows) {
    const auto n = static_cast<std::size_t>(rows);
    for (std::size_t off : {off_tokens, off_positions, off_slots, off_logits_rows})
      if (Status s = copy_meta(off, n * sizeof(std::int32_t)); !s) return s;
    return copy_meta(off_seqs, n * sizeof(kcu::AttentionSeq));
  }

  /// Captures one decode graph per batch size (after an eager warm-up of the
  /// same shape, so cuBLASLt has chosen its algorithms outside the capture).
  Status capture_graphs(const std::vector<int>& sizes) {
    for (int b : sizes) {
      pad_decode_rows(0, b);
      if (Status s = upload_decode_rows(b); !s) return s;
      if (Status s = forward(b, b, 1, o.max_model_len, b); !s) return s;
      if (Status s = cuda_status("graph warm-up", cudaStreamSynchronize(stream)); !s) return s;
      if (Status s = cuda_status("begin capture", cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal)); !s)
        return s;
      const Status fwd = forward(b, b, 1, o.max_model_len, b);
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      if (!fwd) {
        if (graph != nullptr) (void)cudaGraphDestroy(graph);
        return fwd;
      }
      if (Status s = cuda_status("end capture", end); !s) return s;
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      (void)cudaGraphDestroy(graph);
      if (Status s = cuda_status("graph instantiate", inst); !s) return s;
      graphs.emplace(b, exec);
    }
    return cuda_status("graph capture", cudaStreamSynchronize(stream));
  }

  /// Uploads every weight into one device arena: matrices converted to
  /// `wdt`, norms, biases and RoPE frequencies as F32; a tied lm_head shares
  /// the embedding. Sets the layer pointers. Returns the arena's bytes.
  /// Errors: out_of_memory (the arena), internal (a copy failed).
  Result<std::size_t> upload_weights(const ModelWeights& host_weights) {
    // The CUDA runner computes on dense weights: quantized matrices (a GGUF
    // file under --dtype auto) are dequantized on the host first (issue 40).
    auto dense = dequantized_weights(std::shared_ptr<const ModelWeights>(&host_weights, [](const ModelWeights*) {}));
    if (!dense) return std::move(dense).error();
    const ModelWeights& host = **dense;
    /// rows x cols elements of a source whose rows are src_stride elements
    /// apart (a block of a matrix), to `off` in the arena, row after row.
    struct Upload {
      std::size_t off;
      const void* src;
      DType src_dtype;
      std::size_t rows, cols, src_stride;
      bool matrix;  // converted to wdt; vectors stay F32
    };
    std::vector<Upload> uploads;
    Layout wl;
    using Range = ShardLayout::Range;
    const auto element = [](const void* base, DType dt, std::size_t i) {
      return static_cast<const char*>(base) + i * dtype_size(dt);
    };
    // The rows of `mat` named by `ranges`, back to back (the whole matrix: one range).
    const auto add_rows = [&](const Matrix& mat, const std::vector<Range>& ranges) -> std::size_t {
      std::size_t rows = 0;
      for (const Range& r : ranges) rows += static_cast<std::size_t>(r.count);
      const auto cols = static_cast<std::size_t>(mat.cols);
      const std::size_t off = wl.take(rows * cols * dtype_size(wdt));
      std::size_t at = off;
      for (const Range& r : ranges) {
        uploads.push_back({at, element(mat.data, mat.dtype, static_cast<std::size_t>(r.begin) * cols), mat.dtype,
                           static_cast<std::size_t>(r.count), cols, cols, true});
        at += static_cast<std::size_t>(r.count) * cols * dtype_size(wdt);
      }
      return off;
    };
    const auto add_matrix = [&](const Matrix& mat) { return add_rows(mat, {Range{0, mat.rows}}); };
    // Columns [begin, begin + count) of every row of `mat`.
    const auto add_cols = [&](const Matrix& mat, Range cols) -> std::size_t {
      const auto rows = static_cast<std::size_t>(mat.rows);
      const std::size_t off = wl.take(rows * static_cast<std::size_t>(cols.count) * dtype_size(wdt));
      uploads.push_back({off, element(mat.data, mat.dtype, static_cast<std::size_t>(cols.begin)), mat.dtype, rows,
                         static_cast<std::size_t>(cols.count), static_cast<std::size_t>(mat.cols), true});
      return off;
    };
    const auto add_vector_ranges = [&](const Vector& v, const std::vector<Range>& ranges) -> std::size_t {
      std::size_t n = 0;
      for (const Range& r : ranges) n += static_cast<std::size_t>(r.count);
      const std::size_t off = wl.take(n * sizeof(float));
      std::size_t at = off;
      for (const Range& r : ranges) {
        const auto count = static_cast<std::size_t>(r.count);
        uploads.push_back({at, v.data + r.begin, DType::f32, 1, count, count, false});
        at += count * sizeof(float);
      }
      return off;
    };
    const auto add_vector = [&](const Vector& v) { return add_vector_ranges(v, {Range{0, v.size}}); };
    struct LayerOffsets {
      std::size_t input_norm, qkv, qkv_bias = SIZE_MAX, q_norm = SIZE_MAX, k_norm = SIZE_MAX, o_proj, post, gate_up,
                                   down;
    };
    std::vector<LayerOffsets> lo;
    // Stage 0 embeds; the last stage holds the final norm and lm_head.
    const std::size_t embed_off = spec.first_stage() ? add_matrix(host.embed_tokens) : SIZE_MAX;
    for (int l = lay.layer_begin; l < lay.layer_end; ++l) {
      const LayerWeights& lw = host.layers[static_cast<std::size_t>(l)];
      LayerOffsets x{};
      x.qkv_bias = x.q_norm = x.k_norm = SIZE_MAX;
      x.input_norm = add_vector(lw.input_norm);
      x.qkv = add_rows(lw.qkv, lay.qkv_rows);
      if (!lw.qkv_bias.empty()) x.qkv_bias = add_vector_ranges(lw.qkv_bias, lay.qkv_rows);
      if (!lw.q_norm.empty()) x.q_norm = add_vector(lw.q_norm);
      if (!lw.k_norm.empty()) x.k_norm = add_vector(lw.k_norm);
      x.o_proj = add_cols(lw.o_proj, lay.o_proj_cols);
      x.post = add_vector(lw.post_attention_norm);
      // SiDP's ranks hold no FFN weights (their provider has them).
      x.gate_up = ffn ? SIZE_MAX : add_rows(lw.gate_up, lay.gate_up_rows);
      x.down = ffn ? SIZE_MAX : add_cols(lw.down_proj, lay.down_cols);
      lo.push_back(x);
    }
    // A tied lm_head shares the embedding on one device; a TP rank holds
    // its vocabulary slice (none on a rank past the vocabulary's end); a
    // last stage that does not embed holds its own copy.
    const bool tied = host.lm_head.data == host.embed_tokens.data;
    std::size_t lm_off = SIZE_MAX, norm_off = SIZE_MAX;
    if (spec.last_stage()) {
      if (spec.tp > 1)
        lm_off = lay.vocab_rows > 0 ? add_rows(host.lm_head, {Range{lay.vocab_begin, lay.vocab_rows}}) : SIZE_MAX;
      else if (tied && spec.first_stage())
        lm_off = embed_off;
      else
        lm_off = add_matrix(host.lm_head);
      norm_off = add_vector(host.final_norm);
    }
    const std::vector<float> freqs = kernels::cpu::rope_inv_freq(rope_params_for(c));
    const std::size_t freq_off = wl.take(freqs.size() * sizeof(float));
    uploads.push_back({freq_off, freqs.data(), DType::f32, 1, freqs.size(), freqs.size(), false});

    {
      auto buf = kcu::DeviceBuffer::allocate(wl.bytes);
      if (!buf) return make_error(buf.error().code, "model weights (" + std::to_string(wl.bytes) + " bytes): " +
                                                        buf.error().message);
      weights = std::move(buf).value();
    }
    std::vector<char> staging, gathered;
    for (const Upload& u : uploads) {
      const DType dst = u.matrix ? wdt : DType::f32;
      const std::size_t count = u.rows * u.cols;
      const std::size_t bytes = count * dtype_size(dst);
      const void* src = u.src;
      if (u.src_stride != u.cols) {  // a column block: its rows gathered first
        const std::size_t row_bytes = u.cols * dtype_size(u.src_dtype);
        gathered.resize(u.rows * row_bytes);
        for (std::size_t r = 0; r < u.rows; ++r)
          std::memcpy(gathered.data() + r * row_bytes, element(u.src, u.src_dtype, r * u.src_stride), row_bytes);
        src = gathered.data();
      }
      if (u.src_dtype != dst) {
        staging.resize(bytes);
        convert_matrix(src, u.src_dtype, count, dst, staging.data());
        src = staging.data();
      }
      if (Status s = cuda_status("weight upload", cudaMemcpy(weights.as<char>() + u.off, src, bytes,
                                                             cudaMemcpyHostToDevice));
          !s)
        return s.error();
    }
    staging = {};
    gathered = {};
    layers.clear();
    char* wbase = weights.as<char>();
    const auto fptr = [&](std::size_t off) { return off == SIZE_MAX ? nullptr : reinterpret_cast<const float*>(wbase + off); };
    embed = embed_off == SIZE_MAX ? nullptr : wbase + embed_off;
    lm_head = lm_off == SIZE_MAX ? nullptr : wbase + lm_off;
    final_norm = fptr(norm_off);
    inv_freq = fptr(freq_off);
    for (const LayerOffsets& x : lo) {
      DeviceLayer d;
      d.input_norm = fptr(x.input_norm);
      d.qkv = wbase + x.qkv;
      d.qkv_bias = fptr(x.qkv_bias);
      d.q_norm = fptr(x.q_norm);
      d.k_norm = fptr(x.k_norm);
      d.o_proj = wbase + x.o_proj;
      d.post_attention_norm = fptr(x.post);
      d.gate_up = x.gate_up == SIZE_MAX ? nullptr : wbase + x.gate_up;
      d.down = x.down == SIZE_MAX ? nullptr : wbase + x.down;
      layers.push_back(d);
    }
    return wl.bytes;
  }

  /// Allocates the paged KV cache ([layers, 2, num_kv_blocks, kv_heads,
  /// block_size, head_dim] in o.kv_cache_dtype), zeroed, or takes
  /// o.kv_memory (another runner's, as it is). Returns its bytes. Errors:
  /// out_of_memory naming the blocks and bytes; invalid_argument for a
  /// kv_memory smaller than the cache.
  Result<std::size_t> allocate_kv_cache() {
    kv_layer_bytes = kv_half_layer_bytes(c, o, lay);
    const std::size_t kv_bytes = 2 * kv_layer_bytes * static_cast<std::size_t>(lay.layer_end - lay.layer_begin);  // the stage's layers
    if (o.kv_memory != nullptr) {
      if (o.kv_memory_bytes < kv_bytes)
        return make_error(ErrorCode::invalid_argument, "cuda runner: kv_memory of " +
                                                           std::to_string(o.kv_memory_bytes) + " bytes, the cache needs " +
                                                           std::to_string(kv_bytes));
      kv_data = static_cast<char*>(o.kv_memory);
      return kv_bytes;
    }
    {
      auto buf = kcu::DeviceBuffer::allocate(kv_bytes);
      if (!buf) return make_error(buf.error().code, "KV cache (" + std::to_string(o.num_kv_blocks) + " blocks, " +
                                                        std::to_string(kv_bytes) + " bytes): " + buf.error().message);
      kv = std::move(buf).value();
      if (Status s = kv.fill_bytes(0); !s) return s.error();
      kv_data = kv.as<char>();
    }
    return kv_bytes;
  }

  /// Allocates the activation arena (sized for max_num_batched_tokens rows
  /// and max_num_seqs logits rows) and the split-decode attention workspace.
  /// Errors: out_of_memory.
  Status allocate_activations() {
    const int hidden = c.hidden_size;
    const int hd = c.head_dim;
    const int inter = lay.inter_t;
    seqs_cap = o.max_num_seqs;
    rows_cap = std::max(o.max_num_batched_tokens, o.max_num_seqs);
    max_blocks = (o.max_model_len + o.block_size - 1) / o.block_size;
    const auto rows = static_cast<std::size_t>(rows_cap);
    const auto seqs = static_cast<std::size_t>(seqs_cap);
    // Under SP attention's rows are every chunk's: sp * ceil(rows / sp).
    const std::size_t all_rows = static_cast<std::size_t>(spec.sp) * static_cast<std::size_t>(chunk_rows(rows_cap));
    Layout al;
    const std::size_t a_res = al.take(rows * hidden * 4), a_norm = al.take(rows * hidden * 4),
                      a_qkv = al.take(rows * qkv_rows * 4), a_attn = al.take(all_rows * lay.hq_attn * hd * 4),
                      a_gu = al.take(rows * 2 * inter * 4), a_mlp = al.take(rows * inter * 4),
                      a_lin = al.take(seqs * hidden * 4), a_log = al.take(seqs * c.vocab_size * 4);
    const bool tp = spec.tp > 1;
    const std::size_t a_proj = tp ? al.take(rows * hidden * 4) : 0,
                      a_all = tp ? al.take(static_cast<std::size_t>(spec.tp) * seqs * lay.vocab_shard * 4) : 0;
    const bool sp = spec.sp > 1;
    const std::size_t chunk = static_cast<std::size_t>(chunk_rows(rows_cap));
    const std::size_t a_send = sp ? al.take(all_rows * attn_w_sp * 4) : 0,
                      a_recv = sp ? al.take(all_rows * attn_w_sp * 4) : 0,
                      a_back = sp ? al.take(all_rows * lay.hq_attn * hd * 4) : 0,
                      a_attn_t = sp ? al.take(chunk * lay.hq_t * hd * 4) : 0,
                      a_gathered = sp ? al.take(all_rows * hidden * 4) : 0;
    {
      auto buf = kcu::DeviceBuffer::allocate(al.bytes);
      if (!buf) return make_error(buf.error().code, "activations (" + std::to_string(al.bytes) + " bytes): " +
                                                        buf.error().message);
      act = std::move(buf).value();
    }
    char* abase = act.as<char>();
    residual = reinterpret_cast<float*>(abase + a_res);
    normed = reinterpret_cast<float*>(abase + a_norm);
    qkv = reinterpret_cast<float*>(abase + a_qkv);
    attn = reinterpret_cast<float*>(abase + a_attn);
    gate_up = reinterpret_cast<float*>(abase + a_gu);
    mlp = reinterpret_cast<float*>(abase + a_mlp);
    logits_in = reinterpret_cast<float*>(abase + a_lin);
    logits = reinterpret_cast<float*>(abase + a_log);
    if (tp) {
      proj = reinterpret_cast<float*>(abase + a_proj);
      logits_all = reinterpret_cast<float*>(abase + a_all);
    }
    if (sp) {
      a2a_send = reinterpret_cast<float*>(abase + a_send);
      a2a_recv = reinterpret_cast<float*>(abase + a_recv);
      attn_back = reinterpret_cast<float*>(abase + a_back);
      attn_t = reinterpret_cast<float*>(abase + a_attn_t);
      gathered = reinterpret_cast<float*>(abase + a_gathered);
    }

    const std::size_t ws_bytes = kcu::paged_attention_workspace_bytes(seqs_cap, lay.hq_t, hd, o.max_model_len);
    {
      auto buf = kcu::DeviceBuffer::allocate(ws_bytes);
      if (!buf) return make_error(buf.error().code, "attention workspace: " + buf.error().message);
      workspace = std::move(buf).value();
    }
    return Status::ok_status();
  }

  /// Allocates the step metadata at fixed device addresses (what decode
  /// graphs replay from), its pinned host mirror, and the GEMM context.
  /// After allocate_activations (which sets the row and sequence caps).
  /// Errors: out_of_memory, internal.
  Status allocate_metadata() {
    const int hidden = c.hidden_size;
    const int hd = c.head_dim;
    const int inter = c.intermediate_size;
    const Layout ml = layout_metadata();
    {
      auto buf = kcu::DeviceBuffer::allocate(ml.bytes);
      if (!buf) return make_error(buf.error().code, "step metadata: " + buf.error().message);
      meta = std::move(buf).value();
      if (Status s = meta.fill_bytes(0); !s) return s.error();  // the pad table's block 0
    }
    if (Status s = cuda_status("pinned metadata", cudaMallocHost(&meta_host, ml.bytes)); !s) return s.error();
    std::memset(meta_host, 0, ml.bytes);

    {
      auto g = kcu::GemmContext::create(rows_cap, std::max({hidden, inter, c.num_attention_heads * hd}));
      if (!g) return g.error();
      gemm = std::move(g).value();
    }
    return Status::ok_status();
  }

  /// Captures the decode graphs when asked; a failed capture leaves the
  /// runner eager and records why (graph_error).
  void capture_graphs_or_run_eager() {
    if (o.cuda_graphs) {
      if (Status s = capture_graphs(o.cuda_graph_batch_sizes); !s) {
        // Graphs are an optimisation: run eagerly and say why.
        for (auto& [b, g] : graphs) (void)cudaGraphExecDestroy(g);
        graphs.clear();
        graph_error = s.error().message;
        (void)cudaGetLastError();
        (void)cudaStreamSynchronize(stream);
      }
    }
  }

  /// What pack_step found out about a step.
  struct PackedStep {
    int graph_batch = 0;  ///< > 0: replay the decode graph of this batch size
    int max_num_q = 0;    ///< most new tokens of one sequence
    int max_context_len = 0;
  };

  /// Packs a step's metadata into the pinned mirror (block tables back to
  /// back), pads a decode batch up to a captured graph's size, and enqueues
  /// the copies to the device. Errors: invalid_argument (a sequence longer
  /// than max_model_len), internal (a copy failed).
  Result<PackedStep> pack_step(const model::StepInput& in) {
    const int n = in.num_tokens();
    const int num_seqs = static_cast<int>(in.seqs.size());
    const int num_logits = in.num_logits();
    const auto bad_step = [](const std::string& msg) { return make_error(ErrorCode::invalid_argument, "step: " + msg); };
    std::memcpy(host<std::int32_t>(off_tokens), in.token_ids.data(), static_cast<std::size_t>(n) * 4);
    std::memcpy(host<std::int32_t>(off_positions), in.positions.data(), static_cast<std::size_t>(n) * 4);
    std::memcpy(host<std::int32_t>(off_slots), in.slot_mapping.data(), static_cast<std::size_t>(n) * 4);
    std::memcpy(host<std::int32_t>(off_logits_rows), in.logits_rows.data(), static_cast<std::size_t>(num_logits) * 4);
    auto* seqs = host<kcu::AttentionSeq>(off_seqs);
    auto* tables = host<std::int32_t>(off_tables);  // packed: each sequence's used entries, back to back
    std::size_t table_entries = 0;
    int row = 0, max_num_q = 0, max_ctx = 0;
    bool decode_only = true;
    for (int i = 0; i < num_seqs; ++i) {
      const model::StepSeq& s = in.seqs[static_cast<std::size_t>(i)];
      const int ctx = s.num_computed_tokens + s.num_new_tokens;
      if (ctx > o.max_model_len)
        return bad_step("sequence " + std::to_string(s.seq_id) + " reaches " + std::to_string(ctx) +
                        " tokens > max_model_len " + std::to_string(o.max_model_len));
      const auto nblocks = static_cast<std::size_t>((ctx + o.block_size - 1) / o.block_size);
      std::memcpy(tables + table_entries, s.block_table.data(), nblocks * 4);
      seqs[i] = kcu::AttentionSeq{row, s.num_new_tokens, ctx, dev<std::int32_t>(off_tables) + table_entries};
      table_entries += nblocks;
      row += s.num_new_tokens;
      max_num_q = std::max(max_num_q, s.num_new_tokens);
      max_ctx = std::max(max_ctx, ctx);
      decode_only = decode_only && s.num_new_tokens == 1 && s.needs_logits;
    }
    // A decode step of every sequence, logits in row order: a graph fits.
    int graph_batch = 0;
    if (decode_only && num_logits == num_seqs) {
      const auto it = graphs.lower_bound(num_seqs);
      if (it != graphs.end()) graph_batch = it->first;
    }
    if (graph_batch > 0) pad_decode_rows(num_seqs, graph_batch);
    const int rows_up = std::max(n, graph_batch);
    const int seqs_up = std::max(num_seqs, graph_batch);
    for (std::size_t off : {off_tokens, off_positions, off_slots})
      if (Status s = copy_meta(off, static_cast<std::size_t>(rows_up) * 4); !s) return s.error();
    if (Status s = copy_meta(off_logits_rows, static_cast<std::size_t>(std::max(num_logits, graph_batch)) * 4); !s)
      return s.error();
    if (Status s = copy_meta(off_seqs, static_cast<std::size_t>(seqs_up) * sizeof(kcu::AttentionSeq)); !s)
      return s.error();
    if (Status s = copy_meta(off_tables, table_entries * 4); !s) return s.error();
    return PackedStep{graph_batch, max_num_q, max_ctx};
  }

  /// Samples the step's num_logits rows on the device (penalty and masked
  /// id lists and grammar bitmasks uploaded alongside) and returns the ids,
  /// after the stream's sync. Errors: invalid_argument (rows and sequences
  /// disagree, a bitmask of the wrong size), internal.
  Result<std::vector<std::int32_t>> sample_on_device(const model::StepInput& in, int num_logits) {
    // Penalty ids, output counts, masked ids and grammar bitmask words
    // (as int32) of every row.
    std::vector<std::int32_t>& extra = extra_host;
    extra.clear();
    struct Spans {
      std::size_t ids = 0, counts = 0, masked = 0, bitmask = 0;
      int num_ids = 0, num_masked = 0;
      bool has_bitmask = false;
    };
    const auto bitmask_words = static_cast<std::size_t>((c.vocab_size + 31) / 32);
    std::vector<Spans> spans(static_cast<std::size_t>(num_logits));
    std::vector<std::uint64_t> row_seq_ids;  // the sequence of each logits row (rows follow seqs' order)
    row_seq_ids.reserve(static_cast<std::size_t>(num_logits));
    for (const model::StepSeq& sq : in.seqs)
      if (sq.needs_logits) row_seq_ids.push_back(sq.seq_id);
    if (static_cast<int>(row_seq_ids.size()) != num_logits)
      return make_error(ErrorCode::invalid_argument, "step: " + std::to_string(num_logits) + " logits rows for " +
                                                         std::to_string(row_seq_ids.size()) +
                                                         " sequences that need logits");
    for (int i = 0; i < num_logits; ++i) {
      const model::RowSampling& rs = in.sampling[static_cast<std::size_t>(i)];
      Spans& sp = spans[static_cast<std::size_t>(i)];
      if (has_penalties(*rs.params)) {
        const kcu::PenaltyList& pl =
            penalties.get(row_seq_ids[static_cast<std::size_t>(i)], rs.ctx.prompt_ids, rs.ctx.output_ids,
                            c.vocab_size);
        sp.num_ids = static_cast<int>(pl.ids.size());
        sp.ids = extra.size();
        extra.insert(extra.end(), pl.ids.begin(), pl.ids.end());
        sp.counts = extra.size();
        extra.insert(extra.end(), pl.output_counts.begin(), pl.output_counts.end());
      }
      if (rs.params->min_tokens > 0 && static_cast<int>(rs.ctx.output_ids.size()) < rs.params->min_tokens) {
        sp.num_masked = static_cast<int>(rs.ctx.min_tokens_masked_ids.size());
        sp.masked = extra.size();
        extra.insert(extra.end(), rs.ctx.min_tokens_masked_ids.begin(), rs.ctx.min_tokens_masked_ids.end());
      }
      if (!rs.token_bitmask.empty()) {
        if (rs.token_bitmask.size() != bitmask_words)
          return make_error(ErrorCode::invalid_argument,
                            "step: row " + std::to_string(i) + "'s token bitmask has " +
                                std::to_string(rs.token_bitmask.size()) + " words, " +
                                std::to_string(bitmask_words) + " for a vocabulary of " +
                                std::to_string(c.vocab_size));
        sp.has_bitmask = true;
        sp.bitmask = extra.size();
        for (const std::uint32_t w : rs.token_bitmask) extra.push_back(std::bit_cast<std::int32_t>(w));
      }
    }
    if (extra.size() * 4 > sample_ids.size_bytes()) {
      if (Status s = cuda_status("sync", cudaStreamSynchronize(stream)); !s) return s.error();
      sample_ids.reset();
      auto buf = kcu::DeviceBuffer::allocate(std::max<std::size_t>(extra.size() * 4 * 2, 1 << 16));
      if (!buf) return buf.error();
      sample_ids = std::move(buf).value();
    }
    const auto* extra_dev = sample_ids.as<std::int32_t>();
    auto* rows_host = host<kcu::SampleRow>(off_sample_rows);
    for (int i = 0; i < num_logits; ++i) {
      const model::RowSampling& rs = in.sampling[static_cast<std::size_t>(i)];
      const Spans& sp = spans[static_cast<std::size_t>(i)];
      kcu::SampleRow r = kcu::make_sample_row(*rs.params, rs.ctx);
      if (sp.num_ids > 0) {
        r.penalty_ids = extra_dev + sp.ids;
        r.output_counts = extra_dev + sp.counts;
        r.num_penalty_ids = sp.num_ids;
      }
      if (sp.num_masked > 0) {
        r.masked_ids = extra_dev + sp.masked;
        r.num_masked_ids = sp.num_masked;
      }
      if (sp.has_bitmask) r.token_bitmask = reinterpret_cast<const std::uint32_t*>(extra_dev + sp.bitmask);
      rows_host[i] = r;
    }
    // `extra` lives in the runner until the next step, after this one's sync.
    if (!extra.empty())
      if (Status s = cuda_status("sampling ids", cudaMemcpyAsync(sample_ids.data(), extra.data(), extra.size() * 4,
                                                                 cudaMemcpyHostToDevice, stream));
          !s)
        return s.error();
    if (Status s = copy_meta(off_sample_rows, static_cast<std::size_t>(num_logits) * sizeof(kcu::SampleRow)); !s)
      return s.error();
    if (Status s = kcu::sample(logits, num_logits, c.vocab_size, dev<kcu::SampleRow>(off_sample_rows),
                               dev<std::int32_t>(off_sampled), stream);
        !s)
      return s.error();
    if (Status s = cuda_status("sampled ids", cudaMemcpyAsync(host<std::int32_t>(off_sampled),
                                                              dev<std::int32_t>(off_sampled),
                                                              static_cast<std::size_t>(num_logits) * 4,
                                                              cudaMemcpyDeviceToHost, stream));
        !s)
      return s.error();
    if (Status s = cuda_status("step", cudaStreamSynchronize(stream)); !s) return s.error();
    const auto* ids = host<std::int32_t>(off_sampled);
    std::vector<std::int32_t> out(ids, ids + num_logits);
    penalties.end_step();
    return out;
  }
};

std::uint64_t cuda_runner_workspace_bytes(const ModelConfig& c, const CudaRunnerOptions& o, const ShardSpec& spec) {
  if (o.max_num_batched_tokens <= 0 || o.max_num_seqs <= 0 || o.max_model_len <= 0 || o.block_size <= 0) return 0;
  CudaModelRunner::Impl m;
  m.spec = spec;
  m.rows_cap = std::max(o.max_num_batched_tokens, o.max_num_seqs);
  m.seqs_cap = o.max_num_seqs;
  m.max_blocks = (o.max_model_len + o.block_size - 1) / o.block_size;
  const std::uint64_t metadata = m.layout_metadata().bytes;
  const int max_k = std::max({c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim});
  const std::uint64_t cast_scratch = static_cast<std::uint64_t>(m.rows_cap) *
                                     static_cast<std::uint64_t>(kcu::cast_row_stride(max_k)) * 2;
  const std::uint64_t attention =
      kcu::paged_attention_workspace_bytes(m.seqs_cap, c.num_attention_heads, c.head_dim, o.max_model_len);
  const std::uint64_t logits_in = static_cast<std::uint64_t>(m.seqs_cap) * c.hidden_size * 4;
  std::uint64_t ulysses = 0;  // SP's all-to-all buffers, the attended rows' and the gathered residual
  if (spec.sp > 1) {
    const ShardLayout lay = shard_layout(c, spec);
    const auto hd = static_cast<std::uint64_t>(c.head_dim);
    const auto chunk = static_cast<std::uint64_t>(m.chunk_rows(m.rows_cap));
    const std::uint64_t all_rows = static_cast<std::uint64_t>(spec.sp) * chunk;
    const std::uint64_t attn_w_sp = static_cast<std::uint64_t>(lay.hq_attn + 2 * lay.kv_attn) * hd;
    ulysses = (all_rows * (2 * attn_w_sp + static_cast<std::uint64_t>(lay.hq_attn) * hd + c.hidden_size) +
               chunk * static_cast<std::uint64_t>(lay.hq_t) * hd) *
              4;
  }
  return metadata + cast_scratch + attention + logits_in + ulysses + kcu::kGemmWorkspaceBytes;
}

std::size_t cuda_runner_kv_cache_bytes(const ModelConfig& c, const CudaRunnerOptions& o, const ShardSpec& spec) {
  const ShardLayout lay = shard_layout(c, spec);
  return 2 * static_cast<std::size_t>(lay.layer_end - lay.layer_begin) * kv_half_layer_bytes(c, o, lay);
}

std::uint64_t cuda_runner_weight_bytes(const ModelConfig& c, DType wdt, const ShardSpec& spec) {
  const ShardLayout lay = shard_layout(c, spec);
  const auto hidden = static_cast<std::uint64_t>(c.hidden_size);
  const std::uint64_t w = dtype_size(wdt);
  Layout wl;  // the arena's bump allocator, as upload_weights takes its regions
  const auto matrix = [&](std::uint64_t rows, std::uint64_t cols) { (void)wl.take(rows * cols * w); };
  const auto vector = [&](std::uint64_t n) { (void)wl.take(n * sizeof(float)); };
  const auto hd = static_cast<std::uint64_t>(c.head_dim);
  const auto qkv = static_cast<std::uint64_t>(lay.hq_t + 2 * lay.kv_t) * hd;
  if (spec.first_stage()) matrix(static_cast<std::uint64_t>(c.vocab_size), hidden);  // embedding
  for (int l = lay.layer_begin; l < lay.layer_end; ++l) {
    vector(hidden);
    matrix(qkv, hidden);
    if (c.qkv_bias) vector(qkv);
    if (c.qk_norm) {
      vector(hd);
      vector(hd);
    }
    matrix(hidden, static_cast<std::uint64_t>(lay.hq_t) * hd);
    vector(hidden);
    matrix(2 * static_cast<std::uint64_t>(lay.inter_t), hidden);
    matrix(hidden, static_cast<std::uint64_t>(lay.inter_t));
  }
  if (spec.last_stage()) {
    if (spec.tp > 1) {
      if (lay.vocab_rows > 0) matrix(static_cast<std::uint64_t>(lay.vocab_rows), hidden);
    } else if (!c.tie_word_embeddings || !spec.first_stage()) {
      matrix(static_cast<std::uint64_t>(c.vocab_size), hidden);
    }
    vector(hidden);  // final norm
  }
  vector(hd / 2);  // RoPE frequencies
  return wl.bytes;
}

CudaModelRunner::CudaModelRunner(std::unique_ptr<Impl> impl, ModelConfig config, CudaRunnerOptions options,
                                 ShardSpec spec)
    : impl_(std::move(impl)), config_(std::move(config)), options_(std::move(options)), spec_(spec) {}

CudaModelRunner::~CudaModelRunner() {
  if (!impl_) return;
  (void)cudaSetDevice(options_.device_index);
  if (impl_->ffn) impl_->ffn->bind(nullptr);
}

std::vector<int> CudaModelRunner::captured_batch_sizes() const {
  std::vector<int> out;
  for (const auto& [b, g] : impl_->graphs) out.push_back(b);
  return out;
}

Result<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(std::shared_ptr<const ModelWeights> weights,
                                                                 const CudaRunnerOptions& options,
                                                                 const ShardSpec& spec, ShardComms comms,
                                                                 std::shared_ptr<CudaFfnExecutor> ffn) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "cuda runner: no weights");
  if (ffn && !spec.is_whole_model())
    return make_error(ErrorCode::invalid_argument, "cuda runner: SiDP's FFN provider runs on whole-model ranks");
  const ModelConfig& c = weights->config;
  Result<CudaRunnerOptions> checked = checked_options(c, options);
  if (!checked) return std::move(checked).error();
  CudaRunnerOptions o = std::move(checked).value();
  if (Status s = check_cuda_spec(c, spec, comms); !s) return s.error();
  // A group's step is not captured: the in-process device communicator meets
  // its peers on the host at every collective (a rendezvous a graph cannot
  // replay), and the fake NCCL does not model capture.
  if (!spec.is_whole_model()) o.cuda_graphs = false;
  if (!o.upload_weights) o.cuda_graphs = false;       // a graph would hold the weight arena's addresses
  if (ffn) o.cuda_graphs = false;                     // SiDP: the executor works on the host between layers
  if (Status s = select_device(o.device_index); !s) return s.error();

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.c = c;
  m.o = o;
  m.spec = spec;
  m.lay = shard_layout(c, spec);
  m.ffn = std::move(ffn);
  m.tp_comm = spec.tp > 1 ? comms.tp : nullptr;
  m.pp_comm = spec.pp > 1 ? comms.pp : nullptr;
  m.sp_comm = spec.sp > 1 ? comms.sp : nullptr;
  m.attn_w_sp = (m.lay.hq_attn + 2 * m.lay.kv_attn) * c.head_dim;
  // SP rank j's first attended KV head, among this TP rank's (the CPU shard's arithmetic).
  for (int j = 0; j < spec.sp; ++j)
    m.sp_kv_begin.push_back((spec.tp_rank * m.lay.hq_t + j * m.lay.hq_attn) / c.num_queries_per_kv() -
                            m.lay.kv_begin_t);
  m.mode = o.deterministic ? kcu::GemmMode::batch_invariant : kcu::GemmMode::fast;
  const DType wdt = o.weight_dtype;
  if (wdt != DType::f32 && wdt != DType::bf16 && wdt != DType::f16)
    return make_error(ErrorCode::invalid_argument,
                      std::string("cuda runner: weight dtype ") + dtype_name(wdt) + " not supported");
  m.wdt = wdt;
  if (Status s = cuda_status("stream", cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking)); !s)
    return s.error();
  if (o.stream_ordered_comms) {
    // Each communicator of this rank, bound to its stream once; one that
    // cannot be (a host-synchronised backend) keeps the older contract.
    const auto bind = [&](comm::Communicator* comm, bool& ordered, bool point_to_point) -> Status {
      if (comm == nullptr) return Status::ok_status();
      if (Status b = comm->bind_stream(m.stream); !b) {
        // Only a backend without stream order stays host-synchronised; any
        // other failure would leave this rank unbound among bound peers.
        if (b.error().code == ErrorCode::unsupported) return Status::ok_status();
        return make_error(b.error().code, "cuda runner: binding a communicator to the stream: " + b.error().message);
      }
      ordered = point_to_point ? comm->point_to_point_in_stream_order() : comm->collectives_in_stream_order();
      return Status::ok_status();
    };
    if (Status s = bind(m.tp_comm, m.tp_ordered, false); !s) return s.error();
    if (Status s = bind(m.sp_comm, m.sp_ordered, false); !s) return s.error();
    if (Status s = bind(m.pp_comm, m.pp_ordered, true); !s) return s.error();
  }

  m.qkv_rows = (m.lay.hq_t + 2 * m.lay.kv_t) * c.head_dim;

  Result<std::size_t> weight_bytes = o.upload_weights ? m.upload_weights(*weights) : Result<std::size_t>(std::size_t{0});
  if (!weight_bytes) return std::move(weight_bytes).error();
  Result<std::size_t> kv_bytes = m.allocate_kv_cache();
  if (!kv_bytes) return std::move(kv_bytes).error();
  if (Status s = m.allocate_activations(); !s) return s.error();
  if (Status s = m.allocate_metadata(); !s) return s.error();
  // The uploads and memsets above ran on the legacy default stream, which
  // the runner's non-blocking stream does not wait for: finish them first.
  if (Status s = cuda_status("setup", cudaDeviceSynchronize()); !s) return s.error();
  m.capture_graphs_or_run_eager();
  m.ffn_math.m = &m;
  if (m.ffn) m.ffn->bind(&m.ffn_math);

  auto runner = std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(impl), c, o, spec));
  runner->weight_bytes_ = *weight_bytes;
  runner->kv_cache_bytes_ = *kv_bytes;
  return runner;
}

const std::string& CudaModelRunner::graph_capture_error() const { return impl_->graph_error; }

Status upload_ffn_layer(const LayerWeights& layer, DType weight_dtype, std::size_t down_offset, void* region) {
  const Matrix* parts[2] = {&layer.gate_up, &layer.down_proj};
  const std::size_t offsets[2] = {0, down_offset};
  std::vector<char> staging;
  for (int i = 0; i < 2; ++i) {
    const Matrix& m = *parts[i];
    if (m.empty())
      return make_error(ErrorCode::invalid_argument, "upload_ffn_layer: the layer's FFN matrices are not in host memory");
    const std::size_t count = static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols);
    staging.resize(count * dtype_size(weight_dtype));
    convert_matrix(m.data, m.dtype, count, weight_dtype, staging.data());
    if (Status s = cuda_status("FFN upload", cudaMemcpy(static_cast<char*>(region) + offsets[i], staging.data(),
                                                         staging.size(), cudaMemcpyHostToDevice));
        !s)
      return s;
  }
  // From pageable memory the copies land on the legacy stream: wait for them.
  return cuda_status("FFN upload", cudaDeviceSynchronize());
}

Status CudaModelRunner::release_weights() {
  if (!impl_->graphs.empty())
    return make_error(ErrorCode::unsupported, "cuda runner: weights cannot be released under captured decode graphs");
  if (Status s = cuda_status("set device", cudaSetDevice(options_.device_index)); !s) return s;
  impl_->weights.reset();  // waits for the device's work, as cudaFree does
  impl_->layers.clear();
  impl_->embed = impl_->lm_head = nullptr;
  impl_->final_norm = impl_->inv_freq = nullptr;
  weight_bytes_ = 0;
  return Status::ok_status();
}

Status CudaModelRunner::load_weights(const ModelWeights& host) {
  if (weights_on_device()) return Status::ok_status();
  if (host.config.num_hidden_layers != config_.num_hidden_layers ||
      host.layers.size() != static_cast<std::size_t>(config_.num_hidden_layers) ||
      host.config.hidden_size != config_.hidden_size || host.embed_tokens.data == nullptr)
    return make_error(ErrorCode::invalid_argument,
                      "cuda runner: load_weights needs the model's matrices in host memory (this model, not freed)");
  if (Status s = cuda_status("set device", cudaSetDevice(options_.device_index)); !s) return s;
  Result<std::size_t> bytes = impl_->upload_weights(host);
  if (!bytes) {
    impl_->weights.reset();  // a half-filled arena: freed, so a retry does not hold two
    impl_->layers.clear();
    return bytes.error();
  }
  // The uploads ran on the legacy default stream: the runner's does not wait for it.
  if (Status s = cuda_status("weight upload", cudaDeviceSynchronize()); !s) return s;
  weight_bytes_ = *bytes;
  return Status::ok_status();
}

kvstore::KvModelShape CudaModelRunner::kv_model_shape() const {
  return kvstore::KvModelShape{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
                               options_.kv_cache_dtype};
}

DeviceKvCache CudaModelRunner::device_kv_cache() const {
  const Impl& m = *impl_;
  DeviceKvCache d;
  d.data = m.kv_data;  // the copier writes it (copy_in) between steps
  d.device = options_.device_index;
  d.writer = m.stream;  // begin_copy_out orders its copies after this stream's queued KV writes
  d.layout.layer_begin = m.lay.layer_begin;
  d.layout.layer_end = m.lay.layer_end;
  d.layout.num_blocks = options_.num_kv_blocks;
  d.layout.block_size = options_.block_size;
  // Local slot i holds the i-th KV head read by the first query head this
  // rank attends (the CPU shard's kv_cache_view arithmetic).
  const int first = (spec_.tp_rank * m.lay.hq_t + spec_.sp_rank * m.lay.hq_attn) / config_.num_queries_per_kv();
  for (int i = 0; i < m.lay.kv_attn; ++i) d.layout.kv_heads.push_back(first + i);
  return d;
}

bool CudaModelRunner::supports_layer_kv_hook() const {
  // One rank that runs every layer, whose copier orders its copies on the
  // device (a group's ranks run on threads of their own).
  return spec_.is_whole_model();
}

void CudaModelRunner::set_layer_kv_hook(LayerKvHook hook) { impl_->layer_kv_hook = std::move(hook); }

kvstore::KvCopier* CudaModelRunner::kv_copier() {
  if (!kv_copier_) {
    auto c = CudaKvCopier::create(kv_model_shape(), {device_kv_cache()});
    if (c) kv_copier_ = std::move(c).value();
  }
  return kv_copier_.get();
}

Result<model::StepOutput> CudaModelRunner::execute(const model::StepInput& in) {
  Result<model::StepOutput> out = run_step(in);
  // A step that failed after queueing copies from the pinned mirror must not
  // leave them in flight: the next step rewrites the mirror.
  if (!out.ok()) {
    (void)impl_->settle();
    if (impl_->ffn) impl_->ffn->abort_step();
  }
  return out;
}

Result<model::StepOutput> CudaModelRunner::run_step(const model::StepInput& in) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  last_stats_ = CudaStepStats{};
  if (Status s = validate_step(in, config_.vocab_size, options_.num_kv_blocks, options_.block_size); !s)
    return s.error();
  model::StepOutput out;
  out.vocab_size = config_.vocab_size;
  const int n = in.num_tokens();
  const int num_seqs = static_cast<int>(in.seqs.size());
  const int num_logits = in.num_logits();
  const auto bad = [](const std::string& msg) { return make_error(ErrorCode::invalid_argument, "step: " + msg); };
  if (!in.sampling.empty() && static_cast<int>(in.sampling.size()) != num_logits)
    return bad("sampling has " + std::to_string(in.sampling.size()) + " rows for " + std::to_string(num_logits) +
               " logits rows");
  if (n == 0) return out;
  if (!weights_on_device()) return bad("this runner's weights are released (Seesaw's reload): load_weights first");
  if (n > m.rows_cap) return bad(std::to_string(n) + " tokens > max_num_batched_tokens " + std::to_string(m.rows_cap));
  if (num_seqs > m.seqs_cap || num_logits > m.seqs_cap)
    return bad(std::to_string(num_seqs) + " sequences / " + std::to_string(num_logits) + " logits rows > max_num_seqs " +
               std::to_string(m.seqs_cap));
  if (Status s = cuda_status("set device", cudaSetDevice(options_.device_index)); !s) return s.error();

  Result<Impl::PackedStep> packed = m.pack_step(in);
  if (!packed) return std::move(packed).error();
  last_stats_.upload_ms = ms_since(t0);

  const auto t1 = Clock::now();
  if (packed->graph_batch > 0) {
    last_stats_.used_graph = true;
    last_stats_.padded_batch = packed->graph_batch;
    if (Status s = cuda_status("graph launch", cudaGraphLaunch(m.graphs.at(packed->graph_batch), m.stream)); !s)
      return s.error();
  } else {
    // PP: a later stage takes the previous stage's residual [n, hidden]
    // (the receive completes before this stream's kernels are enqueued).
    const std::size_t residual_bytes = static_cast<std::size_t>(m.chunk_rows(n)) * config_.hidden_size * sizeof(float);
    if (!spec_.first_stage())
      if (Status s = m.pp_comm->recv(m.residual, residual_bytes, spec_.stage - 1, kResidualTag); !s) return s.error();
    if (m.ffn)
      if (Status s = m.ffn->begin_step(n); !s) return s.error();
    if (Status s = m.forward(n, num_seqs, packed->max_num_q, packed->max_context_len, num_logits); !s)
      return s.error();
    if (m.ffn) m.ffn->end_step();
    if (!spec_.last_stage()) {
      // The residual goes on to the next stage: queued behind this stream's
      // work (NCCL bound to it), or sent once this stream wrote it; this
      // stage has no logits (the group takes the last stage's output).
      if (Status s = m.sync_unless(m.pp_ordered, "sync before send"); !s) return s.error();
      if (Status s = m.pp_comm->send(m.residual, residual_bytes, spec_.stage + 1, kResidualTag); !s) return s.error();
      if (Status s = m.settle(); !s) return s.error();
      last_stats_.forward_ms = ms_since(t1);
      return out;
    }
  }

  // A step of stream-ordered collectives waits once, here, bounded by the
  // communicators' timeouts (a dead NCCL peer must not hang the stream's
  // synchronisations below).
  if (!m.bound_comms().empty())
    if (Status s = m.settle(); !s) return s.error();
  if (num_logits > 0 && !in.sampling.empty()) {
    Result<std::vector<std::int32_t>> ids = m.sample_on_device(in, num_logits);
    if (!ids) return std::move(ids).error();
    out.sampled_token_ids = std::move(ids).value();
  } else {
    out.logits.resize(static_cast<std::size_t>(num_logits) * static_cast<std::size_t>(config_.vocab_size));
    if (num_logits > 0)
      if (Status s = cuda_status("logits copy", cudaMemcpyAsync(out.logits.data(), m.logits,
                                                                out.logits.size() * sizeof(float),
                                                                cudaMemcpyDeviceToHost, m.stream));
          !s)
        return s.error();
    if (Status s = cuda_status("step", cudaStreamSynchronize(m.stream)); !s) return s.error();
  }
  last_stats_.forward_ms = ms_since(t1);
  return out;
}

}  // namespace shardline::model
