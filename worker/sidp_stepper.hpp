#pragma once
/// \file
/// What a worker does between and around its engine steps when its device is
/// a rank of a SiDP group (seed 002 §4.3), so that the worker actor stays a
/// thin loop:
///
///   before each engine step   before_step()  follow a rebuilt compute group
///   after each engine step    after_step()   in CaS, a step that ran no layer
///                                            still takes its lockstep turn
///   with no work              idle()         in CaS a dummy step (the group
///                                            steps in lockstep, a rank with
///                                            no rows skips everything but
///                                            serves its own layers); in WaS
///                                            join a pending switch to CaS
///   a directive arrives       directive()    announce it (applied at a step
///                                            boundary)
///
/// A compute generation that died under the rank (a peer worker left) is not
/// this worker's failure: a failed dummy step or switch then only moves the
/// rank to WaS until the group is rebuilt. A failed *engine* step is (the
/// caller crashes the worker, as for any engine failure).
///
/// Used from the worker's stepping thread, except directive().

#include <chrono>
#include <cstdint>
#include <memory>

#include "common/result.hpp"
#include "engine/policies/sidp_mode_policy.hpp"
#include "engine/sidp/sidp_node.hpp"

namespace shardline::worker {

/// What idle() asks the caller to do next.
struct SidpIdle {
  /// Call idle() again after `delay` (CaS: the next lockstep turn; WaS with
  /// nothing pending: no need, a message will bring work or a directive).
  bool again = false;
  std::chrono::milliseconds delay{0};
};

class SidpStepper {
 public:
  /// Takes the rank after SidpRank::join.
  explicit SidpStepper(std::unique_ptr<engine::SidpRank> rank);

  [[nodiscard]] engine::SidpRank& rank() { return *rank_; }
  /// "was" or "cas": the mode steps run in now.
  [[nodiscard]] const char* mode_name() const;

  /// At the step boundary before an engine step. Errors: what
  /// SidpRank::refresh returns.
  [[nodiscard]] Status before_step();
  /// After an engine step that succeeded: if the group is in CaS and the
  /// step called no FFN layer (nothing was scheduled), takes this rank's
  /// lockstep turn as a dummy step. Errors: io (a CaS failure that is not
  /// its generation dying).
  [[nodiscard]] Status after_step();
  /// With no work. Errors: io (as after_step).
  [[nodiscard]] Result<SidpIdle> idle();
  /// The orchestrator's directive (any thread).
  void directive(model::sidp::SidpMode mode, std::uint64_t epoch);

  /// Delay between two idle CaS turns when no rank of the group had rows.
  static constexpr std::chrono::milliseconds kIdlePoll{2};

 private:
  /// Steps the FFN took part in so far (WaS, CaS and dummy).
  [[nodiscard]] std::uint64_t ffn_turns() const;
  /// A CaS op failed: fine if the generation died (then refresh), else the error.
  [[nodiscard]] Status absorb(const Error& e);

  std::unique_ptr<engine::SidpRank> rank_;
  std::uint64_t turns_before_ = 0;
};

}  // namespace shardline::worker
