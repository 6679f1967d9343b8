#include "engine/llm_engine.hpp"

#include <algorithm>
#include <span>
#include <string>

#include "common/stopwatch.hpp"
#include "sampling/rng.hpp"
#include "sampling/sampler.hpp"

namespace shardline::engine {
namespace {

using Clock = std::chrono::steady_clock;

/// The sampler's view of a sequence about to get its next token.
sampling::SampleContext sample_context(const Sequence& seq) {
  sampling::SampleContext ctx;
  ctx.seed = seq.seed;
  ctx.position = seq.num_tokens();
  ctx.prompt_ids = seq.prompt_ids;
  ctx.output_ids = seq.output_ids;
  ctx.min_tokens_masked_ids = seq.min_tokens_masked_ids;
  return ctx;
}

}  // namespace

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(model::ModelExecutor& executor, const text::Tokenizer& tokenizer,
                                                     EngineConfig config) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "engine config: " + m); };
  if (config.max_num_seqs < 1) return bad("max_num_seqs must be >= 1");
  if (config.max_num_batched_tokens < 1) return bad("max_num_batched_tokens must be >= 1");
  if (config.max_model_len < 1) return bad("max_model_len must be >= 1");
  if (executor.block_size() < 1) return bad("executor block_size must be >= 1");
  if (executor.vocab_size() < 1) return bad("executor vocab_size must be >= 1");
  const long long capacity = static_cast<long long>(executor.num_kv_blocks()) * executor.block_size();
  if (capacity < config.max_model_len)
    return make_error(ErrorCode::out_of_memory,
                      "KV cache of " + std::to_string(executor.num_kv_blocks()) + " blocks x " +
                          std::to_string(executor.block_size()) + " tokens = " + std::to_string(capacity) +
                          " tokens cannot hold one max_model_len=" + std::to_string(config.max_model_len) +
                          " sequence; raise the KV memory budget or lower max_model_len");
  auto engine = std::unique_ptr<LlmEngine>(new LlmEngine(executor, tokenizer, std::move(config)));
  if (engine->config_.step_phases) {
    auto phases = engine->config_.step_phases(engine->parts_);
    if (!phases.ok()) return std::move(phases).error();
    engine->phases_ = std::move(phases).value();
  }
  return engine;
}

LlmEngine::LlmEngine(model::ModelExecutor& executor, const text::Tokenizer& tokenizer, EngineConfig config)
    : executor_(&executor),
      tokenizer_(&tokenizer),
      config_(std::move(config)),
      scheduler_(SchedulerConfig{config_.max_num_seqs, config_.max_num_batched_tokens, config_.max_model_len,
                                 config_.preemption_mode, config_.prefix_cache},
                 executor.num_kv_blocks(), executor.block_size()),
      kv_io_(executor, config_.swap_space_bytes),
      parts_{&executor,
             &scheduler_,
             &kv_io_,
             config_.max_num_seqs,
             config_.max_num_batched_tokens,
             config_.max_model_len,
             config_.swap_space_bytes} {
  scheduler_.set_partial_block_copies(config_.prefix_cache.enabled && kv_io_.can_copy_kv());
}

Status LlmEngine::add_request(std::uint64_t request_id, std::vector<std::int32_t> prompt_token_ids,
                              const sampling::SamplingParams& params,
                              std::shared_ptr<const sampling::CompiledGrammar> grammar) {
  const std::string who = "request " + std::to_string(request_id) + ": ";
  if (Status s = params.validate(); !s.ok()) return make_error(s.error().code, who + s.error().message);
  const int vocab = executor_->vocab_size();
  if (grammar && grammar->vocab_size() != vocab)
    return make_error(ErrorCode::invalid_argument, who + "a grammar compiled for a vocabulary of " +
                                                       std::to_string(grammar->vocab_size()) + " ids, the model has " +
                                                       std::to_string(vocab));
  for (auto id : prompt_token_ids)
    if (id < 0 || id >= vocab)
      return make_error(ErrorCode::invalid_argument,
                        who + "prompt token id " + std::to_string(id) + " outside vocab of " + std::to_string(vocab));
  auto seq = std::make_unique<Sequence>();
  seq->id = request_id;
  seq->prompt_ids = std::move(prompt_token_ids);
  seq->params = params;
  seq->seed = params.has_seed ? params.seed : sampling::mix_seed(config_.seed, request_id);
  if (!params.ignore_eos)
    for (int id : config_.eos_token_ids) seq->min_tokens_masked_ids.push_back(id);
  for (int id : params.stop_token_ids) seq->min_tokens_masked_ids.push_back(id);
  seq->output_ids.reserve(static_cast<std::size_t>(params.max_tokens));
  if (grammar) seq->grammar = std::make_shared<GrammarState>(std::move(grammar));
  if (!seq->prompt_ids.empty())
    seq->detokenizer = std::make_unique<text::IncrementalDetokenizer>(*tokenizer_, seq->prompt_ids,
                                                                       config_.skip_special_tokens);
  return scheduler_.add(std::move(seq));
}

