#include "engine/group/parallel_config.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace shardline::engine {
namespace engine_parallel_config_test {

ParallelConfig parse_ok(const std::string& text) {
  Result<ParallelConfig> r = parse_parallel_config(text);
  EXPECT_TRUE(r.ok()) << "'" << text << "': " << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? r.value() : ParallelConfig{};
}

void expect_bad(const std::string& text, const std::string& names) {
  Result<ParallelConfig> r = parse_parallel_config(text);
  ASSERT_FALSE(r.ok()) << "'" << text << "' parsed";
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << text;
  EXPECT_NE(r.error().message.find(names), std::string::npos)
      << "'" << text << "': message '" << r.error().message << "' does not name '" << names << "'";
}

TEST(ParallelConfig, DefaultIsSingle) {
  const ParallelConfig pc;
  EXPECT_EQ(pc.group_size(), 1);
  EXPECT_EQ(pc.world_size(), 1);
  EXPECT_TRUE(pc.is_single());
}

TEST(ParallelConfig, ParsesSubsetsInAnyOrder) {
  const ParallelConfig a = parse_ok("tp=2,pp=2");
  EXPECT_EQ(a, (ParallelConfig{.tp = 2, .pp = 2, .sp = 1, .dp = 1}));
  EXPECT_EQ(a.group_size(), 4);
  EXPECT_EQ(a.world_size(), 4);
  EXPECT_FALSE(a.is_single());

  EXPECT_EQ(parse_ok("pp=2,tp=2"), a);
  EXPECT_EQ(parse_ok("dp=3,sp=2,pp=4,tp=8"), (ParallelConfig{.tp = 8, .pp = 4, .sp = 2, .dp = 3}));
  EXPECT_EQ(parse_ok("sp=4"), (ParallelConfig{.tp = 1, .pp = 1, .sp = 4, .dp = 1}));
  EXPECT_EQ(parse_ok("dp=2"), (ParallelConfig{.tp = 1, .pp = 1, .sp = 1, .dp = 2}));
  EXPECT_EQ(parse_ok("tp=64"), (ParallelConfig{.tp = 64}));
  EXPECT_EQ(parse_ok("tp=1,pp=1,sp=1,dp=1"), ParallelConfig{});

  const ParallelConfig b = parse_ok("tp=2,sp=2,pp=2,dp=2");
  EXPECT_EQ(b.group_size(), 8);
  EXPECT_EQ(b.world_size(), 16);
}

TEST(ParallelConfig, EmptyAndSingleMeanAllOnes) {
  EXPECT_EQ(parse_ok(""), ParallelConfig{});
  EXPECT_EQ(parse_ok("single"), ParallelConfig{});
  EXPECT_TRUE(parse_ok("single").is_single());
}

TEST(ParallelConfig, Errors) {
  expect_bad("xp=2", "xp");                // unknown key
  expect_bad("tp=2,foo=1", "foo");         // unknown key after a good one
  expect_bad("TP=2", "TP");                // keys are lower case
  expect_bad("tp=2,tp=4", "tp");           // repeated key
  expect_bad("tp=2,pp=2,tp=2", "twice");
  expect_bad("tp=0", "[1, 64]");           // below range
  expect_bad("pp=65", "65");               // above range
  expect_bad("sp=-1", "-1");
  expect_bad("tp=x", "x");                 // not an integer
  expect_bad("tp=2x", "2x");               // trailing junk
  expect_bad("tp=", "tp");                 // empty value
  expect_bad("tp=2,", "key=value");        // trailing comma: empty part
  expect_bad(",tp=2", "key=value");        // leading comma
  expect_bad("tp2", "tp2");                // missing '='
  expect_bad("tp=2;pp=2", "2;pp=2");       // wrong separator
  expect_bad("tp = 2", "tp ");             // no spaces
  expect_bad("Single", "Single");
  // Every message names the flag and echoes the input.
  Result<ParallelConfig> r = parse_parallel_config("tp=0");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("--parallel 'tp=0'"), std::string::npos) << r.error().message;
}

TEST(ParallelConfig, ToStringRoundTrips) {
  EXPECT_EQ(ParallelConfig{}.to_string(), "tp=1,pp=1,sp=1,dp=1");
  const ParallelConfig pc{.tp = 2, .pp = 4, .sp = 8, .dp = 3};
  EXPECT_EQ(pc.to_string(), "tp=2,pp=4,sp=8,dp=3");
  for (int tp : {1, 2, 64})
    for (int pp : {1, 3})
      for (int sp : {1, 2})
        for (int dp : {1, 5}) {
          const ParallelConfig c{.tp = tp, .pp = pp, .sp = sp, .dp = dp};
          EXPECT_EQ(parse_ok(c.to_string()), c) << c.to_string();
        }
}

TEST(ParallelConfig, RankNumberingTp2Sp2Pp2) {
  const ParallelConfig pc{.tp = 2, .pp = 2, .sp = 2, .dp = 1};
  ASSERT_EQ(pc.group_size(), 8);
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < pc.group_size(); ++r) {
    const RankCoord c = rank_coord(pc, r);
    EXPECT_GE(c.stage, 0);
    EXPECT_LT(c.stage, pc.pp);
    EXPECT_GE(c.sp_rank, 0);
    EXPECT_LT(c.sp_rank, pc.sp);
    EXPECT_GE(c.tp_rank, 0);
    EXPECT_LT(c.tp_rank, pc.tp);
    // rank = stage * (sp * tp) + sp_rank * tp + tp_rank
    EXPECT_EQ(r, c.stage * 4 + c.sp_rank * 2 + c.tp_rank) << r;
    EXPECT_EQ(group_rank_of(pc, c), r) << r;
    seen.insert({c.stage, c.sp_rank, c.tp_rank});
  }
  EXPECT_EQ(seen.size(), 8u);  // a bijection
  // Spot checks: TP innermost, a stage's ranks contiguous.
  const RankCoord r5 = rank_coord(pc, 5);
  EXPECT_EQ(r5.stage, 1);
  EXPECT_EQ(r5.sp_rank, 0);
  EXPECT_EQ(r5.tp_rank, 1);
  const RankCoord r2 = rank_coord(pc, 2);
  EXPECT_EQ(r2.stage, 0);
  EXPECT_EQ(r2.sp_rank, 1);
  EXPECT_EQ(r2.tp_rank, 0);
  EXPECT_EQ(group_rank_of(pc, RankCoord{.stage = 1, .sp_rank = 1, .tp_rank = 1}), 7);
}

TEST(ParallelConfig, RankNumberingRoundTripsForOtherShapes) {
  for (const ParallelConfig pc : {ParallelConfig{}, ParallelConfig{.tp = 4}, ParallelConfig{.pp = 3},
                                  ParallelConfig{.sp = 3, .dp = 2}, ParallelConfig{.tp = 3, .pp = 2, .sp = 5}}) {
    for (int r = 0; r < pc.group_size(); ++r)
      EXPECT_EQ(group_rank_of(pc, rank_coord(pc, r)), r) << pc.to_string() << " rank " << r;
  }
}

}  // namespace
}  // namespace shardline::engine
