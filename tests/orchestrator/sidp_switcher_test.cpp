// The orchestrator's SiDP switcher: joins and their checks, the sync
// directive when a group is first complete, rejoins, scripted traces over
// two groups (only the group whose batch falls switches; the directives name
// exactly its workers; one epoch counter across groups), leaving as batch 0,
// fixed settings, and the switch records.
#include "orchestrator/sidp_switcher.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardline::orchestrator {
namespace orchestrator_sidp_switcher_test {

using engine::SidpMode;
using engine::SidpModeSetting;
using Kind = SidpDirective::Kind;
using TimePoint = SidpSwitcher::TimePoint;

TimePoint at_ms(long long ms) { return TimePoint{} + std::chrono::milliseconds(ms); }

// b* = 4 on the group's batch, h = 0.25 (back above 5), dwell 1 s.
engine::SidpModePolicyOptions base(SidpModeSetting setting = SidpModeSetting::automatic) {
  engine::SidpModePolicyOptions o;
  o.setting = setting;
  o.switch_batch = 4;
  o.hysteresis = 0.25;
  o.min_dwell_s = 1.0;
  o.num_ranks = 99;  // ignored
  return o;
}

SidpSwitcher make(const engine::SidpModePolicyOptions& o, std::uint64_t last_epoch = 0) {
  Result<SidpSwitcher> s = SidpSwitcher::create(o, last_epoch);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return std::move(s).value();
}

std::optional<SidpDirective> join_ok(SidpSwitcher& s, const std::string& group, int rank, int ranks,
                                     const std::string& worker, long long ms = 0) {
  auto r = s.join(group, rank, ranks, worker, at_ms(ms));
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? *r : std::nullopt;
}

TEST(SidpSwitcher, CreateValidatesLikeThePolicyButIgnoresNumRanks) {
  engine::SidpModePolicyOptions o = base();
  o.num_ranks = 0;  // ignored: each group's comes from its hellos
  EXPECT_TRUE(SidpSwitcher::create(o).ok());
  o.switch_batch = 0;
  auto r = SidpSwitcher::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("switch_batch"), std::string::npos) << r.error().message;
  o.setting = SidpModeSetting::was;  // b* is not used by a fixed setting
  EXPECT_TRUE(SidpSwitcher::create(o).ok());
  o = base();
  o.hysteresis = -1;
  EXPECT_FALSE(SidpSwitcher::create(o).ok());
}

TEST(SidpSwitcher, JoinRefusesBadRanksAndChangesNothing) {
  SidpSwitcher s = make(base());
  const auto expect_refused = [&](const std::string& g, int rank, int ranks, const std::string& w) {
    auto r = s.join(g, rank, ranks, w, at_ms(0));
    ASSERT_FALSE(r.ok()) << g << " " << rank << "/" << ranks;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_FALSE(s.check_join(g, rank, ranks).ok());
  };
  expect_refused("", 0, 2, "w");
  expect_refused("n/sidp", 2, 2, "w");
  expect_refused("n/sidp", -1, 2, "w");
  expect_refused("n/sidp", 0, 1, "w");
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(join_ok(s, "n/sidp", 0, 2, "n/cpu:0"));
  expect_refused("n/sidp", 1, 3, "n/cpu:1");  // the group has 2 ranks
  EXPECT_FALSE(s.rank_of("n/cpu:1"));
  ASSERT_EQ(s.status().size(), 1u);
  EXPECT_EQ(s.status()[0].num_ranks, 2);
  EXPECT_EQ(s.status()[0].num_joined, 1);
  EXPECT_EQ(s.last_epoch(), 0u);
}

TEST(SidpSwitcher, SyncsAGroupWhenItIsFirstCompleteAndRejoinsGetTheCurrentModeAndEpoch) {
  SidpSwitcher s = make(base(), /*last_epoch=*/41);  // a restarted orchestrator continues above 41
  EXPECT_FALSE(join_ok(s, "n/sidp", 2, 3, "n/cpu:2"));
  EXPECT_FALSE(join_ok(s, "n/sidp", 0, 3, "n/cpu:0"));
  EXPECT_FALSE(s.status()[0].synced);
  auto sync = join_ok(s, "n/sidp", 1, 3, "n/cpu:1");
  ASSERT_TRUE(sync);
  EXPECT_EQ(sync->kind, Kind::sync);
  EXPECT_EQ(sync->group, "n/sidp");
  EXPECT_EQ(sync->mode, SidpMode::was);  // auto starts in WaS
  EXPECT_EQ(sync->epoch, 42u);
  EXPECT_EQ(sync->workers, (std::vector<std::string>{"n/cpu:0", "n/cpu:1", "n/cpu:2"}));
  EXPECT_EQ(s.last_epoch(), 42u);
  EXPECT_TRUE(s.status()[0].synced);
  EXPECT_EQ(s.status()[0].num_switches, 0u) << "a sync is not a switch";

  // Into CaS, then rank 1's worker restarts: it gets CaS with the switch's
  // epoch, alone, and the counter does not move.
  for (int r = 0; r < 3; ++r) s.observe("n/cpu:" + std::to_string(r), 1, at_ms(100));
  ASSERT_EQ(s.decide(at_ms(1200), 1000).size(), 1u);
  EXPECT_EQ(s.last_epoch(), 43u);
  s.leave("n/cpu:1", at_ms(1300));
  EXPECT_EQ(s.status()[0].num_joined, 2);
  auto again = join_ok(s, "n/sidp", 1, 3, "n/cpu:1", 1400);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->kind, Kind::rejoin);
  EXPECT_EQ(again->mode, SidpMode::cas);
  EXPECT_EQ(again->epoch, 43u);
  EXPECT_EQ(again->workers, (std::vector<std::string>{"n/cpu:1"}));
  EXPECT_EQ(s.last_epoch(), 43u);

  // A second hello for a rank under another name replaces its worker.
  auto other = join_ok(s, "n/sidp", 2, 3, "n/cpu:9", 1500);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->workers, (std::vector<std::string>{"n/cpu:9"}));
  EXPECT_FALSE(s.rank_of("n/cpu:2"));
  EXPECT_EQ(s.rank_of("n/cpu:9"), (std::pair<std::string, int>{"n/sidp", 2}));
}

