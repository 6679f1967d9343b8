#pragma once
/// \file
/// SiDP's WaS <-> CaS switching policy (seed 002, §4.3 "Consistent mode
/// switching"): the orchestrator watches the effective batch of a DP group
/// and, when it "persistently falls below" the hardware threshold b*, tells
/// every rank to run in Compute-as-a-Service; when it rises again past
/// b*·(1+h), back to Weight-as-a-Service. The policy only decides; the
/// orchestrator broadcasts the decision and the ranks apply it at one step
/// boundary (the switching protocol is not here).
///
/// A plain class: no threads, no clock of its own. Callers pass `now` as a
/// std::chrono::steady_clock::time_point (monotonic; the tests use a fixed
/// origin plus scripted offsets). Not thread-safe: one orchestrator actor
/// owns one policy per DP group.
///
/// Rule, for the group's effective batch G = the sum over the group's ranks
/// of each rank's latest reported batch (running sequences):
///
///   WaS -> CaS  when 0 < G < b* and W = 0       has held at every report for >= min_dwell_s
///   CaS -> WaS  when G > b*·(1+h) or W > 0      has held at every report for >= back_dwell_s
///
/// where W = the sum of the ranks' latest waiting prompts (admitted to a
/// rank, not yet running). W = 0 is the paper's tail: no prompt is left to
/// prefill, and only the last sequences decode. The simulator found why it
/// is needed (docs/simulator.md, SiDP projection): with b* above what the
/// group can ever run, G alone put a whole job in CaS, where every layer's
/// FFN runs the group's prefill chunks at one owner.
///
/// and in both directions no sooner than min_dwell_s after the previous
/// switch (so the policy switches at most once per min_dwell_s, whatever the
/// trace). Between b* and b*·(1+h) (both included) nothing changes: that
/// band is the hysteresis.
///
///  - "Held for the dwell": the condition became true at some report at time
///    t0 and every report since kept it true; decide(now) switches when
///    now - t0 >= the dwell. One report that breaks the condition restarts
///    the dwell. So the paper's "window" is the dwell itself: a switch to
///    CaS needs the maximum of G over the last min_dwell_s to be below b*.
///  - The dwell is in seconds, not steps: in WaS the ranks step
///    independently, so a group has no common step count to dwell on, and
///    the paper places switches at "minute-level" boundaries.
///  - An idle group (G = 0: no rank runs anything) is not a tail and does not
///    switch to CaS (it would only make idle ranks poll in lockstep); a
///    report of 0 restarts the dwell like one at or above b*.
///  - back_dwell_s defaults to 0: a burst of work (G > b*·(1+h) at one
///    report) switches back to WaS at the next decide() (subject to the
///    min_dwell_s spacing), because running a large batch in CaS costs every
///    step while the hysteresis band already keeps small wiggles out.
///  - Ranks that have not reported yet: until every rank 0..num_ranks-1 has
///    reported once the group is not "ready", no dwell starts and decide()
///    returns nothing (otherwise a group whose ranks start at different times
///    would look like a tail). A rank keeps its latest report until it sends
///    another; a rank that leaves should be reported with batch 0.
///  - A fixed setting (`was` or `cas`) starts in that mode and never
///    switches; `auto` starts in WaS (the bulk of a job runs in WaS, §4.3).
///  - The units of b*: G is a group sum, so b* here is a threshold on the
///    group's total running sequences. The cost model's per-rank b*
///    (sim::CostModel::sidp_switch_batch_overlapped, the batch at
///    which one rank's forward pass hides its weight fetches) corresponds to
///    dp · b* over dp balanced ranks.

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "model/sidp/mode.hpp"

