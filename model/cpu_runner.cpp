#include "model/cpu_runner.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "kernels/cpu/ops.hpp"

namespace shardline::model {

namespace kc = kernels::cpu;

namespace {

/// Adds the time since the last mark to a profile bucket (no-op when off).
class OpTimer {
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

kc::PackedLinear pack(const Matrix& m) { return kc::PackedLinear::pack(m.data, m.dtype, m.rows, m.cols); }

}  // namespace

CpuModelRunner::CpuModelRunner(std::shared_ptr<const ModelWeights> weights,
                               const CpuRunnerOptions& options)
    : weights_(std::move(weights)), options_(options) {}

Result<std::unique_ptr<CpuModelRunner>> CpuModelRunner::create(
    std::shared_ptr<const ModelWeights> weights, const CpuRunnerOptions& options) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "cpu runner: no weights");
  if (options.num_kv_blocks <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "cpu runner: num_kv_blocks must be > 0 (got " +
                          std::to_string(options.num_kv_blocks) + ")");
  if (options.block_size <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "cpu runner: block_size must be > 0 (got " +
                          std::to_string(options.block_size) + ")");
  if (options.kv_cache_dtype != DType::f32 && options.kv_cache_dtype != DType::bf16)
    return make_error(ErrorCode::invalid_argument, std::string("cpu runner: KV cache dtype must be F32 or BF16, got ") +
                                                       dtype_name(options.kv_cache_dtype));
  if (options.num_threads > 0) omp_set_num_threads(options.num_threads);

  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(weights, options));
  const ModelConfig& c = r->config();
  r->layers_.reserve(weights->layers.size());
  for (const LayerWeights& lw : weights->layers) {
    r->layers_.push_back(PackedLayer{pack(lw.qkv), pack(lw.o_proj), pack(lw.gate_up),
                                     pack(lw.down_proj)});
  }
  r->lm_head_ = pack(weights->lm_head);

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
  r->inv_freq_ = kc::rope_inv_freq(rp);

  r->kv_layer_bytes_ = static_cast<std::size_t>(options.num_kv_blocks) * c.num_key_value_heads *
                       options.block_size * c.head_dim * dtype_size(options.kv_cache_dtype);
  r->kv_cache_bytes_ = 2 * r->kv_layer_bytes_ * weights->layers.size();
  r->kv_cache_ = allocate_aligned(r->kv_cache_bytes_);
  if (!r->kv_cache_)
    return make_error(ErrorCode::out_of_memory,
                      "cpu runner: cannot allocate the KV cache (" + std::to_string(r->kv_cache_bytes_) +
                          " bytes for " + std::to_string(options.num_kv_blocks) + " blocks)");
  std::memset(r->kv_cache_.get(), 0, r->kv_cache_bytes_);  // fault the pages in now, not during steps
  return r;
}

std::size_t CpuModelRunner::packed_weight_bytes() const {
  std::size_t b = lm_head_.bytes();
  for (const PackedLayer& l : layers_) b += l.qkv.bytes() + l.o_proj.bytes() + l.gate_up.bytes() + l.down.bytes();
  return b;
}

kc::KvCacheLayer CpuModelRunner::kv_layer(int layer) {
  const ModelConfig& c = config();
  char* base = static_cast<char*>(kv_cache_.get()) + 2 * kv_layer_bytes_ * static_cast<std::size_t>(layer);
  kc::KvCacheLayer l;
  l.k = base;
  l.v = base + kv_layer_bytes_;
  l.dtype = options_.kv_cache_dtype;
  l.num_blocks = options_.num_kv_blocks;
  l.block_size = options_.block_size;
  l.num_kv_heads = c.num_key_value_heads;
  l.head_dim = c.head_dim;
  return l;
}

void CpuModelRunner::ensure_scratch(int num_tokens) {
  if (num_tokens <= scratch_tokens_) return;
  const ModelConfig& c = config();
  const std::size_t t = static_cast<std::size_t>(num_tokens);
  residual_.resize(t * c.hidden_size);
  normed_.resize(t * c.hidden_size);
  qkv_.resize(t * c.qkv_rows());
  attn_.resize(t * c.num_attention_heads * c.head_dim);
  proj_.resize(t * c.hidden_size);
  gate_up_.resize(t * 2 * c.intermediate_size);
  act_.resize(t * c.intermediate_size);
  scratch_tokens_ = num_tokens;
}

Status CpuModelRunner::validate(const engine::StepInput& in) const {
  const int n = in.num_tokens();
  const auto bad = [](std::string m) { return Status(make_error(ErrorCode::invalid_argument, "step: " + std::move(m))); };
  if (static_cast<int>(in.positions.size()) != n || static_cast<int>(in.slot_mapping.size()) != n)
    return bad("token_ids, positions and slot_mapping differ in length");
  if (in.block_size != options_.block_size)
    return bad("block_size " + std::to_string(in.block_size) + " != runner's " + std::to_string(options_.block_size));
  const int vocab = config().vocab_size;
  const long num_slots = static_cast<long>(options_.num_kv_blocks) * options_.block_size;
  for (int t = 0; t < n; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= vocab)
      return bad("token id " + std::to_string(in.token_ids[t]) + " at row " + std::to_string(t) +
                 " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    if (in.positions[t] < 0) return bad("negative position at row " + std::to_string(t));
    if (in.slot_mapping[t] >= num_slots)
      return bad("KV slot " + std::to_string(in.slot_mapping[t]) + " outside the cache");
  }
  int rows = 0;
  for (const engine::StepSeq& s : in.seqs) {
    const int ctx = s.num_computed_tokens + s.num_new_tokens;
    if (s.num_new_tokens <= 0 || s.num_computed_tokens < 0)
      return bad("sequence " + std::to_string(s.seq_id) + " has no new tokens");
    const long blocks_needed = (ctx + options_.block_size - 1) / options_.block_size;
    if (static_cast<long>(s.block_table.size()) < blocks_needed)
      return bad("sequence " + std::to_string(s.seq_id) + ": block table too short for " + std::to_string(ctx) + " tokens");
    for (std::int32_t b : s.block_table)
      if (b < 0 || b >= options_.num_kv_blocks)
        return bad("sequence " + std::to_string(s.seq_id) + ": block id " + std::to_string(b) + " outside the cache");
    rows += s.num_new_tokens;
  }
  if (rows != n) return bad("sequences cover " + std::to_string(rows) + " rows, batch has " + std::to_string(n));
  for (std::int32_t r : in.logits_rows)
    if (r < 0 || r >= n) return bad("logits row " + std::to_string(r) + " outside the batch");
  return Status::ok_status();
}