TEST(SidpSwitcher, OnlyTheGroupWhoseBatchFallsSwitchesAndEpochsIncreaseAcrossGroups) {
  SidpSwitcher s = make(base());
  ASSERT_FALSE(join_ok(s, "a/sidp", 0, 2, "a/cpu:0"));
  auto sync_a = join_ok(s, "a/sidp", 1, 2, "a/cpu:1");
  ASSERT_FALSE(join_ok(s, "b/sidp", 1, 2, "b/cpu:1"));
  auto sync_b = join_ok(s, "b/sidp", 0, 2, "b/cpu:0");
  ASSERT_TRUE(sync_a && sync_b);
  EXPECT_EQ(sync_a->epoch, 1u);
  EXPECT_EQ(sync_b->epoch, 2u);

  // Group a's batch falls (8 -> 2 in sum) at 1 s; group b stays at 10.
  // Reports every 100 ms, decide after each round.
  std::vector<SidpDirective> seen;
  std::vector<long long> when;
  const auto round = [&](long long ms, long long a_each, long long b_each) {
    s.observe("a/cpu:0", a_each, at_ms(ms));
    s.observe("a/cpu:1", a_each, at_ms(ms));
    s.observe("b/cpu:0", b_each, at_ms(ms));
    s.observe("b/cpu:1", b_each, at_ms(ms));
    for (SidpDirective& d : s.decide(at_ms(ms), 1'700'000'000'000ull + static_cast<std::uint64_t>(ms))) {
      seen.push_back(std::move(d));
      when.push_back(ms);
    }
  };
  for (long long ms = 0; ms < 1000; ms += 100) round(ms, 4, 5);
  EXPECT_TRUE(seen.empty()) << "nothing falls below b* = 4 yet";
  for (long long ms = 1000; ms < 3000; ms += 100) round(ms, 1, 5);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(when[0], 2000) << "after the 1 s dwell from the first low report";
  EXPECT_EQ(seen[0].group, "a/sidp");
  EXPECT_EQ(seen[0].kind, Kind::switch_);
  EXPECT_EQ(seen[0].mode, SidpMode::cas);
  EXPECT_EQ(seen[0].epoch, 3u);
  EXPECT_EQ(seen[0].group_batch, 2);
  EXPECT_EQ(seen[0].workers, (std::vector<std::string>{"a/cpu:0", "a/cpu:1"}));

  // Now b's batch falls too, and a's rises back above b*(1+h) = 5 (a burst).
  for (long long ms = 3000; ms < 5000; ms += 100) round(ms, 3, 1);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].group, "a/sidp");
  EXPECT_EQ(seen[1].mode, SidpMode::was);
  EXPECT_EQ(when[1], 3000) << "a burst switches back at once (back dwell 0, 1 s since the switch)";
  EXPECT_EQ(seen[1].epoch, 4u);
  EXPECT_EQ(seen[2].group, "b/sidp");
  EXPECT_EQ(seen[2].mode, SidpMode::cas);
  EXPECT_EQ(when[2], 4000);
  EXPECT_EQ(seen[2].epoch, 5u);
  EXPECT_EQ(seen[2].workers, (std::vector<std::string>{"b/cpu:0", "b/cpu:1"}));
  EXPECT_EQ(s.last_epoch(), 5u);

  // The records, with the wall clock the caller gave.
  const std::vector<SidpGroupState> st = s.status();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].group, "a/sidp");
  EXPECT_EQ(st[0].mode, SidpMode::was);
  EXPECT_EQ(st[0].num_switches, 2u);
  EXPECT_EQ(st[0].group_batch, 6);
  EXPECT_EQ(st[0].switch_batch, 4);
  EXPECT_EQ(st[0].setting, SidpModeSetting::automatic);
  ASSERT_EQ(st[0].switches.size(), 2u);
  EXPECT_EQ(st[0].switches[0], (SidpSwitchRecord{SidpMode::cas, 1'700'000'002'000ull, 2, 3}));
  EXPECT_EQ(st[0].switches[1], (SidpSwitchRecord{SidpMode::was, 1'700'000'003'000ull, 6, 4}));
  EXPECT_EQ(st[1].mode, SidpMode::cas);
  EXPECT_EQ(st[1].num_switches, 1u);
  ASSERT_EQ(st[1].switches.size(), 1u);
  EXPECT_EQ(st[1].switches[0], (SidpSwitchRecord{SidpMode::cas, 1'700'000'004'000ull, 2, 5}));
}