void LlmEngine::set_prefix_tier(PrefixTier* tier) {
  prefix_tier_ = config_.prefix_cache.enabled && kv_io_.can_copy_kv() && kv_io_.copies_bytes() ? tier : nullptr;
  scheduler_.set_prefix_tier(prefix_tier_);
}

Status LlmEngine::spill_block(const NamedBlock& b) {
  if (prefix_tier_->touch(b.name)) return Status::ok_status();  // kept already: no copy
  Result<std::vector<std::byte>> chunk = kv_io_.copy_block(b.block);
  if (!chunk.ok())
    return make_error(ErrorCode::internal, "spill of prefix block " + std::to_string(b.block) + " to the prefix tier: " +
                                               chunk.error().message);
  prefix_tier_->put(b.name, b.parent, b.tokens, std::move(chunk).value());
  return Status::ok_status();
}

std::vector<NamedBlock> LlmEngine::uncached_prefix_blocks(std::span<const std::int32_t> prompt_ids) const {
  if (prefix_tier_ == nullptr || prompt_ids.size() < 2) return {};
  const BlockManager::Tokens tokens{prompt_ids, {}};
  return scheduler_.block_manager().uncached_blocks(tokens, static_cast<int>(prompt_ids.size()) - 1);
}

Status LlmEngine::spill_prefix_cache() {
  if (prefix_tier_ == nullptr) return Status::ok_status();
  for (const NamedBlock& b : scheduler_.block_manager().named_blocks())
    if (Status s = spill_block(b); !s.ok()) return s;
  return Status::ok_status();
}

Status LlmEngine::add_request(std::uint64_t request_id, std::vector<std::int32_t> prompt_token_ids,
                              const sampling::SamplingParams& params, ResumeState resume,
                              std::shared_ptr<const sampling::CompiledGrammar> grammar) {
  const std::string who = "request " + std::to_string(request_id) + ": ";
  const int vocab = executor_->vocab_size();
  for (auto id : resume.output_ids)
    if (id < 0 || id >= vocab)
      return make_error(ErrorCode::invalid_argument,
                        who + "resumed output token id " + std::to_string(id) + " outside vocab of " +
                            std::to_string(vocab));
  // A constrained request replays what it generated into a fresh matcher
  // (the grammar's state is a function of the accepted tokens).
  std::shared_ptr<GrammarState> replayed;
  if (grammar) {
    if (grammar->vocab_size() != vocab)
      return make_error(ErrorCode::invalid_argument, who + "a grammar compiled for a vocabulary of " +
                                                         std::to_string(grammar->vocab_size()) +
                                                         " ids, the model has " + std::to_string(vocab));
    replayed = std::make_shared<GrammarState>(grammar);
    for (std::size_t i = 0; i < resume.output_ids.size(); ++i)
      if (Status s = replayed->accept(resume.output_ids[i]); !s.ok())
        return make_error(ErrorCode::invalid_argument, who + "resumed output token " + std::to_string(i) +
                                                           " does not fit its grammar: " + s.error().message);
  }
  if (static_cast<long long>(resume.output_ids.size()) >= params.max_tokens)
    return make_error(ErrorCode::invalid_argument,
                      who + "resumes with " + std::to_string(resume.output_ids.size()) +
                          " generated tokens, max_tokens is " + std::to_string(params.max_tokens) +
                          ": it had finished");
  const long long known = static_cast<long long>(prompt_token_ids.size() + resume.output_ids.size());
  if (resume.num_kv_tokens < 0 || resume.num_kv_tokens >= known)
    return make_error(ErrorCode::invalid_argument,
                      who + "resumes " + std::to_string(resume.num_kv_tokens) + " KV positions of " +
                          std::to_string(known) + " tokens (at most the tokens before the last)");
  if (scheduler_.get(request_id) != nullptr)
    return make_error(ErrorCode::invalid_argument, who + "duplicate request id");
  // (An executor whose copier moves no bytes, the simulator's, restores
  // without a chunk: it prices the copy.)
  const bool restore = resume.num_kv_tokens > 0 &&
                       ((kv_io_.can_move_kv() && !resume.kv_chunk.empty()) ||
                        (kv_io_.can_copy_kv() && !kv_io_.copies_bytes() && resume.kv_chunk.empty()));
  // Positions the request had computed before it resumed here.
  const int known_positions =
      resume.output_ids.empty() ? resume.num_kv_tokens : static_cast<int>(known) - 1;
  if (restore) {
    if (Status s = kv_io_.hold_resumed(request_id, resume.num_kv_tokens, std::move(resume.kv_chunk),
                                       known_positions);
        !s.ok())
      return s;
  } else if (resume.num_kv_tokens > 0) {
    kv_io_.count_resume_fallback(known_positions);
  } else {
    kv_io_.count_resume_recompute(known_positions);
  }
  if (Status s = add_request(request_id, std::move(prompt_token_ids), params); !s.ok()) {
    kv_io_.drop(request_id);
    return s;
  }
  Sequence* seq = scheduler_.get(request_id);
  seq->grammar = std::move(replayed);
  for (std::int32_t id : resume.output_ids) {
    seq->output_ids.push_back(id);
    if (seq->detokenizer) (void)seq->detokenizer->push(id);
  }
  if (seq->detokenizer) seq->text = seq->detokenizer->text();
  seq->num_restore_tokens = restore ? resume.num_kv_tokens : 0;
  seq->num_streamed_tokens = resume.num_kv_tokens;  // the store has them already
  return Status::ok_status();
}

