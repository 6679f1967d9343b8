// Seesaw's phase policy (engine/policies/seesaw_policy.hpp; seed 000 §4.2,
// Fig. 2): transition-minimizing and the prefill- / decode-prioritizing
// baselines on hand-made counts, the knobs, plan()'s purity, bad options,
// and a counts-only simulator that compares the three schedules' transitions
// and decode batches.
#include "engine/policies/seesaw_policy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

namespace shardline::engine {
namespace engine_policies_seesaw_policy_test {

constexpr SeesawPhase kPrefill = SeesawPhase::prefill;
constexpr SeesawPhase kDecode = SeesawPhase::decode;
using R = SeesawReason;

SeesawPolicy make(SeesawSchedule schedule = SeesawSchedule::transition_minimizing, int min_prefill_prompts = 1,
                  double decode_drain_fraction = 1.0) {
  Result<SeesawPolicy> p = SeesawPolicy::create({.schedule = schedule,
                                                 .min_prefill_prompts = min_prefill_prompts,
                                                 .decode_drain_fraction = decode_drain_fraction});
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return std::move(p).value();
}

// An empty device of 64 blocks of 16 tokens (watermark 0) and a host buffer
// of 1000 KV tokens, nothing anywhere.
SeesawCounts empty_counts() {
  SeesawCounts c;
  c.block_size = 16;
  c.total_blocks = 64;
  c.free_blocks = 64;
  c.host_capacity_tokens = 1000;
  return c;
}

// `n` prompts of `tokens` each wait (none of it in the host buffer).
SeesawCounts with_prompts(SeesawCounts c, long long n, long long tokens) {
  c.waiting_prompts = n;
  c.head_prompt_tokens = n > 0 ? tokens : 0;
  c.head_prompt_extra_tokens = n > 0 ? tokens : 0;
  return c;
}

// `n` prefilled sequences of `tokens` each wait in the host buffer.
SeesawCounts with_host(SeesawCounts c, long long n, long long tokens) {
  c.host_ready_seqs = n;
  c.host_held_tokens = n * tokens;
  return c;
}

// `n` decodes of `tokens` KV tokens each are resident, one block each.
SeesawCounts with_running(SeesawCounts c, long long n, long long tokens) {
  c.running_decode_seqs = n;
  c.running_decode_tokens = n * tokens;
  c.free_blocks = c.total_blocks - n;
  return c;
}

SeesawPolicy in_decode(SeesawPolicy p) {
  p.on_transition(kDecode, empty_counts());
  EXPECT_EQ(p.phase(), kDecode);
  return p;
}

void expect_plan(const SeesawPlan& got, SeesawPhase phase, long long admit, SeesawReason reason) {
  EXPECT_EQ(got.phase, phase) << to_string(got.reason);
  EXPECT_EQ(got.admit_kv_tokens, admit) << to_string(got.reason);
  EXPECT_EQ(got.reason, reason) << "got " << to_string(got.reason) << ", want " << to_string(reason);
}

// 1.
TEST(SeesawPolicy, TransitionMinimizingPrefillStaysWhileTheHeadPromptFitsOrAPromptIsPrefilling) {
  const SeesawPolicy p = make();
  EXPECT_EQ(p.phase(), kPrefill);  // the warm-up prefill (Fig. 6)
  SeesawCounts c = with_host(with_prompts(empty_counts(), 3, 100), 8, 100);  // room 200
  expect_plan(p.plan(c), kPrefill, 200, R::prompt_fits);
  c.host_held_tokens = 900;  // room 100: exactly the head prompt
  expect_plan(p.plan(c), kPrefill, 100, R::prompt_fits);
  c.host_held_tokens = 850;
  c.host_reserved_tokens = 50;  // reservations count like held chunks
  expect_plan(p.plan(c), kPrefill, 100, R::prompt_fits);
  // A chunked prompt part-way through its prefill finishes first, even with no room left.
  c.host_reserved_tokens = 150;
  c.prefilling_seqs = 1;
  expect_plan(p.plan(c), kPrefill, 0, R::prefilling);
}

// 2.
TEST(SeesawPolicy, TransitionMinimizingPrefillGoesToDecodeWhenTheHostIsFullOrNoPromptIsLeft) {
  const SeesawPolicy p = make();
  SeesawCounts c = with_host(with_prompts(empty_counts(), 3, 100), 9, 100);  // room 100
  c.host_held_tokens = 901;                                                  // room 99 < 100
  expect_plan(p.plan(c), kDecode, 0, R::phase_full);
  // No prompt left: decode what was prefilled, from the host or still resident.
  expect_plan(p.plan(with_host(empty_counts(), 2, 100)), kDecode, 0, R::no_prompts);
  expect_plan(p.plan(with_running(empty_counts(), 1, 100)), kDecode, 0, R::no_prompts);
  // Nothing anywhere: stay, idle.
  expect_plan(p.plan(empty_counts()), kPrefill, 1000, R::idle);
  // Prompts wait, none fits, nothing to decode: stay, but say it is blocked.
  SeesawCounts stuck = with_prompts(empty_counts(), 2, 100);
  stuck.host_capacity_tokens = 99;
  expect_plan(p.plan(stuck), kPrefill, 99, R::blocked);
  EXPECT_EQ(p.transitions(), 0u);
}

// 3.
TEST(SeesawPolicy, TransitionMinimizingDecodeStaysUntilTheHostIsEmpty) {
  const SeesawPolicy p = in_decode(make());
  // However many prompts wait, a non-empty host buffer keeps decode (continuous batching from it).
  SeesawCounts c = with_running(with_host(with_prompts(empty_counts(), 500, 100), 1, 100), 4, 120);
  expect_plan(p.plan(c), kDecode, 900, R::host_not_empty);
  // Empty: back to prefill even with the device full of decodes (they are offloaded: 4·120 + 100 <= 1000).
  c = with_running(with_prompts(empty_counts(), 1, 100), 4, 120);
  c.free_blocks = 0;
  expect_plan(p.plan(c), kPrefill, 0, R::host_empty);
  // The tail: no prompt waits, decode to the end.
  expect_plan(p.plan(with_running(empty_counts(), 4, 120)), kDecode, 1000, R::no_prompts);
  expect_plan(p.plan(empty_counts()), kDecode, 1000, R::no_prompts);
  // Nothing left to decode and a prompt waits.
  expect_plan(p.plan(with_prompts(empty_counts(), 1, 100)), kPrefill, 0, R::decodes_finished);
  // The resident decodes go to the host at the transition: the head prompt must still fit after them.
  c = with_running(with_prompts(empty_counts(), 1, 100), 4, 226);  // 1000 - 904 = 96 < 100
  expect_plan(p.plan(c), kDecode, 1000, R::no_host_room);
  c = with_running(with_prompts(empty_counts(), 1, 100), 4, 225);  // 1000 - 900 = 100
  expect_plan(p.plan(c), kPrefill, 0, R::host_empty);
}

// 4.
TEST(SeesawPolicy, MinPrefillPromptsAndDecodeDrainFraction) {
  const SeesawPolicy few = in_decode(make(SeesawSchedule::transition_minimizing, 4));
  expect_plan(few.plan(with_running(with_prompts(empty_counts(), 3, 10), 2, 10)), kDecode, 1000,
              R::too_few_prompts);
  expect_plan(few.plan(with_running(with_prompts(empty_counts(), 4, 10), 2, 10)), kPrefill, 0, R::host_empty);
  // With nothing left to decode one prompt is enough.
  expect_plan(few.plan(with_prompts(empty_counts(), 3, 10)), kPrefill, 0, R::decodes_finished);

  // Half: leave decode only once at most 32 of the 64 blocks are in use.
  const SeesawPolicy half = in_decode(make(SeesawSchedule::transition_minimizing, 1, 0.5));
  expect_plan(half.plan(with_running(with_prompts(empty_counts(), 1, 10), 33, 10)), kDecode, 1000,
              R::device_busy);
  expect_plan(half.plan(with_running(with_prompts(empty_counts(), 1, 10), 32, 10)), kPrefill, 0, R::host_empty);
  // Zero: only once every resident decode has finished.
  const SeesawPolicy drain = in_decode(make(SeesawSchedule::transition_minimizing, 1, 0.0));
  expect_plan(drain.plan(with_running(with_prompts(empty_counts(), 1, 10), 1, 10)), kDecode, 1000,
              R::device_busy);
  expect_plan(drain.plan(with_prompts(empty_counts(), 1, 10)), kPrefill, 0, R::decodes_finished);
  // The knobs do not hold decode while the host buffer is non-empty, nor keep it past an empty one
  // with the defaults (checked in TransitionMinimizingDecodeStaysUntilTheHostIsEmpty).
}

// 5.
TEST(SeesawPolicy, AdmitIsTheHostRoomNeverNegativeAndAPartlySwappedHeadCountsItsExtraTokens) {
  const SeesawPolicy p = make();
  SeesawCounts over = with_host(with_prompts(empty_counts(), 1, 100), 10, 100);
  over.host_reserved_tokens = 40;  // held + reserved = 1040 > 1000 (a preemption's swap-out)
  over.prefilling_seqs = 1;
  expect_plan(p.plan(over), kPrefill, 0, R::prefilling);
  over.prefilling_seqs = 0;
  expect_plan(p.plan(over), kDecode, 0, R::phase_full);
  expect_plan(in_decode(make()).plan(over), kDecode, 0, R::host_not_empty);

  // A prompt of 100 tokens of which the host buffer holds 60 adds 40.
  SeesawCounts part = with_host(with_prompts(empty_counts(), 2, 100), 2, 470);  // room 60
  part.head_prompt_extra_tokens = 40;
  expect_plan(p.plan(part), kPrefill, 60, R::prompt_fits);
  part.head_prompt_extra_tokens = 61;
  expect_plan(p.plan(part), kDecode, 0, R::phase_full);
}

// 6.
TEST(SeesawPolicy, PrefillPrioritizingPrefillsAsSoonAsAPromptFitsTheDevice) {
  SeesawPolicy p = in_decode(make(SeesawSchedule::prefill_prioritizing));
  SeesawCounts c = empty_counts();
  c.total_blocks = 100;  // watermark 1 block
  EXPECT_EQ(SeesawPolicy::watermark_blocks(c), 1);
  c = with_running(with_prompts(c, 1, 31), 97, 40);  // free 3; blocks(31 + 1) = 2 <= 3 - 1
  c.host_capacity_tokens = 10000;
  expect_plan(p.plan(c), kPrefill, 0, R::prompt_fits_device);
  c.head_prompt_tokens = c.head_prompt_extra_tokens = 32;  // blocks(33) = 3 > 2
  expect_plan(p.plan(c), kDecode, 10000, R::device_busy);
  // Transition-minimizing leaves on the host buffer alone, device full or not.
  expect_plan(in_decode(make()).plan(c), kPrefill, 0, R::host_empty);
  // Sequences swapped out come first (vLLM schedules no prefill while any are).
  c.head_prompt_tokens = c.head_prompt_extra_tokens = 31;
  expect_plan(p.plan(with_host(c, 1, 40)), kDecode, 10000 - 40, R::host_not_empty);

  // The prefill phase admits the device's free tokens at the transition: (3 - 1) · 16.
  p.on_transition(kPrefill, c);
  EXPECT_EQ(p.transitions(), 2u);
  SeesawCounts now = with_prompts(empty_counts(), 5, 31);  // after the offload: the device is empty
  now.host_capacity_tokens = 10000;
  EXPECT_EQ(p.prefill_cap_tokens(now), 32);
  expect_plan(p.plan(now), kPrefill, 32, R::prompt_fits);
  now = with_host(now, 1, 31);
  now.phase_admitted_tokens = 31;  // one prompt in: 1 token left
  expect_plan(p.plan(now), kDecode, 0, R::phase_full);

  // The warm-up phase (no snapshot yet) may fill the empty device above the watermark.
  const SeesawPolicy fresh = make(SeesawSchedule::prefill_prioritizing);
  SeesawCounts start = with_prompts(empty_counts(), 500, 31);
  start.host_capacity_tokens = 10000;
  start.total_blocks = 100;
  start.free_blocks = 40;  // prefills in progress hold blocks: the cap is still the empty device's
  EXPECT_EQ(fresh.prefill_cap_tokens(start), 99 * 16);
  start.phase_admitted_tokens = 99 * 16 - 40;
  expect_plan(fresh.plan(start), kPrefill, 40, R::prompt_fits);
}

// 7.
TEST(SeesawPolicy, DecodePrioritizingPrefillsOneDeviceBatchAndDecodesItToTheEnd) {
  SeesawPolicy p = make(SeesawSchedule::decode_prioritizing);
  SeesawCounts c = with_prompts(empty_counts(), 500, 100);
  c.host_capacity_tokens = 5000;
  EXPECT_EQ(p.prefill_cap_tokens(c), 64 * 16);  // the device's capacity, not the host's
  c.phase_admitted_tokens = 900;
  expect_plan(p.plan(c), kPrefill, 124, R::prompt_fits);
  c = with_host(c, 10, 100);
  c.phase_admitted_tokens = 1000;
  expect_plan(p.plan(c), kDecode, 0, R::phase_full);
  p.on_transition(kDecode, c);

  // Decode keeps going while any decode remains, whatever waits and whatever the host holds.
  SeesawCounts d = with_running(with_prompts(empty_counts(), 500, 100), 1, 100);
  d.host_capacity_tokens = 5000;
  expect_plan(p.plan(d), kDecode, 5000, R::decoding);
  expect_plan(p.plan(with_host(d, 3, 100)), kDecode, 4700, R::host_not_empty);
  d = with_prompts(empty_counts(), 500, 100);
  d.host_capacity_tokens = 5000;
  expect_plan(p.plan(with_host(d, 3, 100)), kDecode, 4700, R::host_not_empty);
  expect_plan(p.plan(d), kPrefill, 0, R::decodes_finished);
  p.on_transition(kPrefill, d);
  EXPECT_EQ(p.prefill_cap_tokens(d), 64 * 16);
  expect_plan(p.plan(d), kPrefill, 1024, R::prompt_fits);
}

// 8.
TEST(SeesawPolicy, PlanIsPureAndOnlyOnTransitionCounts) {
  for (SeesawSchedule s : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                           SeesawSchedule::decode_prioritizing}) {
    SCOPED_TRACE(to_string(s));
    SeesawPolicy p = make(s);
    const std::vector<SeesawCounts> all = {
        empty_counts(),
        with_prompts(empty_counts(), 3, 100),
        with_host(with_prompts(empty_counts(), 3, 100), 10, 100),  // prefill -> decode
        with_host(empty_counts(), 2, 100),
        with_running(with_prompts(empty_counts(), 3, 10), 2, 10),
        with_prompts(empty_counts(), 3, 10),  // decode -> prefill
    };
    for (SeesawPhase phase : {kPrefill, kDecode}) {
      p.on_transition(phase, empty_counts());
      const std::uint64_t before = p.transitions();
      const long long cap = p.prefill_cap_tokens(empty_counts());
      for (const SeesawCounts& c : all) {
        const SeesawPlan first = p.plan(c);
        EXPECT_EQ(p.plan(c), first);
        EXPECT_EQ(p.phase(), phase);
        EXPECT_EQ(p.transitions(), before);
        EXPECT_EQ(p.prefill_cap_tokens(empty_counts()), cap);
      }
    }
    // Plans that switched (both ways) counted nothing; on_transition does.
    EXPECT_EQ(p.transitions(), 1u);
    p.on_transition(kDecode, empty_counts());  // same phase: nothing
    EXPECT_EQ(p.transitions(), 1u);
    p.on_transition(kPrefill, empty_counts());
    EXPECT_EQ(p.phase(), kPrefill);
    EXPECT_EQ(p.transitions(), 2u);
  }
}

// 9.
TEST(SeesawPolicy, BadOptionsAndNamesAreRefusedNamingTheField) {
  const auto message = [](const SeesawPolicyOptions& o) {
    Result<SeesawPolicy> p = SeesawPolicy::create(o);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.error().to_string();
  };
  EXPECT_NE(message({.min_prefill_prompts = 0}).find("min_prefill_prompts (--seesaw-min-prefill-prompts)"),
            std::string::npos);
  EXPECT_NE(message({.decode_drain_fraction = -0.1}).find("decode_drain_fraction must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(message({.decode_drain_fraction = 1.5}).find("decode_drain_fraction"), std::string::npos);
  EXPECT_NE(message({.decode_drain_fraction = std::numeric_limits<double>::quiet_NaN()}).find("decode_drain_fraction"),
            std::string::npos);
  EXPECT_NE(message({.schedule = static_cast<SeesawSchedule>(7)}).find("schedule (--seesaw-policy)"),
            std::string::npos);
  EXPECT_TRUE(SeesawPolicy::create({.min_prefill_prompts = 1, .decode_drain_fraction = 0.0}).ok());

  for (SeesawSchedule s : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                           SeesawSchedule::decode_prioritizing}) {
    Result<SeesawSchedule> back = parse_seesaw_schedule(to_string(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  EXPECT_STREQ(to_string(SeesawSchedule::transition_minimizing), "transition-minimizing");
  Result<SeesawSchedule> bad = parse_seesaw_schedule("Transition-Minimizing");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("'Transition-Minimizing'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("--seesaw-policy"), std::string::npos);
  EXPECT_NE(bad.error().message.find("prefill-prioritizing"), std::string::npos);
  EXPECT_STREQ(to_string(kDecode), "decode");
  EXPECT_STREQ(to_string(R::prompt_fits_device), "prompt-fits-device");
}

// 10. A counts-only simulator: it plays the scheduler and the engine around
// the policy, to compare the schedules as Fig. 2 does. The model, in KV
// tokens with block_size 1 (so blocks = tokens):
//  - N requests, each a prompt of P tokens and D_i >= 1 decode steps after
//    its prefill (the prefill samples the first token).
//  - The host buffer holds k prefilled prompts: capacity k·P.
//  - A decoding sequence occupies S = P + 1 device tokens (its prompt and the
//    position its first decode writes); the KV of later tokens is not
//    modelled, so the device holds exactly m decodes: m·S tokens. m < P, so
//    a cap of m·S tokens also admits exactly m prompts of P.
//  - Prefill phase: each step admits FCFS up to 2 prompts that fit the plan's
//    admit_kv_tokens; a prefill finishes in its step and its KV goes to the
//    host buffer (the scheduler offloads it).
//  - Decode phase: each step first swaps in host-ready sequences FCFS while
//    the device has room for one, then decodes every resident sequence once;
//    a sequence with no decode step left finishes and frees its tokens.
//  - A transition offloads every resident decode into the host buffer, at the
//    front of its queue (P tokens each: later tokens are not modelled), then
//    the engine plans again; that plan must keep the new phase.
struct Workload {
  long long prompt = 9;      // P
  long long host_seqs = 12;  // k
  long long device_seqs = 4;  // m
  std::vector<int> decode_steps;  // D_i, one per request
};

struct SimResult {
  std::uint64_t transitions = 0;
  int prefill_phases = 1;  // the warm-up
  long long decode_steps = 0;
  long long decoded = 0;  // sum of the decode batches
  [[nodiscard]] double mean_decode_batch() const {
    return decode_steps == 0 ? 0 : static_cast<double>(decoded) / static_cast<double>(decode_steps);
  }
};

// Output lengths 1..12 in a fixed shuffled order, repeated: 48 requests.
std::vector<int> mixed_decode_steps(int n) {
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(1 + (i * 5) % 12);
  return d;
}

SimResult simulate(SeesawPolicy& policy, const Workload& w) {
  struct Seq {
    int id = 0;
    int left = 0;  // decode steps left
  };
  const long long P = w.prompt, S = w.prompt + 1;
  const int n = static_cast<int>(w.decode_steps.size());
  std::deque<int> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(i);
  std::deque<Seq> host;
  std::vector<Seq> running;
  std::vector<int> steps_done(static_cast<size_t>(n), 0), finished(static_cast<size_t>(n), 0);
  long long held = 0, phase_admitted = 0;
  int num_finished = 0;
  SimResult r;

  const auto counts = [&] {
    SeesawCounts c;
    c.waiting_prompts = static_cast<long long>(prompts.size());
    c.head_prompt_tokens = c.head_prompt_extra_tokens = prompts.empty() ? 0 : P;
    c.running_decode_seqs = static_cast<long long>(running.size());
    c.running_decode_tokens = c.running_decode_seqs * P;
    c.host_ready_seqs = static_cast<long long>(host.size());
    c.host_held_tokens = held;
    c.host_capacity_tokens = w.host_seqs * P;
    c.phase_admitted_tokens = phase_admitted;
    c.block_size = 1;
    c.total_blocks = w.device_seqs * S;
    c.free_blocks = c.total_blocks - c.running_decode_seqs * S;
    return c;
  };

  for (int iter = 0; num_finished < n; ++iter) {
    if (iter > 100000) {
      ADD_FAILURE() << "no progress";
      return r;
    }
    SeesawCounts c = counts();
    SeesawPlan plan = policy.plan(c);
    if (plan.phase != policy.phase()) {
      for (auto it = running.rbegin(); it != running.rend(); ++it) host.push_front(*it);
      held += static_cast<long long>(running.size()) * P;
      running.clear();
      policy.on_transition(plan.phase, c);
      phase_admitted = 0;
      ++r.transitions;
      if (plan.phase == kPrefill) ++r.prefill_phases;
      plan = policy.plan(counts());
      if (plan.phase != policy.phase()) {
        ADD_FAILURE() << "flipped straight back to " << to_string(plan.phase) << ": " << to_string(plan.reason);
        return r;
      }
    }
    if (policy.phase() == kPrefill) {
      int admitted = 0;
      while (admitted < 2 && !prompts.empty() && P * (admitted + 1) <= plan.admit_kv_tokens) {
        const int id = prompts.front();
        prompts.pop_front();
        host.push_back({id, w.decode_steps[static_cast<size_t>(id)]});
        held += P;
        phase_admitted += P;
        ++admitted;
      }
      if (admitted == 0) {
        ADD_FAILURE() << "a prefill step admitted nothing: " << to_string(plan.reason);
        return r;
      }
    } else {
      while (!host.empty() && static_cast<long long>(running.size() + 1) * S <= w.device_seqs * S) {
        running.push_back(host.front());
        host.pop_front();
        held -= P;
      }
      if (running.empty()) {
        ADD_FAILURE() << "a decode step had nothing to decode: " << to_string(plan.reason);
        return r;
      }
      ++r.decode_steps;
      r.decoded += static_cast<long long>(running.size());
      for (Seq& s : running) {
        ++steps_done[static_cast<size_t>(s.id)];
        if (--s.left == 0) {
          ++finished[static_cast<size_t>(s.id)];
          ++num_finished;
        }
      }
      std::erase_if(running, [](const Seq& s) { return s.left == 0; });
    }
    EXPECT_LE(held, w.host_seqs * P) << "host buffer over its capacity";
    EXPECT_GE(held, 0);
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(finished[static_cast<size_t>(i)], 1) << "request " << i;
    EXPECT_EQ(steps_done[static_cast<size_t>(i)], w.decode_steps[static_cast<size_t>(i)]) << "request " << i;
  }
  EXPECT_EQ(policy.transitions(), r.transitions);
  return r;
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

TEST(SeesawPolicy, SimulatedScheduleComparison) {
  Workload w;
  w.decode_steps = mixed_decode_steps(48);
  const long long N = 48, k = w.host_seqs, m = w.device_seqs;

  // Transition-minimizing with decode_drain_fraction 0: decode ends only once
  // the host buffer is empty and every decode has finished, so a transition
  // offloads nothing and each prefill phase fills the empty host buffer with
  // k prompts (the last with the rest): ceil(N/k) prefill phases, each
  // followed by a decode phase, from the warm-up prefill to the tail decode.
  SeesawPolicy tm_drained = make(SeesawSchedule::transition_minimizing, 1, 0.0);
  const SimResult tm0 = simulate(tm_drained, w);
  EXPECT_EQ(tm0.prefill_phases, ceil_div(N, k));
  EXPECT_EQ(tm0.transitions, static_cast<std::uint64_t>(2 * ceil_div(N, k) - 1));

  // The paper's rule (fraction 1): decode ends as soon as the host buffer is
  // empty, and the transition offloads the <= m resident decodes into it, so a
  // prefill phase after the first admits between k - m and k prompts:
  // ceil(N/k) <= prefill phases <= 1 + ceil((N - k)/(k - m)) (k > m).
  SeesawPolicy tm_policy = make();
  const SimResult tm = simulate(tm_policy, w);
  EXPECT_GE(tm.prefill_phases, ceil_div(N, k));
  EXPECT_LE(tm.prefill_phases, 1 + ceil_div(N - k, k - m));
  EXPECT_EQ(tm.transitions, static_cast<std::uint64_t>(2 * tm.prefill_phases - 1));

  // Decode-prioritizing: each prefill phase admits one device batch (m
  // prompts) and decode runs until all of it has finished, nothing joining:
  // ceil(N/m) phases of each kind, and each batch takes its longest decode.
  SeesawPolicy dp_policy = make(SeesawSchedule::decode_prioritizing);
  const SimResult dp = simulate(dp_policy, w);
  EXPECT_EQ(dp.transitions, static_cast<std::uint64_t>(2 * ceil_div(N, m) - 1));
  long long dp_steps = 0;
  for (size_t b = 0; b < w.decode_steps.size(); b += static_cast<size_t>(m))
    dp_steps += *std::max_element(w.decode_steps.begin() + static_cast<long>(b),
                                  w.decode_steps.begin() + static_cast<long>(b) + m);
  EXPECT_EQ(dp.decode_steps, dp_steps);

  // Prefill-prioritizing: a prefill phase admits at most the device's free
  // tokens (<= m·S, i.e. <= m prompts), so it makes at least decode-
  // prioritizing's transitions; here it prefills whenever a decode finishes.
  SeesawPolicy pp_policy = make(SeesawSchedule::prefill_prioritizing);
  const SimResult pp = simulate(pp_policy, w);
  EXPECT_GE(pp.transitions, dp.transitions);

  // Every decode step of every request runs once under every schedule, so a
  // schedule's mean decode batch is sum(D_i) / its decode steps.
  long long total_decode = 0;
  for (int d : w.decode_steps) total_decode += d;
  for (const SimResult* s : {&tm0, &tm, &dp, &pp}) EXPECT_EQ(s->decoded, total_decode);

  // Fig. 2 on this workload: transition-minimizing transitions least and
  // keeps the decode batch large; prefill-prioritizing keeps it large with
  // many more transitions; decode-prioritizing's batch shrinks as its
  // sequences finish (output lengths differ: with equal ones it would stay m).
  EXPECT_LT(tm.transitions, dp.transitions);
  EXPECT_GT(pp.transitions, 2 * dp.transitions);
  EXPECT_GT(tm.mean_decode_batch(), dp.mean_decode_batch() + 0.5);
  EXPECT_GT(tm0.mean_decode_batch(), dp.mean_decode_batch() + 0.5);
  EXPECT_GT(pp.mean_decode_batch(), dp.mean_decode_batch() + 0.5);
  std::printf("N=%lld k=%lld m=%lld: transitions / mean decode batch: TM %llu / %.2f, TM drained %llu / %.2f, "
              "PP %llu / %.2f, DP %llu / %.2f\n",
              N, k, m, static_cast<unsigned long long>(tm.transitions), tm.mean_decode_batch(),
              static_cast<unsigned long long>(tm0.transitions), tm0.mean_decode_batch(),
              static_cast<unsigned long long>(pp.transitions), pp.mean_decode_batch(),
              static_cast<unsigned long long>(dp.transitions), dp.mean_decode_batch());
}

}  // namespace
}  // namespace shardline::engine

namespace shardline::engine {
namespace engine_policies_seesaw_policy_test {

// §5.1: each decode micro-batch of a PP decode config takes 1/PP of what
// the device can decode now: the residents plus what it can onboard.
TEST(SeesawPipelinedDecode, TakesOnePpthOfResidentAndOnboardableDecodes) {
  SeesawCounts c;
  c.running_decode_seqs = 7;
  EXPECT_EQ(pipelined_decode_tokens(c, 64, 2), 4);  // ceil(7 / 2)
  EXPECT_EQ(pipelined_decode_tokens(c, 64, 1), 7);
  EXPECT_EQ(pipelined_decode_tokens(c, 64, 4), 2);
  c.host_ready_seqs = 9;  // onboardable: 16 in all
  EXPECT_EQ(pipelined_decode_tokens(c, 64, 2), 8);
  EXPECT_EQ(pipelined_decode_tokens(c, 10, 2), 5);  // only 3 more fit max_num_seqs: 10 in all
  c.prefilling_seqs = 2;                            // (none in a decode phase, but they count as running)
  EXPECT_EQ(pipelined_decode_tokens(c, 10, 2), 4);  // 7 + 1
  SeesawCounts empty;
  EXPECT_EQ(pipelined_decode_tokens(empty, 64, 2), 1);  // never 0: a step can always be built
}

}  // namespace
}  // namespace shardline::engine
