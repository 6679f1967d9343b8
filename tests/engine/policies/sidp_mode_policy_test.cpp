#include "engine/policies/sidp_mode_policy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace shardline::engine {
namespace engine_policies_sidp_mode_policy_test {

using TimePoint = SidpModePolicy::TimePoint;

// Scripted time: milliseconds after a fixed origin (integers, so no rounding).
TimePoint at_ms(long long ms) { return TimePoint{} + std::chrono::milliseconds(ms); }
double seconds(TimePoint t) { return std::chrono::duration<double>(t - TimePoint{}).count(); }

// b* = 100 over a group of 2 ranks, h = 0.25 (back above 125), dwell 3 s.
SidpModePolicyOptions opts(SidpModeSetting setting = SidpModeSetting::automatic) {
  SidpModePolicyOptions o;
  o.setting = setting;
  o.switch_batch = 100;
  o.num_ranks = 2;
  return o;
}

SidpModePolicy make(const SidpModePolicyOptions& o) {
  Result<SidpModePolicy> p = SidpModePolicy::create(o);
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return std::move(p).value();
}

struct Seen {
  double t = 0;  // seconds
  SidpSwitch sw;
};

struct Sample {
  double t = 0;
  long long group_batch = 0;
};

// Every `tick_ms` from 0 to end_ms (exclusive), each rank reports
// batch(t_seconds, rank), then the orchestrator calls decide(). Returns the
// switches; `samples` (if given) gets G after every report.
std::vector<Seen> run(SidpModePolicy& p, long long end_ms, long long tick_ms,
                      const std::function<long long(double, int)>& batch, std::vector<Sample>* samples = nullptr) {
  std::vector<Seen> seen;
  for (long long ms = 0; ms < end_ms; ms += tick_ms) {
    const TimePoint now = at_ms(ms);
    for (int r = 0; r < p.options().num_ranks; ++r) {
      const Status st = p.observe(now, r, batch(ms / 1000.0, r));
      EXPECT_TRUE(st.ok()) << st.error().to_string();
      if (samples) samples->push_back({ms / 1000.0, p.group_batch()});
    }
    if (std::optional<SidpSwitch> s = p.decide(now)) seen.push_back({ms / 1000.0, *s});
  }
  return seen;
}

TEST(SidpModePolicy, ModeStringsRoundTrip) {
  EXPECT_STREQ(to_string(SidpMode::was), "was");
  EXPECT_STREQ(to_string(SidpMode::cas), "cas");
  EXPECT_EQ(parse_sidp_mode("was").value(), SidpMode::was);
  EXPECT_EQ(parse_sidp_mode("cas").value(), SidpMode::cas);
  EXPECT_FALSE(parse_sidp_mode("auto").ok());
  EXPECT_FALSE(parse_sidp_mode("WaS").ok());
  for (const char* s : {"auto", "was", "cas"}) {
    Result<SidpModeSetting> m = parse_sidp_mode_setting(s);
    ASSERT_TRUE(m.ok()) << s;
    EXPECT_STREQ(to_string(*m), s);
  }
  Result<SidpModeSetting> bad = parse_sidp_mode_setting("sometimes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("sometimes"), std::string::npos);
}

TEST(SidpModePolicy, Defaults) {
  const SidpModePolicyOptions o;
  EXPECT_EQ(o.setting, SidpModeSetting::automatic);
  EXPECT_DOUBLE_EQ(o.hysteresis, 0.25);
  EXPECT_DOUBLE_EQ(o.min_dwell_s, 3.0);
  EXPECT_DOUBLE_EQ(o.back_dwell_s, 0.0);
  EXPECT_FALSE(o.validate().ok());  // auto needs a b*
  SidpModePolicy p = make(opts());
  EXPECT_EQ(p.mode(), SidpMode::was);
  EXPECT_EQ(p.num_switches(), 0);
  EXPECT_FALSE(p.last_switch().has_value());
  EXPECT_DOUBLE_EQ(p.switch_back_batch(), 125.0);
}

TEST(SidpModePolicy, BadOptionsRejectedNamingTheOption) {
  const auto rejects = [](SidpModePolicyOptions o, const std::string& name) {
    Result<SidpModePolicy> p = SidpModePolicy::create(o);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(p.error().message.find(name), std::string::npos) << p.error().message;
  };
  SidpModePolicyOptions o = opts();
  o.switch_batch = 0;
  rejects(o, "switch_batch");
  o = opts();
  o.switch_batch = -5;
  rejects(o, "switch_batch");
  o = opts();
  o.hysteresis = -0.01;
  rejects(o, "hysteresis");
  o = opts();
  o.hysteresis = std::nan("");
  rejects(o, "hysteresis");
  o = opts();
  o.min_dwell_s = -1;
  rejects(o, "min_dwell_s");
  o = opts();
  o.min_dwell_s = std::numeric_limits<double>::infinity();
  rejects(o, "min_dwell_s");
  o = opts();
  o.back_dwell_s = -0.5;
  rejects(o, "back_dwell_s");
  o = opts();
  o.num_ranks = 0;
  rejects(o, "num_ranks");
  // A fixed mode needs no b*; h = 0 and zero dwells are allowed.
  o = opts(SidpModeSetting::was);
  o.switch_batch = 0;
  EXPECT_TRUE(o.validate().ok());
  o = opts();
  o.hysteresis = 0;
  o.min_dwell_s = 0;
  EXPECT_TRUE(o.validate().ok());
}

TEST(SidpModePolicy, BadReportsRejected) {
  SidpModePolicy p = make(opts());
  EXPECT_EQ(p.observe(at_ms(0), 2, 5).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(p.observe(at_ms(0), -1, 5).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(p.observe(at_ms(0), 0, -1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(p.group_batch(), 0);
  EXPECT_FALSE(p.ready());
}

TEST(SidpModePolicy, GroupBatchIsTheSumOfLatestReports) {
  SidpModePolicy p = make(opts());
  ASSERT_TRUE(p.observe(at_ms(0), 0, 70).ok());
  EXPECT_EQ(p.group_batch(), 70);
  EXPECT_FALSE(p.ready());
  ASSERT_TRUE(p.observe(at_ms(0), 1, 50).ok());
  EXPECT_EQ(p.group_batch(), 120);
  EXPECT_TRUE(p.ready());
  ASSERT_TRUE(p.observe(at_ms(500), 0, 30).ok());  // replaces rank 0's 70
  EXPECT_EQ(p.group_batch(), 80);
}

TEST(SidpModePolicy, NoSwitchUntilEveryRankHasReported) {
  SidpModePolicy p = make(opts());
  for (long long ms = 0; ms <= 10000; ms += 500) {  // rank 0 alone, in a tail of 1, for 10 s
    ASSERT_TRUE(p.observe(at_ms(ms), 0, 1).ok());
    EXPECT_FALSE(p.decide(at_ms(ms)).has_value()) << ms;
  }
  ASSERT_TRUE(p.observe(at_ms(10000), 1, 1).ok());  // the dwell starts only now
  EXPECT_FALSE(p.decide(at_ms(12999)).has_value());
  std::optional<SidpSwitch> s = p.decide(at_ms(13000));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->to, SidpMode::cas);
  EXPECT_DOUBLE_EQ(seconds(s->since), 10.0);
}

TEST(SidpModePolicy, DwellRespectedAndRestartedByOneReportAtOrAboveBStar) {
  // 40 + 40 < 100 from t = 0, reports and decisions every 100 ms.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 10000, 100, [](double, int) { return 40LL; });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].t, 3.0);  // not one tick before
  EXPECT_EQ(s[0].sw.from, SidpMode::was);
  EXPECT_EQ(s[0].sw.to, SidpMode::cas);
  EXPECT_EQ(s[0].sw.group_batch, 80);

  // Same, but at t = 2 s rank 1 reports 60 (G = 100, not < b*) for one tick.
  SidpModePolicy q = make(opts());
  s = run(q, 10000, 100, [](double t, int r) { return r == 1 && t == 2.0 ? 60LL : 40LL; });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].t, 5.1);  // dwell restarted at 2.1 s
  EXPECT_DOUBLE_EQ(seconds(s[0].sw.since), 2.1);
}

TEST(SidpModePolicy, LongTailSwitchesOnce) {
  // Each rank drains one sequence a second from 200 to 0, then idles.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 400000, 1000, [](double t, int) { return std::max(0LL, 200 - (long long)t); });
  ASSERT_EQ(s.size(), 1u);
  // G = 2 * (200 - t) < 100 first at t = 151 (G = 98); dwell 3 s.
  EXPECT_DOUBLE_EQ(s[0].t, 154.0);
  EXPECT_DOUBLE_EQ(seconds(s[0].sw.since), 151.0);
  EXPECT_EQ(s[0].sw.to, SidpMode::cas);
  EXPECT_EQ(p.mode(), SidpMode::cas);
  EXPECT_EQ(p.num_switches(), 1);
  ASSERT_TRUE(p.last_switch().has_value());
  EXPECT_DOUBLE_EQ(seconds(*p.last_switch()), 154.0);

  // An uneven tail: rank 0 is done at once, rank 1 keeps 150 until t = 50,
  // then 60. G = 150 stays above b*, then 60 is below.
  SidpModePolicy q = make(opts());
  s = run(q, 100000, 1000, [](double t, int r) { return r == 0 ? 0LL : (t < 50 ? 150LL : 60LL); });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].t, 53.0);
}

TEST(SidpModePolicy, AnIdleGroupIsNotATail) {
  // Every rank idle for 100 s: G = 0 never switches to CaS.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 100000, 1000, [](double, int) { return 0LL; });
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(p.mode(), SidpMode::was);
  // A tail of 3 running sequences after the idle time switches after the
  // dwell, counted from the first report of it; an idle report in between
  // restarts the dwell.
  SidpModePolicy q = make(opts());
  s = run(q, 20000, 100, [](double t, int r) {
    if (t < 5.0) return 0LL;
    if (t == 6.0) return 0LL;
    return r == 0 ? 3LL : 0LL;
  });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(seconds(s[0].sw.since), 6.1);
  EXPECT_DOUBLE_EQ(s[0].t, 9.1);
  EXPECT_EQ(s[0].sw.group_batch, 3);
}

TEST(SidpModePolicy, BurstSwitchesBack) {
  // The long tail above, then at t = 200 s a burst of 100 per rank for one
  // report (G = 200 > 125), then 10 per rank.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 300000, 1000, [](double t, int) {
    if (t < 200) return std::max(0LL, 200 - (long long)t);
    return t == 200 ? 100LL : 10LL;
  });
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0].t, 154.0);
  EXPECT_EQ(s[0].sw.to, SidpMode::cas);
  EXPECT_DOUBLE_EQ(s[1].t, 200.0);  // at once: back_dwell_s = 0
  EXPECT_EQ(s[1].sw.from, SidpMode::cas);
  EXPECT_EQ(s[1].sw.to, SidpMode::was);
  EXPECT_EQ(s[1].sw.group_batch, 200);
  EXPECT_DOUBLE_EQ(s[2].t, 204.0);  // the tail again, after a full dwell
  EXPECT_EQ(s[2].sw.to, SidpMode::cas);
  EXPECT_EQ(p.num_switches(), 3);
}

