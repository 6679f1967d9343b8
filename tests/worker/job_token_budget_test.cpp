// The worker's per-job token budget switch over a real engine
// (worker/job_token_budget.hpp).
#include "worker/job_token_budget.hpp"

#include <gtest/gtest.h>

#include "engine/group/engine_builder.hpp"
#include "engine/policies/token_budget.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::worker {
namespace worker_job_token_budget_test {

TEST(JobTokenBudget, SwitchesTheEnginePolicyOnlyWhenTheJobPolicyChanges) {
  engine::EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.kv_cache_bytes = 4u << 20;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 64;
  auto built = engine::build_engine(o);
  ASSERT_TRUE(built.ok()) << built.error().to_string();
  engine::LlmEngine& llm = *built->engine;
  EXPECT_EQ(llm.config().token_budget, nullptr);

  JobTokenBudget budget(o.max_num_batched_tokens);
  EXPECT_EQ(budget.current(), "fixed");
  auto first = budget.use("throttle", llm);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_TRUE(*first);
  ASSERT_NE(llm.config().token_budget, nullptr);
  const engine::TokenBudgetPolicy* throttle = llm.config().token_budget.get();
  EXPECT_EQ(budget.current(), "throttle");

  EXPECT_FALSE(budget.use("throttle", llm).value());  // same job policy: nothing to do
  EXPECT_EQ(llm.config().token_budget.get(), throttle);

  EXPECT_TRUE(budget.use("", llm).value());  // "" is fixed
  EXPECT_EQ(budget.current(), "fixed");
  ASSERT_NE(llm.config().token_budget, nullptr);
  EXPECT_NE(llm.config().token_budget.get(), throttle);
  EXPECT_FALSE(budget.use("fixed", llm).value());

  EXPECT_TRUE(budget.use("throttle", llm).value());
  EXPECT_EQ(llm.config().token_budget.get(), throttle);  // made once, kept

  const auto bad = budget.use("nope", llm);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(llm.config().token_budget.get(), throttle);  // unchanged
  EXPECT_EQ(budget.current(), "throttle");

  // The engine still generates under the switched policy.
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 8;
  auto out = llm.generate({{1, 403, 407, 261, 378}}, p);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_EQ(out->at(0).token_ids.size(), 8u);
}

}  // namespace
}  // namespace shardline::worker
