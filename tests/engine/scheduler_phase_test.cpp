// Seesaw's schedule phases (engine/scheduler.hpp SchedulePhase; seed 000
// §4.2): a prefill phase offloads each finished prefill to the host KV
// buffer and admits no decode-ready sequence, a decode phase onboards only
// those (a prefetch of their KV, §5.2) and runs decodes only, and a cluster
// that alternates phases finishes every request once with the same tokens,
// with its KV copies landing a schedule after they were asked for (as the
// prefetcher thread's do).
#include "engine/scheduler.hpp"
#include "tests/support/sequences.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <vector>

namespace shardline::engine {
namespace engine_scheduler_phase_test {

using testing_support::make_seq;

// The fake model: the token sampled at a sequence's n-th known token.
std::int32_t token_for(const Sequence& seq) { return static_cast<std::int32_t>(seq.id * 1000 + seq.num_tokens()); }

std::vector<std::int32_t> sample(const SchedulerOutput& out) {
  std::vector<std::int32_t> sampled;
  for (std::size_t i = 0; i < out.scheduled.size(); ++i)
    if (out.input.seqs[i].needs_logits) sampled.push_back(token_for(*out.scheduled[i].seq));
  return sampled;
}

SchedulerConfig config(PreemptionMode mode = PreemptionMode::swap) {
  return {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64, .preemption_mode = mode};
}

TEST(SchedulerPhase, PrefillOffloadsEachFinishedPrefillAndRunsNoDecode) {
  Scheduler sched(config(), 64, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 3)).ok());
  SchedulerOutput first = sched.schedule();
  EXPECT_EQ(first.num_prefill_tokens, 15);
  EXPECT_EQ(first.num_decode_tokens, 0);
  EXPECT_TRUE(first.offloads.empty());
  sched.update(first, sample(first));  // every prompt's first token sampled

  SchedulerOutput second = sched.schedule();
  EXPECT_TRUE(second.empty());  // nothing left to prefill, and no decode runs here
  ASSERT_EQ(second.offloads.size(), 3u);
  for (const SwapOut& o : second.offloads) {
    EXPECT_EQ(o.num_tokens, 5) << o.seq_id;  // the prompt's KV; the sampled token's comes in decode
    EXPECT_EQ(o.block_table.size(), 2u) << o.seq_id;
    const Sequence* s = sched.find(o.seq_id);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->kv_pending, KvPending::offloading);
    EXPECT_FALSE(Scheduler::is_decode_ready(*s));  // not before its copy is done
    EXPECT_EQ(s->num_preemptions, 0);
  }
  EXPECT_EQ(sched.total_preemptions(), 0);
  EXPECT_EQ(sched.total_offloads(), 3);
  EXPECT_EQ(sched.block_manager().num_free_blocks(), 64 - 6);  // read by the copies until they land
  EXPECT_TRUE(sched.check_integrity().ok());
  EXPECT_EQ(sched.seesaw_counts(0, 100).host_ready_seqs, 3);  // on their way to the host buffer
  EXPECT_EQ(sched.seesaw_counts(0, 100).waiting_prompts, 0);
  for (const SwapOut& o : second.offloads) {
    ASSERT_TRUE(sched.offload_done(o.seq_id, true).ok());
    EXPECT_TRUE(Scheduler::is_decode_ready(*sched.find(o.seq_id)));
  }
  EXPECT_EQ(sched.block_manager().num_free_blocks(), 64);
  EXPECT_TRUE(sched.check_integrity().ok());

  // Still prefill: the decode-ready sequences are not admitted, a new prompt is.
  ASSERT_TRUE(sched.add(make_seq(4, 6, 3)).ok());
  SchedulerOutput third = sched.schedule();
  ASSERT_EQ(third.scheduled.size(), 1u);
  EXPECT_EQ(third.scheduled[0].seq->id, 4u);
  EXPECT_TRUE(third.restores.empty());
  EXPECT_TRUE(third.onboards.empty());
}

