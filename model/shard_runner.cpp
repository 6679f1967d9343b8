#include "model/shard_runner.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "kernels/cpu/ops.hpp"
#include "model/weight_pack.hpp"

namespace shardline::model {

namespace kc = kernels::cpu;

namespace {

using RowRange = ShardLayout::Range;

Error invalid(const std::string& m) { return make_error(ErrorCode::invalid_argument, "shard: " + m); }

/// One packed weight of `parts` stacked by rows: the part itself when there
/// is one, else a PackedQuantStack (only quantized runs are ever mixed).
Result<kc::PackedWeight> stack_parts(std::vector<kc::PackedWeight> parts, const std::string& what) {
  if (parts.size() == 1) return std::move(parts.front());
  kc::PackedQuantStack stack;
  for (kc::PackedWeight& p : parts) {
    kc::PackedQuantLinear* q = p.quantized();
    if (q == nullptr) return make_error(ErrorCode::internal, what + ": a stack of parts must be quantized");
    stack.parts.push_back(std::move(*q));
  }
  return kc::PackedWeight(std::move(stack));
}

/// Packs the rows of `m` named by `ranges`, in order (one contiguous copy
/// per run of one format when they are not simply the whole matrix). A
/// quantized row is whole blocks, so any row range is a block boundary; the
/// rows of a mixed matrix keep their own types (a PackedQuantStack).
Result<kc::PackedWeight> pack_rows(const Matrix& m, const std::vector<RowRange>& ranges, const std::string& what) {
  const std::vector<RowRun> runs = m.runs();
  if (runs.size() == 1 && ranges.size() == 1 && ranges[0].begin == 0 && ranges[0].count == m.rows)
    return pack_part(m.dtype, m.quant, m.data, m.rows, m.cols, what);
  std::vector<kc::PackedWeight> parts;
  std::vector<std::byte> buf;  // [rows of the part being gathered, row_bytes]
  std::optional<kernels::GgmlType> type;
  int rows = 0;
  auto flush = [&]() -> Status {
    if (rows == 0) return Status::ok_status();
    auto p = pack_part(m.dtype, type, buf.data(), rows, m.cols, what);
    if (!p.ok()) return p.error();
    parts.push_back(std::move(p).value());
    buf.clear();
    rows = 0;
    return Status::ok_status();
  };
  for (const RowRange& r : ranges)
    for (const RowRun& run : runs) {
      const int lo = std::max(r.begin, run.begin), hi = std::min(r.begin + r.count, run.begin + run.rows);
      if (lo >= hi) continue;
      if (rows > 0 && type != run.type)
        if (Status s = flush(); !s.ok()) return s.error();
      type = run.type;
      const std::byte* src = run.data + static_cast<std::size_t>(lo - run.begin) * run.row_bytes;
      buf.insert(buf.end(), src, src + static_cast<std::size_t>(hi - lo) * run.row_bytes);
      rows += hi - lo;
    }
  if (Status s = flush(); !s.ok()) return s.error();
  return stack_parts(std::move(parts), what);
}

/// Packs columns [begin, begin + count) of `m`, each run of rows in its own
/// format. A quantized matrix splits only at block boundaries:
/// invalid_argument naming `what` otherwise.
Result<kc::PackedWeight> pack_cols(const Matrix& m, int begin, int count, const std::string& what) {
  if (begin == 0 && count == m.cols) return pack_rows(m, {{0, m.rows}}, what);
  std::vector<kc::PackedWeight> parts;
  for (const RowRun& run : m.runs()) {
    std::size_t elem_bytes = dtype_size(m.dtype);  // bytes per column unit
    int unit = 1;                                  // columns per unit
    if (run.type) {
      const auto traits = *kernels::ggml_type_traits(static_cast<std::uint32_t>(*run.type));
      unit = traits.block_size;
      elem_bytes = static_cast<std::size_t>(traits.type_size);
      if (begin % unit != 0 || count % unit != 0)
        return invalid(what + ": columns [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                       ") split " + traits.name + " blocks of " + std::to_string(unit) +
                       " (a quantized shard must start and end at a block boundary)");
    }
    const std::size_t dst_row = static_cast<std::size_t>(count / unit) * elem_bytes;
    std::vector<std::byte> buf(static_cast<std::size_t>(run.rows) * dst_row);  // [run.rows, dst_row]
    for (int r = 0; r < run.rows; ++r)
      std::memcpy(buf.data() + static_cast<std::size_t>(r) * dst_row,
                  run.data + static_cast<std::size_t>(r) * run.row_bytes + static_cast<std::size_t>(begin / unit) * elem_bytes,
                  dst_row);
    auto p = pack_part(m.dtype, run.type, buf.data(), run.rows, count, what);
    if (!p.ok()) return p.error();
    parts.push_back(std::move(p).value());
  }
  return stack_parts(std::move(parts), what);
}

std::vector<float> slice_vector(const Vector& v, const std::vector<RowRange>& ranges) {
  std::vector<float> out;
  if (v.empty()) return out;
  for (const RowRange& r : ranges) out.insert(out.end(), v.data + r.begin, v.data + r.begin + r.count);
  return out;
}

}  // namespace

ShardSpec shard_spec_at(int tp, int sp, int pp, int group_rank) {
  ShardSpec s;
  s.tp = tp;
  s.tp_rank = group_rank % tp;
  s.sp = sp;
  s.sp_rank = (group_rank / tp) % sp;
  s.pp = pp;
  s.stage = group_rank / (tp * sp);
  return s;
}