TEST(SidpSwitcher, ALeavingWorkerCountsAsZeroAndIsNotNamed) {
  SidpSwitcher s = make(base());
  ASSERT_FALSE(join_ok(s, "n/sidp", 0, 2, "n/cpu:0"));
  ASSERT_TRUE(join_ok(s, "n/sidp", 1, 2, "n/cpu:1"));
  s.observe("n/cpu:0", 3, at_ms(0));
  s.observe("n/cpu:1", 3, at_ms(0));  // G = 6: WaS stays
  s.observe("n/cpu:9", 0, at_ms(0));  // unknown: ignored
  EXPECT_TRUE(s.decide(at_ms(2000), 1).empty());
  s.leave("n/cpu:1", at_ms(2000));  // G = 3 < 4 from now on
  s.leave("n/cpu:9", at_ms(2000));  // unknown: ignored
  EXPECT_EQ(s.status()[0].group_batch, 3);
  EXPECT_TRUE(s.decide(at_ms(2500), 2).empty());
  const std::vector<SidpDirective> d = s.decide(at_ms(3000), 3);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].mode, SidpMode::cas);
  EXPECT_EQ(d[0].workers, (std::vector<std::string>{"n/cpu:0"})) << "the dead worker is not named";
  s.observe("n/cpu:1", 50, at_ms(3100));  // it is gone: its reports no longer count
  EXPECT_EQ(s.status()[0].group_batch, 3);
}

TEST(SidpSwitcher, AFixedSettingSendsOnlyTheSync) {
  for (const SidpModeSetting setting : {SidpModeSetting::was, SidpModeSetting::cas}) {
    SidpSwitcher s = make(base(setting));
    ASSERT_FALSE(join_ok(s, "n/sidp", 0, 2, "n/cpu:0"));
    auto sync = join_ok(s, "n/sidp", 1, 2, "n/cpu:1");
    ASSERT_TRUE(sync);
    EXPECT_EQ(sync->mode, setting == SidpModeSetting::cas ? SidpMode::cas : SidpMode::was);
    EXPECT_EQ(sync->epoch, 1u);
    std::size_t directives = 0;
    for (long long ms = 0; ms < 20'000; ms += 250) {
      const long long each = (ms / 2000) % 2 == 0 ? 0 : 100;  // far below, then far above b*
      s.observe("n/cpu:0", each, at_ms(ms));
      s.observe("n/cpu:1", each, at_ms(ms));
      directives += s.decide(at_ms(ms), 1).size();
    }
    EXPECT_EQ(directives, 0u);
    EXPECT_EQ(s.status()[0].num_switches, 0u);
    EXPECT_EQ(s.status()[0].setting, setting);
    EXPECT_EQ(s.last_epoch(), 1u);
  }
}

TEST(SidpSwitcher, KeepsTheLast64RecordsAndCountsAll) {
  engine::SidpModePolicyOptions o = base();
  o.min_dwell_s = 0;
  SidpSwitcher s = make(o);
  ASSERT_FALSE(join_ok(s, "n/sidp", 0, 2, "n/cpu:0"));
  ASSERT_TRUE(join_ok(s, "n/sidp", 1, 2, "n/cpu:1"));
  std::uint64_t n = 0;
  for (long long i = 0; i < 100; ++i) {
    const long long each = i % 2 == 0 ? 1 : 10;  // a tail of 2 (an idle group is not one), then 20
    s.observe("n/cpu:0", each, at_ms(i));
    s.observe("n/cpu:1", each, at_ms(i));
    n += s.decide(at_ms(i), static_cast<std::uint64_t>(i)).size();
  }
  EXPECT_EQ(n, 100u);
  const SidpGroupState st = s.status().at(0);
  EXPECT_EQ(st.num_switches, 100u);
  ASSERT_EQ(st.switches.size(), SidpSwitcher::kMaxListedSwitches);
  EXPECT_EQ(st.switches.front().at_unix_ms, 36u);
  EXPECT_EQ(st.switches.back().at_unix_ms, 99u);
  EXPECT_EQ(st.switches.back().epoch, 101u);  // the sync took 1
}

}  // namespace
}  // namespace shardline::orchestrator