TEST(SchedulerPhase, AnOffloadInProgressHoldsItsBlocksAndIsNoPrompt) {
  // 4 blocks of 4 tokens: two 5-token prompts fill them.
  Scheduler sched(config(), 4, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 3)).ok());
  SchedulerOutput first = sched.schedule();
  ASSERT_EQ(first.scheduled.size(), 2u);  // seq 3 does not fit
  sched.update(first, sample(first));
  SchedulerOutput second = sched.schedule();
  ASSERT_EQ(second.offloads.size(), 2u);
  EXPECT_TRUE(second.empty());  // seq 3 still does not fit: the copies hold the blocks
  EXPECT_TRUE(sched.schedule().empty());  // and an offloading sequence is not prefilled again
  EXPECT_TRUE(sched.check_integrity().ok());
  // No room in the host buffer for seq 2: it is prefilled again.
  ASSERT_TRUE(sched.offload_done(1, true).ok());
  ASSERT_TRUE(sched.offload_done(2, false).ok());
  EXPECT_TRUE(Scheduler::is_decode_ready(*sched.find(1)));
  EXPECT_EQ(sched.find(2)->num_restore_tokens, 0);
  SchedulerOutput third = sched.schedule();
  ASSERT_EQ(third.scheduled.size(), 2u);
  EXPECT_EQ(third.scheduled[0].seq->id, 2u);
  EXPECT_EQ(third.scheduled[0].num_new_tokens, 6);  // the prompt and its sampled token
  EXPECT_EQ(third.scheduled[1].seq->id, 3u);
  // Done twice, or for a sequence with no offload: refused.
  EXPECT_EQ(sched.offload_done(1, true).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(sched.offload_done(99, true).error().code, ErrorCode::not_found);
  EXPECT_EQ(sched.onboard_done(1).error().code, ErrorCode::invalid_argument);
  EXPECT_TRUE(sched.check_integrity().ok());
}

TEST(SchedulerPhase, DecodeOnboardsOnlyDecodeReadySequencesAndDecodesThemOnceTheirKvIsIn) {
  Scheduler sched(config(), 64, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 2; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 3)).ok());
  SchedulerOutput p = sched.schedule();
  sched.update(p, sample(p));
  for (const SwapOut& o : sched.schedule().offloads) ASSERT_TRUE(sched.offload_done(o.seq_id, true).ok());
  ASSERT_TRUE(sched.add(make_seq(3, 7, 3)).ok());  // needs prefill: waits for the next prefill phase

  sched.set_phase(SchedulePhase::decode);
  SchedulerOutput d = sched.schedule();
  EXPECT_TRUE(d.empty());  // nothing decodes before its KV is in
  ASSERT_EQ(d.onboards.size(), 2u);
  EXPECT_TRUE(d.restores.empty());
  for (const KvRestore& r : d.onboards) {
    EXPECT_EQ(r.num_tokens, 5);
    const Sequence* s = sched.find(r.seq_id);
    EXPECT_EQ(s->status, SeqStatus::running);
    EXPECT_EQ(s->kv_pending, KvPending::onboarding);
    EXPECT_EQ(sched.block_manager().num_tokens_covered(r.seq_id), 6);  // its 5 positions and its last token
  }
  EXPECT_TRUE(sched.schedule().empty());  // still copying in
  EXPECT_EQ(sched.seesaw_counts(0, 100).running_decode_seqs, 2);
  std::vector<SwapOut> none;
  EXPECT_EQ(sched.offload_resident(none).error().code, ErrorCode::invalid_argument);  // drain the mover first
  EXPECT_TRUE(sched.check_integrity().ok());

  ASSERT_TRUE(sched.onboard_done(1).ok());
  SchedulerOutput one = sched.schedule();
  ASSERT_EQ(one.scheduled.size(), 1u);  // seq 1 decodes; seq 2 is still copying in
  EXPECT_EQ(one.scheduled[0].seq->id, 1u);
  sched.update(one, sample(one));
  ASSERT_TRUE(sched.onboard_done(2).ok());
  SchedulerOutput d2 = sched.schedule();
  EXPECT_EQ(d2.num_prefill_tokens, 0);
  EXPECT_EQ(d2.num_decode_tokens, 2);
  for (const ScheduledSeq& s : d2.scheduled) {
    EXPECT_NE(s.seq->id, 3u);
    EXPECT_EQ(s.num_new_tokens, 1);
  }
  EXPECT_EQ(d2.input.positions, (std::vector<std::int32_t>{6, 5}));
  EXPECT_EQ(sched.find(3)->status, SeqStatus::waiting);
  EXPECT_TRUE(sched.check_integrity().ok());
}