ShardSpec shift_spec_at(int tp, int sp, int group_rank) {
  const ShardSpec base = shard_spec_at(tp, sp, 1, group_rank);
  ShardSpec s;
  s.tp = sp * tp;
  s.tp_rank = base.tp_rank * sp + base.sp_rank;
  return s;
}

std::pair<int, int> stage_layer_range(int num_layers, int pp, int stage) {
  const int base = num_layers / pp;
  const int extra = num_layers % pp;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

ShardLayout shard_layout(const ModelConfig& c, const ShardSpec& spec) {
  ShardLayout l;
  const int hd = c.head_dim;
  const int heads = c.num_attention_heads;
  const int kvh = c.num_key_value_heads;
  const int group = c.num_queries_per_kv();
  std::tie(l.layer_begin, l.layer_end) = stage_layer_range(c.num_hidden_layers, spec.pp, spec.stage);
  l.hq_t = heads / spec.tp;
  l.kv_t = std::max(1, l.hq_t / group);
  l.kv_begin_t = spec.tp_rank * l.hq_t / group;
  l.hq_attn = l.hq_t / spec.sp;
  l.kv_attn = std::max(1, l.hq_attn / group);
  l.inter_t = c.intermediate_size / spec.tp;
  l.vocab_shard = (c.vocab_size + spec.tp - 1) / spec.tp;
  l.vocab_begin = std::min(c.vocab_size, spec.tp_rank * l.vocab_shard);
  l.vocab_rows = std::min(c.vocab_size, l.vocab_begin + l.vocab_shard) - l.vocab_begin;
  l.qkv_rows = {{spec.tp_rank * l.hq_t * hd, l.hq_t * hd},
                {(heads + l.kv_begin_t) * hd, l.kv_t * hd},
                {(heads + kvh + l.kv_begin_t) * hd, l.kv_t * hd}};
  const int inter = c.intermediate_size;
  l.gate_up_rows = {{spec.tp_rank * l.inter_t, l.inter_t}, {inter + spec.tp_rank * l.inter_t, l.inter_t}};
  l.o_proj_cols = {spec.tp_rank * l.hq_t * hd, l.hq_t * hd};
  l.down_cols = {spec.tp_rank * l.inter_t, l.inter_t};
  return l;
}

Status check_shard_spec(const ModelConfig& c, const ShardSpec& spec, const ShardComms& comms) {
  if (Status st = check_shardable(c, spec.tp, spec.sp, spec.pp); !st) return st;
  if (spec.tp_rank < 0 || spec.tp_rank >= spec.tp || spec.sp_rank < 0 || spec.sp_rank >= spec.sp ||
      spec.stage < 0 || spec.stage >= spec.pp)
    return invalid("rank coordinates outside tp/sp/pp");
  const auto check_comm = [](comm::Communicator* cm, int size, int rank, const char* what) -> Status {
    if (size == 1) return Status::ok_status();
    if (cm == nullptr) return invalid(std::string(what) + " group of size " + std::to_string(size) + " has no communicator");
    if (cm->world_size() != size || cm->rank() != rank)
      return invalid(std::string(what) + " communicator is rank " + std::to_string(cm->rank()) + " of " +
                     std::to_string(cm->world_size()) + ", expected rank " + std::to_string(rank) + " of " +
                     std::to_string(size));
    return Status::ok_status();
  };
  if (Status st = check_comm(comms.tp, spec.tp, spec.tp_rank, "TP"); !st) return st;
  return check_comm(comms.sp, spec.sp, spec.sp_rank, "SP");
}

Status check_shardable(const ModelConfig& c, int tp, int sp, int pp) {
  const auto s = [](int v) { return std::to_string(v); };
  if (tp < 1 || sp < 1 || pp < 1) return invalid("tp, sp and pp must be >= 1");
  const int heads = c.num_attention_heads;
  const int group = c.num_queries_per_kv();
  if (heads % (tp * sp) != 0)
    return invalid("tp*sp = " + s(tp * sp) + " must divide num_attention_heads = " + s(heads));
  const int hq_t = heads / tp;
  const int hq_attn = hq_t / sp;
  if (hq_t % group != 0 && group % hq_t != 0)
    return invalid("tp = " + s(tp) + " gives " + s(hq_t) + " query heads per rank, not aligned with GQA groups of " +
                   s(group));
  if (hq_attn % group != 0 && group % hq_attn != 0)
    return invalid("tp*sp = " + s(tp * sp) + " gives " + s(hq_attn) +
                   " attended query heads per rank, not aligned with GQA groups of " + s(group));
  if (c.intermediate_size % tp != 0)
    return invalid("tp = " + s(tp) + " must divide intermediate_size = " + s(c.intermediate_size));
  if (pp > c.num_hidden_layers)
    return invalid("pp = " + s(pp) + " is more than num_hidden_layers = " + s(c.num_hidden_layers));
  return Status::ok_status();
}

ShardRunner::ShardRunner(std::shared_ptr<const ModelWeights> weights, const ShardSpec& spec,
                         const CpuRunnerOptions& options, ShardComms comms, std::shared_ptr<FfnExecutor> ffn)
    : weights_(std::move(weights)), spec_(spec), options_(options), comms_(comms), ffn_(std::move(ffn)) {}

Result<std::unique_ptr<ShardRunner>> ShardRunner::create(std::shared_ptr<const ModelWeights> weights,
                                                         const ShardSpec& spec, const CpuRunnerOptions& options,
                                                         ShardComms comms, std::shared_ptr<FfnExecutor> ffn) {
  return create_impl(std::move(weights), spec, options, comms, std::move(ffn), true);
}

Result<std::unique_ptr<ShardRunner>> ShardRunner::create_sharing_kv(std::shared_ptr<const ModelWeights> weights,
                                                                    const ShardSpec& spec, ShardComms comms,
                                                                    ShardRunner& kv_owner) {
  auto r = create_impl(std::move(weights), spec, kv_owner.options_, comms, nullptr, false);
  if (!r) return r;
  const kvstore::KvRankLayout mine = (*r)->kv_cache_view().layout;
  const kvstore::KvRankLayout theirs = kv_owner.kv_cache_view().layout;
  const auto heads = [](const std::vector<int>& h) {
    std::string out;
    for (int x : h) out += (out.empty() ? "" : ",") + std::to_string(x);
    return "{" + out + "}";
  };
  if (mine.layer_begin != theirs.layer_begin || mine.layer_end != theirs.layer_end ||
      mine.kv_heads != theirs.kv_heads || (*r)->kv_cache_bytes_ != kv_owner.kv_cache_bytes_)
    return invalid("the shift runner would attend KV heads " + heads(mine.kv_heads) + " of layers [" +
                   std::to_string(mine.layer_begin) + ", " + std::to_string(mine.layer_end) + ") but the cache holds " +
                   heads(theirs.kv_heads) + " of [" + std::to_string(theirs.layer_begin) + ", " +
                   std::to_string(theirs.layer_end) + ")");
  (*r)->kv_cache_ = kv_owner.kv_cache_;
  (*r)->kv_alloc_bytes_ = kv_owner.kv_alloc_bytes_;
  return r;
}

Result<std::unique_ptr<ShardRunner>> ShardRunner::create_impl(std::shared_ptr<const ModelWeights> weights,
                                                              const ShardSpec& spec, const CpuRunnerOptions& options,
                                                              ShardComms comms, std::shared_ptr<FfnExecutor> ffn,
                                                              bool allocate_kv) {
  if (!weights) return invalid("no weights");
  if (options.num_kv_blocks <= 0) return invalid("num_kv_blocks must be > 0 (got " + std::to_string(options.num_kv_blocks) + ")");
  if (options.block_size <= 0) return invalid("block_size must be > 0 (got " + std::to_string(options.block_size) + ")");
  if (options.kv_cache_dtype != DType::f32 && options.kv_cache_dtype != DType::bf16)
    return invalid(std::string("KV cache dtype must be F32 or BF16, got ") + dtype_name(options.kv_cache_dtype));
  const ModelConfig& c = weights->config;
  if (Status st = check_shard_spec(c, spec, comms); !st) return st.error();
  if (options.num_threads > 0) omp_set_num_threads(options.num_threads);

  if (ffn && !spec.is_whole_model())
    return invalid("an FFN executor (SiDP weight sharing) needs the whole model on each rank (tp = sp = pp = 1)");
  std::unique_ptr<ShardRunner> r(new ShardRunner(weights, spec, options, comms, std::move(ffn)));
  const int hd = c.head_dim;
  const int group = c.num_queries_per_kv();
  const ShardLayout lay = shard_layout(c, spec);
  r->layer_begin_ = lay.layer_begin;
  r->layer_end_ = lay.layer_end;
  r->hq_t_ = lay.hq_t;
  r->kv_t_ = lay.kv_t;
  r->hq_attn_ = lay.hq_attn;
  r->kv_attn_ = lay.kv_attn;
  r->sp_kv_begin_.resize(static_cast<std::size_t>(spec.sp));
  for (int j = 0; j < spec.sp; ++j)
    r->sp_kv_begin_[static_cast<std::size_t>(j)] = (spec.tp_rank * r->hq_t_ + j * r->hq_attn_) / group - lay.kv_begin_t;
  r->inter_t_ = lay.inter_t;
  r->vocab_shard_ = lay.vocab_shard;
  r->vocab_begin_ = lay.vocab_begin;
  r->vocab_rows_ = lay.vocab_rows;

  r->layers_.resize(static_cast<std::size_t>(r->layer_end_ - r->layer_begin_));
  if (Status st = r->pack_weights(); !st.ok()) return st.error();

  r->inv_freq_ = kc::rope_inv_freq(rope_params_for(c));

  r->kv_layer_bytes_ = static_cast<std::size_t>(options.num_kv_blocks) * r->kv_attn_ * options.block_size * hd *
                       dtype_size(options.kv_cache_dtype);
  r->kv_cache_bytes_ = 2 * r->kv_layer_bytes_ * r->layers_.size();
  if (r->kv_cache_bytes_ > 0 && allocate_kv)
    if (Status st = r->allocate_kv_memory(r->kv_cache_bytes_); !st) return st.error();
  return r;
}

Status ShardRunner::allocate_kv_memory(std::size_t bytes) {
  kv_cache_ = std::shared_ptr<void>(allocate_aligned(bytes));
  if (!kv_cache_)
    return make_error(ErrorCode::out_of_memory, "shard: cannot allocate the KV cache (" + std::to_string(bytes) +
                                                    " bytes for " + std::to_string(options_.num_kv_blocks) + " blocks)");
  std::memset(kv_cache_.get(), 0, bytes);  // fault the pages in now, not during steps
  kv_alloc_bytes_ = bytes;
  return Status::ok_status();
}

Result<std::unique_ptr<ShardRunner>> ShardRunner::create_on_kv_memory(std::shared_ptr<const ModelWeights> weights,
                                                                      const ShardSpec& spec, ShardComms comms,
                                                                      ShardRunner& owner) {
  auto r = create_impl(std::move(weights), spec, owner.options_, comms, nullptr, false);
  if (!r) return r;
  if (owner.kv_alloc_bytes_ < (*r)->kv_cache_bytes_) {
    // This layout needs more bytes per block (e.g. pp=2's 3 of 5 layers x
    // all heads against tp=2's 5 layers x half the heads): both move to one
    // allocation of the larger size. Nothing is cached yet.
    if (Status st = owner.allocate_kv_memory((*r)->kv_cache_bytes_); !st) return st.error();
  }
  (*r)->kv_cache_ = owner.kv_cache_;
  (*r)->kv_alloc_bytes_ = owner.kv_alloc_bytes_;
  return r;
}

Status ShardRunner::pack_weights() {
  const ShardLayout lay = shard_layout(weights_->config, spec_);
  for (int l = layer_begin_; l < layer_end_; ++l) {
    const LayerWeights& lw = weights_->layers[static_cast<std::size_t>(l)];
    PackedLayer& pl = layers_[static_cast<std::size_t>(l - layer_begin_)];
    const std::string b = "blk." + std::to_string(l) + ".";
    auto qkv = pack_rows(lw.qkv, lay.qkv_rows, b + "attn_qkv");
    if (!qkv.ok()) return qkv.error();
    pl.qkv = std::move(qkv).value();
    pl.qkv_bias = slice_vector(lw.qkv_bias, lay.qkv_rows);
    auto o = pack_cols(lw.o_proj, lay.o_proj_cols.begin, lay.o_proj_cols.count, b + "attn_output");
    if (!o.ok()) return o.error();
    pl.o_proj = std::move(o).value();
    if (!ffn_) {  // an FfnExecutor (SiDP) runs the FFNs: none packed here
      auto gu = pack_rows(lw.gate_up, lay.gate_up_rows, b + "ffn_gate_up");
      if (!gu.ok()) return gu.error();
      pl.gate_up = std::move(gu).value();
      auto dn = pack_cols(lw.down_proj, lay.down_cols.begin, lay.down_cols.count, b + "ffn_down");
      if (!dn.ok()) return dn.error();
      pl.down = std::move(dn).value();
    }
  }
  if (spec_.last_stage() && vocab_rows_ > 0) {
    auto lm = pack_rows(weights_->lm_head, {{vocab_begin_, vocab_rows_}}, "output");
    if (!lm.ok()) return lm.error();
    lm_head_ = std::move(lm).value();
  }
  weights_packed_ = true;
  return Status::ok_status();
}

void ShardRunner::release_weights() {
  for (PackedLayer& pl : layers_) pl = PackedLayer{};
  lm_head_ = kc::PackedWeight{};
  weights_packed_ = false;
}

Status ShardRunner::load_weights() {
  if (!weights_packed_) return pack_weights();
  return Status::ok_status();
}

void ShardRunner::embed(const std::int32_t* token_ids, int num_tokens, float* out) const {
  const Matrix& table = weights_->embed_tokens;
  const int hidden = table.cols;
  if (!table.quantized()) {
    kc::embedding(token_ids, num_tokens, table.data, table.dtype, hidden, out);
    return;
  }
  for (int t = 0; t < num_tokens; ++t)
    matrix_row_f32(table, token_ids[t], out + static_cast<std::size_t>(t) * hidden);
}

std::size_t ShardRunner::packed_weight_bytes() const {
  std::size_t b = lm_head_.bytes();
  for (const PackedLayer& l : layers_) b += l.qkv.bytes() + l.o_proj.bytes() + l.gate_up.bytes() + l.down.bytes();
  return b;
}

kvstore::KvModelShape ShardRunner::kv_model_shape() const {
  const ModelConfig& c = config();
  return kvstore::KvModelShape{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, options_.kv_cache_dtype};
}

kvstore::KvCacheView ShardRunner::kv_cache_view() {
  kvstore::KvCacheView v;
  v.data = kv_cache_.get();
  v.layout.layer_begin = layer_begin_;
  v.layout.layer_end = layer_end_;
  v.layout.num_blocks = options_.num_kv_blocks;
  v.layout.block_size = options_.block_size;
  // Local slot i holds the i-th KV head read by the first query head this
  // rank attends (the same arithmetic as sp_kv_begin_ in create()).
  const int group = config().num_queries_per_kv();
  const int first = (spec_.tp_rank * hq_t_ + spec_.sp_rank * hq_attn_) / group;
  for (int i = 0; i < kv_attn_; ++i) v.layout.kv_heads.push_back(first + i);
  return v;
}

kc::KvCacheLayer ShardRunner::kv_layer(int local_layer) {
  char* base = static_cast<char*>(kv_cache_.get()) + 2 * kv_layer_bytes_ * static_cast<std::size_t>(local_layer);
  kc::KvCacheLayer l;
  l.k = base;
  l.v = base + kv_layer_bytes_;
  l.dtype = options_.kv_cache_dtype;
  l.num_blocks = options_.num_kv_blocks;
  l.block_size = options_.block_size;
  l.num_kv_heads = kv_attn_;
  l.head_dim = config().head_dim;
  return l;
}

void ShardRunner::ensure_scratch(int num_tokens) {
  const int c_rows = chunk_rows(num_tokens);
  if (c_rows <= scratch_tokens_) return;
  const ModelConfig& c = config();
  const std::size_t ch = static_cast<std::size_t>(c_rows);
  const std::size_t n = ch * static_cast<std::size_t>(spec_.sp);
  const std::size_t hd = static_cast<std::size_t>(c.head_dim);
  const std::size_t hidden = static_cast<std::size_t>(c.hidden_size);
  const std::size_t attn_w = static_cast<std::size_t>(hq_attn_ + 2 * kv_attn_) * hd;
  residual_.resize(ch * hidden);
  normed_.resize(n * hidden);
  qkv_.resize(ch * static_cast<std::size_t>(hq_t_ + 2 * kv_t_) * hd);
  proj_.resize(ch * hidden);
  gate_up_.resize(ch * 2 * static_cast<std::size_t>(inter_t_));
  act_.resize(ch * static_cast<std::size_t>(inter_t_));
  attn_.resize(n * static_cast<std::size_t>(hq_attn_) * hd);
  if (spec_.sp > 1) {
    a2a_send_.resize(n * attn_w);
    a2a_recv_.resize(n * attn_w);
    attn_back_.resize(n * static_cast<std::size_t>(hq_attn_) * hd);
    attn_t_.resize(ch * static_cast<std::size_t>(hq_t_) * hd);
    gathered_.resize(n * hidden);
  }
  scratch_tokens_ = c_rows;
}

float* ShardRunner::residual(int num_tokens) {
  ensure_scratch(num_tokens);
  return residual_.data();
}

Status ShardRunner::all_reduce_tp(float* data, std::size_t count) {
  if (spec_.tp == 1) return Status::ok_status();
  // Ring-equivalent bytes a rank sends: 2 (tp-1)/tp of the payload.
  profile_.comm_bytes += 2 * (spec_.tp - 1) * count * sizeof(float) / spec_.tp;
  return comms_.tp->all_reduce_sum(data, count);
}

kc::RopeParams rope_params_for(const ModelConfig& c) {
  kc::RopeParams rp;
  rp.head_dim = c.head_dim;
  rp.theta = c.rope_theta;
  if (c.rope_scaling && c.rope_scaling->rope_type == "llama3") {
    rp.llama3_scaling = true;
    rp.factor = c.rope_scaling->factor;
    rp.low_freq_factor = c.rope_scaling->low_freq_factor;
    rp.high_freq_factor = c.rope_scaling->high_freq_factor;
    rp.original_max_position_embeddings = c.rope_scaling->original_max_position_embeddings;
  }
  rp.freq_factors = c.rope_freq_factors;
  return rp;
}

/// Adds the time since the last mark to a profile bucket (no-op when off).
class ShardRunner::OpTimer {
 public:
  explicit OpTimer(bool on) : on_(on), last_(on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  void add_to(double& bucket) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    bucket += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point last_;
};

const char* step_overlap_name(StepOverlap overlap) {
  switch (overlap) {
    case StepOverlap::none: return "none";
    case StepOverlap::kv_prefetch: return "kv-prefetch";
    case StepOverlap::nano_batch: return "nano-batch";
  }
  return "none";
}

Result<StepOverlap> parse_step_overlap(const std::string& name) {
  for (StepOverlap o : {StepOverlap::none, StepOverlap::kv_prefetch, StepOverlap::nano_batch})
    if (name == step_overlap_name(o)) return o;
  return make_error(ErrorCode::invalid_argument,
                    "step overlap must be none, kv-prefetch or nano-batch, got '" + name + "'");
}

Status ShardRunner::validate(const model::StepInput& in) const {
  return validate_step(in, config().vocab_size, options_.num_kv_blocks, options_.block_size);
}


Status ShardRunner::run_stage(const model::StepInput& in) {
  if (!weights_packed_)
    return make_error(ErrorCode::invalid_argument, "shard: a step on a rank whose weights are released");
  if (!ffn_) return run_layers(in);
  if (in.num_tokens() == 0) {
    profile_ = StepProfile{};
    return Status::ok_status();
  }
  if (Status st = ffn_->begin_step(in.num_tokens()); !st) return st;
  Status st = run_layers(in);
  if (st) ffn_->end_step();
  else ffn_->abort_step();
  return st;
}

kc::LinePrefetchQueue* ShardRunner::plan_kv_prefetch(std::span<const kc::AttentionSeq> seqs, int layer) {
  if (options_.overlap == StepOverlap::none) return nullptr;
  prefetch_.assign(kc::kv_line_runs(seqs, kv_layer(layer - layer_begin_), omp_get_max_threads(),
                                    options_.overlap_prefetch_bytes));
  return prefetch_.size() > 0 ? &prefetch_ : nullptr;
}

void ShardRunner::qkv_rows(int l, int r0, int rows, int real, const std::int32_t* positions,
                           kc::LinePrefetchQueue* side, OpTimer& timer) {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layers[static_cast<std::size_t>(l)];
  const PackedLayer& pl = layers_[static_cast<std::size_t>(l - layer_begin_)];
  const int hidden = c.hidden_size, hd = c.head_dim;
  const int qkv_w = (hq_t_ + 2 * kv_t_) * hd;
  const std::size_t h0 = static_cast<std::size_t>(r0) * hidden;
  float* normed = normed_.data() + h0;                                  // [rows, hidden]
  float* q = qkv_.data() + static_cast<std::size_t>(r0) * qkv_w;        // [rows, hq_t * hd] (row stride qkv_w)
  float* k = q + hq_t_ * hd;                                            // [rows, kv_t * hd]
  kc::rms_norm(residual_.data() + h0, hidden, lw.input_norm.data, normed, hidden, rows, hidden, c.rms_norm_eps);
  timer.add_to(profile_.other_ms);
  kc::linear(normed, rows, hidden, pl.qkv, pl.qkv_bias.empty() ? nullptr : pl.qkv_bias.data(), q, qkv_w, side);
  timer.add_to(profile_.gemm_ms);
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
    for (int t = 0; t < real; ++t) {
      float* qt = q + static_cast<std::size_t>(t) * qkv_w;
      float* kt = k + static_cast<std::size_t>(t) * qkv_w;
      kc::rms_norm(qt, hd, lw.q_norm.data, qt, hd, hq_t_, hd, c.rms_norm_eps);
      kc::rms_norm(kt, hd, lw.k_norm.data, kt, hd, kv_t_, hd, c.rms_norm_eps);
    }
  }
  kc::rope(q, real, qkv_w, hq_t_, hd, positions, inv_freq_.data());
  kc::rope(k, real, qkv_w, kv_t_, hd, positions, inv_freq_.data());
  timer.add_to(profile_.other_ms);
}

Status ShardRunner::post_attention_rows(int l, const float* o_in, int r0, int rows, OpTimer& timer) {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layers[static_cast<std::size_t>(l)];
  const PackedLayer& pl = layers_[static_cast<std::size_t>(l - layer_begin_)];
  const int hidden = c.hidden_size;
  const std::size_t h0 = static_cast<std::size_t>(r0) * hidden;
  const std::size_t elems = static_cast<std::size_t>(rows) * hidden;
  float* residual = residual_.data() + h0;                                      // [rows, hidden]
  float* normed = normed_.data() + h0;                                          // [rows, hidden]
  float* proj = proj_.data() + h0;                                              // [rows, hidden]
  float* gate_up = gate_up_.data() + static_cast<std::size_t>(r0) * 2 * inter_t_;  // [rows, 2 * inter_t]
  float* act = act_.data() + static_cast<std::size_t>(r0) * inter_t_;             // [rows, inter_t]
  StepProfile& p = profile_;
  kc::linear(o_in, rows, hq_t_ * c.head_dim, pl.o_proj, nullptr, proj, hidden);
  timer.add_to(p.gemm_ms);
  if (Status st = all_reduce_tp(proj, elems); !st) return st;
  timer.add_to(p.comm_ms);
  kc::add_rms_norm(residual, proj, lw.post_attention_norm.data, normed, rows, hidden, c.rms_norm_eps);
  timer.add_to(p.other_ms);
  if (ffn_) {  // SiDP: the layer's owner, the WaS cache or CaS computes it
    if (Status st = ffn_->forward(l, normed, rows, proj); !st) return st;
    timer.add_to(p.gemm_ms);
  } else {
    kc::linear(normed, rows, hidden, pl.gate_up, nullptr, gate_up, 2 * inter_t_);
    timer.add_to(p.gemm_ms);
    kc::silu_and_mul(gate_up, act, rows, inter_t_);
    timer.add_to(p.other_ms);
    kc::linear(act, rows, inter_t_, pl.down, nullptr, proj, hidden);
    timer.add_to(p.gemm_ms);
  }
  if (Status st = all_reduce_tp(proj, elems); !st) return st;
  timer.add_to(p.comm_ms);
  kc::add_inplace(residual, proj, static_cast<long>(elems));
  timer.add_to(p.other_ms);
  return Status::ok_status();
}

namespace {

/// The attention view of a step's sequences (rows in step order).
std::vector<kc::AttentionSeq> attention_seqs(const model::StepInput& in) {
  std::vector<kc::AttentionSeq> seqs;
  seqs.reserve(in.seqs.size());
  int row = 0;
  for (const model::StepSeq& s : in.seqs) {
    seqs.push_back(kc::AttentionSeq{row, s.num_new_tokens, s.num_computed_tokens + s.num_new_tokens,
                                    s.block_table.data()});
    row += s.num_new_tokens;
  }
  return seqs;
}

/// The first sequence of nano-batch B: the first boundary at or past half
/// the rows, so that both halves are non-empty. 0 when there is no such
/// split (fewer than two sequences).
std::size_t nano_batch_split(const std::vector<kc::AttentionSeq>& seqs, int num_tokens) {
  if (seqs.size() < 2) return 0;
  for (std::size_t s = 1; s < seqs.size(); ++s)
    if (2 * seqs[s].q_start >= num_tokens) return s;
  return seqs.size() - 1;
}

}  // namespace

Status ShardRunner::run_layers(const model::StepInput& in) {
  profile_ = StepProfile{};
  const int n = in.num_tokens();
  if (n == 0) return Status::ok_status();
  const std::vector<kc::AttentionSeq> attn_seqs = attention_seqs(in);
  if (options_.overlap == StepOverlap::nano_batch && spec_.tp == 1 && spec_.sp == 1 && !ffn_) {
    if (const std::size_t split = nano_batch_split(attn_seqs, n); split > 0) return run_layers_nano_batch(in, attn_seqs, split);
  }
  const ModelConfig& c = config();
  const int hidden = c.hidden_size;
  const int hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int sp = spec_.sp;
  const int ch = chunk_rows(n);                         // rows of this rank's chunk
  const int row0 = spec_.sp_rank * ch;                  // its first global row
  const int real = std::clamp(n - row0, 0, ch);         // its rows that are real tokens
  const int qkv_w = (hq_t_ + 2 * kv_t_) * hd;           // QKV row width of this TP rank
  const int attn_w = sp > 1 ? (hq_attn_ + 2 * kv_attn_) * hd : qkv_w;  // row width attention reads
  ensure_scratch(n);
  OpTimer timer(profiling_);
  StepProfile& p = profile_;

  float* residual = residual_.data();  // [ch, hidden]
  float* qkv = qkv_.data();            // [ch, qkv_w]
  float* attn = attn_.data();          // [sp * ch, hq_attn * hd]
  const std::size_t chunk_elems = static_cast<std::size_t>(ch) * hidden;

  if (spec_.first_stage()) {
    embed(in.token_ids.data() + row0, real, residual);
    std::fill(residual + static_cast<std::size_t>(real) * hidden, residual + chunk_elems, 0.0f);
  }

  for (int l = layer_begin_; l < layer_end_; ++l) {
    const kc::KvCacheLayer cache = kv_layer(l - layer_begin_);
    // StepOverlap::kv_prefetch: layer l's QKV GEMM prefetches its attention's KV.
    qkv_rows(l, 0, ch, real, in.positions.data() + row0, plan_kv_prefetch(attn_seqs, l), timer);

    // Attention input: this rank's heads for all tokens.
    const float* attn_in = qkv;
    if (sp > 1) {  // Ulysses all-to-all: [ch, heads_t] -> [sp * ch, heads_t / sp] (+ KV replication)
      const std::size_t hq_bytes = static_cast<std::size_t>(hq_attn_) * hd * sizeof(float);
      const std::size_t kv_bytes = static_cast<std::size_t>(kv_attn_) * hd * sizeof(float);
      for (int j = 0; j < sp; ++j) {
        const int kv0 = sp_kv_begin_[static_cast<std::size_t>(j)];
        for (int t = 0; t < ch; ++t) {
          const float* src = qkv + static_cast<std::size_t>(t) * qkv_w;
          float* dst = a2a_send_.data() + (static_cast<std::size_t>(j) * ch + t) * attn_w;
          std::memcpy(dst, src + j * hq_attn_ * hd, hq_bytes);
          std::memcpy(dst + hq_attn_ * hd, src + (hq_t_ + kv0) * hd, kv_bytes);
          std::memcpy(dst + (hq_attn_ + kv_attn_) * hd, src + (hq_t_ + kv_t_ + kv0) * hd, kv_bytes);
        }
      }
      timer.add_to(p.other_ms);
      const std::size_t count = static_cast<std::size_t>(ch) * attn_w;
      p.comm_bytes += count * (sp - 1) * sizeof(float);
      if (Status st = comms_.sp->all_to_all(a2a_send_.data(), a2a_recv_.data(), count); !st) return st;
      timer.add_to(p.comm_ms);
      attn_in = a2a_recv_.data();
    }
    const float* kk = attn_in + hq_attn_ * hd;
    const float* vv = kk + kv_attn_ * hd;
    kc::write_kv(kk, vv, attn_w, n, in.slot_mapping.data(), cache);
    if (layer_kv_hook_) layer_kv_hook_(l);
    kc::paged_attention(attn_in, attn_w, attn_seqs, cache, hq_attn_, scale, attn, hq_attn_ * hd);
    timer.add_to(p.attention_ms);

    const float* o_in = attn;  // [ch, hq_t * hd]
    if (sp > 1) {  // back: [sp * ch, heads_t / sp] -> [ch, heads_t]
      const std::size_t width = static_cast<std::size_t>(hq_attn_) * hd;
      std::fill(attn + static_cast<std::size_t>(n) * width, attn + static_cast<std::size_t>(sp) * ch * width, 0.0f);
      const std::size_t count = static_cast<std::size_t>(ch) * width;
      p.comm_bytes += count * (sp - 1) * sizeof(float);
      if (Status st = comms_.sp->all_to_all(attn, attn_back_.data(), count); !st) return st;
      timer.add_to(p.comm_ms);
      for (int j = 0; j < sp; ++j)
        for (int t = 0; t < ch; ++t)
          std::memcpy(attn_t_.data() + static_cast<std::size_t>(t) * hq_t_ * hd + j * width,
                      attn_back_.data() + (static_cast<std::size_t>(j) * ch + t) * width, width * sizeof(float));
      timer.add_to(p.other_ms);
      o_in = attn_t_.data();
    }
    if (Status st = post_attention_rows(l, o_in, 0, ch, timer); !st) return st;
  }
  return Status::ok_status();
}

Status ShardRunner::run_layers_nano_batch(const model::StepInput& in, std::span<const kc::AttentionSeq> all_seqs,
                                          std::size_t split) {
  const int n = in.num_tokens();
  const ModelConfig& c = config();
  const int hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int qkv_w = (hq_t_ + 2 * kv_t_) * hd;
  ensure_scratch(n);
  OpTimer timer(profiling_);
  StepProfile& p = profile_;
  // Nano-batches A = sequences [0, split), B = [split, end): rows [r0, r0 + rows).
  const std::span<const kc::AttentionSeq> seqs[2] = {all_seqs.first(split), all_seqs.subspan(split)};
  const int r0[2] = {0, all_seqs[split].q_start};
  const int rows[2] = {r0[1], n - r0[1]};

  if (spec_.first_stage())
    embed(in.token_ids.data(), n, residual_.data());
  // Half h's layer-l front: QKV (carrying `side`), then its KV written.
  auto front = [&](int h, int l, kc::LinePrefetchQueue* side) {
    qkv_rows(l, r0[h], rows[h], rows[h], in.positions.data() + r0[h], side, timer);
    const float* q = qkv_.data() + static_cast<std::size_t>(r0[h]) * qkv_w;
    const float* k = q + hq_t_ * hd;
    kc::write_kv(k, k + kv_t_ * hd, qkv_w, rows[h], in.slot_mapping.data() + r0[h], kv_layer(l - layer_begin_));
    timer.add_to(p.attention_ms);
  };
  auto attend = [&](int h, int l) {
    kc::paged_attention(qkv_.data(), qkv_w, seqs[h], kv_layer(l - layer_begin_), hq_attn_, scale, attn_.data(),
                        hq_attn_ * hd);
    timer.add_to(p.attention_ms);
  };
  front(0, layer_begin_, nullptr);
  front(1, layer_begin_, plan_kv_prefetch(seqs[0], layer_begin_));
  if (layer_kv_hook_) layer_kv_hook_(layer_begin_);
  for (int l = layer_begin_; l < layer_end_; ++l) {
    const bool last = l + 1 == layer_end_;
    attend(0, l);
    const float* o_in = attn_.data() + static_cast<std::size_t>(r0[0]) * hq_attn_ * hd;
    if (Status st = post_attention_rows(l, o_in, r0[0], rows[0], timer); !st) return st;
    if (!last) front(0, l + 1, plan_kv_prefetch(seqs[1], l));
    attend(1, l);
    o_in = attn_.data() + static_cast<std::size_t>(r0[1]) * hq_attn_ * hd;
    if (Status st = post_attention_rows(l, o_in, r0[1], rows[1], timer); !st) return st;
    if (!last) {
      front(1, l + 1, plan_kv_prefetch(seqs[0], l + 1));
      if (layer_kv_hook_) layer_kv_hook_(l + 1);
    }
  }
  return Status::ok_status();
}

Result<model::StepOutput> ShardRunner::run_logits(const model::StepInput& in) {
  const ModelConfig& c = config();
  model::StepOutput out;
  out.vocab_size = c.vocab_size;
  const int num_logits = in.num_logits();
  if (num_logits == 0 || in.num_tokens() == 0) return out;
  if (!spec_.last_stage()) return make_error(ErrorCode::internal, "shard: logits asked of a stage that is not the last");
  const int hidden = c.hidden_size;
  const int ch = chunk_rows(in.num_tokens());
  OpTimer timer(profiling_);
  StepProfile& p = profile_;

  const float* rows = residual_.data();  // [n, hidden] once gathered
  if (spec_.sp > 1) {
    const std::size_t count = static_cast<std::size_t>(ch) * hidden;
    p.comm_bytes += (spec_.sp - 1) * count * sizeof(float);  // its share to every peer
    if (Status st = comms_.sp->all_gather(residual_.data(), count, gathered_.data()); !st) return st.error();
    timer.add_to(p.comm_ms);
    rows = gathered_.data();
  }
  float* normed = normed_.data();  // [num_logits, hidden]
  for (int i = 0; i < num_logits; ++i)
    kc::rms_norm(rows + static_cast<std::size_t>(in.logits_rows[i]) * hidden, hidden, weights_->final_norm.data,
                 normed + static_cast<std::size_t>(i) * hidden, hidden, 1, hidden, c.rms_norm_eps);
  const std::size_t vocab = static_cast<std::size_t>(c.vocab_size);
  out.logits.resize(static_cast<std::size_t>(num_logits) * vocab);
  if (spec_.tp == 1) {
    kc::linear(normed, num_logits, hidden, lm_head_, nullptr, out.logits.data(), c.vocab_size);
    timer.add_to(p.logits_ms);
    return out;
  }
  // Vocabulary-parallel lm_head: each TP rank computes its rows, then all-gather.
  const std::size_t vs = static_cast<std::size_t>(vocab_shard_);
  std::vector<float> part(static_cast<std::size_t>(num_logits) * vs, 0.0f);  // [num_logits, vocab_shard]
  if (vocab_rows_ > 0) kc::linear(normed, num_logits, hidden, lm_head_, nullptr, part.data(), vocab_shard_);
  timer.add_to(p.logits_ms);
  std::vector<float> all(static_cast<std::size_t>(spec_.tp) * part.size());  // [tp, num_logits, vocab_shard]
  p.comm_bytes += (spec_.tp - 1) * part.size() * sizeof(float);  // its share to every peer
  if (Status st = comms_.tp->all_gather(part.data(), part.size(), all.data()); !st) return st.error();
  timer.add_to(p.comm_ms);
  for (int t = 0; t < spec_.tp; ++t) {
    const std::size_t begin = static_cast<std::size_t>(t) * vs;
    if (begin >= vocab) break;
    const std::size_t cols = std::min(vs, vocab - begin);
    for (int i = 0; i < num_logits; ++i)
      std::memcpy(out.logits.data() + static_cast<std::size_t>(i) * vocab + begin,
                  all.data() + (static_cast<std::size_t>(t) * num_logits + i) * vs, cols * sizeof(float));
  }
  timer.add_to(p.other_ms);
  return out;
}

}  // namespace shardline::model
