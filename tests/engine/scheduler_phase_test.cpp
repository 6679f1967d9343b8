// Seesaw's schedule phases (engine/scheduler.hpp SchedulePhase; seed 000
// §4.2): a prefill phase offloads each finished prefill to the host KV
// buffer and admits no decode-ready sequence, a decode phase admits only
// those (restoring their KV) and runs decodes only, and a cluster that
// alternates phases finishes every request once with the same tokens.
#include "engine/scheduler.hpp"
#include "tests/support/sequences.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <vector>

namespace shardline::engine {
namespace {

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
    EXPECT_TRUE(Scheduler::is_decode_ready(*s));
    EXPECT_EQ(s->num_preemptions, 0);
  }
  EXPECT_EQ(sched.total_preemptions(), 0);
  EXPECT_EQ(sched.total_offloads(), 3);
  EXPECT_EQ(sched.block_manager().num_free_blocks(), 64);
  EXPECT_TRUE(sched.check_integrity().ok());

  // Still prefill: the decode-ready sequences are not admitted, a new prompt is.
  ASSERT_TRUE(sched.add(make_seq(4, 6, 3)).ok());
  SchedulerOutput third = sched.schedule();
  ASSERT_EQ(third.scheduled.size(), 1u);
  EXPECT_EQ(third.scheduled[0].seq->id, 4u);
  EXPECT_TRUE(third.restores.empty());
}

TEST(SchedulerPhase, DecodeAdmitsOnlyDecodeReadySequencesByRestoringTheirKv) {
  Scheduler sched(config(), 64, 4);
  sched.set_phase(SchedulePhase::prefill);
  for (std::uint64_t i = 1; i <= 2; ++i) ASSERT_TRUE(sched.add(make_seq(i, 5, 3)).ok());
  SchedulerOutput p = sched.schedule();
  sched.update(p, sample(p));
  ASSERT_EQ(sched.schedule().offloads.size(), 2u);
  ASSERT_TRUE(sched.add(make_seq(3, 7, 3)).ok());  // needs prefill: waits for the next prefill phase

  sched.set_phase(SchedulePhase::decode);
  SchedulerOutput d = sched.schedule();
  EXPECT_EQ(d.num_prefill_tokens, 0);
  EXPECT_EQ(d.num_decode_tokens, 2);
  ASSERT_EQ(d.restores.size(), 2u);
  for (const KvRestore& r : d.restores) EXPECT_EQ(r.num_tokens, 5);
  for (const ScheduledSeq& s : d.scheduled) {
    EXPECT_NE(s.seq->id, 3u);
    EXPECT_EQ(s.num_new_tokens, 1);
  }
  EXPECT_EQ(d.input.positions, (std::vector<std::int32_t>{5, 5}));
  EXPECT_EQ(sched.find(3)->status, SeqStatus::waiting);
  EXPECT_TRUE(sched.check_integrity().ok());
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
  std::map<std::uint64_t, int> host;  // seq id -> KV tokens held
  const auto move_out = [&](const std::vector<SwapOut>& outs) {
    for (const SwapOut& o : outs) {
      EXPECT_EQ(host.count(o.seq_id), 0u) << o.seq_id;
      host[o.seq_id] = o.num_tokens;
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
    move_out(out.offloads);
    r.offloads += static_cast<int>(out.offloads.size());
    move_out(out.swap_outs);
    for (const KvRestore& k : out.restores) {
      EXPECT_EQ(host.count(k.seq_id), 1u) << k.seq_id;
      EXPECT_EQ(host[k.seq_id], k.num_tokens) << k.seq_id;
      host.erase(k.seq_id);
    }
    EXPECT_TRUE(sched.check_integrity().ok()) << sched.check_integrity().error().message;
    if (phase == SchedulePhase::decode) EXPECT_EQ(out.num_prefill_tokens, 0) << step;
    if (phase == SchedulePhase::prefill) EXPECT_EQ(out.num_decode_tokens, 0) << step;
    if (out.empty()) {
      EXPECT_LT(++idle, 3) << "no phase can run anything at step " << step;
      if (idle >= 3) break;
      std::vector<SwapOut> resident;
      EXPECT_TRUE(sched.offload_resident(resident).ok());
      move_out(resident);
      phase = phase == SchedulePhase::prefill ? SchedulePhase::decode : SchedulePhase::prefill;
      sched.set_phase(phase);
      ++r.transitions;
      continue;
    }
    idle = 0;
    std::vector<std::uint64_t> ids;
    for (const ScheduledSeq& s : out.scheduled) ids.push_back(s.seq->id);
    sched.update(out, sample(out));
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
      if (host == 13) EXPECT_GE(r.transitions, 11) << what;  // >= 6 prefill phases
      if (host == 40) EXPECT_GT(sched.total_preemptions(), 0) << what;
    }
  }
}

}  // namespace
}  // namespace shardline::engine
