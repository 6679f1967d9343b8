#include "worker/job_token_budget.hpp"

#include "engine/policies/token_budget_policies.hpp"

namespace shardline::worker {

Result<bool> JobTokenBudget::use(std::string_view name, engine::LlmEngine& engine) {
  const std::string_view want = name.empty() ? std::string_view("fixed") : name;
  if (installed_ && want == current_) return false;
  auto it = policies_.find(want);
  if (it == policies_.end()) {
    auto made = engine::make_token_budget_policy(want, max_num_batched_tokens_);
    if (!made) return std::move(made).error();
    it = policies_.emplace(std::string(want), std::shared_ptr<const engine::TokenBudgetPolicy>(std::move(made).value()))
             .first;
  }
  engine.set_token_budget(it->second);
  current_ = it->first;
  installed_ = true;
  return true;
}

}  // namespace shardline::worker
