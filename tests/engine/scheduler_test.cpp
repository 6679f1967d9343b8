#include "engine/scheduler.hpp"
#include "tests/support/sequences.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <vector>

namespace shardline::engine {
namespace engine_scheduler_test {

using testing_support::make_seq;

struct RunResult {
  std::map<std::uint64_t, std::vector<std::int32_t>> outputs;
  int steps = 0;
  int max_step_tokens = 0;
  int max_step_seqs = 0;
};

// Drives the scheduler to completion with a fake "model": the sampled token
// is a function of (sequence id, position), so outputs are checkable. Checks
// the step contract and integrity every step.
RunResult run_to_completion(Scheduler& sched) {
  RunResult r;
  const auto& cfg = sched.config();
  while (sched.has_unfinished()) {
    SchedulerOutput out = sched.schedule();
    EXPECT_TRUE(sched.check_integrity().ok()) << sched.check_integrity().error().message;
    EXPECT_FALSE(out.empty()) << "livelock at step " << r.steps;
    if (out.empty()) break;
    const model::StepInput& in = out.input;
    EXPECT_LE(in.num_tokens(), cfg.max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(in.seqs.size()), cfg.max_num_seqs);
    EXPECT_EQ(in.num_tokens(), out.num_prefill_tokens + out.num_decode_tokens);
    r.max_step_tokens = std::max(r.max_step_tokens, in.num_tokens());
    r.max_step_seqs = std::max(r.max_step_seqs, static_cast<int>(in.seqs.size()));
    // Slots must be distinct within the step and consistent with the tables.
    std::vector<int> seen(static_cast<std::size_t>(sched.block_manager().num_blocks() * in.block_size), 0);
    int row = 0;
    std::vector<std::int32_t> sampled;
    for (std::size_t i = 0; i < in.seqs.size(); ++i) {
      const model::StepSeq& ss = in.seqs[i];
      const Sequence& seq = *out.scheduled[i].seq;
      for (int k = 0; k < ss.num_new_tokens; ++k, ++row) {
        const int pos = ss.num_computed_tokens + k;
        EXPECT_EQ(in.positions[row], pos);
        EXPECT_EQ(in.token_ids[row], seq.token_at(pos));
        EXPECT_EQ(in.slot_mapping[row], ss.block_table[pos / in.block_size] * in.block_size + pos % in.block_size);
        EXPECT_EQ(seen[in.slot_mapping[row]]++, 0);
      }
      if (ss.needs_logits) sampled.push_back(static_cast<std::int32_t>(seq.id * 1000 + seq.num_tokens()));
    }
    EXPECT_EQ(in.num_logits(), static_cast<int>(sampled.size()));
    std::vector<std::uint64_t> ids;
    for (const auto& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sampled);
    for (std::uint64_t id : ids) {
      Sequence* seq = sched.get(id);
      if (seq->num_output_tokens() >= seq->params.max_tokens) {
        auto done = sched.finish(id, FinishReason::length);
        r.outputs[id] = done->output_ids;
      }
    }
    EXPECT_TRUE(sched.check_integrity().ok());
    ++r.steps;
    if (r.steps > 100000) break;
  }
  EXPECT_EQ(sched.block_manager().num_free_blocks(), sched.block_manager().num_blocks());
  return r;
}

void expect_exact_outputs(const RunResult& r, std::uint64_t num_seqs, int prompt_len, int max_tokens) {
  ASSERT_EQ(r.outputs.size(), num_seqs);
  for (const auto& [id, out] : r.outputs) {
    ASSERT_EQ(static_cast<int>(out.size()), max_tokens) << "seq " << id;
    for (int k = 0; k < max_tokens; ++k)
      EXPECT_EQ(out[k], static_cast<std::int32_t>(id * 1000 + prompt_len + k)) << "seq " << id;
  }
}

TEST(Scheduler, ChunkedPrefillSplitsLongPrompt) {
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_model_len = 512}, 64, 16);
  ASSERT_TRUE(sched.add(make_seq(1, 100, 2)).ok());
  std::vector<int> chunk_tokens;
  std::vector<bool> logits;
  while (sched.has_unfinished()) {
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.input.seqs.size(), 1u);
    chunk_tokens.push_back(out.input.num_tokens());
    logits.push_back(out.input.seqs[0].needs_logits);
    if (out.input.seqs[0].needs_logits) {
      EXPECT_EQ(out.input.logits_rows, std::vector<std::int32_t>{out.input.num_tokens() - 1});
    } else {
      EXPECT_TRUE(out.input.logits_rows.empty());
    }
    const std::vector<std::int32_t> sampled(static_cast<std::size_t>(out.input.num_logits()), 7);
    sched.update(out, sampled);
    if (sched.get(1)->num_output_tokens() == 2) (void)sched.finish(1, FinishReason::length);
  }
  EXPECT_EQ(chunk_tokens, (std::vector<int>{32, 32, 32, 4, 1}));
  EXPECT_EQ(logits, (std::vector<bool>{false, false, false, true, true}));
}

