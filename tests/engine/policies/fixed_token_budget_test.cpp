#include "engine/policies/fixed_token_budget.hpp"

#include <gtest/gtest.h>

namespace shardline::engine {
namespace engine_policies_fixed_token_budget_test {

engine::SchedulerState state(int wp, int rd, int cap = 2048) {
  engine::SchedulerState s;
  s.num_waiting_prefill_tokens = wp;
  s.num_running_decode_seqs = rd;
  s.num_free_kv_blocks = 100;
  s.num_total_kv_blocks = 100;
  s.pipeline_depth = 1;
  s.max_num_batched_tokens = cap;
  return s;
}

TEST(FixedTokenBudget, DecodesFirstPrefillFillsTheRest) {
  const FixedTokenBudget p(512);
  EXPECT_STREQ(p.name(), "fixed");
  EXPECT_EQ(p.token_budget(), 512);
  const engine::MicroBatchBudget b = p.budget(state(1000, 100));
  EXPECT_EQ(b.max_decode_tokens, 100);
  EXPECT_EQ(b.max_prefill_tokens, 412);  // 512 - 100
}

TEST(FixedTokenBudget, DecodesAloneCanFillTheBudget) {
  const FixedTokenBudget p(512);
  const engine::MicroBatchBudget b = p.budget(state(1000, 600));
  EXPECT_EQ(b.max_decode_tokens, 512);
  EXPECT_EQ(b.max_prefill_tokens, 0);
  // Exactly full.
  const engine::MicroBatchBudget c = p.budget(state(1000, 512));
  EXPECT_EQ(c.max_decode_tokens, 512);
  EXPECT_EQ(c.max_prefill_tokens, 0);
}

TEST(FixedTokenBudget, ClampedToTheEnginesPerStepCap) {
  const FixedTokenBudget p(2048);
  const engine::MicroBatchBudget b = p.budget(state(1000, 10, 256));
  EXPECT_EQ(b.max_decode_tokens, 10);
  EXPECT_EQ(b.max_prefill_tokens, 246);  // min(2048, 256) - 10
  const engine::MicroBatchBudget c = p.budget(state(1000, 300, 256));
  EXPECT_EQ(c.max_decode_tokens, 256);
  EXPECT_EQ(c.max_prefill_tokens, 0);
}

TEST(FixedTokenBudget, PrefillNeverMoreThanWaiting) {
  const FixedTokenBudget p(512);
  const engine::MicroBatchBudget b = p.budget(state(50, 10));
  EXPECT_EQ(b.max_decode_tokens, 10);
  EXPECT_EQ(b.max_prefill_tokens, 50);
}

TEST(FixedTokenBudget, EmptyStateGivesNothing) {
  const FixedTokenBudget p(512);
  const engine::MicroBatchBudget b = p.budget(engine::SchedulerState{});
  EXPECT_EQ(b.max_decode_tokens, 0);
  EXPECT_EQ(b.max_prefill_tokens, 0);
  // Only prefill waiting: the whole budget goes to prefill.
  const engine::MicroBatchBudget c = p.budget(state(5000, 0));
  EXPECT_EQ(c.max_decode_tokens, 0);
  EXPECT_EQ(c.max_prefill_tokens, 512);
}

TEST(FixedTokenBudget, IgnoresKvCacheAndPipelineDepth) {
  const FixedTokenBudget p(512);
  engine::SchedulerState s = state(1000, 100);
  const engine::MicroBatchBudget ref = p.budget(s);
  s.num_free_kv_blocks = 1;  // nearly full KV cache: Sarathi-Serve schedules eagerly anyway
  s.pipeline_depth = 4;
  const engine::MicroBatchBudget b = p.budget(s);
  EXPECT_EQ(b.max_decode_tokens, ref.max_decode_tokens);
  EXPECT_EQ(b.max_prefill_tokens, ref.max_prefill_tokens);
}

TEST(FixedTokenBudget, NegativeCountsAndBadBudgetAreHarmless) {
  const FixedTokenBudget p(0);  // treated as 1
  EXPECT_EQ(p.token_budget(), 1);
  const engine::MicroBatchBudget b = p.budget(state(-5, -3));
  EXPECT_EQ(b.max_decode_tokens, 0);
  EXPECT_EQ(b.max_prefill_tokens, 0);
  const engine::MicroBatchBudget c = FixedTokenBudget(64).budget(state(10, 10, -1));
  EXPECT_EQ(c.max_decode_tokens, 0);
  EXPECT_EQ(c.max_prefill_tokens, 0);
}

}  // namespace
}  // namespace shardline::engine
