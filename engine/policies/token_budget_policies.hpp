#pragma once
/// \file
/// Picks a per-micro-batch token budget policy by name (the `--token-budget`
/// style choice of the engine): "fixed" (Sarathi-Serve, fixed_token_budget.hpp)
/// or "throttle" (gLLM Token Throttling, seed 004 §3, token_throttling.hpp).

#include <memory>
#include <string_view>

#include "common/result.hpp"
#include "engine/policies/token_budget.hpp"

namespace shardline::engine {

/// Names accepted by make_token_budget_policy, for help texts: "fixed, throttle".
[[nodiscard]] const char* token_budget_policy_names() noexcept;

/// Checks that `name` is one of token_budget_policy_names(), without making
/// a policy (what the message codec and job admission check). Errors:
/// invalid_argument naming the policy and listing the valid names.
[[nodiscard]] Status check_token_budget_policy_name(std::string_view name);

/// Makes the policy called `name` for an engine whose per-step cap is
/// `max_num_batched_tokens` tokens:
///  - "fixed":    FixedTokenBudget(max_num_batched_tokens)
///  - "throttle": TokenThrottling with the paper's defaults (#T = 8,
///                KV_thresh = 0.05) and #MaxP = max_num_batched_tokens (the
///                paper sets #MaxP = 2048, the token budget of its baselines),
///                #MinP = min(32, #MaxP).
/// Errors: invalid_argument for an unknown name (the message names it and
/// lists the valid names) or max_num_batched_tokens < 1.
[[nodiscard]] Result<std::unique_ptr<TokenBudgetPolicy>> make_token_budget_policy(
    std::string_view name, int max_num_batched_tokens);

}  // namespace shardline::engine