bool LlmEngine::abort_request(std::uint64_t request_id) {
  if (Sequence* live = scheduler_.get(request_id); live != nullptr && live->in_flight) {
    live->abort_requested = true;
    return true;
  }
  // A KV copy of it on the mover must land before its blocks are freed.
  if (kv_io_.move_pending(request_id))
    if (Status s = parts_.apply_done(kv_io_.drain_moves()); !s.ok() && deferred_error_.ok()) deferred_error_ = s;
  std::unique_ptr<Sequence> seq = scheduler_.finish(request_id, FinishReason::abort);
  if (!seq) return false;
  kv_io_.drop(request_id);
  aborted_.push_back(to_output(*seq));
  return true;
}

RequestOutput LlmEngine::to_output(Sequence& seq) {
  if (seq.detokenizer && seq.finish_reason != FinishReason::stop) {
    (void)seq.detokenizer->finish();
    seq.text = seq.detokenizer->text();
  }
  RequestOutput out;
  out.request_id = seq.id;
  out.prompt_token_ids = std::move(seq.prompt_ids);
  out.token_ids = std::move(seq.output_ids);
  out.text = std::move(seq.text);
  out.finish_reason = seq.finish_reason;
  out.stop_reason = std::move(seq.stop_reason);
  out.num_preemptions = seq.num_preemptions;
  out.num_cached_tokens = std::max(seq.num_cached_tokens, 0);
  out.logits = std::move(seq.captured_logits);
  out.logprobs = std::move(seq.logprobs);
  return out;
}

FinishReason LlmEngine::check_stop(Sequence& seq) {
  const std::int32_t last = seq.output_ids.back();
  const std::size_t old_len = seq.text.size();
  if (seq.detokenizer) {
    (void)seq.detokenizer->push(last);
    seq.text = seq.detokenizer->text();
  }
  const sampling::SamplingParams& p = seq.params;
  if (seq.num_output_tokens() >= p.min_tokens) {
    // Stop strings: earliest match that ends in the new text.
    std::size_t best = std::string::npos;
    const std::string* best_stop = nullptr;
    for (const std::string& stop : p.stop) {
      const std::size_t from = old_len >= stop.size() - 1 ? old_len - (stop.size() - 1) : 0;
      const std::size_t at = seq.text.find(stop, from);
      if (at != std::string::npos && at < best) {
        best = at;
        best_stop = &stop;
      }
    }
    if (best_stop != nullptr) {
      seq.text.resize(best);
      seq.stop_reason = *best_stop;
      return FinishReason::stop;
    }
    if (!p.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), last) !=
                             config_.eos_token_ids.end())
      return FinishReason::stop;
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end()) {
      seq.stop_reason = std::to_string(last);
      return FinishReason::stop;
    }
  }
  if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= config_.max_model_len)
    return FinishReason::length;
  return FinishReason::none;
}

Result<std::vector<RequestOutput>> LlmEngine::step() {
  const auto t0 = Clock::now();
  if (!deferred_error_.ok()) return deferred_error_.error();
  std::vector<RequestOutput> results = std::move(aborted_);
  aborted_.clear();
  if (!scheduler_.has_unfinished()) return results;

  if (Status s = fill_pipeline(); !s.ok()) return s.error();
  if (in_flight_.empty())
    return make_error(ErrorCode::internal, "scheduler planned an empty step with " +
                                               std::to_string(scheduler_.num_waiting()) + " waiting requests");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  Result<model::StepOutput> output = collect_oldest(f);
  if (!output.ok()) return std::move(output).error();
  const auto t_sample = Clock::now();
  const std::vector<Sequence*> sampled = sample_rows(f, output.value());
  f.stats.sample_ms = ms_since(t_sample);
  finish_sequences(f.sched, sampled, results);
  if (Status s = stream_increments(f.sched); !s.ok()) return s.error();

  f.stats.step_ms = ms_since(t0);
  step_stats_.push_back(f.stats);
  if (step_callback_) step_callback_(f.stats);
  return results;
}

