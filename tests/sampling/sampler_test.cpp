#include "sampling/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sampling/rng.hpp"

namespace shardline::sampling {
namespace sampling_sampler_test {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::int32_t draw(std::vector<float> logits, const SamplingParams& p, std::uint64_t seed, int position) {
  SampleContext ctx;
  ctx.seed = seed;
  ctx.position = position;
  return sample(logits, p, ctx);
}

// log of a probability table, so softmax gives it back.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int, int> histogram(const std::vector<float>& logits, const SamplingParams& p, int n) {
  std::map<int, int> h;
  for (int s = 0; s < n; ++s) ++h[draw(logits, p, mix_seed(99, s), 3)];
  return h;
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  EXPECT_EQ(draw({1.0f, 3.0f, 3.0f, 2.0f}, greedy(), 0, 0), 1);
  EXPECT_EQ(draw({-5.0f, -1.0f, -1.0f}, greedy(), 0, 0), 1);
  EXPECT_EQ(argmax(std::vector<float>{0.0f, 0.0f}), 0);
}

// argmax's definition, as a plain walk: the first index of the largest
// non-NaN value; all NaN: the last index.
std::int32_t argmax_reference(const std::vector<float>& v) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best] || std::isnan(v[best])) best = static_cast<std::int32_t>(i);
  return best;
}

// The vectorized argmax agrees with the definition on rows of every length
// up to 100 and a 32,000 vocabulary, with ties inside and across lanes,
// NaN and -inf anywhere (first, last, all), and only a few distinct values.
TEST(Sampler, ArgmaxMatchesTheDefinitionWithTiesNanAndInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pick(0, 9);
  auto row = [&](std::size_t n, int distinct) {
    std::vector<float> v(n);
    for (float& x : v) {
      const int k = pick(rng);
      x = k == 0 ? nan : k == 1 ? -inf : static_cast<float>(static_cast<int>(rng() % distinct));
    }
    return v;
  };
  int checked = 0;
  for (std::size_t n = 1; n <= 100; ++n)
    for (int distinct : {1, 3, 1000})
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> v = row(n, distinct);
        ASSERT_EQ(argmax(v), argmax_reference(v)) << "n " << n << " distinct " << distinct;
        ++checked;
      }
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<float> v = row(32000, 7);
    if (rep % 5 == 0) v.back() = 100.0f;  // the maximum in the tail
    if (rep % 5 == 1) v[18] = v[33] = 100.0f;  // a tie across lanes 2 and 1: 18 wins
    if (rep % 5 == 2) v[3] = v[19] = 100.0f;   // a tie within lane 3: 3 wins
    ASSERT_EQ(argmax(v), argmax_reference(v)) << "rep " << rep;
  }
  for (std::size_t n : {16u, 17u, 40u}) {
    EXPECT_EQ(argmax(std::vector<float>(n, nan)), static_cast<std::int32_t>(n - 1));
    EXPECT_EQ(argmax(std::vector<float>(n, -inf)), 0);
    std::vector<float> v(n, nan);
    v[n / 2] = -inf;
    EXPECT_EQ(argmax(v), static_cast<std::int32_t>(n / 2));
    v[n - 1] = 1.0f;
    v[0] = 1.0f;
    EXPECT_EQ(argmax(v), 0);
  }
  EXPECT_GT(checked, 5000);
}

