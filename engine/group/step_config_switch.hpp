#pragma once
/// \file
/// Which parallel config a group's next step runs in: the one switch behind
/// Shift Parallelism's per-step choice and Seesaw's phase change.
///  - Shift Parallelism (seed 001 §3.3): the group has a base config
///    (SP x TP) and a shift config (TP' = SP x TP over the same devices,
///    sharing their KV); a ShiftPolicy picks per step, by the step's token
///    count, and the choice can change at every step.
///  - Seesaw (seed 000 §4.1, dynamic model re-sharding): the group has a
///    prefill config cp and a decode config cd; the engine's phase hook
///    switches between them at a transition (set_phase), and every step of a
///    phase runs in its config.
/// Rank 0 (ParallelExecutor) picks; the header kind of each step
/// (engine/group/step_control.hpp) tells every other rank (ShardWorker)
/// which of its shards runs it. A plain single-threaded value.

#include <cstdint>
#include <optional>

#include "engine/group/step_control.hpp"
#include "engine/policies/shift_policy.hpp"
#include "model/executor.hpp"

namespace shardline::engine {

/// The configs a group's step can run in.
enum class GroupStepConfig {
  base,    ///< the group's own config (cp under Seesaw)
  shift,   ///< Shift's TP' config
  decode,  ///< Seesaw's cd
};

/// What a group's shift steps did so far (rank 0's count).
struct ShiftStats {
  std::uint64_t base_steps = 0, shift_steps = 0;
  std::uint64_t switches = 0;  ///< steps whose config differs from the step before (across policy changes)
  std::uint64_t base_tokens = 0, shift_tokens = 0;
  double base_ms = 0, shift_ms = 0;  ///< rank 0's compute time in each config
};

class StepConfigSwitch {
 public:
  /// Shift: from now on each step picks between the phase's config and the
  /// shift config by `policy`.
  void set_shift_policy(ShiftPolicy policy) { shift_policy_ = std::move(policy); }
  [[nodiscard]] bool shifts() const { return shift_policy_.has_value(); }
  /// Seesaw: the phase's config from now on (cp for prefill, cd for decode).
  void set_phase(model::StepConfig phase) { decode_active_ = phase == model::StepConfig::decode; }
  [[nodiscard]] model::StepConfig phase() const {
    return decode_active_ ? model::StepConfig::decode : model::StepConfig::prefill;
  }
  [[nodiscard]] bool decode_active() const { return decode_active_; }

  /// The config a step of `num_tokens` tokens runs in: the shift config when
  /// the policy picks it (ShiftPolicy::decide, which keeps its hysteresis
  /// state: one call per step), else the phase's.
  [[nodiscard]] GroupStepConfig pick(int num_tokens);
  /// The header kind of a step in `config` (kKindStep, kKindStepShift, kKindStepDecode).
  [[nodiscard]] static std::int32_t header_kind(GroupStepConfig config);
  /// The config of a step header's kind; nullopt for a kind that is not a step.
  [[nodiscard]] static std::optional<GroupStepConfig> of_header(std::int32_t kind);

  /// Counts a step submitted in `config`, of `num_tokens` tokens and
  /// `step_ms` of rank 0's compute.
  void count(GroupStepConfig config, int num_tokens, double step_ms);
  [[nodiscard]] const ShiftStats& shift_stats() const { return shift_stats_; }
  /// The shift policy's choice for the last counted step.
  [[nodiscard]] ShiftMode last_shift_mode() const { return last_mode_; }
  /// Steps submitted in `phase` so far.
  [[nodiscard]] std::uint64_t num_steps_in(model::StepConfig phase) const {
    return phase_steps_[phase == model::StepConfig::decode ? 1 : 0];
  }

 private:
  std::optional<ShiftPolicy> shift_policy_;
  bool decode_active_ = false;
  ShiftStats shift_stats_;
  ShiftMode last_mode_ = ShiftMode::base;
  std::uint64_t phase_steps_[2] = {0, 0};  ///< steps submitted in cp, cd
};

}  // namespace shardline::engine
