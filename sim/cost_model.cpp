#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace shardline::sim {

namespace {

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, "cost model: " + m)); }

std::string num(double v) { return std::to_string(v); }

bool positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

ModelShape ModelShape::from_config(const model::ModelConfig& c) {
  ModelShape s;
  s.num_layers = c.num_hidden_layers;
  s.hidden_size = c.hidden_size;
  s.num_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.intermediate_size = c.intermediate_size;
  s.vocab_size = c.vocab_size;
  return s;
}

double ModelShape::layer_params() const {
  const double h = hidden_size, d = head_dim;
  return h * (num_heads + 2.0 * num_kv_heads) * d + num_heads * d * h + 3.0 * h * intermediate_size;
}

Status ModelShape::validate() const {
  const std::pair<const char*, int> fields[] = {
      {"num_layers", num_layers},     {"hidden_size", hidden_size}, {"num_heads", num_heads},
      {"num_kv_heads", num_kv_heads}, {"head_dim", head_dim},       {"intermediate_size", intermediate_size},
      {"vocab_size", vocab_size}};
  for (const auto& [name, v] : fields)
    if (v < 1) return bad(std::string("model shape ") + name + " must be >= 1, got " + std::to_string(v));
  if (num_heads % num_kv_heads != 0)
    return bad("model shape num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
               std::to_string(num_kv_heads) + ")");
  return Status::ok_status();
}

void StepShape::add_sequence(long long cached_tokens, long long new_tokens) {
  if (new_tokens <= 0) return;
  cached_tokens = std::max(0LL, cached_tokens);
  if (cached_tokens > 0 && new_tokens == 1)
    num_decode_tokens += 1;
  else
    num_prefill_tokens += new_tokens;
  num_sequences += 1;
  num_context_tokens += cached_tokens;
  num_attention_pairs += new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2;
}

namespace {

/// Whether `points` are points of positive rows (strictly ascending) and positive FLOP/s.
bool valid_flops_points(const std::vector<std::pair<double, double>>& points) {
  for (std::size_t i = 0; i < points.size(); ++i)
    if (!positive(points[i].first) || !positive(points[i].second) ||
        (i > 0 && !(points[i].first > points[i - 1].first)))
      return false;
  return true;
}

}  // namespace

double interpolate_by_rows(const std::vector<std::pair<double, double>>& points, double x) {
  if (x <= points.front().first) return points.front().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    const auto& [x1, y1] = points[i];
    if (x <= x1) {
      const auto& [x0, y0] = points[i - 1];
      return x1 > x0 ? y0 + (y1 - y0) * (x - x0) / (x1 - x0) : y1;
    }
  }
  return points.back().second;
}

double HardwareSpec::flops_at(double rows) const {
  return flops_by_rows.empty() ? flops_per_s : interpolate_by_rows(flops_by_rows, rows);
}

double HardwareSpec::flops_at(double rows, int tp) const {
  return tp > 1 && !tp_flops_by_rows.empty() ? interpolate_by_rows(tp_flops_by_rows, rows) : flops_at(rows);
}

Result<CostModel> CostModel::create(const ModelShape& shape, const ElementSizes& sizes, const HardwareSpec& hw) {
  if (Status st = shape.validate(); !st) return st.error();
  if (!positive(sizes.weight_bytes)) return bad("weight_bytes must be > 0, got " + num(sizes.weight_bytes)).error();
  if (!positive(sizes.kv_bytes)) return bad("kv_bytes must be > 0, got " + num(sizes.kv_bytes)).error();
  if (!positive(sizes.activation_bytes))
    return bad("activation_bytes must be > 0, got " + num(sizes.activation_bytes)).error();
  if (!positive(hw.memory_bw_bytes_per_s))
    return bad("memory_bw_bytes_per_s must be > 0, got " + num(hw.memory_bw_bytes_per_s)).error();
  if (!positive(hw.flops_per_s)) return bad("flops_per_s must be > 0, got " + num(hw.flops_per_s)).error();
  if (!valid_flops_points(hw.flops_by_rows))
    return bad("flops_by_rows must be points of positive rows (ascending) and positive FLOP/s").error();
  if (!valid_flops_points(hw.tp_flops_by_rows))
    return bad("tp_flops_by_rows must be points of positive rows (ascending) and positive FLOP/s").error();
  if (!positive(hw.comm_bw_bytes_per_s))
    return bad("comm_bw_bytes_per_s must be > 0, got " + num(hw.comm_bw_bytes_per_s)).error();
  if (!std::isfinite(hw.comm_latency_s) || hw.comm_latency_s < 0)
    return bad("comm_latency_s must be >= 0, got " + num(hw.comm_latency_s)).error();
  return CostModel(shape, sizes, hw);
}