TEST(SchedulerPhase, DecodeOnboardsOnlyWhatFreeBlocksAndSlotsTake) {
  SchedulerConfig c = config();
  c.max_num_seqs = 3;
  Scheduler sched(c, 64, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 4; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 3)).ok());
  SchedulerOutput p = sched.schedule();  // three prompts (max_num_seqs)
  sched.update(p, sample(p));
  p = sched.schedule();  // offloads the three, prefills the fourth
  ASSERT_EQ(p.offloads.size(), 3u);
  ASSERT_EQ(p.scheduled.size(), 1u);
  for (const SwapOut& o : p.offloads) ASSERT_TRUE(sched.offload_done(o.seq_id, true).ok());
  sched.update(p, sample(p));
  for (const SwapOut& o : sched.schedule().offloads) ASSERT_TRUE(sched.offload_done(o.seq_id, true).ok());
  sched.set_phase(SchedulePhase::decode);
  EXPECT_EQ(sched.schedule().onboards.size(), 3u);  // the slots
  EXPECT_TRUE(sched.schedule().onboards.empty());

  Scheduler few_blocks(config(), 5, 4);  // 5 blocks: two sequences of 2 blocks each
  few_blocks.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 2; ++i) ASSERT_TRUE(few_blocks.add(make_seq(i, 5, 3)).ok());
  p = few_blocks.schedule();
  few_blocks.update(p, sample(p));
  for (const SwapOut& o : few_blocks.schedule().offloads) ASSERT_TRUE(few_blocks.offload_done(o.seq_id, true).ok());
  ASSERT_TRUE(few_blocks.add(make_seq(3, 9, 3)).ok());  // 9 + 1 tokens: 3 blocks
  p = few_blocks.schedule();
  few_blocks.update(p, sample(p));
  for (const SwapOut& o : few_blocks.schedule().offloads) ASSERT_TRUE(few_blocks.offload_done(o.seq_id, true).ok());
  few_blocks.set_phase(SchedulePhase::decode);
  SchedulerOutput d = few_blocks.schedule();
  ASSERT_EQ(d.onboards.size(), 2u);  // FCFS: seq 3 waits for blocks
  EXPECT_EQ(d.onboards[0].seq_id, 1u);
  EXPECT_EQ(d.onboards[1].seq_id, 2u);
  EXPECT_TRUE(few_blocks.check_integrity().ok());
}

TEST(SchedulerPhase, PrefillAdmitsOnlyWhatTheHostBufferCanTake) {
  Scheduler sched(config(), 64, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(sched.add(make_seq(i, 10, 3)).ok());
  SchedulerOutput out = sched.schedule(nullptr, 25);  // room for two 10-token prompts
  EXPECT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.num_prefill_tokens, 20);
  SchedulerOutput none = sched.schedule(nullptr, 9);
  EXPECT_TRUE(none.empty());  // the head prompt (10 tokens) does not fit: FCFS, nothing behind it either
  // In the mixed phase the cap does not apply.
  sched.set_phase(SchedulePhase::mixed);
  EXPECT_EQ(sched.schedule(nullptr, 0).scheduled.size(), 1u);
}

TEST(SchedulerPhase, OffloadResidentEmptiesTheDeviceAndRefusesWithStepsInFlight) {
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 8, .max_model_len = 64}, 64, 4);
  ASSERT_TRUE(sched.add(make_seq(1, 20, 3)).ok());
  ASSERT_TRUE(sched.add(make_seq(2, 4, 3)).ok());
  SchedulerOutput out = sched.schedule();  // 8 tokens of seq 1's prompt
  std::vector<SwapOut> offloads;
  Status busy = sched.offload_resident(offloads);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(busy.error().message.find("in flight"), std::string::npos);
  EXPECT_TRUE(offloads.empty());
  EXPECT_EQ(sched.num_running(), 1);
  sched.update(out, sample(out));

  ASSERT_TRUE(sched.offload_resident(offloads).ok());
  ASSERT_EQ(offloads.size(), 1u);
  EXPECT_EQ(offloads[0].seq_id, 1u);
  EXPECT_EQ(offloads[0].num_tokens, 8);  // a partial prefill keeps what it computed
  EXPECT_EQ(sched.num_running(), 0);
  EXPECT_EQ(sched.find(1)->num_restore_tokens, 8);
  EXPECT_FALSE(Scheduler::is_decode_ready(*sched.find(1)));  // its prefill continues in a prefill phase
  EXPECT_EQ(sched.block_manager().num_free_blocks(), 62);  // until its copy lands
  ASSERT_TRUE(sched.offload_done(1, true).ok());
  EXPECT_FALSE(Scheduler::is_decode_ready(*sched.find(1)));
  EXPECT_EQ(sched.block_manager().num_free_blocks(), 64);
  EXPECT_TRUE(sched.check_integrity().ok());
}

// A cluster alternating phases, as Seesaw runs it: prefill until nothing is
// left to prefill, offload what is resident, decode until nothing is
// decode-ready, and again. The host KV buffer is a map that checks every
// restore brings back exactly what went out.
struct PhasedRun {
  std::map<std::uint64_t, std::vector<std::int32_t>> outputs;
  int transitions = 0, offloads = 0;
};

