// The group's one config switch (engine/group/step_config_switch.hpp):
// Shift's per-step choice and Seesaw's phase, and the header kinds that
// carry them to the ranks.
#include "engine/group/step_config_switch.hpp"

#include <gtest/gtest.h>

namespace shardline::engine {
namespace engine_step_config_switch_test {

ShiftPolicy policy(long long threshold, double hysteresis) {
  auto p = ShiftPolicy::create(ShiftPolicyOptions{threshold, hysteresis});
  EXPECT_TRUE(p.ok());
  return std::move(p).value();
}

TEST(StepConfigSwitch, WithoutAPolicyEveryStepRunsInThePhasesConfig) {
  StepConfigSwitch sw;
  EXPECT_FALSE(sw.shifts());
  EXPECT_EQ(sw.phase(), model::StepConfig::prefill);
  EXPECT_EQ(sw.pick(1), GroupStepConfig::base);
  EXPECT_EQ(sw.pick(100000), GroupStepConfig::base);
  sw.set_phase(model::StepConfig::decode);
  EXPECT_TRUE(sw.decode_active());
  EXPECT_EQ(sw.pick(1), GroupStepConfig::decode);
  sw.count(GroupStepConfig::decode, 3, 1.0);
  sw.set_phase(model::StepConfig::prefill);
  EXPECT_EQ(sw.pick(7), GroupStepConfig::base);
  sw.count(GroupStepConfig::base, 7, 1.0);
  sw.count(GroupStepConfig::base, 0, 0.0);  // an empty step counts in its phase too
  EXPECT_EQ(sw.num_steps_in(model::StepConfig::prefill), 2u);
  EXPECT_EQ(sw.num_steps_in(model::StepConfig::decode), 1u);
  // Shift's statistics only count with a policy.
  EXPECT_EQ(sw.shift_stats().base_steps + sw.shift_stats().shift_steps, 0u);
}

TEST(StepConfigSwitch, APolicyShiftsSmallStepsWithHysteresisAndCountsTheSwitches) {
  StepConfigSwitch sw;
  sw.set_shift_policy(policy(8, 0.5));  // shift at <= 8 tokens, back to base above 12
  ASSERT_TRUE(sw.shifts());
  const int steps[] = {20, 8, 12, 13, 4};
  const GroupStepConfig want[] = {GroupStepConfig::base, GroupStepConfig::shift, GroupStepConfig::shift,
                                  GroupStepConfig::base, GroupStepConfig::shift};
  for (int i = 0; i < 5; ++i) {
    const GroupStepConfig got = sw.pick(steps[i]);
    EXPECT_EQ(got, want[i]) << "step " << i << " of " << steps[i] << " tokens";
    sw.count(got, steps[i], 2.0);
  }
  const ShiftStats& st = sw.shift_stats();
  EXPECT_EQ(st.base_steps, 2u);
  EXPECT_EQ(st.shift_steps, 3u);
  EXPECT_EQ(st.base_tokens, 33u);
  EXPECT_EQ(st.shift_tokens, 24u);
  EXPECT_EQ(st.switches, 3u);  // base -> shift -> base -> shift
  EXPECT_DOUBLE_EQ(st.shift_ms, 6.0);
  EXPECT_EQ(sw.last_shift_mode(), ShiftMode::shift);
  EXPECT_EQ(sw.num_steps_in(model::StepConfig::prefill), 5u);
}

TEST(StepConfigSwitch, HeaderKindsRoundTripAndOtherKindsAreNoSteps) {
  for (GroupStepConfig c : {GroupStepConfig::base, GroupStepConfig::shift, GroupStepConfig::decode})
    EXPECT_EQ(StepConfigSwitch::of_header(StepConfigSwitch::header_kind(c)), c);
  EXPECT_EQ(StepConfigSwitch::header_kind(GroupStepConfig::base), kKindStep);
  EXPECT_EQ(StepConfigSwitch::header_kind(GroupStepConfig::shift), kKindStepShift);
  EXPECT_EQ(StepConfigSwitch::header_kind(GroupStepConfig::decode), kKindStepDecode);
  for (std::int32_t k : {kKindShutdown, kKindSwitchConfig, kKindKvOut, kKindKvIn, kKindKvLayout, -1, 99})
    EXPECT_FALSE(StepConfigSwitch::of_header(k).has_value()) << k;
}

}  // namespace
}  // namespace shardline::engine
