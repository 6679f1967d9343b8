// The scheduler with micro-batches in flight (pipeline parallelism) and with
// per-micro-batch token budgets (a TokenBudgetPolicy's answer).
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "engine/scheduler.hpp"
#include "tests/support/sequences.hpp"

namespace shardline::engine {
namespace engine_scheduler_pipeline_test {

std::unique_ptr<Sequence> make_seq(std::uint64_t id, int prompt_len, int max_tokens) {
  return testing_support::make_seq(id, prompt_len, max_tokens, 1);
}

/// Applies a micro-batch: one sampled token per sequence that needs logits.
void land(Scheduler& s, const SchedulerOutput& out) {
  std::vector<std::int32_t> sampled(static_cast<std::size_t>(out.input.num_logits()), 9);
  s.update(out, sampled);
}

TEST(SchedulerPipeline, InFlightSequencesAreNotScheduledAgain) {
  Scheduler s({8, 64, 256}, 64, 16);
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(s.add(make_seq(i, 10, 5)).ok());
  SchedulerOutput a = s.schedule();
  ASSERT_EQ(a.scheduled.size(), 4u);  // all four prompts fit
  for (const auto& x : a.scheduled) EXPECT_TRUE(x.seq->in_flight);
  SchedulerOutput b = s.schedule();  // everything is in flight
  EXPECT_TRUE(b.empty());
  land(s, a);
  for (const auto& x : a.scheduled) EXPECT_FALSE(x.seq->in_flight);
  SchedulerOutput c = s.schedule();
  EXPECT_EQ(c.num_decode_tokens, 4);
  EXPECT_TRUE(s.check_integrity().ok());
}

TEST(SchedulerPipeline, DecodeBudgetSplitsDecodesOverMicroBatches) {
  Scheduler s({8, 64, 256}, 64, 16);
  for (std::uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(s.add(make_seq(i, 4, 5)).ok());
  land(s, s.schedule());  // prefill all six
  const MicroBatchBudget half{0, 3};  // #D = 6 / 2
  SchedulerOutput mb0 = s.schedule(&half);
  SchedulerOutput mb1 = s.schedule(&half);
  SchedulerOutput mb2 = s.schedule(&half);
  EXPECT_EQ(mb0.num_decode_tokens, 3);
  EXPECT_EQ(mb1.num_decode_tokens, 3);
  EXPECT_TRUE(mb2.empty());
  // Disjoint: the second micro-batch takes the three the first left.
  for (const auto& x : mb0.scheduled)
    for (const auto& y : mb1.scheduled) EXPECT_NE(x.seq->id, y.seq->id);
  EXPECT_EQ(mb0.scheduled.front().seq->id, 0u);
  EXPECT_EQ(mb1.scheduled.front().seq->id, 3u);
}

TEST(SchedulerPipeline, PrefillBudgetChunksPromptsAndZeroAdmitsNothing) {
  Scheduler s({8, 64, 256}, 64, 16);
  ASSERT_TRUE(s.add(make_seq(0, 40, 5)).ok());
  const MicroBatchBudget none{0, 8};
  EXPECT_TRUE(s.schedule(&none).empty());
  const MicroBatchBudget some{12, 8};
  SchedulerOutput a = s.schedule(&some);
  EXPECT_EQ(a.num_prefill_tokens, 12);
  land(s, a);
  SchedulerOutput b = s.schedule(&some);
  EXPECT_EQ(b.num_prefill_tokens, 12);
  EXPECT_EQ(b.input.positions.front(), 12);
}

TEST(SchedulerPipeline, NeverPreemptsASequenceInFlight) {
  // 4 blocks of 4 tokens: two sequences of 6 prompt tokens hold 2 blocks each.
  Scheduler s({4, 64, 16}, 4, 4);
  ASSERT_TRUE(s.add(make_seq(0, 7, 8)).ok());
  ASSERT_TRUE(s.add(make_seq(1, 7, 8)).ok());
  land(s, s.schedule());  // both prefilled: 8 tokens each after one decode...
  SchedulerOutput d0 = s.schedule(nullptr);  // both decode at position 7: still in 2 blocks
  ASSERT_EQ(d0.num_decode_tokens, 2);
  land(s, d0);
  // Next decode needs a third block for each; the cache has none free.
  const MicroBatchBudget one{0, 1};
  SchedulerOutput a = s.schedule(&one);  // seq 0 grows by preempting seq 1 (not in flight)
  ASSERT_EQ(a.scheduled.size(), 1u);
  EXPECT_EQ(a.scheduled[0].seq->id, 0u);
  EXPECT_EQ(a.num_preemptions, 1);
  EXPECT_TRUE(s.check_integrity().ok());
  // Seq 1 (waiting now) cannot come back while seq 0 is in flight holding the blocks,
  // and seq 0 is never its victim.
  SchedulerOutput b = s.schedule(&one);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(s.get(0)->status, SeqStatus::running);
  land(s, a);
  EXPECT_TRUE(s.check_integrity().ok());
}

TEST(SchedulerPipeline, StateCountsWaitingPrefillAndRunningDecodes) {
  Scheduler s({8, 64, 256}, 64, 16);
  ASSERT_TRUE(s.add(make_seq(0, 5, 5)).ok());
  ASSERT_TRUE(s.add(make_seq(1, 30, 5)).ok());
  const MicroBatchBudget b{10, 8};
  land(s, s.schedule(&b));  // seq 0 prefilled (5), seq 1 got 5 of 30
  const SchedulerState st = s.state(2);
  EXPECT_EQ(st.num_running_decode_seqs, 1);
  EXPECT_EQ(st.num_waiting_prefill_tokens, 25);
  EXPECT_EQ(st.pipeline_depth, 2);
  EXPECT_EQ(st.num_total_kv_blocks, 64);
  EXPECT_EQ(st.num_free_kv_blocks, 62);
  EXPECT_EQ(st.max_num_batched_tokens, 64);
}

}  // namespace
}  // namespace shardline::engine