Status LlmEngine::fill_pipeline() {
  // Device sampling returns ids only: not when the raw logits are captured.
  const bool device_sampling = executor_->samples_on_device() && !config_.capture_logits;
  // The depth is read each time: a phase transition may switch to a config
  // with another number of pipeline stages.
  while (static_cast<int>(in_flight_.size()) < std::max(1, executor_->max_in_flight())) {
    const auto t_sched = Clock::now();
    // A phased technique's admission for this micro-batch; a change of
    // phase waits until the pipeline is drained.
    long long admit_kv_tokens = -1;
    if (phases_) {
      Result<PhaseAdmission> admission = phases_->admit();
      if (admission.ok() && admission->transition_due) {
        if (!in_flight_.empty()) break;
        admission = phases_->transition();
      }
      if (!admission.ok()) return std::move(admission).error();
      admit_kv_tokens = admission->admit_kv_tokens;
    }
    // After any transition: the depth of the config this micro-batch runs in.
    const int depth = std::max(1, executor_->max_in_flight());
    MicroBatchBudget limits;
    bool limited = config_.token_budget != nullptr;
    if (limited) limits = config_.token_budget->budget(scheduler_.state(depth));
    if (phases_) limited = phases_->limits(depth, limited, limits);
    SchedulerOutput sched = scheduler_.schedule(limited ? &limits : nullptr, admit_kv_tokens);
    if (Status s = apply_kv_moves(sched); !s.ok()) return s;
    // A policy may hold everything back (e.g. Token Throttling pauses prefill
    // when the KV cache is nearly full); with nothing in flight that would
    // stall the engine, so fall back to the plain budget, whose preemption
    // always makes progress.
    if (sched.empty() && config_.token_budget && in_flight_.empty()) {
      sched = scheduler_.schedule(nullptr, admit_kv_tokens);
      if (Status s = apply_kv_moves(sched); !s.ok()) return s;
    }
    InFlight f;
    f.stats.schedule_ms = ms_since(t_sched);
    if (config_.check_integrity)
      if (Status s = scheduler_.check_integrity(); !s.ok()) return s;
    if (sched.empty()) {
      // Nothing runs until a KV copy lands (e.g. the first onboards of a
      // decode phase): the one wait on the mover that is not hidden.
      if (in_flight_.empty() && kv_io_.num_moves_pending() > 0) {
        if (Status s = parts_.apply_done(kv_io_.wait_moves()); !s.ok()) return s;
        continue;
      }
      break;
    }
    // A row that asks for logprobs needs its logits on the host: such a
    // micro-batch samples on the host.
    // Constrained rows sample on the device too, under their masks, once
    // these are ready (grammar_masks_ready).
    if (device_sampling && !wants_logprobs(sched) && grammar_masks_ready(sched, f.stats))
      attach_device_sampling(sched);
    f.submitted = Clock::now();
    offer_prefix_links(sched);
    LayerStreaming by_layer;
    arm_layer_streaming(sched, by_layer);
    Status submitted = executor_->submit(sched.input);
    if (!by_layer.seqs.empty()) {
      // Every layer went out: the step-end increment starts after them. A
      // failed layer copy is not the step's failure: the positions stay
      // unstreamed and go out whole after the step (whose own copy reports
      // a copier that keeps failing).
      const Status streamed = finish_layer_streaming(by_layer, submitted.ok());
      if (submitted.ok() && streamed.ok() && by_layer.layers_done == kv_io_.shape().num_layers)
        for (const LayerStream& ls : by_layer.seqs)
          if (Sequence* seq = scheduler_.get(ls.seq_id); seq != nullptr) seq->num_streamed_tokens = ls.token_end;
    }
    if (!submitted.ok()) return submitted;
    f.stats.num_seqs = static_cast<int>(sched.scheduled.size());
    f.stats.num_prefill_tokens = sched.num_prefill_tokens;
    f.stats.num_decode_tokens = sched.num_decode_tokens;
    f.stats.num_preemptions = sched.num_preemptions;
    if (phases_) phases_->on_submitted();
    f.sched = std::move(sched);
    in_flight_.push_back(std::move(f));
  }
  return Status::ok_status();
}