Result<engine::StepOutput> CpuModelRunner::execute(const engine::StepInput& in) {
  if (Status st = validate(in); !st) return st.error();
  const ModelConfig& c = config();
  const int n = in.num_tokens();
  const int hidden = c.hidden_size;
  const int heads = c.num_attention_heads;
  const int kv_heads = c.num_key_value_heads;
  const int hd = c.head_dim;
  const int qkv_rows = c.qkv_rows();
  const int inter = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  engine::StepOutput out;
  out.vocab_size = c.vocab_size;
  profile_ = StepProfile{};
  if (n == 0) return out;
  ensure_scratch(n);
  OpTimer timer(profiling_);
  StepProfile& p = profile_;

  std::vector<kc::AttentionSeq> attn_seqs;
  attn_seqs.reserve(in.seqs.size());
  int row = 0;
  for (const engine::StepSeq& s : in.seqs) {
    attn_seqs.push_back(kc::AttentionSeq{row, s.num_new_tokens, s.num_computed_tokens + s.num_new_tokens,
                                         s.block_table.data()});
    row += s.num_new_tokens;
  }

  float* residual = residual_.data();  // [n, hidden]
  float* normed = normed_.data();      // [n, hidden]
  float* qkv = qkv_.data();            // [n, qkv_rows]
  float* attn = attn_.data();          // [n, heads * hd]
  float* proj = proj_.data();          // [n, hidden]
  float* gate_up = gate_up_.data();    // [n, 2 * inter]
  float* act = act_.data();            // [n, inter]

  kc::embedding(in.token_ids.data(), n, weights_->embed_tokens.data, weights_->embed_tokens.dtype, hidden,
                residual);

  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& lw = weights_->layers[l];
    const PackedLayer& pl = layers_[l];
    const kc::KvCacheLayer cache = kv_layer(static_cast<int>(l));

    kc::rms_norm(residual, hidden, lw.input_norm.data, normed, hidden, n, hidden, eps);
    timer.add_to(p.other_ms);
    kc::linear(normed, n, hidden, pl.qkv, lw.qkv_bias.data, qkv, qkv_rows);
    timer.add_to(p.gemm_ms);
    float* q = qkv;                  // rows of stride qkv_rows: [n, heads * hd]
    float* k = qkv + heads * hd;     // [n, kv_heads * hd]
    float* v = k + kv_heads * hd;    // [n, kv_heads * hd]
    if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
      for (int t = 0; t < n; ++t) {
        float* qt = q + static_cast<std::size_t>(t) * qkv_rows;
        float* kt = k + static_cast<std::size_t>(t) * qkv_rows;
        kc::rms_norm(qt, hd, lw.q_norm.data, qt, hd, heads, hd, eps);
        kc::rms_norm(kt, hd, lw.k_norm.data, kt, hd, kv_heads, hd, eps);
      }
    }
    kc::rope(q, n, qkv_rows, heads, hd, in.positions.data(), inv_freq_.data());
    kc::rope(k, n, qkv_rows, kv_heads, hd, in.positions.data(), inv_freq_.data());
    timer.add_to(p.other_ms);
    kc::write_kv(k, v, qkv_rows, n, in.slot_mapping.data(), cache);
    kc::paged_attention(q, qkv_rows, attn_seqs, cache, heads, scale, attn, heads * hd);
    timer.add_to(p.attention_ms);
    kc::linear(attn, n, heads * hd, pl.o_proj, nullptr, proj, hidden);
    timer.add_to(p.gemm_ms);
    kc::add_rms_norm(residual, proj, lw.post_attention_norm.data, normed, n, hidden, eps);
    timer.add_to(p.other_ms);
    kc::linear(normed, n, hidden, pl.gate_up, nullptr, gate_up, 2 * inter);
    timer.add_to(p.gemm_ms);
    kc::silu_and_mul(gate_up, act, n, inter);
    timer.add_to(p.other_ms);
    kc::linear(act, n, inter, pl.down, nullptr, proj, hidden);
    timer.add_to(p.gemm_ms);
    kc::add_inplace(residual, proj, static_cast<long>(n) * hidden);
    timer.add_to(p.other_ms);
  }

  // Final norm and logits only for the rows the scheduler asked for.
  const int num_logits = in.num_logits();
  if (num_logits == 0) return out;
  for (int i = 0; i < num_logits; ++i) {
    kc::rms_norm(residual + static_cast<std::size_t>(in.logits_rows[i]) * hidden, hidden,
                 weights_->final_norm.data, normed + static_cast<std::size_t>(i) * hidden, hidden, 1,
                 hidden, eps);
  }
  out.logits.resize(static_cast<std::size_t>(num_logits) * c.vocab_size);
  kc::linear(normed, num_logits, hidden, lm_head_, nullptr, out.logits.data(), c.vocab_size);
  timer.add_to(p.logits_ms);
  return out;
}

}  // namespace shardline::model
