// sim/simulated_executor: a step costs the per-micro-batch overhead plus the
// cost model's estimate of exactly that step; PP micro-batches flow through
// the stages by the pipeline recurrence (checked against hand-computed
// times); every logits row gets a token and its time; Shift prices small
// steps in the shift config.
#include "sim/simulated_executor.hpp"

#include <gtest/gtest.h>

namespace shardline::sim {
namespace sim_simulated_executor_test {

sim::CostModel test_model() {
  sim::ModelShape shape{8, 1024, 16, 4, 64, 4096, 32000};
  sim::HardwareSpec hw{1e12, 100e12, 100e9, 10e-6};
  return *sim::CostModel::create(shape, sim::ElementSizes{2, 2, 2}, hw);
}

/// A step of `n` decoding sequences with `ctx` cached tokens each.
model::StepInput decode_step(int n, int ctx, std::uint64_t first_id = 0) {
  model::StepInput in;
  in.block_size = 16;
  for (int i = 0; i < n; ++i) {
    model::StepSeq s;
    s.seq_id = first_id + static_cast<std::uint64_t>(i);
    s.num_computed_tokens = ctx;
    s.num_new_tokens = 1;
    s.needs_logits = true;
    in.seqs.push_back(s);
    in.token_ids.push_back(3);
    in.positions.push_back(ctx);
    in.slot_mapping.push_back(0);
    in.logits_rows.push_back(i);
  }
  return in;
}

sim::StepShape shape_of(int n, int ctx) {
  sim::StepShape s;
  for (int i = 0; i < n; ++i) s.add_sequence(ctx, 1);
  return s;
}

TEST(SimulatedExecutor, AStepCostsItsOverheadPlusTheCostModelsEstimate) {
  const auto model = test_model();
  SimulatedExecutorOptions o;
  o.num_kv_blocks = 100;
  o.step_overhead_ms = 0.25;
  auto ex = SimulatedExecutor::create(model, o);
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  auto out = (*ex)->execute(decode_step(4, 100));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->sampled_token_ids, (std::vector<std::int32_t>{3, 3, 3, 3}));
  const double want = 0.25 + model.estimate({}, shape_of(4, 100))->total_ms;
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), want);
  ASSERT_EQ((*ex)->records().size(), 1u);
  EXPECT_EQ((*ex)->records()[0].num_decode_tokens, 4);
  EXPECT_EQ((*ex)->token_times().at(2).first_ms, want);
  // The next step starts where this one ended.
  ASSERT_TRUE((*ex)->execute(decode_step(4, 101)).ok());
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), want + 0.25 + model.estimate({}, shape_of(4, 101))->total_ms);
  EXPECT_EQ((*ex)->token_times().at(2).num_tokens, 2);
  // A prefill chunk: only its last row gets logits.
  model::StepInput chunk;
  chunk.block_size = 16;
  model::StepSeq s;
  s.seq_id = 9;
  s.num_new_tokens = 5;
  s.needs_logits = true;
  chunk.seqs.push_back(s);
  chunk.token_ids.assign(5, 3);
  chunk.positions = {0, 1, 2, 3, 4};
  chunk.slot_mapping.assign(5, 0);
  chunk.logits_rows = {4};
  auto c = (*ex)->execute(chunk);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sampled_token_ids.size(), 1u);
  EXPECT_EQ((*ex)->records().back().num_prefill_tokens, 5);
  EXPECT_EQ((*ex)->token_times().at(9).num_tokens, 1);
}

TEST(SimulatedExecutor, PipelineStagesFollowTheRecurrence) {
  const auto model = test_model();
  SimulatedExecutorOptions o;
  o.config.pp = 2;
  o.num_kv_blocks = 100;
  o.step_overhead_ms = 0.1;
  auto ex = SimulatedExecutor::create(model, o);
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ((*ex)->max_in_flight(), 2);
  engine::ParallelConfig pp2;
  pp2.pp = 2;
  const auto a = *model.estimate(pp2, shape_of(8, 50));
  const auto b = *model.estimate(pp2, shape_of(2, 50));
  ASSERT_TRUE((*ex)->submit(decode_step(8, 50, 0)).ok());
  ASSERT_TRUE((*ex)->submit(decode_step(2, 50, 100)).ok());
  EXPECT_FALSE((*ex)->submit(decode_step(1, 50, 200)).ok()) << "two in flight at most";
  // a: enters stage 0 at 0.1; b: submitted at 0.2, enters stage 0 when a leaves it.
  const double a0 = 0.1 + a.stages[0].micro_batch_ms, a1 = a0 + a.stages[1].micro_batch_ms;
  const double b0 = std::max(0.2, a0) + b.stages[0].micro_batch_ms;
  const double b1 = std::max(b0, a1) + b.stages[1].micro_batch_ms;
  ASSERT_TRUE((*ex)->collect().ok());
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), a1);
  ASSERT_TRUE((*ex)->collect().ok());
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), b1);
  EXPECT_DOUBLE_EQ((*ex)->stage_busy_ms()[0], a.stages[0].micro_batch_ms + b.stages[0].micro_batch_ms);
  EXPECT_FALSE((*ex)->collect().ok()) << "nothing in flight";
}

TEST(SimulatedExecutor, ShiftPricesSmallStepsInTheShiftConfig) {
  const auto model = test_model();
  SimulatedExecutorOptions o;
  o.config.sp = 2;
  engine::ParallelConfig tp2;
  tp2.tp = 2;
  o.shift_config = tp2;
  o.shift = engine::ShiftPolicyOptions{16, 0.0};
  o.num_kv_blocks = 100;
  auto ex = SimulatedExecutor::create(model, o);
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  ASSERT_TRUE((*ex)->execute(decode_step(8, 50)).ok());
  EXPECT_TRUE((*ex)->records().back().shifted);
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), model.estimate(tp2, shape_of(8, 50))->total_ms);
  const double before = (*ex)->now_ms();
  engine::ParallelConfig sp2;
  sp2.sp = 2;
  ASSERT_TRUE((*ex)->execute(decode_step(32, 50)).ok());
  EXPECT_FALSE((*ex)->records().back().shifted);
  EXPECT_DOUBLE_EQ((*ex)->now_ms(), before + model.estimate(sp2, shape_of(32, 50))->total_ms);
  EXPECT_EQ((*ex)->shift_switches(), 2u);  // base -> shift -> base

  o.config = engine::ParallelConfig{};  // sp*tp = 1: nothing to shift to
  EXPECT_FALSE(SimulatedExecutor::create(model, o).ok());
  o.shift_config.reset();
  o.num_kv_blocks = 0;
  EXPECT_FALSE(SimulatedExecutor::create(model, o).ok());
}

}  // namespace
}  // namespace shardline::sim