Status LlmEngine::apply_kv_moves(const SchedulerOutput& sched) {
  // Evicted named blocks go to the prefix tier before anything writes them
  // (this step, a restore or a copy into a block taken by eviction).
  if (prefix_tier_ != nullptr)
    for (const NamedBlock& b : sched.prefix_spills)
      if (Status s = spill_block(b); !s.ok()) return s;
  // Then the tier's blocks admissions took, into their new blocks.
  for (const TierRestore& r : sched.tier_restores)
    if (Status s = kv_io_.restore_tier_blocks(r, scheduler_.block_manager().block_table(r.seq_id)); !s.ok())
      return make_error(ErrorCode::internal, s.error().message);
  // Then the partial-block copies, before any move below writes a block: a
  // copy's source is pinned until the next schedule, so it is still the
  // block that was matched.
  for (const PrefixCopy& c : sched.prefix_copies)
    if (Status s = kv_io_.copy_prefix(c, scheduler_.block_manager().block_table(c.seq_id)); !s.ok())
      return make_error(ErrorCode::internal, s.error().message);
  for (const SwapOut& swap : sched.swap_outs) {
    Result<bool> kept = kv_io_.swap_out(swap);
    if (!kept.ok()) return kept.error();
    if (!*kept)  // no room in the swap space: this victim recomputes
      if (Sequence* seq = scheduler_.get(swap.seq_id); seq != nullptr) seq->num_restore_tokens = 0;
  }
  if (Status s = parts_.offload_all(sched.offloads, phases_.get()); !s.ok()) return s;
  for (const KvRestore& r : sched.restores)
    if (Status s = kv_io_.restore(r, scheduler_.block_manager().block_table(r.seq_id)); !s.ok())
      return make_error(ErrorCode::internal, s.error().message);
  for (const KvRestore& r : sched.onboards)
    if (Status s = kv_io_.begin_onboard(r, scheduler_.block_manager().block_table(r.seq_id)); !s.ok())
      return make_error(ErrorCode::internal, s.error().message);
  return Status::ok_status();
}

bool LlmEngine::restream_kv(std::uint64_t request_id) {
  Sequence* seq = scheduler_.get(request_id);
  if (seq == nullptr || seq->is_finished()) return false;
  seq->num_streamed_tokens = 0;
  return true;
}

void LlmEngine::offer_prefix_links(const SchedulerOutput& sched) {
  if (kv_sink_ == nullptr || !kv_io_.can_move_kv()) return;
  const BlockManager& blocks = scheduler_.block_manager();
  const int block_size = blocks.block_size();
  for (const model::StepSeq& s : sched.input.seqs) {
    Sequence* seq = scheduler_.get(s.seq_id);
    if (seq == nullptr || seq->prefix_link_offered) continue;
    seq->prefix_link_offered = true;
    // A resumed or restored request has no cached head (num_cached_tokens
    // 0): its KV came from the store or is streamed already.
    const int num_blocks = std::max(seq->num_cached_tokens, 0) / block_size;
    if (num_blocks == 0 || seq->num_streamed_tokens != 0) continue;
    const std::vector<std::uint64_t> names =
        blocks.head_names(BlockManager::Tokens{seq->prompt_ids, seq->output_ids}, num_blocks);
    if (names.empty()) continue;
    const auto n = names.size() * static_cast<std::size_t>(block_size);
    if (n > seq->prompt_ids.size()) continue;  // a head past the prompt: no first admission
    const int linked = kv_sink_->link_prefix(seq->id, blocks.root_name(), names,
                                             std::span<const std::int32_t>(seq->prompt_ids.data(), n),
                                             seq->num_prompt_tokens());
    // Whole blocks of the cached head, which the step does not write.
    if (linked > 0 && linked % block_size == 0 && linked <= std::min<int>(static_cast<int>(n), s.num_computed_tokens))
      seq->num_streamed_tokens = linked;
  }
}