TEST(SidpModePolicy, BurstRightAfterASwitchWaitsForTheMinimumSpacing) {
  // A tail of 1 per rank from 0 (CaS at 3 s); a burst from 4 s that lasts
  // switches back at 6 s (3 s after the last switch), not at 4 s.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 10000, 500, [](double t, int) { return t < 4 ? 1LL : 100LL; });
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[0].t, 3.0);
  EXPECT_DOUBLE_EQ(s[1].t, 6.0);
  EXPECT_EQ(s[1].sw.to, SidpMode::was);
  EXPECT_DOUBLE_EQ(seconds(s[1].sw.since), 4.0);

  // A burst that is over (4 s to 5 s) before the spacing allows a switch
  // leaves the group in CaS.
  SidpModePolicy q = make(opts());
  s = run(q, 10000, 500, [](double t, int) { return t >= 4 && t < 5 ? 100LL : 1LL; });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(q.mode(), SidpMode::cas);
}

TEST(SidpModePolicy, BackDwellDelaysTheSwitchBack) {
  SidpModePolicyOptions o = opts();
  o.back_dwell_s = 2.0;
  SidpModePolicy p = make(o);
  // A tail (CaS at 3 s), a 1 s burst at 10 s (too short), a lasting one at 20 s.
  std::vector<Seen> s = run(p, 30000, 500, [](double t, int) { return (t >= 10 && t < 11) || t >= 20 ? 100LL : 1LL; });
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[0].t, 3.0);
  EXPECT_DOUBLE_EQ(s[1].t, 22.0);
  EXPECT_EQ(s[1].sw.to, SidpMode::was);
}

