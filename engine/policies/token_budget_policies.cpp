#include "engine/policies/token_budget_policies.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "engine/policies/fixed_token_budget.hpp"
#include "engine/policies/token_throttling.hpp"

namespace shardline::engine {

namespace {
constexpr std::string_view kPolicyNames[] = {"fixed", "throttle"};
}  // namespace

const char* token_budget_policy_names() noexcept { return "fixed, throttle"; }

Status check_token_budget_policy_name(std::string_view name) {
  if (std::find(std::begin(kPolicyNames), std::end(kPolicyNames), name) != std::end(kPolicyNames))
    return Status::ok_status();
  return make_error(ErrorCode::invalid_argument, "unknown token budget policy '" + std::string(name) +
                                                     "' (expected one of: " + token_budget_policy_names() + ")");
}

Result<std::unique_ptr<TokenBudgetPolicy>> make_token_budget_policy(std::string_view name,
                                                                           int max_num_batched_tokens) {
  if (max_num_batched_tokens < 1)
    return make_error(ErrorCode::invalid_argument,
                      "token budget policy: max_num_batched_tokens must be >= 1, got " +
                          std::to_string(max_num_batched_tokens));
  if (name == "fixed")
    return std::unique_ptr<TokenBudgetPolicy>(std::make_unique<FixedTokenBudget>(max_num_batched_tokens));
  if (name == "throttle") {
    TokenThrottlingParams p;
    p.max_prefill_tokens = max_num_batched_tokens;
    p.min_prefill_tokens = std::min(p.min_prefill_tokens, p.max_prefill_tokens);
    if (Status st = p.validate(); !st) return st.error();
    return std::unique_ptr<TokenBudgetPolicy>(std::make_unique<TokenThrottling>(p));
  }
  if (Status st = check_token_budget_policy_name(name); !st) return st.error();
  return make_error(ErrorCode::internal, "token budget policy '" + std::string(name) + "' is listed but not made");
}

}  // namespace shardline::engine
