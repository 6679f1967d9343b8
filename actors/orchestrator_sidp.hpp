#pragma once
/// \file
/// The orchestrator actor's SiDP half (seed 002), kept out of its behaviour:
/// the WaS <-> CaS switcher of every SiDP group (orchestrator::SidpSwitcher,
/// created on the first hello of a SiDP worker, so a cluster without SiDP
/// never checks the options), its metrics and log lines, the epoch kept in
/// the node's OrchestratorRoster across restarts, and the registry of layer
/// owners for `actor list` / `actor kill`. It decides what to send; the actor
/// sends it (each SidpDirective as a signed WorkerMsg SidpSwitch to each
/// named worker). Used from the orchestrator's behaviour only (not
/// thread-safe, except for the roster, which it locks).

#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/actors.hpp"
#include "actors/metrics.hpp"
#include "messages/types.hpp"
#include "orchestrator/sidp_switcher.hpp"

namespace shardline::actors {

/// "12.3 MiB".
[[nodiscard]] std::string mib(std::uint64_t bytes);

/// The SiDP metric families (shardline_sidp_mode, shardline_sidp_switches_total).
void describe_sidp_metrics(MetricsRegistry& metrics);

class OrchestratorSidp {
 public:
  using Clock = std::chrono::steady_clock;
  using Directives = std::vector<orchestrator::SidpDirective>;

  /// `roster` and `metrics` must not be null.
  OrchestratorSidp(engine::SidpModePolicyOptions policy, std::shared_ptr<OrchestratorRoster> roster,
                   std::shared_ptr<MetricsRegistry> metrics)
      : policy_(policy), roster_(std::move(roster)), metrics_(std::move(metrics)) {}

  // ---- workers of SiDP groups ----

  /// Before the pool registers a SiDP worker (hello.sidp_group not empty):
  /// whether it may join. Creates the switcher on the first call (its epoch
  /// continues above the roster's). Errors: invalid_argument from
  /// SidpSwitcher::create (bad options) or check_join (bad rank, a group
  /// size other than its peers').
  [[nodiscard]] Status check(const messages::WorkerHello& hello);
  /// After the pool registered it: joins its rank; returns the sync (the
  /// group is complete for the first time) or rejoin directive to send now,
  /// if any. Errors: as check().
  [[nodiscard]] Result<Directives> joined(const messages::WorkerHello& hello, Clock::time_point now);
  /// A heartbeat of worker `name` (ignored unless it holds a SiDP rank):
  /// records its running sequences and waiting prompts, then decide().
  [[nodiscard]] Directives heartbeat(const std::string& name, long long num_running, Clock::time_point now,
                                     long long num_waiting = 0);
  /// Every group's policy decides at `now` (also on the orchestrator's tick:
  /// a dwell can end between heartbeats). Each switch is logged, counted and
  /// recorded with the wall clock.
  [[nodiscard]] Directives decide(Clock::time_point now);
  /// Worker `name` died or was dropped: its rank reports 0 from now on.
  void left(const std::string& name, Clock::time_point now);
  /// The groups for `job status`, in name order (none before a SiDP hello).
  [[nodiscard]] std::vector<messages::SidpGroupStatus> groups() const;
  /// The SiDP mode of a switch directive in wire form.
  [[nodiscard]] static messages::SidpSwitch to_message(const orchestrator::SidpDirective& d);

  // ---- layer owners ----

  /// A LayerOwnerHello from `sender` at `now`: registers the owner, or
  /// refreshes it. Returns true when `sender` is a new incarnation (first
  /// hello, or after a kill or crash): the caller monitors it. A late hello
  /// from an incarnation already reported down is ignored.
  [[nodiscard]] bool owner_seen(const caf::actor& sender, const messages::LayerOwnerHello& hello,
                                Clock::time_point now);
  /// A down message: true if `source` was a registered owner (now "down").
  bool owner_down(const caf::actor_addr& source);
  /// The live owner named `name`; null if unknown or down.
  [[nodiscard]] caf::actor owner(const std::string& name) const;
  /// One ActorInfo per owner heard of (kind "owner"), in name order.
  /// `silent_after`: an owner not heard of for longer says so in its detail.
  [[nodiscard]] std::vector<messages::ActorInfo> list_owners(Clock::time_point now,
                                                            std::chrono::milliseconds silent_after) const;

 private:
  struct Owner {
    messages::LayerOwnerHello info;
    caf::actor handle;  ///< null while down
    Clock::time_point last_seen;
    int restarts = 0;   ///< new incarnations after the first
  };

  /// Logs and counts one directive and keeps the epoch in the roster.
  void note(const orchestrator::SidpDirective& d);

  engine::SidpModePolicyOptions policy_;
  std::shared_ptr<OrchestratorRoster> roster_;
  std::shared_ptr<MetricsRegistry> metrics_;
  std::optional<orchestrator::SidpSwitcher> switcher_;
  std::map<std::string, Owner> owners_;
  std::set<caf::actor_addr> dead_owners_;  ///< incarnations reported down (their late hellos are ignored)
};

}  // namespace shardline::actors