TEST(SidpModePolicy, OscillationInsideTheHysteresisBandSwitchesOnce) {
  // G alternates 90 (< b*) and 120 (in [b*, b*(1+h)] = [100, 125]) every 10 s.
  // The first low phase switches to CaS; 120 never exceeds 125, so it never
  // switches back. Without the hysteresis (back above b* = 100) it would
  // flap twice per 20 s period.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 200000, 500, [](double t, int) { return (long long)(t / 10) % 2 == 0 ? 45LL : 60LL; });
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].t, 3.0);
  EXPECT_EQ(p.mode(), SidpMode::cas);

  // Same trace with h = 0: back above 100, so every phase switches: CaS at
  // 20k + 3 s, WaS at 20k + 10 s, for k = 0..9 -> 20 switches.
  SidpModePolicyOptions o = opts();
  o.hysteresis = 0;
  SidpModePolicy q = make(o);
  s = run(q, 200000, 500, [](double t, int) { return (long long)(t / 10) % 2 == 0 ? 45LL : 60LL; });
  ASSERT_EQ(s.size(), 20u);
  for (size_t i = 0; i < s.size(); ++i) {
    const double period = 20.0 * static_cast<double>(i / 2);
    EXPECT_DOUBLE_EQ(s[i].t, period + (i % 2 == 0 ? 3.0 : 10.0)) << i;
    EXPECT_EQ(s[i].sw.to, i % 2 == 0 ? SidpMode::cas : SidpMode::was) << i;
  }
}