// sample_row leaves the row as it was and draws what sample() draws on a
// copy, for plain greedy rows (read in place) and for every kind of row that
// changes its logits (penalties, min_tokens masks, temperature, truncation).
TEST(Sampler, SampleRowDrawsWhatSampleDrawsAndLeavesTheRow) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(500);
  for (float& x : row) x = normal(rng);
  const std::vector<float> original = row;
  const std::vector<std::int32_t> prompt{3, 7, 7, 42}, output{argmax(row), 9};
  const std::vector<std::int32_t> masked{argmax(row)};
  std::vector<SamplingParams> params(7, greedy());
  params[1].repetition_penalty = 1.3f;
  params[2].presence_penalty = 0.5f;
  params[3].frequency_penalty = 0.7f;
  params[4].min_tokens = 5;  // masks the row's argmax while fewer outputs
  params[5] = SamplingParams{};  // temperature 1
  params[6].temperature = 0.8f, params[6].top_k = 20, params[6].top_p = 0.9f;
  std::vector<float> scratch;
  for (std::size_t k = 0; k < params.size(); ++k)
    for (int position = 0; position < 30; ++position) {
      SampleContext ctx;
      ctx.seed = 77;
      ctx.position = position;
      ctx.prompt_ids = prompt;
      ctx.output_ids = output;
      ctx.min_tokens_masked_ids = masked;
      std::vector<float> copy = row;
      const std::int32_t want = sample(copy, params[k], ctx);
      ASSERT_EQ(sample_row(row, params[k], ctx, scratch), want) << "params " << k << " position " << position;
      ASSERT_EQ(row, original);
    }
  // the min_tokens mask changes a greedy row's answer: sample_row applied it
  SampleContext ctx;
  ctx.output_ids = output;
  ctx.min_tokens_masked_ids = masked;
  EXPECT_NE(sample_row(row, params[4], ctx, scratch), argmax(row));
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.top_k = 1;
  for (int pos = 0; pos < 200; ++pos) ASSERT_EQ(draw({0.1f, 0.5f, 0.4f, 0.45f}, p, 7, pos), 1);
}

TEST(Sampler, TopKKeepsExactlyK) {
  SamplingParams p;
  p.top_k = 2;
  const auto h = histogram(logits_of({0.1, 0.4, 0.2, 0.3}), p, 20000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h.at(1), 0);
  EXPECT_GT(h.at(3), 0);
  // Renormalised 0.4 / 0.7.
  EXPECT_NEAR(h.at(1) / 20000.0, 0.4 / 0.7, 0.015);
}

TEST(Sampler, TopKTieKeepsLowerId) {
  SamplingParams p;
  p.top_k = 1;
  for (int pos = 0; pos < 50; ++pos) ASSERT_EQ(draw({0.0f, 2.0f, 2.0f}, p, 1, pos), 1);
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8 -> {0, 1}
  auto h = histogram(logits, p, 20000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_NEAR(h[0] / 20000.0, 0.5 / 0.8, 0.015);
  p.top_p = 0.45f;  // first token alone reaches it
  h = histogram(logits, p, 2000);
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 0);
  p.top_p = 0.9f;  // 0.95 needed -> {0, 1, 2}
  h = histogram(logits, p, 20000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
}

TEST(Sampler, MinPDropsBelowFractionOfMax) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.min_p = 0.25f;  // threshold 0.125 -> drops only 0.05
  auto h = histogram(logits, p, 20000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_NEAR(h[2] / 20000.0, 0.15 / 0.95, 0.015);
  p.min_p = 0.7f;  // threshold 0.35 -> only token 0
  h = histogram(logits, p, 2000);
  EXPECT_EQ(h.size(), 1u);
}

TEST(Sampler, TopKTopPMinPCompose) {
  const auto logits = logits_of({0.05, 0.4, 0.1, 0.3, 0.15});
  SamplingParams p;
  p.top_k = 3;   // {1, 3, 4} -> renormalised 0.4/0.85, 0.3/0.85, 0.15/0.85
  p.top_p = 0.8f;  // 0.47, 0.82 -> {1, 3}
  const auto h = histogram(logits, p, 4000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h.at(1), 0);
  EXPECT_GT(h.at(3), 0);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> logits{2.0f, -2.0f, 1.0f, 4.0f};
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0f;
  const std::vector<std::int32_t> prompt{0, 1}, output{1, 3};
  SampleContext ctx;
  ctx.prompt_ids = prompt;
  ctx.output_ids = output;
  const auto id = sample(logits, p, ctx);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 2.0f}));
  EXPECT_EQ(id, 3);
}

TEST(Sampler, PresenceAndFrequencyOverOutputOnly) {
  std::vector<float> logits{1.0f, 1.0f, 1.0f};
  SamplingParams p = greedy();
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  const std::vector<std::int32_t> prompt{0, 0, 0}, output{2, 2, 1};
  SampleContext ctx;
  ctx.prompt_ids = prompt;
  ctx.output_ids = output;
  EXPECT_EQ(sample(logits, p, ctx), 0);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 0.25f, -0.25f}));
}