Result<StepCost> CostModel::estimate(const engine::ParallelConfig& pc, const StepShape& step) const {
  if (pc.tp < 1 || pc.pp < 1 || pc.sp < 1 || pc.dp < 1)
    return bad("parallel degrees must be >= 1, got " + pc.to_string()).error();
  if (pc.pp > shape_.num_layers)
    return bad("pp = " + std::to_string(pc.pp) + " exceeds the model's " + std::to_string(shape_.num_layers) +
               " layers")
        .error();
  if (step.num_prefill_tokens < 0 || step.num_decode_tokens < 0 || step.num_sequences < 0 ||
      step.num_context_tokens < 0 || step.num_attention_pairs < 0)
    return bad("step counts must be >= 0").error();
  if (step.num_micro_batches < 1)
    return bad("num_micro_batches must be >= 1, got " + std::to_string(step.num_micro_batches)).error();

  const double tp = pc.tp, sp = pc.sp;
  const double M = step.num_micro_batches;
  const double h = shape_.hidden_size, d = shape_.head_dim;
  const double hq = shape_.num_heads, hkv = shape_.num_kv_heads;
  const double wb = sizes_.weight_bytes, kvb = sizes_.kv_bytes, ab = sizes_.activation_bytes;
  const double bw = hw_.memory_bw_bytes_per_s;
  const double cbw = hw_.comm_bw_bytes_per_s, lat = hw_.comm_latency_s;

  // One micro-batch (balanced split of the step).
  const double tokens = static_cast<double>(step.num_tokens()) / M;
  const double seqs = static_cast<double>(step.num_sequences) / M;
  const double context = static_cast<double>(step.num_context_tokens) / M;
  const double pairs = static_cast<double>(step.num_attention_pairs) / M;
  // SP splits the rows into sp chunks of ceil(tokens / sp), the last padded
  // (model/shard_runner.hpp chunk_rows): every rank computes a full chunk.
  const double tokens_rank = std::ceil(tokens / sp - 1e-9);
  const double peak = hw_.flops_at(tokens_rank, pc.tp);  // the GEMM rate at the rank's rows

  // Shard of one rank.
  const double kv_tp = std::max(hkv / tp, 1.0);          // KV heads of the QKV projection shard
  const double hq_attn = hq / (tp * sp);                 // query heads attended by one rank
  const double kv_attn = std::max(hkv / (tp * sp), 1.0);  // KV heads attended by one rank
  const double w_rank = h * d * (hq / tp + 2.0 * kv_tp) + (hq / tp) * d * h + 3.0 * h * shape_.intermediate_size / tp;
  const double lm_params_rank = static_cast<double>(shape_.vocab_size) * h / tp;

  // Per layer, per rank, one micro-batch (seconds / bytes / FLOPs).
  const double lin_bytes = w_rank * wb;
  const double lin_flops = 2.0 * w_rank * tokens_rank;
  const double attn_bytes = kvb * 2.0 * kv_attn * d * context + ab * (hq_attn + 2.0 * kv_attn) * d * tokens;
  const double attn_flops = 4.0 * hq_attn * d * pairs;
  const double t_lin_dm = lin_bytes / bw, t_lin_c = lin_flops / peak;
  const double t_attn_dm = attn_bytes / bw, t_attn_c = attn_flops / peak;

  double tp_bytes_layer = 0, t_tp_layer = 0;
  if (pc.tp > 1) {
    const double sent = 2.0 * (tp - 1.0) / tp * tokens_rank * h * ab;  // ring all-reduce
    tp_bytes_layer = 2.0 * sent;                                        // after o_proj and down_proj
    t_tp_layer = 2.0 * (lat + sent / cbw);
  }
  double sp_bytes_layer = 0, t_sp_layer = 0;
  if (pc.sp > 1) {
    const double frac = (sp - 1.0) / sp;
    const double sent_qkv = frac * tokens_rank * (hq / tp + 2.0 * kv_tp) * d * ab;
    const double sent_out = frac * tokens_rank * (hq / tp) * d * ab;
    sp_bytes_layer = sent_qkv + sent_out;
    t_sp_layer = 2.0 * lat + sp_bytes_layer / cbw;
  }
  const double t_layer = std::max(t_lin_dm, t_lin_c) + std::max(t_attn_dm, t_attn_c) + t_tp_layer + t_sp_layer;

  // lm_head on the last stage (only when logits are computed). SP ranks
  // all-gather the residual first, so each computes every logits row of its
  // vocabulary shard; TP ranks then all-gather the shards (vocab-parallel).
  const double lm_bytes = seqs > 0 ? lm_params_rank * wb : 0.0;
  const double lm_flops = 2.0 * lm_params_rank * seqs;
  const double sp_gather_bytes = pc.sp > 1 && seqs > 0 ? (sp - 1.0) * tokens_rank * h * ab : 0.0;
  const double tp_gather_bytes =
      pc.tp > 1 && seqs > 0 ? (tp - 1.0) * seqs * std::ceil(shape_.vocab_size / tp) * ab : 0.0;
  const double t_sp_gather = sp_gather_bytes > 0 ? lat + sp_gather_bytes / cbw : 0.0;
  const double t_tp_gather = tp_gather_bytes > 0 ? lat + tp_gather_bytes / cbw : 0.0;
  const double t_lm = std::max(lm_bytes / bw, lm_flops / peak) + t_sp_gather + t_tp_gather;

  // PP send of one micro-batch's activations.
  const double pp_bytes_mb = pc.pp > 1 ? tokens_rank * h * ab : 0.0;
  const double t_pp = pc.pp > 1 ? lat + pp_bytes_mb / cbw : 0.0;

  StepCost out;
  out.stages.resize(pc.pp);
  const int base = shape_.num_layers / pc.pp, extra = shape_.num_layers % pc.pp;
  if (step.num_tokens() == 0) {  // no forward pass at all
    for (int s = 0; s < pc.pp; ++s) out.stages[s].num_layers = base + (s < extra ? 1 : 0);
    return out;
  }
  double sum_t = 0, max_t = -1;
  for (int s = 0; s < pc.pp; ++s) {
    StageCost& st = out.stages[s];
    const bool last = s == pc.pp - 1;
    st.num_layers = base + (s < extra ? 1 : 0);
    const double n = st.num_layers;
    st.micro_batch_ms = (n * t_layer + (last ? t_lm : 0.0) + (last ? 0.0 : t_pp)) * 1e3;
    st.weight_read_ms = (n * t_lin_dm + (last ? lm_bytes / bw : 0.0)) * 1e3;
    st.kv_read_ms = n * t_attn_dm * 1e3;
    st.linear_compute_ms = (n * t_lin_c + (last ? lm_flops / peak : 0.0)) * 1e3;
    st.attention_compute_ms = n * t_attn_c * 1e3;
    st.tp_comm_ms = (n * t_tp_layer + (last ? t_tp_gather : 0.0)) * 1e3;
    st.sp_comm_ms = (n * t_sp_layer + (last ? t_sp_gather : 0.0)) * 1e3;
    st.pp_comm_ms = last ? 0.0 : t_pp * 1e3;
    st.tp_bytes = M * (n * tp_bytes_layer + (last ? tp_gather_bytes : 0.0));
    st.sp_bytes = M * (n * sp_bytes_layer + (last ? sp_gather_bytes : 0.0));
    st.pp_bytes = last ? 0.0 : M * pp_bytes_mb;
    sum_t += st.micro_batch_ms;
    if (st.micro_batch_ms > max_t) {
      max_t = st.micro_batch_ms;
      out.bottleneck_stage = s;
    }
  }

  const StageCost& b = out.stages[out.bottleneck_stage];
  const int nb = b.num_layers;
  const bool b_last = out.bottleneck_stage == pc.pp - 1;
  out.bubble_ms = sum_t - max_t;
  out.total_ms = M * max_t + out.bubble_ms;
  out.weight_read_ms = M * b.weight_read_ms;
  out.kv_read_ms = M * b.kv_read_ms;
  out.linear_compute_ms = M * b.linear_compute_ms;
  out.attention_compute_ms = M * b.attention_compute_ms;
  out.compute_ms = out.linear_compute_ms + out.attention_compute_ms;
  out.tp_comm_ms = M * b.tp_comm_ms;
  out.sp_comm_ms = M * b.sp_comm_ms;
  out.pp_comm_ms = M * b.pp_comm_ms;
  out.comm_ms = out.tp_comm_ms + out.sp_comm_ms + out.pp_comm_ms;
  out.memory_bytes = M * (nb * (lin_bytes + attn_bytes) + (b_last ? lm_bytes : 0.0));
  out.flops = M * (nb * (lin_flops + attn_flops) + (b_last ? lm_flops : 0.0));
  out.tp_bytes_per_rank = out.stages[0].tp_bytes;
  out.sp_bytes_per_rank = out.stages[0].sp_bytes;
  out.pp_bytes_per_rank = out.stages[0].pp_bytes;
  out.tokens_per_s = out.total_ms > 0 ? pc.dp * static_cast<double>(step.num_tokens()) / (out.total_ms / 1e3) : 0.0;
  return out;
}

