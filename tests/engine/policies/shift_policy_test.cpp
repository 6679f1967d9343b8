// Shift Parallelism's per-step switch (engine/policies/shift_policy.hpp) on
// scripted step sizes: Alg. 3 at h = 0, the hysteresis band, the static
// ends (T = 0, T above every step), empty steps, bad options.
#include <gtest/gtest.h>

#include <vector>

#include "engine/policies/shift_policy.hpp"

namespace shardline::engine {
namespace engine_policies_shift_policy_test {

std::vector<ShiftMode> run(ShiftPolicy& p, const std::vector<long long>& steps) {
  std::vector<ShiftMode> out;
  for (long long n : steps) out.push_back(p.decide(n));
  return out;
}

constexpr ShiftMode B = ShiftMode::base;
constexpr ShiftMode S = ShiftMode::shift;

TEST(ShiftPolicy, WithoutHysteresisItIsAlgorithm3) {
  auto p = ShiftPolicy::create({.threshold = 16, .hysteresis = 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(run(*p, {64, 16, 17, 1, 2048, 8}), (std::vector<ShiftMode>{B, S, B, S, B, S}));
  EXPECT_EQ(p->switches(), 5u);
  EXPECT_EQ(p->base_steps(), 3u);
  EXPECT_EQ(p->shift_steps(), 3u);
}

TEST(ShiftPolicy, HysteresisKeepsStepsAroundTheThresholdFromFlapping) {
  // T = 16, h = 0.25: shift at <= 16, back to base only above 20.
  auto p = ShiftPolicy::create({.threshold = 16, .hysteresis = 0.25});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->upper_threshold(), 20);
  EXPECT_EQ(run(*p, {17, 16, 17, 16, 20, 17, 21, 17, 18, 16}),
            (std::vector<ShiftMode>{B, S, S, S, S, S, B, B, B, S}));
  EXPECT_EQ(p->switches(), 3u);
  // The same alternating trace at h = 0 switches at every step.
  auto q = ShiftPolicy::create({.threshold = 16, .hysteresis = 0});
  EXPECT_EQ(run(*q, {17, 16, 17, 16, 17, 16}), (std::vector<ShiftMode>{B, S, B, S, B, S}));
  EXPECT_EQ(q->switches(), 5u);
}

TEST(ShiftPolicy, ThresholdZeroNeverShiftsAndAHugeOneAlwaysDoes) {
  auto never = ShiftPolicy::create({.threshold = 0, .hysteresis = 0.25});
  EXPECT_EQ(run(*never, {1, 2, 2048, 1}), (std::vector<ShiftMode>{B, B, B, B}));
  EXPECT_EQ(never->switches(), 0u);
  auto always = ShiftPolicy::create({.threshold = 1 << 20, .hysteresis = 0});
  EXPECT_EQ(run(*always, {1, 2048, 7}), (std::vector<ShiftMode>{S, S, S}));
  EXPECT_EQ(always->switches(), 1u);  // from the starting base config
}

TEST(ShiftPolicy, EmptyStepsChangeNothing) {
  auto p = ShiftPolicy::create({.threshold = 8, .hysteresis = 0});
  EXPECT_EQ(run(*p, {0, 4, 0, 0}), (std::vector<ShiftMode>{B, S, S, S}));
  EXPECT_EQ(p->switches(), 1u);
  EXPECT_EQ(p->shift_steps(), 1u);
  EXPECT_EQ(p->base_steps(), 0u);
}

TEST(ShiftPolicy, BadOptionsAreRefusedNamingTheFlag) {
  auto neg = ShiftPolicy::create({.threshold = -1, .hysteresis = 0});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.error().message.find("--shift-threshold"), std::string::npos);
  auto h = ShiftPolicy::create({.threshold = 4, .hysteresis = -0.5});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("--shift-hysteresis"), std::string::npos);
}

}  // namespace
}  // namespace shardline::engine
