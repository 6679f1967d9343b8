// sim/planner: the candidates are every shardable (tp, pp, sp, dp) of the
// device count, with both budgets for pp > 1 and Shift for sp > 1; the plan
// ranks the feasible ones by simulated throughput, sets aside what does not
// fit with its reason, and says why the best won.
#include "sim/planner.hpp"

#include <gtest/gtest.h>

#include <set>

#include "model/shard_runner.hpp"

namespace shardline::sim {
namespace sim_planner_test {

const std::string kShapes = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/";

model::ModelConfig shape(const std::string& name) { return *model::load_model_config(kShapes + name); }

TEST(Planner, CandidatesAreEveryShardableConfigOfTheDeviceCount) {
  const auto config = shape("llama-3.1-8b");
  PlanOptions o;
  const auto c = candidate_strategies(config, 8, o);
  std::set<std::string> labels;
  for (const Strategy& s : c) {
    EXPECT_EQ(s.parallel.world_size(), 8) << s.label();
    EXPECT_TRUE(model::check_shardable(config, s.parallel.tp, s.parallel.sp, s.parallel.pp).ok()) << s.label();
    EXPECT_TRUE(labels.insert(s.label()).second) << "twice: " << s.label();
    if (s.shift) EXPECT_TRUE(s.parallel.sp > 1 && s.parallel.pp == 1) << s.label();
    if (s.parallel.pp == 1) EXPECT_EQ(s.token_budget, "fixed") << s.label();
  }
  for (const char* want : {"tp=8,pp=1,sp=1,dp=1 fixed", "tp=1,pp=1,sp=1,dp=8 fixed", "tp=1,pp=8,sp=1,dp=1 throttle",
                           "tp=2,pp=2,sp=1,dp=2 fixed", "tp=1,pp=1,sp=8,dp=1 fixed shift(T=256)"})
    EXPECT_EQ(labels.count(want), 1u) << want;
  // Seesaw (prefill in pp=g, decode in tp=g) for g = 2, 4, 8, and SiDP over
  // 8 single-device ranks.
  for (const char* want : {"seesaw pp=2:tp=2,dp=4 fixed", "seesaw pp=4:tp=4,dp=2 fixed", "seesaw pp=8:tp=8 fixed",
                           "tp=1,pp=1,sp=1,dp=8 fixed sidp(auto)"})
    EXPECT_EQ(labels.count(want), 1u) << want;
  o.shift_threshold = 0;
  o.token_budgets = {"fixed"};
  o.seesaw = false;
  o.sidp = false;
  for (const Strategy& s : candidate_strategies(config, 8, o)) {
    EXPECT_FALSE(s.shift.has_value());
    EXPECT_FALSE(s.seesaw.has_value());
    EXPECT_FALSE(s.sidp.has_value());
    EXPECT_EQ(s.token_budget, "fixed");
  }
  EXPECT_EQ(candidate_strategies(config, 1, o).size(), 1u);
  EXPECT_EQ(candidate_strategies(config, 1, PlanOptions{}).size(), 1u) << "one device: no Seesaw or SiDP";
}

TEST(Planner, RanksByThroughputAndSetsAsideWhatDoesNotFit) {
  // A prefill-heavy batch job of an 8B model on 8 H200: replicas without
  // collectives win.
  auto c = load_cluster("h200x8");
  ASSERT_TRUE(c.ok());
  PlanOptions o;
  o.sim.max_batch = 64;
  o.sim.prefill_run = false;
  auto p = plan(shape("llama-3.1-8b"), *c, fixed_workload(256, 1024, 16), o);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->ranked.front().strategy.parallel.dp, 8) << p->why;
  for (std::size_t i = 1; i < p->ranked.size(); ++i)
    EXPECT_GE(p->ranked[i - 1].result.total_tok_s, p->ranked[i].result.total_tok_s);
  EXPECT_NE(p->why.find("the runner-up"), std::string::npos) << p->why;

  // 70B in BF16 on 8 A10 (24 GB each): only configs that shard it 8 ways fit.
  auto a10 = load_cluster("a10x8");
  ASSERT_TRUE(a10.ok());
  auto big = plan(shape("llama-3.1-70b"), *a10, fixed_workload(16, 128, 16), o);
  ASSERT_TRUE(big.ok()) << big.error().to_string();
  EXPECT_FALSE(big->infeasible.empty());
  for (const PlanEntry& e : big->ranked) EXPECT_EQ(e.strategy.parallel.dp, 1) << e.strategy.label();
  for (const PlanEntry& e : big->infeasible) EXPECT_NE(e.error.find("do not fit"), std::string::npos) << e.error;
  EXPECT_NE(big->why.find("do not fit"), std::string::npos) << big->why;

  // On two of them nothing fits: an error naming a reason.
  auto none = plan(shape("llama-3.1-70b"), *a10, fixed_workload(16, 128, 16), PlanOptions{2});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::out_of_memory);
  EXPECT_FALSE(plan(shape("llama-3.1-8b"), *c, {}, o).ok());
  EXPECT_FALSE(plan(shape("llama-3.1-8b"), *c, fixed_workload(1, 8, 2), PlanOptions{16}).ok());
}

}  // namespace
}  // namespace shardline::sim