double CostModel::ffn_layer_bytes() const {
  return 3.0 * shape_.hidden_size * static_cast<double>(shape_.intermediate_size) * sizes_.weight_bytes;
}

double CostModel::sidp_weight_fetch_ms(const LinkSpec& link) const {
  return (link.latency_s + ffn_layer_bytes() / link.bandwidth_bytes_per_s) * 1e3;
}

double CostModel::sidp_ffn_gemm_ms(long long batch) const {
  const double ffn_params = 3.0 * shape_.hidden_size * static_cast<double>(shape_.intermediate_size);
  const double b = static_cast<double>(std::max(0LL, batch));
  return std::max(ffn_layer_bytes() / hw_.memory_bw_bytes_per_s, 2.0 * ffn_params * b / hw_.flops_at(b)) * 1e3;
}

namespace {

/// The least b in [1, max_batch] with hides(b) (max_batch if none), for a
/// hides() monotone in b whose compute-bound solution is `exact`: the closed
/// form, then a step either way to settle the rounding of ceil().
template <class Hides>
long long least_hiding_batch(const Hides& hides, double exact, long long max_batch) {
  if (hides(1)) return 1;
  long long b =
      exact >= static_cast<double>(max_batch) ? max_batch : std::max(1LL, static_cast<long long>(std::ceil(exact)));
  while (b > 1 && hides(b - 1)) --b;
  while (b < max_batch && !hides(b)) ++b;
  return b;
}

}  // namespace

