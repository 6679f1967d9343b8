#pragma once
/// \file
/// The orchestrator's half of SiDP mode switching (seed 002 §4.3,
/// "consistent mode switching"): one engine::SidpModePolicy per SiDP DP
/// group, the group's ranks and the workers that run them, and the
/// directives the orchestrator must send (which mode, under which epoch, to
/// which workers). A plain class: no actors, no clock of its own (callers
/// pass `now`, steady clock, and a wall-clock time for the records). Not
/// thread-safe: the orchestrator actor owns one.
///
/// Directives. Every directive carries an epoch from ONE counter shared by
/// all groups, strictly increasing: a rank applies a directive only when its
/// epoch is above the last one it applied. Epochs travel as floats inside the
/// ranks' control all-gather, so they are small counters (1, 2, 3, ...),
/// exact as floats up to 2^24, never timestamps. The counter starts above
/// the value given to create(), so an orchestrator restarted inside the same
/// node process continues above the epochs its previous incarnation sent
/// (the actor keeps last_epoch() in the node's OrchestratorRoster).
///
/// Three kinds of directive:
///  - sync: the first time a group is complete in this switcher (every rank
///    0..num_ranks-1 has a worker), all its workers get the policy's current
///    mode (WaS under `auto`, the fixed mode under `was`/`cas`) with a fresh
///    epoch. After an orchestrator restart the ranks may still run in the
///    mode the previous incarnation told them (say CaS) while the fresh
///    policy starts in WaS; the sync makes them agree again. A sync is not a
///    switch: it is not recorded nor counted.
///  - rejoin: a worker that says hello for a rank of a group already synced
///    (a restarted worker, or the same one again) gets the mode last
///    broadcast to the group with the epoch of that broadcast, so it agrees
///    with its peers without making them apply anything.
///  - switch: decide() found that a group's policy switched; all the group's
///    workers get the new mode with a fresh epoch. Recorded (the last
///    kMaxListedSwitches, plus a total count).
///
/// A dead worker leaves (leave()): its rank counts as reporting batch 0 (as
/// the policy header asks) until a worker joins that rank again, and it is
/// not named in later directives.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "engine/policies/sidp_mode_policy.hpp"

namespace shardline::orchestrator {

/// What the orchestrator must send: SidpSwitch{group, mode, epoch} to each
/// of `workers`.
struct SidpDirective {
  enum class Kind {
    sync,     ///< the group became complete: every worker gets the current mode
    rejoin,   ///< one worker joined an already synced group: the mode and epoch last broadcast
    switch_,  ///< the policy switched the group (recorded)
  };
  std::string group;    ///< "NODE/sidp"
  engine::SidpMode mode = engine::SidpMode::was;
  std::uint64_t epoch = 0;            ///< >= 1
  std::vector<std::string> workers;   ///< by rank; the ranks without a worker are left out
  Kind kind = Kind::sync;
  long long group_batch = 0;          ///< the group's effective batch when it was made
};

/// One switch of a group, as `job status` shows it.
struct SidpSwitchRecord {
  engine::SidpMode to = engine::SidpMode::cas;
  std::uint64_t at_unix_ms = 0;  ///< wall clock, ms since 1970 (the decide() caller's)
  long long group_batch = 0;     ///< the group's effective batch when it switched
  std::uint64_t epoch = 0;
  bool operator==(const SidpSwitchRecord&) const = default;
};

/// One group's switching state.
struct SidpGroupState {
  std::string group;
  engine::SidpMode mode = engine::SidpMode::was;  ///< last broadcast (the policy's before any)
  engine::SidpModeSetting setting = engine::SidpModeSetting::automatic;
  int num_ranks = 0;
  int num_joined = 0;            ///< ranks with a worker now
  bool synced = false;           ///< the sync directive went out
  long long switch_batch = 0;    ///< b*
  long long group_batch = 0;     ///< G at the last report
  std::vector<SidpSwitchRecord> switches;  ///< oldest first, the last kMaxListedSwitches
  std::uint64_t num_switches = 0;          ///< all of them
};

class SidpSwitcher {
 public:
  using Clock = engine::SidpModePolicy::Clock;
  using TimePoint = engine::SidpModePolicy::TimePoint;
  /// Switch records kept per group (older ones only count).
  static constexpr std::size_t kMaxListedSwitches = 64;

