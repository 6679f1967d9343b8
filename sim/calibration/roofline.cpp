#include "sim/calibration/roofline.hpp"

#include <algorithm>

namespace shardline::sim::calibration {

double StepCost::roofline_ms(double membw_gbs, double gemm_gflops) const {
  const double mem_ms = bytes() / (membw_gbs * 1e9) * 1e3;
  const double compute_ms = flops / (gemm_gflops * 1e9) * 1e3;
  return std::max(mem_ms, compute_ms);
}

double StepCost::gemm_limit_ms(double membw_gbs, double gemm_gflops) const {
  return std::max(gemm_weight_bytes / (membw_gbs * 1e9), gemm_flops / (gemm_gflops * 1e9)) * 1e3;
}

double StepCost::attention_limit_ms(double membw_gbs) const { return kv_bytes / (membw_gbs * 1e9) * 1e3; }

double StepCost::lm_head_limit_ms(double membw_gbs, double gemm_gflops) const {
  return std::max(lm_head_weight_bytes / (membw_gbs * 1e9), lm_head_flops / (gemm_gflops * 1e9)) * 1e3;
}

StepCost step_cost(const model::ModelConfig& c, double weight_elem_bytes, double kv_elem_bytes,
                   const model::StepInput& step) {
  const double hidden = c.hidden_size;
  const double layer_params = hidden * c.qkv_rows() +                                 // qkv
                              static_cast<double>(c.num_attention_heads) * c.head_dim * hidden +  // o
                              3.0 * hidden * c.intermediate_size;                      // gate, up, down
  const double lm_head_params = static_cast<double>(c.vocab_size) * hidden;
  const double n = step.num_tokens();
  const double num_logits = step.num_logits();
  const double layers = c.num_hidden_layers;

  StepCost cost;
  cost.gemm_weight_bytes = layers * layer_params * weight_elem_bytes;
  cost.lm_head_weight_bytes = num_logits > 0 ? lm_head_params * weight_elem_bytes : 0.0;
  cost.weight_bytes = cost.gemm_weight_bytes + cost.lm_head_weight_bytes;
  cost.gemm_flops = 2.0 * n * layers * layer_params;
  cost.lm_head_flops = 2.0 * num_logits * lm_head_params;

  // Attention: each query token at position p attends p + 1 keys.
  const double kv_token_bytes = 2.0 * c.num_key_value_heads * c.head_dim * kv_elem_bytes;  // K and V
  double attended = 0;  // sum over query tokens of keys attended
  double kv_read_tokens = 0;
  for (const model::StepSeq& s : step.seqs) {
    const double ctx = s.num_computed_tokens + s.num_new_tokens;
    const double first = s.num_computed_tokens + 1;  // keys seen by the first new token
    attended += (first + ctx) * s.num_new_tokens / 2.0;
    kv_read_tokens += ctx;  // each key read once per step (GQA group shares it)
  }
  cost.kv_bytes = layers * kv_token_bytes * (kv_read_tokens + n);
  cost.attention_flops = layers * 4.0 * c.num_attention_heads * c.head_dim * attended;
  cost.flops = cost.gemm_flops + cost.lm_head_flops + cost.attention_flops;
  return cost;
}

}  // namespace shardline::sim::calibration
