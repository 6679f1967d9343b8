#include "engine/policies/fixed_token_budget.hpp"

#include <algorithm>

namespace shardline::engine {

FixedTokenBudget::FixedTokenBudget(int token_budget) : token_budget_(std::max(1, token_budget)) {}

MicroBatchBudget FixedTokenBudget::budget(const SchedulerState& s) const {
  const int cap = std::max(0, std::min(token_budget_, s.max_num_batched_tokens));
  const int rd = std::max(0, s.num_running_decode_seqs);
  const int wp = std::max(0, s.num_waiting_prefill_tokens);
  MicroBatchBudget b;
  b.max_decode_tokens = std::min(rd, cap);
  b.max_prefill_tokens = std::min(wp, cap - b.max_decode_tokens);
  return b;
}

}  // namespace shardline::engine
