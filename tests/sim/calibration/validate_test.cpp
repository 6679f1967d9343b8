// The validation's cases (sim/calibration/validate.hpp): each name is the strategy it
// says, and bad requests are refused before anything is measured.
#include "sim/calibration/validate.hpp"

#include <gtest/gtest.h>

#include <set>

namespace shardline::sim::calibration {
namespace sim_calibration_validate_test {

TEST(ValidationCases, EachNameIsTheStrategyItSays) {
  ValidateOptions o;
  o.shift_threshold = 300;
  std::set<std::string> labels;
  for (const std::string& name : validation_case_names()) {
    auto c = validation_case(name, o);
    ASSERT_TRUE(c.ok()) << name << ": " << c.error().to_string();
    EXPECT_EQ(c->name, name);
    labels.insert(c->strategy.label());
  }
  EXPECT_EQ(validation_case_names().size(), 10u);
  EXPECT_EQ(labels.size(), 10u) << "two cases simulate the same strategy";

  auto pp = validation_case("pp=2-throttle", o);
  ASSERT_TRUE(pp.ok());
  EXPECT_EQ(pp->strategy.parallel.pp, 2);
  EXPECT_EQ(pp->strategy.token_budget, "throttle");
  EXPECT_EQ(validation_case("pp=2-fixed", o)->strategy.token_budget, "fixed");

  auto shift = validation_case("shift", o);
  ASSERT_TRUE(shift.ok());
  ASSERT_TRUE(shift->strategy.shift.has_value());
  EXPECT_EQ(shift->strategy.shift->threshold, 300);
  EXPECT_EQ(shift->strategy.parallel.sp, 2);

  auto seesaw = validation_case("seesaw", o);
  ASSERT_TRUE(seesaw.ok());
  ASSERT_TRUE(seesaw->strategy.seesaw.has_value());
  EXPECT_EQ(seesaw->strategy.parallel.pp, 2);
  EXPECT_EQ(seesaw->strategy.seesaw->decode.tp, 2);
  EXPECT_EQ(seesaw->strategy.seesaw->decode.pp, 1);

  for (const char* name : {"sidp-was", "sidp-cas"}) {
    auto s = validation_case(name, o);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(s->strategy.sidp.has_value());
    EXPECT_EQ(s->strategy.parallel.dp, 2);
    EXPECT_EQ(s->strategy.sidp->mode, std::string(name) == "sidp-was" ? engine::SidpModeSetting::was
                                                                        : engine::SidpModeSetting::cas);
  }
}

TEST(ValidationCases, AnUnknownCaseIsNamedWithTheValidOnes) {
  auto c = validation_case("tp=3", ValidateOptions{});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(c.error().message.find("'tp=3'"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("single"), std::string::npos) << c.error().message;

  // run_validation refuses it (and bad sizes) before calibrating anything.
  ValidateOptions o;
  o.shape_dir = "/nonexistent";
  o.cases = {"single", "tp=3"};
  auto r = run_validation(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'tp=3'"), std::string::npos) << r.error().message;
  o.cases = {"single"};
  o.agreement = 0;
  r = run_validation(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  o.agreement = 0.1;
  o.min_rounds = 3;
  o.max_rounds = 2;
  r = run_validation(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
}

// A case is steady when its two fastest rounds agree on both measurements:
// the fastest total tok/s (highest) and the fastest decode step (lowest).
// A slow round (an episode) does not matter; a lone fast one does.
TEST(ValidationRounds, TheTwoFastestRoundsMustAgreeOnBoth) {
  ValidationRow row;
  row.round_total_tok_s = {700};
  row.round_decode_step_ms = {60};
  EXPECT_FALSE(rounds_agree(row, 0.1)) << "one round cannot agree with itself";
  row.round_total_tok_s = {700, 500, 660};  // an episode in round 2
  row.round_decode_step_ms = {60, 85, 64};
  EXPECT_TRUE(rounds_agree(row, 0.1));
  row.round_total_tok_s = {700, 500, 600};  // the fastest seen once: 700 vs 600 is 14%
  EXPECT_FALSE(rounds_agree(row, 0.1));
  EXPECT_TRUE(rounds_agree(row, 0.2));
  row.round_total_tok_s = {700, 690, 500};
  row.round_decode_step_ms = {85, 60, 70};  // 60 vs 70: the step's two fastest differ by 17%
  EXPECT_FALSE(rounds_agree(row, 0.1));
  row.round_decode_step_ms = {85, 60, 65};
  EXPECT_TRUE(rounds_agree(row, 0.1));
  row.round_decode_step_ms = {85, 0, 65};  // a round without a decode step measured
  EXPECT_FALSE(rounds_agree(row, 0.1));
}

}  // namespace
}  // namespace shardline::sim::calibration