void LlmEngine::arm_layer_streaming(const SchedulerOutput& sched, LayerStreaming& ls) {
  // One step at a time (the hook reads the cache while this step runs).
  if (!stream_prompt_by_layer_ || kv_sink_ == nullptr || !kv_io_.can_move_kv() ||
      !executor_->supports_layer_kv_hook() || executor_->max_in_flight() != 1 || sched.num_prefill_tokens == 0 ||
      !kv_sink_->accepting())
    return;
  for (const model::StepSeq& s : sched.input.seqs) {
    const Sequence* seq = scheduler_.get(s.seq_id);
    // A prefill chunk that continues the streamed positions (no catch-up gap).
    if (seq == nullptr || s.num_new_tokens <= 1 || seq->num_streamed_tokens != s.num_computed_tokens) continue;
    ls.seqs.push_back({s.seq_id, s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens});
  }
  if (ls.seqs.empty()) return;
  LayerStreaming* state = &ls;
  if (kv_io_.copies_in_stream_order()) {
    // The layer's KV write is only queued on the device: begin its copies
    // behind it (they overlap the next layers); finish_layer_streaming pushes them.
    executor_->set_layer_kv_hook([this, state](int layer) {
      if (!state->error.ok()) return;
      std::vector<kvstore::KvCopyItem> items;
      for (const LayerStream& s : state->seqs)
        items.push_back({scheduler_.block_manager().block_table(s.seq_id),
                         kvstore::KvRange{layer, layer + 1, s.token_begin, s.token_end}});
      Result<std::uint64_t> ticket = kv_io_.begin_copy_layers(items);
      if (!ticket.ok()) {
        state->error = make_error(ErrorCode::internal, "KV streaming (layer " + std::to_string(layer) +
                                                           "): " + ticket.error().message);
        return;
      }
      state->tickets.emplace_back(layer, *ticket);
      ++state->layers_done;
    });
    return;
  }
  executor_->set_layer_kv_hook([this, state](int layer) {
    if (!state->error.ok()) return;
    for (const LayerStream& s : state->seqs) {
      if (scheduler_.get(s.seq_id) == nullptr) continue;
      Result<std::vector<std::byte>> chunk = kv_io_.copy_layers(scheduler_.block_manager().block_table(s.seq_id),
                                                                layer, layer + 1, s.token_begin, s.token_end);
      if (!chunk.ok()) {
        state->error = make_error(ErrorCode::internal, "KV streaming (layer " + std::to_string(layer) +
                                                           "): " + chunk.error().message);
        return;
      }
      kv_sink_->push(layer_increment(s, layer, std::move(chunk).value()));
    }
    ++state->layers_done;
  });
}

Status LlmEngine::finish_layer_streaming(LayerStreaming& ls, bool step_ran) {
  executor_->set_layer_kv_hook({});
  Status result = ls.error;
  std::vector<kvstore::KvRange> ranges;
  for (const auto& [layer, ticket] : ls.tickets) {
    ranges.clear();
    for (const LayerStream& s : ls.seqs) ranges.push_back(kvstore::KvRange{layer, layer + 1, s.token_begin, s.token_end});
    // Every ticket ends, so that the copier's memory is free for the next step.
    Result<std::vector<std::vector<std::byte>>> chunks = kv_io_.end_copy_layers(ticket, ranges);
    if (!result.ok() || !step_ran) continue;
    if (!chunks.ok()) {
      result = make_error(ErrorCode::internal,
                          "KV streaming (layer " + std::to_string(layer) + "): " + chunks.error().message);
      continue;
    }
    for (std::size_t i = 0; i < ls.seqs.size(); ++i)
      if (scheduler_.get(ls.seqs[i].seq_id) != nullptr)
        kv_sink_->push(layer_increment(ls.seqs[i], layer, std::move((*chunks)[i])));
  }
  return result;
}

KvIncrement LlmEngine::layer_increment(const LayerStream& ls, int layer, std::vector<std::byte> chunk) {
  const Sequence* seq = scheduler_.get(ls.seq_id);
  KvIncrement inc;
  inc.request_id = ls.seq_id;
  inc.range = kvstore::KvRange{layer, layer + 1, ls.token_begin, ls.token_end};
  inc.chunk = std::move(chunk);
  for (int p = ls.token_begin; p < ls.token_end; ++p) inc.token_ids.push_back(seq->token_at(p));
  inc.num_prompt_tokens = seq->num_prompt_tokens();
  return inc;
}

Status LlmEngine::stream_increments(const SchedulerOutput& sched) {
  if (kv_sink_ == nullptr || !kv_io_.can_move_kv() || !kv_sink_->accepting()) return Status::ok_status();
  // Every sequence's increment in one batch (one gather on a device).
  std::vector<kvstore::KvCopyItem> items;
  std::vector<Sequence*> seqs;
  for (const model::StepSeq& step_seq : sched.input.seqs) {
    // By id: a sequence that finished in this step is gone (its pointer in
    // sched.scheduled dangles).
    const std::uint64_t id = step_seq.seq_id;
    Sequence* seq = scheduler_.get(id);
    if (seq == nullptr || seq->is_finished() || seq->num_computed_tokens <= seq->num_streamed_tokens) continue;
    items.push_back({scheduler_.block_manager().block_table(id),
                     kvstore::KvRange{0, kv_io_.shape().num_layers, seq->num_streamed_tokens, seq->num_computed_tokens}});
    seqs.push_back(seq);
  }
  if (items.empty()) return Status::ok_status();
  Result<std::vector<std::vector<std::byte>>> chunks = kv_io_.copy_increments(items);
  if (!chunks.ok()) return make_error(ErrorCode::internal, "KV streaming: " + chunks.error().message);
  for (std::size_t i = 0; i < items.size(); ++i) {
    Sequence* seq = seqs[i];
    KvIncrement inc;
    inc.request_id = seq->id;
    inc.range = items[i].range;
    inc.chunk = std::move((*chunks)[i]);
    for (int p = inc.range.token_begin; p <= inc.range.token_end; ++p) inc.token_ids.push_back(seq->token_at(p));
    inc.num_prompt_tokens = seq->num_prompt_tokens();
    seq->num_streamed_tokens = seq->num_computed_tokens;
    kv_sink_->push(std::move(inc));
  }
  return Status::ok_status();
}

