#include "engine/scheduler.hpp"

#include <algorithm>
#include <optional>
#include <string>

namespace shardline::engine {

model::StepInput make_step_input(std::span<const ScheduledSeq> scheduled, const BlockManager& blocks) {
  model::StepInput in;
  in.block_size = blocks.block_size();
  in.seqs.reserve(scheduled.size());
  int row = 0;
  for (const ScheduledSeq& s : scheduled) {
    const Sequence& seq = *s.seq;
    model::StepSeq ss;
    ss.seq_id = seq.id;
    ss.num_computed_tokens = seq.num_computed_tokens;
    ss.num_new_tokens = s.num_new_tokens;
    const int end = seq.num_computed_tokens + s.num_new_tokens;
    ss.needs_logits = end == seq.num_tokens();
    const auto& table = blocks.block_table(seq.id);
    const int num_table_blocks = blocks.blocks_for_tokens(end);
    ss.block_table.assign(table.begin(), table.begin() + std::min<std::ptrdiff_t>(num_table_blocks, table.size()));
    for (int pos = seq.num_computed_tokens; pos < end; ++pos, ++row) {
      in.token_ids.push_back(seq.token_at(pos));
      in.positions.push_back(pos);
      in.slot_mapping.push_back(table[static_cast<std::size_t>(pos / in.block_size)] * in.block_size +
                                pos % in.block_size);
    }
    if (ss.needs_logits) in.logits_rows.push_back(row - 1);
    in.seqs.push_back(std::move(ss));
  }
  return in;
}

const char* preemption_mode_name(PreemptionMode mode) noexcept {
  return mode == PreemptionMode::swap ? "swap" : "recompute";
}

Result<PreemptionMode> parse_preemption_mode(const std::string& name) {
  if (name == "recompute") return PreemptionMode::recompute;
  if (name == "swap") return PreemptionMode::swap;
  return make_error(ErrorCode::invalid_argument,
                    "unknown preemption mode '" + name + "' (choose recompute or swap)");
}

const char* schedule_phase_name(SchedulePhase phase) noexcept {
  switch (phase) {
    case SchedulePhase::prefill: return "prefill";
    case SchedulePhase::decode: return "decode";
    case SchedulePhase::mixed: break;
  }
  return "mixed";
}

Scheduler::Scheduler(SchedulerConfig config, int num_kv_blocks, int block_size)
    : config_(config), blocks_(num_kv_blocks, block_size, config.prefix_cache) {}

namespace {
BlockManager::Tokens tokens_of(const Sequence& seq) { return {seq.prompt_ids, seq.output_ids}; }
/// Prefix caching: at most this many waiting sequences are put off (their
/// next block being computed) per schedule before admission stops: a queue
/// of thousands of lines behind one head is not rescanned whole each step.
constexpr int kMaxPrefixWaitsPerSchedule = 256;
}  // namespace

Status Scheduler::add(std::unique_ptr<Sequence> seq) {
  const std::string who = "request " + std::to_string(seq->id) + ": ";
  if (seqs_.count(seq->id) != 0)
    return make_error(ErrorCode::invalid_argument, who + "duplicate request id");
  if (seq->prompt_ids.empty()) return make_error(ErrorCode::invalid_argument, who + "empty prompt");
  if (seq->num_prompt_tokens() > config_.max_model_len)
    return make_error(ErrorCode::invalid_argument,
                      who + "prompt has " + std::to_string(seq->num_prompt_tokens()) +
                          " tokens, more than max_model_len " + std::to_string(config_.max_model_len));
  const long long max_len = std::min<long long>(
      static_cast<long long>(seq->num_prompt_tokens()) + seq->params.max_tokens, config_.max_model_len);
  const long long need = (max_len + blocks_.block_size() - 1) / blocks_.block_size();
  if (need > blocks_.num_blocks())
    return make_error(ErrorCode::out_of_memory,
                      who + "prompt + max_tokens = " + std::to_string(max_len) + " tokens need " +
                          std::to_string(need) + " KV blocks, the whole cache has " +
                          std::to_string(blocks_.num_blocks()));
  if (seq->num_restore_tokens < 0 || seq->num_restore_tokens >= seq->num_tokens())
    return make_error(ErrorCode::invalid_argument,
                      who + "restores " + std::to_string(seq->num_restore_tokens) + " KV positions of " +
                          std::to_string(seq->num_tokens()) + " tokens (at most the tokens before the last)");
  seq->status = SeqStatus::waiting;
  seq->num_computed_tokens = 0;
  seq->arrival = next_arrival_++;
  Sequence* raw = seq.get();
  seqs_.emplace(raw->id, std::move(seq));
  waiting_.push_back(raw);
  return Status::ok_status();
}

void Scheduler::insert_by_arrival(std::deque<Sequence*>& queue, Sequence* seq) {
  auto it = std::upper_bound(queue.begin(), queue.end(), seq,
                             [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  queue.insert(it, seq);
}

void Scheduler::insert_by_arrival(std::vector<Sequence*>& queue, Sequence* seq) {
  auto it = std::upper_bound(queue.begin(), queue.end(), seq,
                             [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  queue.insert(it, seq);
}

Sequence* Scheduler::last_preemptible() const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (!(*it)->in_flight && (*it)->kv_pending == KvPending::none) return *it;
  return nullptr;
}

void Scheduler::preempt(Sequence* victim, SchedulerOutput& out) {
  std::erase(running_, victim);
  computing_.stop(victim->id);
  if (config_.preemption_mode == PreemptionMode::swap && victim->num_computed_tokens > 0) {
    // Positions whose KV is computed; the last known token is never among
    // them (it is computed by the step that samples the next one).
    out.swap_outs.push_back({victim->id, blocks_.block_table(victim->id), victim->num_computed_tokens});
    victim->num_restore_tokens = victim->num_computed_tokens;
  } else {
    victim->num_restore_tokens = 0;
  }
  blocks_.free(victim->id);
  victim->num_computed_tokens = 0;
  victim->status = SeqStatus::waiting;
  ++victim->num_preemptions;
  ++total_preemptions_;
  insert_by_arrival(waiting_, victim);  // ahead of everything that arrived later
}

void Scheduler::offload(Sequence* seq, std::vector<SwapOut>& offloads) {
  std::erase(running_, seq);
  computing_.stop(seq->id);
  if (seq->num_computed_tokens > 0) {
    offloads.push_back({seq->id, blocks_.block_table(seq->id), seq->num_computed_tokens});
    ++total_offloads_;
    seq->kv_pending = KvPending::offloading;  // the blocks are read until offload_done
  } else {
    blocks_.free(seq->id);
  }
  seq->num_restore_tokens = seq->num_computed_tokens;
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::waiting;
  insert_by_arrival(waiting_, seq);
}

Status Scheduler::offload_resident(std::vector<SwapOut>& offloads) {
  for (const Sequence* s : running_) {
    if (s->in_flight)
      return make_error(ErrorCode::invalid_argument,
                        "scheduler: sequence " + std::to_string(s->id) + " is in flight; drain before a transition");
    if (s->kv_pending != KvPending::none)
      return make_error(ErrorCode::invalid_argument, "scheduler: sequence " + std::to_string(s->id) +
                                                         " has a KV copy pending; drain the mover before a transition");
  }
  while (!running_.empty()) offload(running_.back(), offloads);
  return Status::ok_status();
}

Status Scheduler::offload_done(std::uint64_t seq_id, bool kept) {
  Sequence* seq = get(seq_id);
  if (seq == nullptr) return make_error(ErrorCode::not_found, "scheduler: offload of unknown sequence " + std::to_string(seq_id));
  if (seq->kv_pending != KvPending::offloading)
    return make_error(ErrorCode::invalid_argument,
                      "scheduler: sequence " + std::to_string(seq_id) + " has no offload pending");
  blocks_.free(seq_id);
  seq->kv_pending = KvPending::none;
  if (!kept) seq->num_restore_tokens = 0;  // no room in the host buffer: prefilled again
  return Status::ok_status();
}

Status Scheduler::onboard_done(std::uint64_t seq_id) {
  Sequence* seq = get(seq_id);
  if (seq == nullptr) return make_error(ErrorCode::not_found, "scheduler: onboard of unknown sequence " + std::to_string(seq_id));
  if (seq->kv_pending != KvPending::onboarding)
    return make_error(ErrorCode::invalid_argument,
                      "scheduler: sequence " + std::to_string(seq_id) + " has no onboard pending");
  seq->kv_pending = KvPending::none;
  return Status::ok_status();
}

SeesawCounts Scheduler::seesaw_counts(long long host_held_tokens, long long host_capacity_tokens) const {
  SeesawCounts c;
  for (const Sequence* s : waiting_) {
    if (is_decode_ready(*s) || s->kv_pending == KvPending::offloading) {  // in the host buffer, or on its way
      ++c.host_ready_seqs;
    } else {
      if (c.waiting_prompts++ == 0) {
        c.head_prompt_tokens = s->num_tokens();
        c.head_prompt_extra_tokens = s->num_tokens() - s->num_restore_tokens;
      }
    }
  }
  for (const Sequence* s : running_) {
    if (s->is_decoding()) {
      ++c.running_decode_seqs;
      c.running_decode_tokens += s->num_tokens() - 1;  // the KV a transition offloads
      // In a prefill phase a running decode has just been prefilled: the
      // next schedule offloads it, so its KV is already spoken for in the
      // host buffer (else the same schedule admits prompts into its room and
      // the offload falls back to recomputation).
      if (phase_ == SchedulePhase::prefill) c.host_reserved_tokens += s->num_tokens() - 1;
    } else {
      ++c.prefilling_seqs;
      c.host_reserved_tokens += s->num_tokens();  // offloaded when its prefill ends
    }
  }
  c.host_held_tokens = host_held_tokens;
  c.host_capacity_tokens = host_capacity_tokens;
  c.phase_admitted_tokens = phase_admitted_tokens_;
  c.free_blocks = blocks_.num_free_blocks();
  c.total_blocks = blocks_.num_blocks();
  c.block_size = blocks_.block_size();
  return c;
}

SchedulerState Scheduler::state(int pipeline_depth) const {
  SchedulerState st;
  for (const Sequence* s : waiting_) st.num_waiting_prefill_tokens += s->num_tokens() - s->num_restore_tokens;
  for (const Sequence* s : running_) {
    if (s->is_decoding()) ++st.num_running_decode_seqs;
    else st.num_waiting_prefill_tokens += s->num_tokens() - s->num_computed_tokens;
  }
  st.num_free_kv_blocks = blocks_.num_free_blocks();
  st.num_total_kv_blocks = blocks_.num_blocks();
  st.pipeline_depth = pipeline_depth;
  st.max_num_batched_tokens = config_.max_num_batched_tokens;
  return st;
}

SchedulerOutput Scheduler::schedule(const MicroBatchBudget* limits, long long admit_kv_tokens) {
  blocks_.release_pins();  // the last schedule's prefix copies are done
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;
  int decode_left = limits != nullptr ? limits->max_decode_tokens : budget;
  int prefill_left = limits != nullptr ? limits->max_prefill_tokens : budget;
  const auto is_decode = [](const Sequence* seq) { return seq->is_decoding(); };
  auto record = [&](Sequence* seq, int n) {
    const bool decode = n == 1 && is_decode(seq);
    (decode ? out.num_decode_tokens : out.num_prefill_tokens) += n;
    (decode ? decode_left : prefill_left) -= n;
    out.scheduled.push_back({seq, n});
    seq->in_flight = true;
    budget -= n;
  };

  // 0. Prefill phase: sequences whose prefill is done leave for the host KV
  //    buffer (Seesaw §4.2); they come back in the decode phase.
  if (phase_ == SchedulePhase::prefill) {
    std::vector<Sequence*> done;
    for (Sequence* seq : running_)
      if (!seq->in_flight && seq->kv_pending == KvPending::none && is_decode(seq)) done.push_back(seq);
    for (Sequence* seq : done) offload(seq, out.offloads);
  }

  // 1. Running sequences, oldest first; preempt from the newest end (never
  //    one in flight). The decode phase runs decodes only.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if ((phase_ == SchedulePhase::decode && !is_decode(seq)) || seq->kv_pending != KvPending::none) {
      ++i;  // not this phase's, or its KV is still being copied in
      continue;
    }
    const int cap = std::min(budget, is_decode(seq) ? decode_left : prefill_left);
    if (seq->in_flight || cap <= 0) {
      ++i;
      continue;
    }
    const int n = std::min(seq->num_tokens() - seq->num_computed_tokens, cap);
    const int end = seq->num_computed_tokens + n;
    bool self_preempted = false;
    bool blocked = false;
    while (!blocks_.can_grow(seq->id, end)) {
      Sequence* victim = last_preemptible();
      if (victim == nullptr) {  // only sequences in flight hold blocks: wait for them
        blocked = true;
        break;
      }
      preempt(victim, out);
      ++out.num_preemptions;
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the newest preemptible running sequence
    if (blocked) {
      ++i;
      continue;
    }
    (void)blocks_.allocate_slots(seq->id, end);  // cannot fail: can_grow checked
    record(seq, n);
    ++i;
  }

  // 2. Admit waiting sequences FCFS (not in a step that had to preempt).
  //    The decode phase onboards decode-ready sequences instead (its
  //    prefetches, §5.2): blocks now, the decode once their KV is in.
  if (phase_ == SchedulePhase::decode) {
    if (out.num_preemptions == 0) onboard_decode_ready(out);
    out.input = make_step_input(out.scheduled, blocks_);
    out.prefix_spills = blocks_.take_evicted();
    return out;
  }
  //    A prefill phase admits prompts only (within admit_kv_tokens).
  std::size_t w = 0;
  int waits = 0;  // prefix caching: sequences put off this schedule (the scan's bound)
  while (out.num_preemptions == 0 && budget > 0 && prefill_left > 0 && w < waiting_.size() &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_[w];
    if (seq->kv_pending != KvPending::none || (phase_ == SchedulePhase::prefill && is_decode_ready(*seq))) {
      ++w;  // its KV is on the way out, or it is the decode phase's
      continue;
    }
    const int restored = seq->num_restore_tokens;  // KV copied in, not computed
    // Prefix caching: a sequence with nothing to restore starts after the
    // cached blocks its tokens lead with (its last token is always
    // computed: its logits are needed). They are shared, never written.
    // If its next block is being computed by a running sequence, it waits
    // for it (computed once, then a hit) instead of computing it again.
    std::optional<std::uint64_t> miss;
    const int cached =
        restored == 0 ? blocks_.acquire_cached_prefix(seq->id, tokens_of(*seq), seq->num_tokens() - 1, &miss) : 0;
    if (miss && computing_.computing(*miss)) {
      blocks_.free(seq->id);
      ++prefix_waits_;
      if (++waits > kMaxPrefixWaitsPerSchedule) break;
      ++w;
      continue;
    }
    // Its next full blocks from the prefix tier, when the device lacks them
    // and no request computes them (they were evicted and spilled).
    std::vector<std::vector<std::byte>> tier_blocks;
    if (restored == 0 && tier_ != nullptr && miss)
      tier_blocks = blocks_.fetch_from_tier(tier_, seq->id, tokens_of(*seq), seq->num_tokens() - 1);
    int tier_tokens = static_cast<int>(tier_blocks.size()) * blocks_.block_size();
    // The rest of the shared prefix, when it ends inside a block another
    // request computed: its KV is copied (copy-on-write), not computed.
    BlockManager::PartialBlockHit partial =
        restored == 0 && partial_block_copies_ && tier_tokens == 0
            ? blocks_.acquire_partial_block(seq->id, tokens_of(*seq), seq->num_tokens() - 1)
            : BlockManager::PartialBlockHit{};
    if (phase_ == SchedulePhase::prefill && admit_kv_tokens >= 0) {
      if (seq->num_tokens() > admit_kv_tokens) {  // the host KV buffer has no room for it
        blocks_.free(seq->id);
        break;
      }
      admit_kv_tokens -= seq->num_tokens();
    }
    if (phase_ == SchedulePhase::prefill) phase_admitted_tokens_ += seq->num_tokens();
    int start = restored + cached + tier_tokens + partial.num_tokens;
    int n = std::min({seq->num_tokens() - start, budget, prefill_left});
    if (!blocks_.can_grow(seq->id, start + n) && (partial.num_tokens > 0 || tier_tokens > 0)) {
      // The pinned source is a block eviction could have handed it, and
      // more tokens at once may not fit: give those hits up rather than
      // the admission (it computes them, in chunks).
      if (partial.num_tokens > 0) blocks_.unpin(partial.src_block);
      partial = {};
      tier_blocks.clear();
      tier_tokens = 0;
      start = restored + cached;
      n = std::min({seq->num_tokens() - start, budget, prefill_left});
    }
    if (!blocks_.can_grow(seq->id, start + n)) {
      blocks_.free(seq->id);  // gives the cached blocks back
      break;
    }
    (void)blocks_.allocate_slots(seq->id, start + n);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    if (restored > 0) {
      out.restores.push_back({seq->id, restored});
      seq->num_computed_tokens = restored;
      seq->num_restore_tokens = 0;
    } else if (blocks_.prefix_caching()) {
      prefix_query_tokens_ += seq->num_tokens();
      prefix_hit_tokens_ += cached + partial.num_tokens;
      seq->num_computed_tokens = cached + tier_tokens + partial.num_tokens;
      if (partial.num_tokens > 0) out.prefix_copies.push_back({seq->id, partial.src_block, cached, partial.num_tokens});
      if (tier_tokens > 0) out.tier_restores.push_back({seq->id, cached, std::move(tier_blocks)});
      // The blocks it computes (or restores from the tier) from its cached
      // ones on: requests behind it wait for them and hit them.
      computing_.start(seq->id, blocks_.pending_names(seq->id, tokens_of(*seq), seq->num_tokens() - 1),
                       cached / blocks_.block_size());
    }
    // Its first admission says how much of its prompt was cached (none
    // when it was restored: a resumed or swapped request).
    if (seq->num_cached_tokens < 0)
      seq->num_cached_tokens =
          restored > 0 || !blocks_.prefix_caching() ? 0 : cached + tier_tokens + partial.num_tokens;
    seq->status = SeqStatus::running;
    insert_by_arrival(running_, seq);
    record(seq, n);
  }

  out.input = make_step_input(out.scheduled, blocks_);
  out.prefix_spills = blocks_.take_evicted();
  return out;
}

void Scheduler::onboard_decode_ready(SchedulerOutput& out) {
  for (std::size_t w = 0; w < waiting_.size() && static_cast<int>(running_.size()) < config_.max_num_seqs;) {
    Sequence* seq = waiting_[w];
    if (!is_decode_ready(*seq)) {
      ++w;  // needs prefill: the next prefill phase's
      continue;
    }
    const int restored = seq->num_restore_tokens;
    if (!blocks_.can_grow(seq->id, restored + 1)) break;  // FCFS: no free slot for it
    (void)blocks_.allocate_slots(seq->id, restored + 1);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    out.onboards.push_back({seq->id, restored});
    seq->num_computed_tokens = restored;
    seq->num_restore_tokens = 0;
    seq->kv_pending = KvPending::onboarding;
    seq->status = SeqStatus::running;
    insert_by_arrival(running_, seq);
  }
}

void Scheduler::update(const SchedulerOutput& out, std::span<const std::int32_t> sampled) {
  std::size_t next = 0;
  for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
    Sequence* seq = out.scheduled[i].seq;
    seq->in_flight = false;
    seq->num_computed_tokens += out.scheduled[i].num_new_tokens;
    blocks_.cache_full_blocks(seq->id, tokens_of(*seq), seq->num_computed_tokens);  // no-op without caching
    computing_.progress(seq->id, seq->num_computed_tokens / blocks_.block_size());
    if (out.input.seqs[i].needs_logits && next < sampled.size()) seq->output_ids.push_back(sampled[next++]);
  }
}

std::unique_ptr<Sequence> Scheduler::finish(std::uint64_t seq_id, FinishReason reason) {
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(it->second);
  seqs_.erase(it);
  blocks_.free(seq_id);
  computing_.stop(seq_id);
  std::erase(running_, seq.get());
  std::erase(waiting_, seq.get());
  seq->status = SeqStatus::finished;
  seq->finish_reason = reason;
  return seq;
}

Sequence* Scheduler::get(std::uint64_t seq_id) {
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

const Sequence* Scheduler::find(std::uint64_t seq_id) const {
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

Status Scheduler::check_integrity() const {
  if (Status s = blocks_.check_integrity(); !s.ok()) return s;
  auto fail = [](const std::string& m) { return make_error(ErrorCode::internal, "scheduler: " + m); };
  if (static_cast<int>(running_.size()) > config_.max_num_seqs)
    return fail(std::to_string(running_.size()) + " running sequences > max_num_seqs");
  if (running_.size() + waiting_.size() != seqs_.size())
    return fail("running + waiting != live sequences (a request was lost)");
  for (const Sequence* s : running_) {
    if (s->status != SeqStatus::running) return fail("sequence in running queue not running");
    if (s->kv_pending == KvPending::offloading)
      return fail("running sequence " + std::to_string(s->id) + " is being offloaded");
    if (blocks_.num_tokens_covered(s->id) < s->num_computed_tokens)
      return fail("sequence " + std::to_string(s->id) + " computed " + std::to_string(s->num_computed_tokens) +
                  " tokens but its table covers " + std::to_string(blocks_.num_tokens_covered(s->id)));
  }
  for (const Sequence* s : waiting_) {
    if (s->status != SeqStatus::waiting) return fail("sequence in waiting queue not waiting");
    if (s->kv_pending == KvPending::onboarding)
      return fail("waiting sequence " + std::to_string(s->id) + " is being onboarded");
    // An offloading sequence keeps its blocks until its copy is done.
    if ((blocks_.has_seq(s->id) && s->kv_pending != KvPending::offloading) || s->num_computed_tokens != 0)
      return fail("waiting sequence " + std::to_string(s->id) + " holds KV blocks");
  }
  for (std::size_t i = 1; i < running_.size(); ++i)
    if (running_[i - 1]->arrival >= running_[i]->arrival) return fail("running queue out of arrival order");
  for (std::size_t i = 1; i < waiting_.size(); ++i)
    if (waiting_[i - 1]->arrival >= waiting_[i]->arrival) return fail("waiting queue out of arrival order");
  return Status::ok_status();
}

}  // namespace shardline::engine
