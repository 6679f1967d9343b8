#include "engine/policies/seesaw_policy.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace shardline::engine {

namespace {

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, "seesaw policy: " + m)); }

/// Host buffer room in KV tokens: capacity − held − reserved, never negative.
long long host_room(const SeesawCounts& c) {
  return std::max(0LL, c.host_capacity_tokens - c.host_held_tokens - c.host_reserved_tokens);
}

long long blocks_for(long long tokens, long long block_size) {
  const long long bs = std::max(1LL, block_size);
  return (tokens + bs - 1) / bs;
}

}  // namespace

const char* to_string(SeesawPhase phase) noexcept { return phase == SeesawPhase::decode ? "decode" : "prefill"; }

const char* to_string(SeesawSchedule schedule) noexcept {
  switch (schedule) {
    case SeesawSchedule::prefill_prioritizing: return "prefill-prioritizing";
    case SeesawSchedule::decode_prioritizing: return "decode-prioritizing";
    case SeesawSchedule::transition_minimizing: break;
  }
  return "transition-minimizing";
}

Result<SeesawSchedule> parse_seesaw_schedule(std::string_view text) {
  for (SeesawSchedule s : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                           SeesawSchedule::decode_prioritizing})
    if (text == to_string(s)) return s;
  return make_error(ErrorCode::invalid_argument,
                    "--seesaw-policy must be transition-minimizing, prefill-prioritizing or decode-prioritizing, got '" +
                        std::string(text) + "'");
}

const char* to_string(SeesawReason reason) noexcept {
  switch (reason) {
    case SeesawReason::prefilling: return "prefilling";
    case SeesawReason::prompt_fits: return "prompt-fits";
    case SeesawReason::idle: return "idle";
    case SeesawReason::blocked: return "blocked";
    case SeesawReason::phase_full: return "phase-full";
    case SeesawReason::no_prompts: return "no-prompts";
    case SeesawReason::host_not_empty: return "host-not-empty";
    case SeesawReason::too_few_prompts: return "too-few-prompts";
    case SeesawReason::device_busy: return "device-busy";
    case SeesawReason::no_host_room: return "no-host-room";
    case SeesawReason::decoding: return "decoding";
    case SeesawReason::host_empty: return "host-empty";
    case SeesawReason::prompt_fits_device: return "prompt-fits-device";
    case SeesawReason::decodes_finished: return "decodes-finished";
  }
  return "unknown";
}

Status SeesawPolicyOptions::validate() const {
  if (schedule != SeesawSchedule::transition_minimizing && schedule != SeesawSchedule::prefill_prioritizing &&
      schedule != SeesawSchedule::decode_prioritizing)
    return bad("schedule (--seesaw-policy) is not one of transition-minimizing, prefill-prioritizing, "
               "decode-prioritizing");
  if (min_prefill_prompts < 1)
    return bad("min_prefill_prompts (--seesaw-min-prefill-prompts) must be >= 1, got " +
               std::to_string(min_prefill_prompts));
  if (!std::isfinite(decode_drain_fraction) || decode_drain_fraction < 0 || decode_drain_fraction > 1)
    return bad("decode_drain_fraction must be in [0, 1], got " + std::to_string(decode_drain_fraction));
  return Status::ok_status();
}

Result<SeesawPolicy> SeesawPolicy::create(const SeesawPolicyOptions& options) {
  if (Status st = options.validate(); !st) return st.error();
  return SeesawPolicy(options);
}

long long SeesawPolicy::watermark_blocks(const SeesawCounts& counts) {
  return std::max(0LL, counts.total_blocks) / 100;
}

long long SeesawPolicy::cap_at_transition(const SeesawCounts& c) const {
  const long long bs = std::max(1LL, c.block_size);
  switch (options_.schedule) {
    case SeesawSchedule::prefill_prioritizing:
      return std::max(0LL, c.free_blocks - watermark_blocks(c)) * bs;
    case SeesawSchedule::decode_prioritizing:
      return std::max(0LL, c.total_blocks) * bs;
    case SeesawSchedule::transition_minimizing: break;
  }
  return kNoCap;
}

long long SeesawPolicy::prefill_cap_tokens(const SeesawCounts& counts) const {
  if (options_.schedule == SeesawSchedule::transition_minimizing) return kNoCap;
  if (cap_snapshot_) return *cap_snapshot_;
  // The initial (warm-up) prefill phase starts on an empty device.
  SeesawCounts empty = counts;
  empty.free_blocks = counts.total_blocks;
  return cap_at_transition(empty);
}