PhasedRun run_phased(Scheduler& sched, std::uint64_t num_requests, long long host_kv_tokens) {
  PhasedRun r;
  std::map<std::uint64_t, int> host;  // seq id -> KV tokens held (or being copied out)
  // KV copies asked for by the last schedule: they land before the next one,
  // as a prefetcher thread's would while the step runs.
  std::vector<std::uint64_t> offloading, onboarding;
  const auto land = [&] {
    for (std::uint64_t id : offloading) EXPECT_TRUE(sched.offload_done(id, true).ok()) << id;
    for (std::uint64_t id : onboarding) EXPECT_TRUE(sched.onboard_done(id).ok()) << id;
    offloading.clear();
    onboarding.clear();
  };
  const auto move_out = [&](const std::vector<SwapOut>& outs, bool offloads) {
    for (const SwapOut& o : outs) {
      EXPECT_EQ(host.count(o.seq_id), 0u) << o.seq_id;
      host[o.seq_id] = o.num_tokens;
      if (offloads) offloading.push_back(o.seq_id);
    }
  };
  const auto move_in = [&](const std::vector<KvRestore>& ins, bool onboards) {
    for (const KvRestore& k : ins) {
      EXPECT_EQ(host.count(k.seq_id), 1u) << k.seq_id;
      EXPECT_EQ(host[k.seq_id], k.num_tokens) << k.seq_id;
      host.erase(k.seq_id);
      if (onboards) onboarding.push_back(k.seq_id);
    }
  };
  SchedulePhase phase = SchedulePhase::prefill;
  sched.set_phase(phase);
  int idle = 0;
  for (int step = 0; sched.has_unfinished() && step < 10000; ++step) {
    // Room in the host buffer: capacity - held - what running prefills will bring.
    long long admit = host_kv_tokens;
    for (const auto& [id, tokens] : host) admit -= tokens;
    for (std::uint64_t id = 0; id < num_requests; ++id)
      if (const Sequence* s = sched.find(id); s != nullptr && s->status == SeqStatus::running) admit -= s->num_tokens();
    SchedulerOutput out = sched.schedule(nullptr, std::max(0LL, admit));
    move_out(out.offloads, true);
    r.offloads += static_cast<int>(out.offloads.size());
    move_out(out.swap_outs, false);
    move_in(out.restores, false);
    move_in(out.onboards, true);
    EXPECT_TRUE(sched.check_integrity().ok()) << sched.check_integrity().error().message;
    if (phase == SchedulePhase::decode) {
      EXPECT_EQ(out.num_prefill_tokens, 0) << step;
    }
    if (phase == SchedulePhase::prefill) {
      EXPECT_EQ(out.num_decode_tokens, 0) << step;
    }
    if (out.empty()) {
      if (!offloading.empty() || !onboarding.empty()) {  // wait for the copies
        land();
        continue;
      }
      EXPECT_LT(++idle, 3) << "no phase can run anything at step " << step;
      if (idle >= 3) break;
      std::vector<SwapOut> resident;
      EXPECT_TRUE(sched.offload_resident(resident).ok());
      move_out(resident, true);
      land();  // a transition drains the mover
      phase = phase == SchedulePhase::prefill ? SchedulePhase::decode : SchedulePhase::prefill;
      sched.set_phase(phase);
      ++r.transitions;
      continue;
    }
    idle = 0;
    std::vector<std::uint64_t> ids;
    for (const ScheduledSeq& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sample(out));
    land();
    for (std::uint64_t id : ids) {
      const Sequence* seq = sched.find(id);
      if (seq->num_output_tokens() >= seq->params.max_tokens) {
        host.erase(id);
        r.outputs[id] = sched.finish(id, FinishReason::length)->output_ids;
      }
    }
  }
  EXPECT_TRUE(host.empty());
  EXPECT_EQ(sched.block_manager().num_free_blocks(), sched.block_manager().num_blocks());
  return r;
}

TEST(SchedulerPhase, AlternatingPhasesFinishEveryRequestOnceWithItsTokens) {
  for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
    // host 13 tokens: two 6-token prompts per prefill phase, many transitions;
    // host 40: six, whose decodes outgrow the 10 blocks of 4 tokens (a
    // request grows to 6 + 12 = 18 tokens, 5 blocks): decode phases preempt.
    // Chunked prefills (budget 8) cross transitions.
    for (const long long host : {13LL, 40LL}) {
      const std::string what = std::string(preemption_mode_name(mode)) + ", host " + std::to_string(host);
      SchedulerConfig c = config(mode);
      c.max_num_batched_tokens = 8;
      Scheduler sched(c, 10, 4);
      for (std::uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(sched.add(make_seq(i, 6, 12)).ok());
      const PhasedRun r = run_phased(sched, 12, host);
      ASSERT_EQ(r.outputs.size(), 12u) << what;
      for (const auto& [id, out] : r.outputs) {
        ASSERT_EQ(out.size(), 12u) << what << " seq " << id;
        for (int k = 0; k < 12; ++k) EXPECT_EQ(out[k], static_cast<std::int32_t>(id * 1000 + 6 + k)) << what;
      }
      EXPECT_GE(r.offloads, 12) << what;
      if (host == 13) {
        EXPECT_GE(r.transitions, 11) << what;  // >= 6 prefill phases
      }
      if (host == 40) {
        EXPECT_GT(sched.total_preemptions(), 0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace shardline::engine
