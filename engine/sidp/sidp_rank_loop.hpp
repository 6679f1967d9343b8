#pragma once
/// \file
/// One SiDP rank's generate loop (seed 002 §4.3), shared by the ranks of an
/// in-process group (generate_sidp's threads) and by a rank that is a
/// process of its own (`shardline shard serve --weight-sharing sidp`,
/// engine/sidp/sidp_process.hpp):
///
///   while the rank has work: step its engine (WaS or CaS);
///   then, in CaS: dummy steps (which move no data) until no rank has work;
///   in WaS: apply a pending WaS -> CaS switch (sync_mode), otherwise wait,
///   idle, until every rank of the group is idle in WaS.
///
/// "Every rank idle" is decided by a SidpRound (below) on the group's rank 0,
/// at the group's newest directive epoch: a rank counts itself idle with the
/// epoch it had been announced when it found no switch pending, so a switch
/// announced after a rank counted itself (and which that rank must join)
/// makes the count stale instead of ending the round under it.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "model/sidp/sidp_ffn.hpp"

namespace shardline::engine {

/// What a rank's loop needs from its group during one round.
class SidpRoundHooks {
 public:
  virtual ~SidpRoundHooks() = default;
  /// After each real step with the sequences it ran, and once with 0 when
  /// the rank runs out of work (the batch the switch policy watches).
  virtual void report(int num_seqs) = 0;
  /// A request of this rank finished.
  virtual void output(RequestOutput&& out) = 0;
  /// The newest directive epoch this rank has been announced so far (its
  /// SidpFfn saw it before this returns it).
  [[nodiscard]] virtual std::uint64_t announced_epoch() = 0;
  /// The rank is idle in WaS with no switch pending, having been announced
  /// up to `epoch`. Returns whether the round is over.
  [[nodiscard]] virtual bool idle(std::uint64_t epoch) = 0;
  /// Whether the round was aborted (another rank failed): stop now.
  [[nodiscard]] virtual bool aborted() = 0;
};

/// Runs the rank's requests (already added to `engine`) to the end of the
/// round. Returns ok also when aborted. Errors: what a step, a dummy step or
/// sync_mode returns (io when a peer died mid-CaS).
[[nodiscard]] Status run_sidp_rank(LlmEngine& engine, model::sidp::SidpFfn& ffn, SidpRoundHooks& hooks);

/// Rank 0's bookkeeping of one group's rounds: the directive epochs it
/// announced and which ranks are idle at which epoch. Thread-safe.
class SidpRound {
 public:
  explicit SidpRound(int dp);

  /// Starts a round: nobody idle, not done, not aborted. `on_done` runs
  /// once, under the lock, when every rank is idle at the newest epoch (it
  /// tells remote ranks to stop). Epochs carry on from earlier rounds.
  void start(std::function<void()> on_done);
  /// The next epoch; `deliver(epoch)` runs under the lock (it announces to
  /// every rank), so that deliveries and the round's end are ordered alike
  /// on every rank.
  std::uint64_t announce(const std::function<void(std::uint64_t epoch)>& deliver);
  [[nodiscard]] std::uint64_t epoch() const;
  /// Rank `rank` is idle, announced up to `epoch`. Returns whether the round is over.
  bool idle(int rank, std::uint64_t epoch);
  [[nodiscard]] bool done() const;
  void abort();
  [[nodiscard]] bool aborted() const;

 private:
  mutable std::mutex mu_;
  int dp_;
  std::function<void()> on_done_;
  std::uint64_t epoch_ = 0;
  std::vector<std::optional<std::uint64_t>> idle_at_;  ///< [dp] epoch each rank is idle at
  bool done_ = false;
  bool aborted_ = false;
};

}  // namespace shardline::engine
