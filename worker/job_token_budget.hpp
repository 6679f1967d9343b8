#pragma once
/// \file
/// A worker's per-job token budget: the engine runs the policy of the job
/// whose lines it took last ("fixed" until told otherwise). Lines of two jobs
/// can share the engine for a while (the tail of one and the head of the
/// next); the policy only paces micro-batches, it never changes a line's
/// tokens (batch-invariant kernels, seeded sampling), so switching mid-way
/// is safe. Plain class: the worker actor owns one.

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "engine/policies/token_budget.hpp"

namespace shardline::worker {

class JobTokenBudget {
 public:
  /// `max_num_batched_tokens`: the engine's per-step cap (what the policies
  /// are made for).
  explicit JobTokenBudget(int max_num_batched_tokens) : max_num_batched_tokens_(max_num_batched_tokens) {}

  /// Makes `engine` run the policy `name` ("" = "fixed") from its next step,
  /// when it is not already the current one; true when it switched. Policies
  /// are made once per name and kept. Errors: invalid_argument for an unknown
  /// name (the engine keeps its policy).
  [[nodiscard]] Result<bool> use(std::string_view name, engine::LlmEngine& engine);

  /// The name of the policy in use ("fixed" before the first use()).
  [[nodiscard]] const std::string& current() const noexcept { return current_; }

 private:
  int max_num_batched_tokens_;
  std::string current_ = "fixed";
  bool installed_ = false;  ///< false: the engine still has the policy it was built with
  std::map<std::string, std::shared_ptr<const engine::TokenBudgetPolicy>, std::less<>> policies_;
};

}  // namespace shardline::worker