bool LlmEngine::wants_logprobs(const SchedulerOutput& sched) {
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i)
    if (sched.input.seqs[i].needs_logits && sched.scheduled[i].seq->params.logprobs >= 0) return true;
  return false;
}

bool LlmEngine::has_grammar(const SchedulerOutput& sched) {
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i)
    if (sched.input.seqs[i].needs_logits && sched.scheduled[i].seq->grammar) return true;
  return false;
}

bool LlmEngine::grammar_masks_ready(const SchedulerOutput& sched, StepStats& stats) {
  if (!has_grammar(sched)) return true;
  const auto t_wait = Clock::now();
  const Status filled = grammar_masks_.wait();
  stats.grammar_wait_ms += ms_since(t_wait);
  stats.grammar_fill_ms += grammar_masks_.last_fill_ms();
  if (!filled.ok()) {
    if (deferred_error_.ok()) deferred_error_ = filled;
    return false;
  }
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i) {
    if (!sched.input.seqs[i].needs_logits) continue;
    GrammarState* g = sched.scheduled[i].seq->grammar.get();
    if (g == nullptr) continue;
    // A grammar with no next mask (ended, or its fill fails): sample_rows
    // ends that request on the host.
    if (g->matcher.is_terminated() || !g->fill_mask().ok()) return false;
  }
  return true;
}

void LlmEngine::attach_device_sampling(SchedulerOutput& sched) const {
  sched.input.sampling.clear();
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i) {
    if (!sched.input.seqs[i].needs_logits) continue;
    const Sequence& seq = *sched.scheduled[i].seq;
    model::RowSampling row;
    row.params = &seq.params;
    row.ctx = sample_context(seq);
    if (seq.grammar) row.token_bitmask = seq.grammar->mask;  // ready: grammar_masks_ready
    sched.input.sampling.push_back(row);
  }
}

Result<model::StepOutput> LlmEngine::collect_oldest(InFlight& f) {
  Result<model::StepOutput> exec = executor_->collect();
  if (!exec.ok()) return std::move(exec).error();
  f.stats.execute_ms = ms_since(f.submitted);
  const model::StepOutput& out = exec.value();
  const int num_logits = f.sched.input.num_logits();
  const auto vocab = static_cast<std::size_t>(out.vocab_size);
  if (!f.sched.input.sampling.empty()) {
    if (out.sampled_token_ids.size() != static_cast<std::size_t>(num_logits))
      return make_error(ErrorCode::internal, "executor returned " + std::to_string(out.sampled_token_ids.size()) +
                                                 " sampled ids for " + std::to_string(num_logits) + " rows");
  } else if (out.vocab_size < 1 || out.logits.size() != vocab * static_cast<std::size_t>(num_logits)) {
    return make_error(ErrorCode::internal, "executor returned " + std::to_string(out.logits.size()) +
                                               " logits for " + std::to_string(num_logits) + " rows of vocab " +
                                               std::to_string(out.vocab_size));
  }
  return exec;
}

