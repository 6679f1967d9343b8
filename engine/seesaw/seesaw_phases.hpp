#pragma once
/// \file
/// Seesaw's phases in the step loop (seed 000): the engine's StepPhaseHook
/// (engine/step_phases.hpp) that runs phases of pure prefill and pure
/// decode with a host KV buffer between them.
///  - §4.2 tiered KV buffer and transition-minimizing scheduling: before
///    each micro-batch the phase policy (engine/policies/seesaw_policy.hpp)
///    plans from the scheduler's counts; a prefill's KV goes to the host
///    buffer when it ends (an offload), a decode phase brings it back (an
///    onboard); at a transition every resident sequence's KV leaves too.
///  - §4.1 dynamic model re-sharding: an executor with step configs runs
///    prefill under cp and decode under cd; the switch happens at the
///    transition, when the device KV is empty (the copies re-shard it).
///  - §5.1 pipelined decode: under a decode config with PP, each
///    micro-batch takes 1/PP of the decodes (pipelined_decode_tokens).
///  - §5.2 asynchronous pipeline: the offloads and onboards run on the KV
///    mover (engine/seesaw/kv_mover.hpp), a prefetcher thread, or the
///    engine's thread in synchronous mode.

#include <memory>
#include <optional>

#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "engine/policies/seesaw_policy.hpp"
#include "engine/step_phases.hpp"

namespace shardline::engine {

struct SeesawOptions {
  SeesawPolicyOptions policy;  ///< when to switch phases (§4.2)
  /// The KV copies (offloads and onboards) run on a prefetcher thread while
  /// the devices compute (§5.2), or, false, on the engine's thread before
  /// the step that needs them.
  bool async_kv = true;
  /// An emulated host link (PCIe) per device that paces every KV copy to
  /// and from the host buffer (engine/seesaw/kv_mover.hpp); none: a copy
  /// costs its memcpy.
  std::optional<comm::LinkSpec> host_link;
};

/// What Seesaw's phases did so far.
struct SeesawStats {
  std::uint64_t transitions = 0;
  std::uint64_t prefill_steps = 0, decode_steps = 0;
  std::uint64_t offloads = 0;  ///< sequences whose KV went to the host KV buffer (prefill ends and transitions)
  double transition_ms = 0;    ///< time in transitions: offloading resident KV and switching
  double switch_ms = 0;        ///< of which switching the executor's parallel config (cp <-> cd, §4.1)
  long long host_peak_tokens = 0;  ///< most KV tokens the host buffer held at once
  double drain_ms = 0;  ///< of transition_ms: waiting for the KV mover before switching (§5.2)
};

class SeesawPhases final : public StepPhaseHook {
 public:
  /// Starts in prefill (Fig. 6): the scheduler builds prefill steps, an
  /// executor with step configs switches to cp, and the KV mover starts.
  /// The host KV buffer is the engine's swap space. Errors (the engine's
  /// create fails with them): invalid_argument (caches that cannot be
  /// copied to the host, a buffer that cannot hold one max_model_len
  /// sequence, a bad policy or link spec); the executor's (the switch to cp).
  [[nodiscard]] static Result<std::unique_ptr<SeesawPhases>> create(const EngineParts& parts, SeesawOptions options);

  [[nodiscard]] Result<PhaseAdmission> admit() override;
  [[nodiscard]] Result<PhaseAdmission> transition() override;
  [[nodiscard]] bool limits(int depth, bool limited, MicroBatchBudget& budget) const override;
  void on_offload() override;
  void on_submitted() override;

  /// The phase the next micro-batch runs in.
  [[nodiscard]] SeesawPhase phase() const { return policy_.phase(); }
  [[nodiscard]] const SeesawStats& stats() const { return stats_; }

 private:
  SeesawPhases(const EngineParts& parts, SeesawPolicy policy) : parts_(parts), policy_(std::move(policy)) {}
  /// The admission the policy plans from the scheduler's counts now.
  [[nodiscard]] PhaseAdmission plan();

  EngineParts parts_;
  SeesawPolicy policy_;
  SeesawStats stats_;
  SeesawCounts counts_;  ///< those the last plan was made from
  SeesawPhase planned_ = SeesawPhase::prefill;  ///< the phase the last plan chose
};

/// EngineConfig::step_phases for Seesaw.
[[nodiscard]] StepPhaseFactory seesaw_phases(SeesawOptions options);

/// The Seesaw phases `engine` runs; null when it runs none.
[[nodiscard]] const SeesawPhases* seesaw_phases_of(const LlmEngine& engine);
/// Their statistics; zero when `engine` runs no Seesaw phases.
[[nodiscard]] SeesawStats seesaw_stats_of(const LlmEngine& engine);

}  // namespace shardline::engine