TEST(SidpModePolicy, FastOscillationAcrossTheBandNeverOutlastsTheDwell) {
  // G alternates 50 and 200 every second: below b* never for 3 s.
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 120000, 250, [](double t, int) { return (long long)t % 2 == 0 ? 25LL : 100LL; });
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(p.mode(), SidpMode::was);
  EXPECT_EQ(p.num_switches(), 0);
}

TEST(SidpModePolicy, SlowOscillationAcrossTheBandSwitchesTwicePerPeriod) {
  // G alternates 50 and 200 every 5 s for 40 s: CaS at 10k + 3 s; WaS as soon
  // as the spacing allows, at 10k + 6 s (the burst started at 10k + 5 s).
  SidpModePolicy p = make(opts());
  std::vector<Seen> s = run(p, 40000, 500, [](double t, int) { return (long long)(t / 5) % 2 == 0 ? 25LL : 100LL; });
  const std::vector<double> want = {3, 6, 13, 16, 23, 26, 33, 36};
  ASSERT_EQ(s.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_DOUBLE_EQ(s[i].t, want[i]) << i;
    EXPECT_EQ(s[i].sw.to, i % 2 == 0 ? SidpMode::cas : SidpMode::was) << i;
  }
}

TEST(SidpModePolicy, RandomTracesObeyTheRule) {
  // A random walk per rank around b* / 2 each: every switch must be justified
  // by the trace, and switches are at least min_dwell_s apart.
  for (unsigned seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> step(-6, 6);
    std::vector<long long> cur = {50, 50};
    SidpModePolicy p = make(opts());
    std::vector<Sample> samples;
    std::vector<Seen> s = run(
        p, 600000, 250,
        [&](double, int r) {
          cur[r] = std::clamp<long long>(cur[r] + step(rng), 0, 120);
          return cur[r];
        },
        &samples);
    ASSERT_GE(s.size(), 2u) << "seed " << seed << ": the walk should cross the band";
    SidpMode mode = SidpMode::was;
    for (size_t i = 0; i < s.size(); ++i) {
      const Seen& x = s[i];
      EXPECT_EQ(x.sw.from, mode);
      if (i > 0) {
        EXPECT_GE(x.t - s[i - 1].t, 3.0) << "seed " << seed;
      }
      // Every report after `since` up to the switch met the condition of
      // leaving `mode` (at `since` itself, the report that started the dwell
      // did; reports of other ranks at the same time may precede it).
      for (const Sample& sm : samples) {
        if (sm.t <= seconds(x.sw.since) || sm.t > x.t) continue;
        if (mode == SidpMode::was) {
          EXPECT_LT(sm.group_batch, 100) << "seed " << seed << " t " << sm.t;
          EXPECT_GT(sm.group_batch, 0) << "seed " << seed << " t " << sm.t << ": an idle group is not a tail";
        } else
          EXPECT_GT(sm.group_batch, 125) << "seed " << seed << " t " << sm.t;
      }
      EXPECT_GE(x.t - seconds(x.sw.since), mode == SidpMode::was ? 3.0 : 0.0);
      mode = x.sw.to;
    }
    EXPECT_EQ(p.mode(), mode);
    EXPECT_EQ(p.num_switches(), static_cast<long long>(s.size()));
  }
}