Result<CostModel> CostModel::for_cpu_devices(const model::ModelConfig& config, DType weight_dtype,
                                             DType kv_cache_dtype, double machine_memory_bw_bytes_per_s,
                                             double machine_flops_per_s, int num_devices, const LinkSpec& link) {
  if (num_devices < 1) return bad("num_devices must be >= 1, got " + std::to_string(num_devices)).error();
  ElementSizes sizes;
  sizes.weight_bytes = static_cast<double>(dtype_size(weight_dtype));
  sizes.kv_bytes = static_cast<double>(dtype_size(kv_cache_dtype));
  sizes.activation_bytes = 4;
  HardwareSpec hw;
  hw.memory_bw_bytes_per_s = machine_memory_bw_bytes_per_s / num_devices;
  hw.flops_per_s = machine_flops_per_s / num_devices;
  hw.comm_bw_bytes_per_s = link.bandwidth_bytes_per_s;
  hw.comm_latency_s = link.latency_s;
  return create(ModelShape::from_config(config), sizes, hw);
}

Result<CostModel> CostModel::for_sidp_rank(const model::ModelConfig& config, DType weight_dtype, DType kv_cache_dtype,
                                           double machine_memory_bw_bytes_per_s, double machine_flops_per_s, int dp,
                                           const LinkSpec& link) {
  return for_sidp_rank(config, static_cast<double>(dtype_size(weight_dtype)), kv_cache_dtype,
                       machine_memory_bw_bytes_per_s, machine_flops_per_s, dp, link);
}

Result<CostModel> CostModel::for_sidp_rank(const model::ModelConfig& config, double weight_bytes, DType kv_cache_dtype,
                                           double machine_memory_bw_bytes_per_s, double machine_flops_per_s, int dp,
                                           const LinkSpec& link) {
  if (dp < 1) return bad("dp must be >= 1, got " + std::to_string(dp)).error();
  auto model = for_cpu_devices(config, DType::f32, kv_cache_dtype, machine_memory_bw_bytes_per_s, machine_flops_per_s,
                               dp, link);
  if (!model) return model;
  ElementSizes sizes = model->sizes_;
  sizes.weight_bytes = weight_bytes;
  return create(model->shape_, sizes, model->hw_);
}