TEST(Scheduler, TokenBudgetMixesDecodesAndPrefillChunks) {
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 20, .max_model_len = 512}, 256, 4);
  for (std::uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(sched.add(make_seq(i, 15 + static_cast<int>(i), 5)).ok());
  const RunResult r = run_to_completion(sched);
  EXPECT_EQ(r.max_step_tokens, 20);
  for (std::uint64_t i = 0; i < 6; ++i) {
    const auto& out = r.outputs.at(i);
    ASSERT_EQ(out.size(), 5u);
    EXPECT_EQ(out[0], static_cast<std::int32_t>(i * 1000 + 15 + i));
  }
}

TEST(Scheduler, MaxNumSeqsRespected) {
  Scheduler sched({.max_num_seqs = 3, .max_num_batched_tokens = 1000, .max_model_len = 512}, 256, 4);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 4)).ok());
  const RunResult r = run_to_completion(sched);
  EXPECT_EQ(r.max_step_seqs, 3);
  expect_exact_outputs(r, 10, 5, 4);
}

TEST(Scheduler, PreemptionUnderTinyCacheLosesNothing) {
  // 10 blocks of 4 tokens; each request needs up to 6 + 12 = 18 tokens (5 blocks).
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64}, 10, 4);
  for (std::uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(sched.add(make_seq(i, 6, 12)).ok());
  const RunResult r = run_to_completion(sched);
  EXPECT_GT(sched.total_preemptions(), 0);
  expect_exact_outputs(r, 12, 6, 12);
}

TEST(Scheduler, PreemptionWithChunkingAndSmallBudget) {
  Scheduler sched({.max_num_seqs = 5, .max_num_batched_tokens = 7, .max_model_len = 64}, 12, 2);
  for (std::uint64_t i = 0; i < 9; ++i) ASSERT_TRUE(sched.add(make_seq(i, 9, 14)).ok());
  const RunResult r = run_to_completion(sched);
  EXPECT_GT(sched.total_preemptions(), 0);
  expect_exact_outputs(r, 9, 9, 14);
}

TEST(Scheduler, PreemptedSequenceRecomputesPromptPlusOutput) {
  // Two sequences that cannot both grow: the later one is preempted and
  // re-prefills prompt + generated tokens in one chunk.
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, 4, 4);
  ASSERT_TRUE(sched.add(make_seq(0, 4, 8)).ok());
  ASSERT_TRUE(sched.add(make_seq(1, 4, 8)).ok());
  bool saw_recompute = false;
  while (sched.has_unfinished()) {
    SchedulerOutput out = sched.schedule();
    ASSERT_TRUE(sched.check_integrity().ok());
    std::vector<std::int32_t> sampled(static_cast<std::size_t>(out.input.num_logits()), 3);
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const Sequence& s = *out.scheduled[i].seq;
      if (s.num_preemptions > 0 && s.num_computed_tokens == 0 && s.num_output_tokens() > 0) {
        saw_recompute = true;
        EXPECT_EQ(out.scheduled[i].num_new_tokens, s.num_tokens());
        EXPECT_TRUE(out.input.seqs[i].needs_logits);
      }
    }
    std::vector<std::uint64_t> ids;
    for (const auto& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sampled);
    for (auto id : ids)
      if (sched.get(id)->num_output_tokens() == 8) (void)sched.finish(id, FinishReason::length);
  }
  EXPECT_TRUE(saw_recompute);
}