  /// `base`: setting, switch_batch, hysteresis, min_dwell_s, back_dwell_s
  /// for every group; base.num_ranks is ignored (each group's comes with its
  /// workers' hellos). `last_epoch`: the highest epoch already used (0 =
  /// none); the first directive gets last_epoch + 1. Errors: invalid_argument
  /// from SidpModePolicyOptions::validate() (e.g. b* < 1 under `auto`).
  [[nodiscard]] static Result<SidpSwitcher> create(engine::SidpModePolicyOptions base, std::uint64_t last_epoch = 0);

  /// Whether join() would accept this rank: invalid_argument for an empty
  /// group name, num_ranks < 2, rank >= num_ranks, or a num_ranks other than
  /// the one the group was first seen with. Changes nothing.
  [[nodiscard]] Status check_join(const std::string& group, int rank, int num_ranks) const;

  /// Worker `worker` said hello as rank `rank` of `group` (of `num_ranks`
  /// ranks) at `now`. The group is created on first sight. A second hello
  /// for a rank replaces its worker (a restarted one); a worker name moves
  /// out of any rank it held before. Returns the directive to send now: the
  /// sync when this hello completed the group for the first time, the rejoin
  /// when the group was synced already, nothing while the group is
  /// incomplete. Errors: those of check_join (then nothing changes).
  [[nodiscard]] Result<std::optional<SidpDirective>> join(const std::string& group, int rank, int num_ranks,
                                                          const std::string& worker, TimePoint now);

  /// A heartbeat: `worker` runs `num_running` sequences and has
  /// `num_waiting` prompts admitted but not running at `now`. Unknown
  /// workers and negative counts are ignored.
  void observe(const std::string& worker, long long num_running, TimePoint now, long long num_waiting = 0);

  /// `worker` is dead: its rank reports 0 at `now` and has no worker until
  /// one joins it again. Unknown workers are ignored.
  void leave(const std::string& worker, TimePoint now);

  /// Asks every synced group's policy to decide at `now`; each switch
  /// becomes a directive (kind switch_, a fresh epoch, groups in name order)
  /// and a record stamped `unix_ms`.
  [[nodiscard]] std::vector<SidpDirective> decide(TimePoint now, std::uint64_t unix_ms);

  /// Every group, in name order.
  [[nodiscard]] std::vector<SidpGroupState> status() const;

  /// The highest epoch used so far (the create() value before any directive).
  [[nodiscard]] std::uint64_t last_epoch() const noexcept { return last_epoch_; }
  /// The group and rank of `worker`, if it holds one.
  [[nodiscard]] std::optional<std::pair<std::string, int>> rank_of(const std::string& worker) const;
  [[nodiscard]] bool empty() const noexcept { return groups_.empty(); }

 private:
  struct Group {
    engine::SidpModePolicy policy;
    std::vector<std::string> workers;  ///< by rank; "" = none
    std::optional<engine::SidpMode> broadcast;  ///< mode last broadcast
    std::uint64_t broadcast_epoch = 0;          ///< its epoch
    std::deque<SidpSwitchRecord> switches;
    std::uint64_t num_switches = 0;
  };

  explicit SidpSwitcher(engine::SidpModePolicyOptions base, std::uint64_t last_epoch)
      : base_(base), last_epoch_(last_epoch) {}
  [[nodiscard]] static std::vector<std::string> named(const Group& g);

  engine::SidpModePolicyOptions base_;
  std::uint64_t last_epoch_ = 0;
  std::map<std::string, Group> groups_;
  std::map<std::string, std::pair<std::string, int>> ranks_;  ///< worker -> (group, rank)
};

}  // namespace shardline::orchestrator