SeesawPlan SeesawPolicy::plan(const SeesawCounts& counts) const {
  return phase_ == SeesawPhase::prefill ? plan_prefill(counts) : plan_decode(counts);
}

SeesawPlan SeesawPolicy::plan_prefill(const SeesawCounts& c) const {
  const long long room = host_room(c);
  const long long cap = prefill_cap_tokens(c);
  const long long admit = cap == kNoCap ? room : std::min(room, std::max(0LL, cap - c.phase_admitted_tokens));
  const auto stay = [&](SeesawReason r) { return SeesawPlan{SeesawPhase::prefill, admit, r}; };

  if (c.prefilling_seqs > 0) return stay(SeesawReason::prefilling);
  if (c.waiting_prompts > 0 && c.head_prompt_extra_tokens <= admit) return stay(SeesawReason::prompt_fits);
  if (c.host_ready_seqs > 0 || c.running_decode_seqs > 0)
    return {SeesawPhase::decode, 0, c.waiting_prompts > 0 ? SeesawReason::phase_full : SeesawReason::no_prompts};
  return stay(c.waiting_prompts > 0 ? SeesawReason::blocked : SeesawReason::idle);
}

SeesawPlan SeesawPolicy::plan_decode(const SeesawCounts& c) const {
  const long long room = host_room(c);
  const auto stay = [&](SeesawReason r) { return SeesawPlan{SeesawPhase::decode, room, r}; };
  const auto go = [](SeesawReason r) { return SeesawPlan{SeesawPhase::prefill, 0, r}; };

  if (c.waiting_prompts == 0) return stay(SeesawReason::no_prompts);  // the tail (or idle)
  if (c.running_decode_seqs == 0 && c.host_ready_seqs == 0) return go(SeesawReason::decodes_finished);
  // All three swap the host buffer in before new prompts (TM: §4.2; PP:
  // vLLM schedules no prefill while sequences are swapped out; DP: the batch
  // includes them).
  if (c.host_ready_seqs > 0) return stay(SeesawReason::host_not_empty);

  switch (options_.schedule) {
    case SeesawSchedule::decode_prioritizing:
      return stay(SeesawReason::decoding);
    case SeesawSchedule::transition_minimizing: {
      if (c.waiting_prompts < options_.min_prefill_prompts) return stay(SeesawReason::too_few_prompts);
      const long long used = std::max(0LL, c.total_blocks - c.free_blocks);
      if (static_cast<double>(used) > options_.decode_drain_fraction * static_cast<double>(c.total_blocks))
        return stay(SeesawReason::device_busy);
      break;
    }
    case SeesawSchedule::prefill_prioritizing:
      if (blocks_for(c.head_prompt_tokens + 1, c.block_size) > c.free_blocks - watermark_blocks(c))
        return stay(SeesawReason::device_busy);
      break;
  }
  // The transition offloads every resident decode into the host buffer; the
  // head prompt must still fit after that, or the prefill phase would admit
  // nothing and flip straight back.
  if (c.head_prompt_extra_tokens > std::max(0LL, room - c.running_decode_tokens))
    return stay(SeesawReason::no_host_room);
  return go(options_.schedule == SeesawSchedule::transition_minimizing ? SeesawReason::host_empty
                                                                       : SeesawReason::prompt_fits_device);
}

int pipelined_decode_tokens(const SeesawCounts& counts, int max_num_seqs, int pipeline_depth) {
  const long long onboard = std::clamp(static_cast<long long>(max_num_seqs) - counts.running_decode_seqs -
                                           counts.prefilling_seqs,
                                       0LL, counts.host_ready_seqs);
  const long long resident = counts.running_decode_seqs + onboard;
  const long long depth = std::max(1, pipeline_depth);
  return static_cast<int>(std::max(1LL, (resident + depth - 1) / depth));
}

void SeesawPolicy::on_transition(SeesawPhase to, const SeesawCounts& counts) {
  if (to == phase_) return;
  ++transitions_;
  phase_ = to;
  if (to == SeesawPhase::prefill) cap_snapshot_ = cap_at_transition(counts);
}

}  // namespace shardline::engine