namespace shardline::engine {

/// How a SiDP group runs its FFN layers: WaS (Weight-as-a-Service: each rank
/// fetches non-owned FFN weights and computes its own rows) or CaS
/// (Compute-as-a-Service: each rank sends its rows to the layer's owner).
using SidpMode = model::sidp::SidpMode;

/// "was" or "cas".
[[nodiscard]] const char* to_string(SidpMode mode) noexcept;
/// Parses "was" / "cas" (exact, lower case). Errors: invalid_argument naming the text.
[[nodiscard]] Result<SidpMode> parse_sidp_mode(std::string_view text);

/// The `--sidp-mode` setting: switch automatically, or stay in one mode.
enum class SidpModeSetting {
  automatic,  ///< "auto": start in WaS, switch by the rule above
  was,        ///< "was": always WaS, never switch
  cas,        ///< "cas": always CaS, never switch
};

/// "auto", "was" or "cas".
[[nodiscard]] const char* to_string(SidpModeSetting setting) noexcept;
/// Parses "auto" / "was" / "cas" (exact, lower case). Errors: invalid_argument naming the text.
[[nodiscard]] Result<SidpModeSetting> parse_sidp_mode_setting(std::string_view text);

/// Options of the policy (`--sidp-mode`, `--sidp-switch-batch`,
/// `--sidp-hysteresis`, `--sidp-min-dwell`).
struct SidpModePolicyOptions {
  SidpModeSetting setting = SidpModeSetting::automatic;
  /// b*: threshold on the group's effective batch (sum of running sequences
  /// over the group's ranks). >= 1 when setting is auto; not used (and not
  /// checked) by a fixed setting. No default: it comes from the cost model or
  /// the user.
  long long switch_batch = 0;
  /// h: the group switches back to WaS only above b*·(1+h). >= 0, finite. Default 0.25.
  double hysteresis = 0.25;
  /// Seconds G < b* must hold before switching to CaS, and the least time
  /// between two switches. >= 0, finite. Default 3 s.
  double min_dwell_s = 3.0;
  /// Seconds G > b*·(1+h) must hold before switching back to WaS. >= 0,
  /// finite. Default 0 (a burst switches back at once).
  double back_dwell_s = 0.0;
  /// Ranks in the DP group (reports come from ranks 0..num_ranks-1). >= 1.
  int num_ranks = 1;

  /// ok, or invalid_argument naming the bad option and its allowed range.
  [[nodiscard]] Status validate() const;
};

/// A switch the orchestrator should broadcast.
struct SidpSwitch {
  SidpMode from = SidpMode::was;
  SidpMode to = SidpMode::cas;
  std::chrono::steady_clock::time_point at;     ///< the `now` of the decide() that made it
  std::chrono::steady_clock::time_point since;  ///< when the condition started to hold
  long long group_batch = 0;                    ///< G when it was made
};

/// The WaS <-> CaS switching policy of one DP group (rule in the file comment).
class SidpModePolicy {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;

  /// Errors: invalid_argument from options.validate().
  [[nodiscard]] static Result<SidpModePolicy> create(const SidpModePolicyOptions& options);

  /// Records rank `rank`'s latest effective batch (running sequences) and
  /// its waiting prompts at `now`. Errors: invalid_argument for a rank
  /// outside [0, num_ranks) or a negative count (nothing is recorded then).
  [[nodiscard]] Status observe(TimePoint now, int rank, long long effective_batch, long long waiting_prompts = 0);

  /// The switch to broadcast now, if any; the policy's mode is then the new
  /// one (it assumes the orchestrator broadcasts what it returns). Never
  /// switches under a fixed setting or before every rank has reported.
  [[nodiscard]] std::optional<SidpSwitch> decide(TimePoint now);

  /// The mode last decided (the initial one before any switch).
  [[nodiscard]] SidpMode mode() const { return mode_; }
  /// Switches decided so far (both directions).
  [[nodiscard]] long long num_switches() const { return num_switches_; }
  /// Time of the last switch, if any.
  [[nodiscard]] std::optional<TimePoint> last_switch() const { return last_switch_; }
  /// G: the sum of the ranks' latest reports (ranks not yet reported add 0).
  [[nodiscard]] long long group_batch() const { return group_batch_; }
  /// W: the sum of the ranks' latest waiting prompts.
  [[nodiscard]] long long group_waiting() const { return group_waiting_; }
  /// Whether every rank has reported at least once.
  [[nodiscard]] bool ready() const { return num_reported_ == options_.num_ranks; }
  /// b*·(1+h): G must exceed it to switch back to WaS.
  [[nodiscard]] double switch_back_batch() const;
  [[nodiscard]] const SidpModePolicyOptions& options() const { return options_; }

 private:
  explicit SidpModePolicy(const SidpModePolicyOptions& options);
  /// Whether G now meets the condition to leave the current mode.
  [[nodiscard]] bool leave_condition() const;

  SidpModePolicyOptions options_;
  SidpMode mode_ = SidpMode::was;
  std::vector<long long> latest_;     ///< per rank; -1 = not reported yet
  int num_reported_ = 0;
  long long group_batch_ = 0;
  std::vector<long long> latest_waiting_;  ///< per rank
  long long group_waiting_ = 0;            ///< W
  std::optional<TimePoint> held_since_;  ///< the leave condition has held at every report since
  long long num_switches_ = 0;
  std::optional<TimePoint> last_switch_;
};

}  // namespace shardline::engine