TEST(SidpModePolicy, FixedModesNeverSwitch) {
  // The tail-and-burst trace of BurstSwitchesBack.
  const auto trace = [](double t, int) {
    if (t < 200) return std::max(0LL, 200 - (long long)t);
    return t == 200 ? 100LL : 10LL;
  };
  for (SidpModeSetting setting : {SidpModeSetting::was, SidpModeSetting::cas}) {
    SidpModePolicyOptions o = opts(setting);
    o.min_dwell_s = 0;
    SidpModePolicy p = make(o);
    const SidpMode fixed = setting == SidpModeSetting::was ? SidpMode::was : SidpMode::cas;
    EXPECT_EQ(p.mode(), fixed);
    EXPECT_TRUE(run(p, 300000, 1000, trace).empty()) << to_string(setting);
    EXPECT_EQ(p.mode(), fixed);
    EXPECT_EQ(p.num_switches(), 0);
    EXPECT_FALSE(p.last_switch().has_value());
    EXPECT_EQ(p.group_batch(), 20);  // still tracked, for metrics
  }
}

TEST(SidpModePolicy, ZeroDwellSwitchesOnTheFirstReport) {
  SidpModePolicyOptions o = opts();
  o.min_dwell_s = 0;
  SidpModePolicy p = make(o);
  ASSERT_TRUE(p.observe(at_ms(0), 0, 10).ok());
  ASSERT_TRUE(p.observe(at_ms(0), 1, 10).ok());
  std::optional<SidpSwitch> s = p.decide(at_ms(0));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->to, SidpMode::cas);
  EXPECT_FALSE(p.decide(at_ms(0)).has_value());  // nothing more until a report changes G
}

// The tail (seed 002 §4.3): CaS only once no prompt waits to be prefilled.
// A group below b* with prompts still waiting is the bulk of a job (its
// batch is only small because the KV cache or max batch caps it); a prompt
// waiting again in CaS (new work) switches back to WaS.
TEST(SidpModePolicy, WaitingPromptsKeepWasUntilTheTailAndSendCasBack) {
  SidpModePolicy p = make(opts());
  // G = 60 < b* = 100, but rank 1 has 5 prompts waiting: no dwell starts.
  for (long long ms = 0; ms <= 10'000; ms += 500) {
    ASSERT_TRUE(p.observe(at_ms(ms), 0, 30, 0).ok());
    ASSERT_TRUE(p.observe(at_ms(ms), 1, 30, 5).ok());
    EXPECT_EQ(p.group_waiting(), 5);
    EXPECT_FALSE(p.decide(at_ms(ms)).has_value()) << "switched with prompts waiting at " << ms << " ms";
  }
  // The last prompts are admitted: the dwell starts, and after it, CaS.
  ASSERT_TRUE(p.observe(at_ms(10'500), 1, 30, 0).ok());
  EXPECT_EQ(p.group_waiting(), 0);
  EXPECT_FALSE(p.decide(at_ms(12'000)).has_value());
  ASSERT_TRUE(p.observe(at_ms(13'500), 0, 30, 0).ok());
  auto sw = p.decide(at_ms(13'500));
  ASSERT_TRUE(sw.has_value());
  EXPECT_EQ(sw->to, SidpMode::cas);
  EXPECT_EQ(sw->since, at_ms(10'500));
  // New work arrives (a prompt waits) while G is still small: back to WaS
  // once the minimum spacing since the last switch has passed.
  ASSERT_TRUE(p.observe(at_ms(14'000), 0, 20, 3).ok());
  EXPECT_FALSE(p.decide(at_ms(14'000)).has_value()) << "sooner than min_dwell_s after the last switch";
  sw = p.decide(at_ms(16'500));
  ASSERT_TRUE(sw.has_value());
  EXPECT_EQ(sw->to, SidpMode::was);
  // A negative waiting count is refused like a negative batch.
  const Status bad = p.observe(at_ms(17'000), 0, 1, -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("negative"), std::string::npos);
  EXPECT_EQ(p.group_waiting(), 3) << "a refused report changes nothing";
}

}  // namespace
}  // namespace shardline::engine
