#include "engine/policies/token_throttling.hpp"

#include <gtest/gtest.h>

namespace shardline::engine {
namespace engine_policies_token_throttling_test {

// Paper defaults (seed 004 §4.1): #T = 8, #MinP = 32, #MaxP = 2048, KV_thresh = 0.05.
engine::SchedulerState state(int wp, int rd, int free_blocks, int total_blocks, int pp = 1, int cap = 4096) {
  engine::SchedulerState s;
  s.num_waiting_prefill_tokens = wp;
  s.num_running_decode_seqs = rd;
  s.num_free_kv_blocks = free_blocks;
  s.num_total_kv_blocks = total_blocks;
  s.pipeline_depth = pp;
  s.max_num_batched_tokens = cap;
  return s;
}

TEST(TokenThrottling, PaperDefaults) {
  const TokenThrottlingParams p;
  EXPECT_EQ(p.iterations, 8);
  EXPECT_EQ(p.min_prefill_tokens, 32);
  EXPECT_EQ(p.max_prefill_tokens, 2048);
  EXPECT_DOUBLE_EQ(p.kv_thresh, 0.05);
  EXPECT_TRUE(p.validate().ok());
  EXPECT_STREQ(TokenThrottling().name(), "throttle");
}

TEST(TokenThrottling, Eq1ThrottleByWaitingTokens) {
  const TokenThrottling t;
  EXPECT_EQ(t.prefill_by_waiting(8000), 1000);     // 8000 / 8
  EXPECT_EQ(t.prefill_by_waiting(8007), 1000);     // floor(1000.875)
  EXPECT_EQ(t.prefill_by_waiting(100), 32);        // 12 -> #MinP
  EXPECT_EQ(t.prefill_by_waiting(0), 32);          // eq. 1 alone has no zero case
  EXPECT_EQ(t.prefill_by_waiting(100000), 2048);   // 12500 -> #MaxP
}

TEST(TokenThrottling, Eq2ThrottleByKvFreeRate) {
  const TokenThrottling t;
  EXPECT_EQ(t.prefill_by_kv_free(1.0), 2048);
  EXPECT_EQ(t.prefill_by_kv_free(0.5), 1024);
  EXPECT_EQ(t.prefill_by_kv_free(0.25), 512);
  EXPECT_EQ(t.prefill_by_kv_free(0.01), 32);  // floor(20.48) -> #MinP
  EXPECT_EQ(t.prefill_by_kv_free(0.0), 32);
}

TEST(TokenThrottling, Eq3CombinesBothAndTheThreshold) {
  const TokenThrottling t;
  // KV_free = 1: the KV term is #MaxP; #WP / #T decides.
  EXPECT_EQ(t.prefill_tokens(8000, 1.0), 1000);
  // KV_free = 0.525: (0.525 - 0.05) / 0.95 = 0.5 -> 1024 > 1000.
  EXPECT_EQ(t.prefill_tokens(8000, 0.525), 1000);
  // KV_free = 0.2875: 0.2375 / 0.95 = 0.25 -> 512 < 1000.
  EXPECT_EQ(t.prefill_tokens(8000, 0.2875), 512);
  // KV_free = 0.06: 2048 * 0.01 / 0.95 = 21.56 -> 21 -> #MinP.
  EXPECT_EQ(t.prefill_tokens(8000, 0.06), 32);
  // Exactly at the threshold: KV term 0, eq. 3 gives #MinP.
  EXPECT_EQ(t.prefill_tokens(8000, 0.05), 32);
  // Below the threshold: prefill suspended (§3.1.3).
  EXPECT_EQ(t.prefill_tokens(8000, 0.0499), 0);
  EXPECT_EQ(t.prefill_tokens(8000, 0.0), 0);
  // Nothing waiting: nothing to prefill.
  EXPECT_EQ(t.prefill_tokens(0, 1.0), 0);
  // Few waiting: #MinP (the budget clamps it to #WP).
  EXPECT_EQ(t.prefill_tokens(100, 1.0), 32);
}

TEST(TokenThrottling, Eq4DecodeSpreadOverThePipeline) {
  EXPECT_EQ(TokenThrottling::decode_tokens(8, 4), 2);
  EXPECT_EQ(TokenThrottling::decode_tokens(10, 4), 3);  // ceil(2.5)
  EXPECT_EQ(TokenThrottling::decode_tokens(5, 4), 2);   // ceil(1.25)
  EXPECT_EQ(TokenThrottling::decode_tokens(3, 4), 1);
  EXPECT_EQ(TokenThrottling::decode_tokens(0, 4), 0);
  EXPECT_EQ(TokenThrottling::decode_tokens(7, 1), 7);
  EXPECT_EQ(TokenThrottling::decode_tokens(7, 0), 7);   // depth < 1 read as 1
  EXPECT_EQ(TokenThrottling::decode_tokens(-2, 4), 0);
}

TEST(TokenThrottling, BudgetAtSeveralStates) {
  const TokenThrottling t;
  // 8000 waiting, 10 decoding, empty KV cache, 4 stages.
  engine::MicroBatchBudget b = t.budget(state(8000, 10, 400, 400, 4));
  EXPECT_EQ(b.max_decode_tokens, 3);
  EXPECT_EQ(b.max_prefill_tokens, 1000);
  // Same with 115 of 400 blocks free (KV_free = 0.2875): KV term 512.
  b = t.budget(state(8000, 10, 115, 400, 4));
  EXPECT_EQ(b.max_decode_tokens, 3);
  EXPECT_EQ(b.max_prefill_tokens, 512);
  // 100 waiting: #MinP = 32.
  b = t.budget(state(100, 10, 400, 400, 4));
  EXPECT_EQ(b.max_prefill_tokens, 32);
  // 20 waiting: #MinP clamped to the 20 there are.
  b = t.budget(state(20, 10, 400, 400, 4));
  EXPECT_EQ(b.max_prefill_tokens, 20);
  // #RD divisible by #PP.
  b = t.budget(state(0, 64, 400, 400, 4));
  EXPECT_EQ(b.max_decode_tokens, 16);
  EXPECT_EQ(b.max_prefill_tokens, 0);
}

TEST(TokenThrottling, KvThresholdSuspendsPrefillButNotDecode) {
  const TokenThrottling t;
  // 19 of 400 free = 0.0475 < 0.05.
  engine::MicroBatchBudget b = t.budget(state(8000, 10, 19, 400, 2));
  EXPECT_EQ(b.max_prefill_tokens, 0);
  EXPECT_EQ(b.max_decode_tokens, 5);
  // 20 of 400 = 0.05: allowed, #MinP.
  b = t.budget(state(8000, 10, 20, 400, 2));
  EXPECT_EQ(b.max_prefill_tokens, 32);
  // 24 of 400 = 0.06: KV term 21 -> #MinP.
  b = t.budget(state(8000, 10, 24, 400, 2));
  EXPECT_EQ(b.max_prefill_tokens, 32);
  // Threshold 0: a full cache still gets #MinP (eq. 3 as written).
  TokenThrottlingParams p;
  p.kv_thresh = 0.0;
  b = TokenThrottling(p).budget(state(8000, 10, 0, 400, 2));
  EXPECT_EQ(b.max_prefill_tokens, 32);
}

TEST(TokenThrottling, ClampsToMinPAndMaxP) {
  TokenThrottlingParams p;
  p.max_prefill_tokens = 512;
  p.min_prefill_tokens = 64;
  const TokenThrottling t(p);
  // 100000 / 8 = 12500 -> #MaxP (the KV term is 512 at KV_free = 1).
  EXPECT_EQ(t.budget(state(100000, 0, 400, 400)).max_prefill_tokens, 512);
  // 200 / 8 = 25 -> #MinP.
  EXPECT_EQ(t.budget(state(200, 0, 400, 400)).max_prefill_tokens, 64);
  // Half-full cache (KV_free = 0.525 -> 0.5 * 512 = 256) and 4000 / 8 = 500.
  EXPECT_EQ(t.budget(state(4000, 0, 210, 400)).max_prefill_tokens, 256);
}

TEST(TokenThrottling, ClampsToMaxNumBatchedTokensDecodesFirst) {
  const TokenThrottling t;
  engine::MicroBatchBudget b = t.budget(state(8000, 10, 400, 400, 4, 500));
  EXPECT_EQ(b.max_decode_tokens, 3);
  EXPECT_EQ(b.max_prefill_tokens, 497);
  b = t.budget(state(8000, 10, 400, 400, 4, 2));
  EXPECT_EQ(b.max_decode_tokens, 2);
  EXPECT_EQ(b.max_prefill_tokens, 0);
  b = t.budget(state(8000, 10, 400, 400, 4, 0));
  EXPECT_EQ(b.max_decode_tokens, 0);
  EXPECT_EQ(b.max_prefill_tokens, 0);
}

TEST(TokenThrottling, CaseStudyWithT3) {
  // §3.1.4 uses #T = 3: 300 waiting tokens go out in 100-token portions.
  TokenThrottlingParams p;
  p.iterations = 3;
  const TokenThrottling t(p);
  EXPECT_EQ(t.budget(state(300, 0, 400, 400, 2)).max_prefill_tokens, 100);
  EXPECT_EQ(t.budget(state(200, 0, 400, 400, 2)).max_prefill_tokens, 66);
}

TEST(TokenThrottling, EmptyStates) {
  const TokenThrottling t;
  engine::MicroBatchBudget b = t.budget(engine::SchedulerState{});
  EXPECT_EQ(b.max_decode_tokens, 0);
  EXPECT_EQ(b.max_prefill_tokens, 0);
  // No KV information (0 total blocks): KV_free read as 1.
  b = t.budget(state(8000, 0, 0, 0));
  EXPECT_EQ(b.max_prefill_tokens, 1000);
  // Negative counts read as 0.
  b = t.budget(state(-1, -1, 400, 400, -3));
  EXPECT_EQ(b.max_decode_tokens, 0);
  EXPECT_EQ(b.max_prefill_tokens, 0);
}

TEST(TokenThrottling, ValidateNamesTheBadParameter) {
  const auto expect_bad = [](TokenThrottlingParams p, const std::string& what) {
    const Status st = p.validate();
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  TokenThrottlingParams p;
  p.iterations = 0;
  expect_bad(p, "#T");
  p = {};
  p.max_prefill_tokens = 0;
  expect_bad(p, "#MaxP");
  p = {};
  p.min_prefill_tokens = 4096;
  expect_bad(p, "#MinP");
  p = {};
  p.min_prefill_tokens = -1;
  expect_bad(p, "#MinP");
  p = {};
  p.kv_thresh = 1.0;
  expect_bad(p, "KV_thresh");
  p = {};
  p.kv_thresh = -0.1;
  expect_bad(p, "KV_thresh");
}

}  // namespace
}  // namespace shardline::engine
