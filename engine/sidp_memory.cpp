#include "engine/sidp_memory.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "engine/gpu_memory_plan.hpp"
#include "model/sidp/layer_owner.hpp"

namespace shardline::engine {
namespace {

using u64 = std::uint64_t;

u64 nonneg(int v) { return v > 0 ? static_cast<u64>(v) : 0; }

/// One rank's capacity under `plan_cpu_memory`; out_of_memory gives 0 blocks.
Result<RankKvCapacity> rank_capacity(const KvCapacityInput& in, int rank, int owned, int slots) {
  RankKvCapacity r;
  r.rank = rank;
  r.owned_ffn_layers = owned;
  r.cache_slots = slots;
  r.weight_bytes = sidp_weight_bytes_for(in.config, in.weight_dtype, owned, slots);
  CpuMemoryPlanInput pi;
  pi.device_memory_bytes = in.device_memory_bytes;
  pi.weight_bytes = r.weight_bytes;
  pi.activation_bytes = in.activation_bytes;
  pi.reserved_bytes = in.reserved_bytes;
  pi.num_layers = in.config.num_hidden_layers;
  pi.num_kv_heads = in.config.num_key_value_heads;
  pi.head_dim = in.config.head_dim;
  pi.block_size = in.block_size;
  pi.kv_dtype = in.kv_dtype;
  pi.max_model_len = in.block_size;  // one block: count whatever is left
  auto plan = plan_cpu_memory(pi);
  if (!plan) {
    if (plan.error().code != ErrorCode::out_of_memory) return std::move(plan).error();
    return r;  // does not fit: no KV blocks
  }
  r.num_kv_blocks = plan->num_kv_blocks;
  r.kv_tokens = static_cast<u64>(plan->num_kv_blocks) * static_cast<u64>(in.block_size);
  return r;
}

}  // namespace

u64 ffn_weight_bytes_per_layer(const model::ModelConfig& c, DType weight_dtype) noexcept {
  // gate_up [2 * inter, hidden] + down_proj [hidden, inter]
  return 3 * nonneg(c.hidden_size) * nonneg(c.intermediate_size) * dtype_size(weight_dtype);
}

int sidp_owned_ffn_layer_count(int num_layers, int dp, int rank) noexcept {
  if (num_layers <= 0 || dp <= 0 || rank < 0 || rank >= dp) return 0;
  return num_layers / dp + (rank < num_layers % dp ? 1 : 0);
}

u64 sidp_weight_bytes_for(const model::ModelConfig& c, DType weight_dtype, int num_owned_ffn_layers,
                          int cache_slots) noexcept {
  const int layers = std::max(0, c.num_hidden_layers);
  const int owned = num_owned_ffn_layers < 0 ? layers : std::min(num_owned_ffn_layers, layers);
  const u64 ffn = ffn_weight_bytes_per_layer(c, weight_dtype);
  // weight_bytes_for counts every layer's FFN exactly once at `ffn` bytes.
  const u64 replicated = weight_bytes_for(c, weight_dtype) - static_cast<u64>(layers) * ffn;
  return replicated + static_cast<u64>(owned) * ffn + nonneg(cache_slots) * ffn;
}

u64 sidp_weight_bytes_of(const model::ModelWeights& w, int num_owned_ffn_layers, int cache_slots) noexcept {
  const u64 layers = w.layers.size();
  u64 ffn_total = 0, ffn_largest = 0;
  for (const model::LayerWeights& l : w.layers) {
    const u64 b = (l.gate_up.empty() ? 0 : l.gate_up.bytes()) + (l.down_proj.empty() ? 0 : l.down_proj.bytes());
    ffn_total += b;
    ffn_largest = std::max(ffn_largest, b);
  }
  const u64 owned = num_owned_ffn_layers < 0 ? layers : std::min<u64>(num_owned_ffn_layers, layers);
  const u64 mean = layers == 0 ? 0 : (ffn_total + layers - 1) / layers;
  return w.total_bytes() - ffn_total + owned * mean + nonneg(cache_slots) * ffn_largest;
}

Result<SidpFfnFormat> sidp_ffn_format(const model::ModelWeights& w) {
  if (w.layers.empty()) return make_error(ErrorCode::invalid_argument, "SiDP FFN format: the model has no layers");
  double region_bytes = 0, weights = 0;
  std::map<kernels::GgmlType, double> quant_weights;  // FFN weights per quantized type
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const model::LayerWeights& lw = w.layers[l];
    if (lw.gate_up.empty() || lw.down_proj.empty())
      return make_error(ErrorCode::invalid_argument,
                        "SiDP FFN format: layer " + std::to_string(l) + " has no gate_up or down_proj");
    auto layout = model::sidp::ffn_layout(w.config, lw, static_cast<int>(l));
    if (!layout) return std::move(layout).error();
    region_bytes += static_cast<double>(layout->bytes);
    for (const model::Matrix* m : {&lw.gate_up, &lw.down_proj}) {
      weights += static_cast<double>(m->rows) * m->cols;
      for (const model::RowRun& run : m->runs())
        if (run.type) quant_weights[*run.type] += static_cast<double>(run.rows) * m->cols;
    }
  }
  SidpFfnFormat out;
  out.region_bytes_per_weight = region_bytes / weights;
  double quantized = 0, most = 0;
  for (const auto& [type, count] : quant_weights) {
    quantized += count;
    if (count > most) {
      most = count;
      out.quant_type = type;
    }
  }
  if (quantized * 2 < weights) out.quant_type.reset();  // mostly dense
  return out;
}

u64 KvCapacity::plain_kv_tokens() const noexcept {
  u64 total = 0;
  for (const RankKvCapacity& r : plain) total += r.kv_tokens;
  return total;
}

u64 KvCapacity::sidp_kv_tokens() const noexcept {
  u64 total = 0;
  for (const RankKvCapacity& r : sidp) total += r.kv_tokens;
  return total;
}

Result<KvCapacity> kv_capacity_plain_vs_sidp(const KvCapacityInput& in) {
  if (in.dp < 1)
    return make_error(ErrorCode::invalid_argument, "KV capacity: dp must be >= 1, got " + std::to_string(in.dp));
  if (in.cache_slots < 0)
    return make_error(ErrorCode::invalid_argument,
                      "KV capacity: cache_slots must be >= 0, got " + std::to_string(in.cache_slots));
  if (in.config.num_hidden_layers <= 0)
    return make_error(ErrorCode::invalid_argument, "KV capacity: the model has no layers");
  KvCapacity out;
  for (int rank = 0; rank < in.dp; ++rank) {
    auto plain = rank_capacity(in, rank, in.config.num_hidden_layers, 0);
    if (!plain) return std::move(plain).error();
    out.plain.push_back(*plain);
    auto sidp = rank_capacity(in, rank, sidp_owned_ffn_layer_count(in.config.num_hidden_layers, in.dp, rank),
                              in.cache_slots);
    if (!sidp) return std::move(sidp).error();
    out.sidp.push_back(*sidp);
  }
  return out;
}

}  // namespace shardline::engine