TEST(Sampler, MinTokensMasksStopIdsOnlyBeforeMinTokens) {
  SamplingParams p = greedy();
  p.min_tokens = 2;
  const std::vector<std::int32_t> masked{2};
  std::vector<std::int32_t> output{5};
  SampleContext ctx;
  ctx.output_ids = output;
  ctx.min_tokens_masked_ids = masked;
  std::vector<float> logits{0.0f, 1.0f, 9.0f};
  EXPECT_EQ(sample(logits, p, ctx), 1);
  EXPECT_TRUE(std::isinf(logits[2]));
  output.push_back(6);
  ctx.output_ids = output;
  logits = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(sample(logits, p, ctx), 2);
}

TEST(Sampler, AllMaskedFallsBackWithoutCrash) {
  SamplingParams p;
  p.min_tokens = 1;
  const std::vector<std::int32_t> masked{0, 1};
  SampleContext ctx;
  ctx.min_tokens_masked_ids = masked;
  std::vector<float> logits{1.0f, 2.0f};
  const auto id = sample(logits, p, ctx);
  EXPECT_TRUE(id == 0 || id == 1);
}

TEST(Sampler, SameSeedAndPositionSameToken) {
  std::vector<float> logits(64, 0.0f);  // uniform
  SamplingParams p;
  // Uniform over 64 ids with no truncation: the inverse CDF in id order picks
  // floor(u * 64), the top 6 bits of Philox word 0 keyed by (seed, position).
  // Known tokens for seed 5, positions 0-7 (from an independent Philox4x32-10):
  const std::vector<int> known{49, 22, 61, 42, 43, 33, 63, 40};
  for (int pos = 0; pos < 8; ++pos) EXPECT_EQ(draw(logits, p, 5, pos), known[pos]) << "position " << pos;
  for (int pos = 0; pos < 100; ++pos) {
    const auto word = philox4x32_10({static_cast<std::uint32_t>(pos), 0u, 0u, 0u}, {5u, 0u})[0];
    ASSERT_EQ(draw(logits, p, 5, pos), static_cast<std::int32_t>(word >> 26)) << "position " << pos;
  }
  std::set<int> distinct;
  for (int pos = 0; pos < 100; ++pos) distinct.insert(draw(logits, p, 5, pos));
  EXPECT_GT(distinct.size(), 40u);  // ~ 64 * (1 - e^{-100/64}) = 50 expected
  int same = 0;
  for (int pos = 0; pos < 1000; ++pos) same += draw(logits, p, 5, pos) == draw(logits, p, 6, pos);
  EXPECT_LT(same, 60);  // ~ 1000/64 expected by chance
}

TEST(Sampler, DistributionMatchesSoftmaxWithTemperature) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 0.7f;
  constexpr int kN = 60000;
  std::vector<int> counts(logits.size(), 0);
  for (int s = 0; s < kN; ++s) ++counts[draw(logits, p, mix_seed(3, s), 11)];
  double z = 0.0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (std::size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(counts[i] / double(kN), std::exp(logits[i] / 0.7) / z, 0.008) << "token " << i;
}

TEST(Sampler, NegativeInfinityNeverSampled) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits{ninf, 0.0f, ninf, 0.0f};
  SamplingParams p;
  p.top_p = 0.99f;
  for (int pos = 0; pos < 500; ++pos) {
    const auto id = draw(logits, p, 1, pos);
    ASSERT_TRUE(id == 1 || id == 3);
  }
}

TEST(SamplingParams, ValidateNamesTheField) {
  auto field_error = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    const Status s = p.validate();
    return s.ok() ? std::string("ok") : s.error().message;
  };
  EXPECT_EQ(field_error([](SamplingParams&) {}), "ok");
  EXPECT_NE(field_error([](SamplingParams& p) { p.temperature = -1; }).find("temperature"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.min_p = -0.1f; }).find("min_p"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.max_tokens = 0; }).find("max_tokens"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.min_tokens = 17; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.min_tokens = -1; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.stop = {""}; }).find("stop"), std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.stop_token_ids = {-3}; }).find("stop_token_ids"),
            std::string::npos);
  EXPECT_NE(field_error([](SamplingParams& p) { p.presence_penalty = 3; }).find("presence_penalty"),
            std::string::npos);
  SamplingParams p;
  p.top_k = -1;
  p.min_tokens = 16;
  p.temperature = 0;
  EXPECT_TRUE(p.validate().ok());
  p.top_p = 0;
  EXPECT_EQ(p.validate().error().code, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace shardline::sampling
