#include "engine/policies/token_budget_policies.hpp"

#include <gtest/gtest.h>

#include <string>

namespace shardline::engine {
namespace engine_policies_token_budget_policies_test {

engine::SchedulerState busy_state() {
  engine::SchedulerState s;
  s.num_waiting_prefill_tokens = 8000;
  s.num_running_decode_seqs = 10;
  s.num_free_kv_blocks = 400;
  s.num_total_kv_blocks = 400;
  s.pipeline_depth = 4;
  s.max_num_batched_tokens = 512;
  return s;
}

TEST(TokenBudgetPolicies, Fixed) {
  auto p = make_token_budget_policy("fixed", 512);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_STREQ((*p)->name(), "fixed");
  const engine::MicroBatchBudget b = (*p)->budget(busy_state());
  EXPECT_EQ(b.max_decode_tokens, 10);
  EXPECT_EQ(b.max_prefill_tokens, 502);
}

TEST(TokenBudgetPolicies, ThrottleUsesTheCapAsMaxP) {
  auto p = make_token_budget_policy("throttle", 512);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_STREQ((*p)->name(), "throttle");
  const engine::MicroBatchBudget b = (*p)->budget(busy_state());
  EXPECT_EQ(b.max_decode_tokens, 3);     // ceil(10 / 4)
  EXPECT_EQ(b.max_prefill_tokens, 509);  // min(8000 / 8, #MaxP = 512) = 512, cap 512 - 3

  // A cap below the paper's #MinP = 32 lowers #MinP with it.
  auto small = make_token_budget_policy("throttle", 16);
  ASSERT_TRUE(small.ok()) << small.error().to_string();
  engine::SchedulerState s = busy_state();
  s.num_waiting_prefill_tokens = 40;  // 40 / 8 = 5 -> #MinP = 16
  s.num_running_decode_seqs = 0;
  s.max_num_batched_tokens = 16;
  EXPECT_EQ((*small)->budget(s).max_prefill_tokens, 16);
}

TEST(TokenBudgetPolicies, UnknownNameIsInvalidArgument) {
  for (const char* name : {"sarathi", "", "Fixed", "throttling"}) {
    auto p = make_token_budget_policy(name, 512);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(p.error().message.find("'" + std::string(name) + "'"), std::string::npos) << p.error().message;
    EXPECT_NE(p.error().message.find("fixed"), std::string::npos) << p.error().message;
    EXPECT_NE(p.error().message.find("throttle"), std::string::npos) << p.error().message;
  }
}

TEST(TokenBudgetPolicies, NameCheckAgreesWithTheFactory) {
  // Every listed name passes the check and makes a policy of that name;
  // anything else fails both with the same message.
  for (const char* name : {"fixed", "throttle"}) {
    EXPECT_TRUE(check_token_budget_policy_name(name).ok()) << name;
    auto p = make_token_budget_policy(name, 512);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ(std::string((*p)->name()), name);
  }
  for (const char* name : {"sarathi", "", "Fixed", "throttling"}) {
    const Status st = check_token_budget_policy_name(name);
    ASSERT_FALSE(st.ok()) << name;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(st.error().message, make_token_budget_policy(name, 512).error().message);
  }
}

TEST(TokenBudgetPolicies, NonPositiveCapIsInvalidArgument) {
  for (const char* name : {"fixed", "throttle"}) {
    auto p = make_token_budget_policy(name, 0);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(p.error().message.find("max_num_batched_tokens"), std::string::npos) << p.error().message;
  }
}

}  // namespace
}  // namespace shardline::engine
