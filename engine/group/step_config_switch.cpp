#include "engine/group/step_config_switch.hpp"

namespace shardline::engine {

GroupStepConfig StepConfigSwitch::pick(int num_tokens) {
  if (shift_policy_ && shift_policy_->decide(num_tokens) == ShiftMode::shift) return GroupStepConfig::shift;
  return decode_active_ ? GroupStepConfig::decode : GroupStepConfig::base;
}

std::int32_t StepConfigSwitch::header_kind(GroupStepConfig config) {
  switch (config) {
    case GroupStepConfig::shift:
      return kKindStepShift;
    case GroupStepConfig::decode:
      return kKindStepDecode;
    case GroupStepConfig::base:
      break;
  }
  return kKindStep;
}

std::optional<GroupStepConfig> StepConfigSwitch::of_header(std::int32_t kind) {
  if (kind == kKindStep) return GroupStepConfig::base;
  if (kind == kKindStepShift) return GroupStepConfig::shift;
  if (kind == kKindStepDecode) return GroupStepConfig::decode;
  return std::nullopt;
}

void StepConfigSwitch::count(GroupStepConfig config, int num_tokens, double step_ms) {
  ++phase_steps_[decode_active_ ? 1 : 0];
  if (!shift_policy_ || num_tokens <= 0) return;
  const ShiftMode mode = config == GroupStepConfig::shift ? ShiftMode::shift : ShiftMode::base;
  ShiftStats& st = shift_stats_;
  // Config changes between consecutive steps, across policy replacements.
  if (st.base_steps + st.shift_steps > 0 && mode != last_mode_) ++st.switches;
  last_mode_ = mode;
  (mode == ShiftMode::shift ? st.shift_steps : st.base_steps) += 1;
  (mode == ShiftMode::shift ? st.shift_tokens : st.base_tokens) += static_cast<std::uint64_t>(num_tokens);
  (mode == ShiftMode::shift ? st.shift_ms : st.base_ms) += step_ms;
}

}  // namespace shardline::engine
