#include "engine/policies/token_throttling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace shardline::engine {

namespace {

// floor() that forgives the rounding of a product of doubles just below an
// integer (e.g. 2048 * 0.95 / 0.95 = 2047.9999...).
int floor_tokens(double x) {
  if (!(x > 0)) return 0;
  return static_cast<int>(std::floor(x + 1e-9));
}

}  // namespace

Status TokenThrottlingParams::validate() const {
  const auto bad = [](const std::string& m) {
    return Status(make_error(ErrorCode::invalid_argument, "token throttling: " + m));
  };
  if (iterations < 1) return bad("#T (iterations) must be >= 1, got " + std::to_string(iterations));
  if (max_prefill_tokens < 1)
    return bad("#MaxP (max_prefill_tokens) must be >= 1, got " + std::to_string(max_prefill_tokens));
  if (min_prefill_tokens < 0 || min_prefill_tokens > max_prefill_tokens)
    return bad("#MinP (min_prefill_tokens) must be in [0, #MaxP = " + std::to_string(max_prefill_tokens) +
               "], got " + std::to_string(min_prefill_tokens));
  if (!(kv_thresh >= 0.0 && kv_thresh < 1.0))
    return bad("KV_thresh (kv_thresh) must be in [0, 1), got " + std::to_string(kv_thresh));
  return Status::ok_status();
}

TokenThrottling::TokenThrottling(TokenThrottlingParams params) : p_(params) {
  p_.iterations = std::max(1, p_.iterations);
  p_.max_prefill_tokens = std::max(1, p_.max_prefill_tokens);
  p_.min_prefill_tokens = std::clamp(p_.min_prefill_tokens, 0, p_.max_prefill_tokens);
  if (!(p_.kv_thresh >= 0.0)) p_.kv_thresh = 0.0;
  if (!(p_.kv_thresh < 1.0)) p_.kv_thresh = 0.99;
}

int TokenThrottling::prefill_by_waiting(int waiting_prefill_tokens) const {
  const int wt = std::max(0, waiting_prefill_tokens) / p_.iterations;
  return std::min(std::max(wt, p_.min_prefill_tokens), p_.max_prefill_tokens);
}

int TokenThrottling::prefill_by_kv_free(double kv_free) const {
  kv_free = std::clamp(kv_free, 0.0, 1.0);
  return std::max(floor_tokens(p_.max_prefill_tokens * kv_free), p_.min_prefill_tokens);
}

int TokenThrottling::prefill_tokens(int waiting_prefill_tokens, double kv_free) const {
  kv_free = std::clamp(kv_free, 0.0, 1.0);
  if (waiting_prefill_tokens <= 0) return 0;
  if (kv_free < p_.kv_thresh) return 0;
  const int wt = waiting_prefill_tokens / p_.iterations;
  const int ut = floor_tokens(p_.max_prefill_tokens * (kv_free - p_.kv_thresh) / (1.0 - p_.kv_thresh));
  return std::max(std::min(wt, ut), p_.min_prefill_tokens);
}

int TokenThrottling::decode_tokens(int running_decode_seqs, int pipeline_depth) {
  const long long rd = std::max(0, running_decode_seqs);
  const long long pp = std::max(1, pipeline_depth);
  return static_cast<int>((rd + pp - 1) / pp);
}

MicroBatchBudget TokenThrottling::budget(const SchedulerState& s) const {
  const int cap = std::max(0, s.max_num_batched_tokens);
  const int wp = std::max(0, s.num_waiting_prefill_tokens);
  double kv_free = 1.0;
  if (s.num_total_kv_blocks > 0)
    kv_free = std::clamp(static_cast<double>(std::max(0, s.num_free_kv_blocks)) / s.num_total_kv_blocks, 0.0, 1.0);

  MicroBatchBudget b;
  b.max_decode_tokens = std::min(decode_tokens(s.num_running_decode_seqs, s.pipeline_depth), cap);
  b.max_prefill_tokens = std::min({prefill_tokens(wp, kv_free), wp, cap - b.max_decode_tokens});
  return b;
}

}  // namespace shardline::engine