Result<ShiftThresholdPoint> CostModel::shift_threshold(const engine::ParallelConfig& base,
                                                       long long context_tokens_per_seq, long long max_tokens) const {
  if (base.pp != 1) return bad("Shift Parallelism needs pp = 1, got " + base.to_string()).error();
  if (base.sp < 1 || base.tp < 1 || base.sp * base.tp < 2)
    return bad("Shift Parallelism needs sp*tp >= 2, got " + base.to_string()).error();
  if (context_tokens_per_seq < 0)
    return bad("context_tokens_per_seq must be >= 0, got " + std::to_string(context_tokens_per_seq)).error();
  if (max_tokens < 1) return bad("max_tokens must be >= 1, got " + std::to_string(max_tokens)).error();
  engine::ParallelConfig shift = base;
  shift.tp = base.sp * base.tp;
  shift.sp = 1;
  // Both step times of n decoding sequences.
  const auto times = [&](long long n) -> Result<std::pair<double, double>> {
    const long long context = std::max(1LL, context_tokens_per_seq);
    StepShape step;  // n x add_sequence(context, 1)
    step.num_decode_tokens = n;
    step.num_sequences = n;
    step.num_context_tokens = n * context;
    step.num_attention_pairs = n * (context + 1);
    auto b = estimate(base, step);
    if (!b) return b.error();
    auto s = estimate(shift, step);
    if (!s) return s.error();
    return std::pair<double, double>{b->total_ms, s->total_ms};
  };
  ShiftThresholdPoint out;
  out.threshold = max_tokens;
  out.capped = true;
  for (long long n = 1; n <= max_tokens; ++n) {
    auto t = times(n);
    if (!t) return t.error();
    if (t->first < t->second) {
      out.threshold = n - 1;
      out.capped = false;
      out.base_next_ms = t->first;
      out.shift_next_ms = t->second;
      break;
    }
  }
  auto at = times(std::max(1LL, out.threshold));
  if (!at) return at.error();
  out.base_ms = at->first;
  out.shift_ms = at->second;
  return out;
}

double CostModel::sidp_layer_ms(long long batch) const {
  const double w = shape_.layer_params();
  const double b = static_cast<double>(std::max(0LL, batch));
  return std::max(w * sizes_.weight_bytes / hw_.memory_bw_bytes_per_s, 2.0 * w * b / hw_.flops_at(b)) * 1e3;
}

Result<SidpSwitchPoint> CostModel::sidp_switch_batch_overlapped(const LinkSpec& link, int dp,
                                                                long long max_batch) const {
  if (dp < 2) return bad("dp must be >= 2, got " + std::to_string(dp)).error();
  auto base = sidp_switch_batch(link, max_batch);  // checks the link and max_batch
  if (!base) return base.error();
  SidpSwitchPoint out = *base;
  out.dp = dp;
  const double hidden_ms = (dp - 1.0) / dp * out.fetch_ms;  // fetch per layer of forward
  const auto hides = [&](long long b) { return sidp_layer_ms(b) >= hidden_ms * (1.0 - 1e-12); };
  const long long b = least_hiding_batch(hides, hidden_ms / 1e3 * hw_.flops_per_s / (2.0 * shape_.layer_params()),
                                         max_batch);
  out.switch_batch = b;
  out.capped = !hides(b);
  out.ffn_gemm_ms = sidp_ffn_gemm_ms(b);
  out.layer_ms = sidp_layer_ms(b);
  return out;
}

Result<SidpSwitchPoint> CostModel::sidp_switch_batch(const LinkSpec& link, long long max_batch) const {
  if (!positive(link.bandwidth_bytes_per_s))
    return bad("link bandwidth_bytes_per_s must be > 0, got " + num(link.bandwidth_bytes_per_s)).error();
  if (!std::isfinite(link.latency_s) || link.latency_s < 0)
    return bad("link latency_s must be >= 0, got " + num(link.latency_s)).error();
  if (max_batch < 1) return bad("max_batch must be >= 1, got " + std::to_string(max_batch)).error();

  SidpSwitchPoint out;
  out.fetch_ms = sidp_weight_fetch_ms(link);
  out.ffn_weight_read_ms = ffn_layer_bytes() / hw_.memory_bw_bytes_per_s * 1e3;
  // T_ffn(b) >= T_fetch, with a relative tolerance so that an exact balance
  // (e.g. no latency and FLOPS * weight_bytes / (2 B_link) an integer) is not
  // lost to rounding.
  const auto hides = [&](long long b) { return sidp_ffn_gemm_ms(b) >= out.fetch_ms * (1.0 - 1e-12); };
  const double ffn_params = 3.0 * shape_.hidden_size * static_cast<double>(shape_.intermediate_size);
  const long long b = least_hiding_batch(hides, out.fetch_ms / 1e3 * hw_.flops_per_s / (2.0 * ffn_params), max_batch);
  out.switch_batch = b;
  out.capped = !hides(b);
  out.ffn_gemm_ms = sidp_ffn_gemm_ms(b);
  return out;
}

}  // namespace shardline::sim