std::vector<Sequence*> LlmEngine::sample_rows(InFlight& f, model::StepOutput& output) {
  const SchedulerOutput& sched = f.sched;
  const bool sampled_on_device = !sched.input.sampling.empty();
  const auto vocab = static_cast<std::size_t>(output.vocab_size);
  std::vector<std::int32_t> sampled;
  std::vector<Sequence*> sampled_seqs;
  sampled.reserve(static_cast<std::size_t>(sched.input.num_logits()));
  std::vector<float> scratch;  // [vocab] when a row's params change its logits
  std::vector<float> masked;   // [vocab]: a constrained row's masked logits when its raw row is kept for logprobs
  // The masks filled beside this micro-batch's forward pass (for a
  // micro-batch sampled on the device, waited for before it went out).
  const auto t_wait = Clock::now();
  if (Status s = grammar_masks_.wait(); !s.ok() && deferred_error_.ok()) deferred_error_ = s;
  f.stats.grammar_wait_ms += ms_since(t_wait);
  f.stats.grammar_fill_ms += grammar_masks_.last_fill_ms();
  std::vector<std::shared_ptr<GrammarState>> constrained;  // sampled now: their next masks
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i) {
    if (!sched.input.seqs[i].needs_logits) continue;
    Sequence& seq = *sched.scheduled[i].seq;
    // A grammar that cannot go on ends its request (finish_reason abort,
    // the reason in stop_reason), never the engine: its stop token was
    // taken but the request did not stop on it (a stop token the engine
    // does not stop on), or the sampled token is refused (every allowed
    // token masked again after the grammar's mask, e.g. min_tokens holding
    // back the only allowed stop token).
    Status grammar_ok = Status::ok_status();
    std::int32_t id = 0;
    if (seq.grammar) ++f.stats.num_constrained_rows;
    if (sampled_on_device) {  // constrained rows under their masks (grammar_masks_ready)
      id = output.sampled_token_ids[sampled.size()];
    } else {
      float* row = output.logits.data() + sampled.size() * vocab;
      if (config_.capture_logits) seq.captured_logits.emplace_back(row, row + vocab);
      const float* sample_from = row;
      if (seq.grammar) {
        if (seq.grammar->matcher.is_terminated())
          grammar_ok = make_error(ErrorCode::invalid_argument, "complete, but the request did not stop");
        else
          grammar_ok = seq.grammar->fill_mask();
        if (grammar_ok.ok()) {
          // In place, unless the raw row is still needed (logprobs are those
          // of the unmasked row, as vLLM returns them).
          std::span<float> to_mask{row, vocab};
          if (seq.params.logprobs >= 0) {
            masked.assign(row, row + vocab);
            to_mask = masked;
          }
          sampling::apply_token_bitmask(to_mask, seq.grammar->mask);
          sample_from = to_mask.data();
        }
      }
      id = sampling::sample_row({sample_from, vocab}, seq.params, sample_context(seq), scratch);
      if (seq.params.logprobs >= 0)
        seq.logprobs.push_back(sampling::compute_logprobs({row, vocab}, id, seq.params.logprobs));
    }
    if (seq.grammar) {
      if (grammar_ok.ok()) grammar_ok = seq.grammar->accept(id);
      if (!grammar_ok.ok()) {
        seq.stop_reason = "grammar: " + grammar_ok.error().message;
        seq.abort_requested = true;
      } else if (!seq.grammar->matcher.is_terminated()) {
        constrained.push_back(seq.grammar);
      }
    }
    sampled.push_back(id);
    sampled_seqs.push_back(&seq);
  }
  scheduler_.update(sched, sampled);
  grammar_masks_.start(std::move(constrained));
  return sampled_seqs;
}

void LlmEngine::finish_sequences(const SchedulerOutput& sched, const std::vector<Sequence*>& sampled,
                                 std::vector<RequestOutput>& results) {
  std::vector<std::uint64_t> abort_ids;  // aborts that waited for this micro-batch
  for (const ScheduledSeq& s : sched.scheduled)
    if (s.seq->abort_requested) abort_ids.push_back(s.seq->id);
  for (Sequence* seq : sampled) {
    if (seq->abort_requested) continue;
    const FinishReason reason = check_stop(*seq);
    if (reason == FinishReason::none) continue;
    std::unique_ptr<Sequence> done = scheduler_.finish(seq->id, reason);
    kv_io_.drop(seq->id);
    results.push_back(to_output(*done));
  }
  for (std::uint64_t id : abort_ids) {
    kv_io_.drop(id);
    results.push_back(to_output(*scheduler_.finish(id, FinishReason::abort)));
  }
  std::sort(results.begin(), results.end(),
            [](const RequestOutput& a, const RequestOutput& b) { return a.request_id < b.request_id; });
}

Result<std::vector<RequestOutput>> LlmEngine::generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                                       const sampling::SamplingParams& params,
                                                       std::shared_ptr<const sampling::CompiledGrammar> grammar) {
  if (has_unfinished())
    return make_error(ErrorCode::invalid_argument, "generate: requests are already in flight");
  if (Status s = params.validate(); !s.ok()) return s.error();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (Status s = add_request(i, prompts[i], params, grammar); !s.ok()) {
      for (std::size_t j = 0; j < i; ++j) (void)scheduler_.finish(j, FinishReason::abort);
      return s.error();
    }
  }
  std::vector<RequestOutput> outputs(prompts.size());
  while (has_unfinished()) {
    Result<std::vector<RequestOutput>> r = step();
    if (!r.ok()) return std::move(r).error();
    for (RequestOutput& o : r.value()) outputs[o.request_id] = std::move(o);
  }
  return outputs;
}

}  // namespace shardline::engine
