// sampling::compute_logprobs against a direct log_softmax, and its order rules.
#include "sampling/logprobs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "sampling/sampling_params.hpp"

namespace shardline::sampling {
namespace sampling_logprobs_test {

TEST(Logprobs, MatchLogSoftmaxAndTopIsSortedWithLowerIdOnTies) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -std::numeric_limits<float>::infinity()};
  double z = 0.0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  const SampleLogprobs lp = compute_logprobs(logits, /*sampled_id=*/4, /*num_top=*/3);
  EXPECT_EQ(lp.sampled.token_id, 4);
  EXPECT_NEAR(lp.sampled.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token_id, 1);  // 3.0, the lower id of the tie
  EXPECT_EQ(lp.top[1].token_id, 3);
  EXPECT_EQ(lp.top[2].token_id, 0);
  for (const TokenLogprob& t : lp.top)
    EXPECT_NEAR(t.logprob, logits[static_cast<std::size_t>(t.token_id)] - std::log(z), 1e-6);
  // The probabilities sum to one.
  double total = 0.0;
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(logits.size()); ++i)
    total += std::exp(compute_logprobs(logits, i, 0).sampled.logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_EQ(compute_logprobs(logits, 5, 0).sampled.logprob, -std::numeric_limits<float>::infinity());
}

TEST(Logprobs, TopIsClampedToTheVocabularyAndZeroGivesNone) {
  const std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_TRUE(compute_logprobs(logits, 0, 0).top.empty());
  const SampleLogprobs lp = compute_logprobs(logits, 0, 20);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].token_id, 1);
}

TEST(Logprobs, LargeLogitsDoNotOverflow) {
  const std::vector<float> logits = {1000.0f, 1000.0f, 0.0f};
  const SampleLogprobs lp = compute_logprobs(logits, 0, 1);
  EXPECT_NEAR(lp.sampled.logprob, -std::log(2.0), 1e-6);
  EXPECT_TRUE(std::isfinite(compute_logprobs(logits, 2, 0).sampled.logprob));
}

TEST(Logprobs, ParamsRangeIsChecked) {
  SamplingParams p;
  p.logprobs = kMaxLogprobs;
  EXPECT_TRUE(p.validate().ok());
  p.logprobs = kMaxLogprobs + 1;
  const Status s = p.validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("logprobs"), std::string::npos);
  p.logprobs = -2;
  EXPECT_FALSE(p.validate().ok());
}

}  // namespace
}  // namespace shardline::sampling