TEST(Scheduler, SwapPreemptionListsTheVictimsKvAndRestoresIt) {
  // The same squeeze as above with preemption by swap: the victim's computed
  // positions are listed for swap-out with its block table (before the
  // blocks are reused), and its readmission lists them for restore, so only
  // the tokens after them are scheduled.
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64,
                   .preemption_mode = PreemptionMode::swap},
                  4, 4);
  ASSERT_TRUE(sched.add(make_seq(0, 4, 8)).ok());
  ASSERT_TRUE(sched.add(make_seq(1, 4, 8)).ok());
  std::map<std::uint64_t, SwapOut> swapped;
  int num_restores = 0;
  while (sched.has_unfinished()) {
    SchedulerOutput out = sched.schedule();
    ASSERT_TRUE(sched.check_integrity().ok());
    for (const SwapOut& so : out.swap_outs) {
      const Sequence* victim = sched.get(so.seq_id);
      ASSERT_NE(victim, nullptr);
      EXPECT_EQ(victim->status, SeqStatus::waiting);
      EXPECT_EQ(victim->num_restore_tokens, so.num_tokens);
      EXPECT_EQ(so.num_tokens, victim->num_tokens() - 1);  // every known token but the last
      EXPECT_EQ(static_cast<int>(so.block_table.size()), (so.num_tokens + 3) / 4) << "its table covers its KV";
      swapped[so.seq_id] = so;
    }
    for (const KvRestore& r : out.restores) {
      ++num_restores;
      ASSERT_EQ(swapped.count(r.seq_id), 1u);
      EXPECT_EQ(r.num_tokens, swapped[r.seq_id].num_tokens);
      for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
        if (out.scheduled[i].seq->id != r.seq_id) continue;
        EXPECT_EQ(out.input.seqs[i].num_computed_tokens, r.num_tokens);
        EXPECT_EQ(out.scheduled[i].num_new_tokens, 1) << "only the last known token is computed";
      }
    }
    std::vector<std::int32_t> sampled(static_cast<std::size_t>(out.input.num_logits()), 3);
    std::vector<std::uint64_t> ids;
    for (const auto& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sampled);
    for (auto id : ids)
      if (sched.get(id)->num_output_tokens() == 8) (void)sched.finish(id, FinishReason::length);
  }
  EXPECT_FALSE(swapped.empty());
  EXPECT_EQ(num_restores, static_cast<int>(swapped.size()));
}

TEST(Scheduler, RecomputePreemptionListsNoSwaps) {
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, 4, 4);
  ASSERT_TRUE(sched.add(make_seq(0, 4, 8)).ok());
  ASSERT_TRUE(sched.add(make_seq(1, 4, 8)).ok());
  int preemptions = 0;
  while (sched.has_unfinished()) {
    SchedulerOutput out = sched.schedule();
    preemptions += out.num_preemptions;
    EXPECT_TRUE(out.swap_outs.empty());
    EXPECT_TRUE(out.restores.empty());
    std::vector<std::int32_t> sampled(static_cast<std::size_t>(out.input.num_logits()), 3);
    std::vector<std::uint64_t> ids;
    for (const auto& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sampled);
    for (auto id : ids)
      if (sched.get(id)->num_output_tokens() == 8) (void)sched.finish(id, FinishReason::length);
  }
  EXPECT_GT(preemptions, 0);
}

TEST(Scheduler, PreemptionModeNames) {
  EXPECT_EQ(parse_preemption_mode("swap").value(), PreemptionMode::swap);
  EXPECT_EQ(parse_preemption_mode("recompute").value(), PreemptionMode::recompute);
  auto bad = parse_preemption_mode("spill");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("recompute or swap"), std::string::npos);
  EXPECT_STREQ(preemption_mode_name(PreemptionMode::swap), "swap");
}

TEST(Scheduler, RejectsRequestsThatCanNeverFit) {
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 100}, 4, 4);
  Status s = sched.add(make_seq(1, 10, 7));  // 17 tokens > 16
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::out_of_memory);
  EXPECT_TRUE(sched.add(make_seq(2, 10, 6)).ok());
  s = sched.add(make_seq(2, 1, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);  // duplicate
  s = sched.add(make_seq(3, 0, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);  // empty
  s = sched.add(make_seq(4, 101, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);  // > max_model_len
  EXPECT_EQ(sched.num_waiting(), 1);
}

TEST(Scheduler, MakeStepInputUsesBlockTables) {
  BlockManager bm(8, 4);
  ASSERT_TRUE(bm.allocate_slots(99, 4).ok());  // occupy block 0 so tables are not identity
  auto seq = make_seq(5, 6, 4);
  seq->num_computed_tokens = 3;
  ASSERT_TRUE(bm.allocate_slots(5, 6).ok());
  const std::vector<ScheduledSeq> sched{{seq.get(), 3}};
  const model::StepInput in = make_step_input(sched, bm);
  const auto& table = bm.block_table(5);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(in.positions, (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(in.token_ids, (std::vector<std::int32_t>{503, 504, 505}));
  EXPECT_EQ(in.slot_mapping,
            (std::vector<std::int32_t>{table[0] * 4 + 3, table[1] * 4 + 0, table[1] * 4 + 1}));
  EXPECT_EQ(in.logits_rows, std::vector<std::int32_t>{2});
  EXPECT_EQ(in.seqs[0].block_table, table);
  EXPECT_EQ(in.block_size, 4);
}

}  // namespace
}  // namespace shardline::engine
