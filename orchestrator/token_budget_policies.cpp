#include "orchestrator/token_budget_policies.hpp"

#include <algorithm>
#include <string>

#include "orchestrator/fixed_token_budget.hpp"
#include "orchestrator/token_throttling.hpp"

namespace shardline::orchestrator {

const char* token_budget_policy_names() noexcept { return "fixed, throttle"; }

Result<std::unique_ptr<engine::TokenBudgetPolicy>> make_token_budget_policy(std::string_view name,
                                                                           int max_num_batched_tokens) {
  if (max_num_batched_tokens < 1)
    return make_error(ErrorCode::invalid_argument,
                      "token budget policy: max_num_batched_tokens must be >= 1, got " +
                          std::to_string(max_num_batched_tokens));
  if (name == "fixed")
    return std::unique_ptr<engine::TokenBudgetPolicy>(std::make_unique<FixedTokenBudget>(max_num_batched_tokens));
  if (name == "throttle") {
    TokenThrottlingParams p;
    p.max_prefill_tokens = max_num_batched_tokens;
    p.min_prefill_tokens = std::min(p.min_prefill_tokens, p.max_prefill_tokens);
    if (Status st = p.validate(); !st) return st.error();
    return std::unique_ptr<engine::TokenBudgetPolicy>(std::make_unique<TokenThrottling>(p));
  }
  return make_error(ErrorCode::invalid_argument, "unknown token budget policy '" + std::string(name) +
                                                     "' (expected one of: " + token_budget_policy_names() + ")");
}

}  // namespace shardline::orchestrator
