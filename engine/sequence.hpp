#pragma once
/// \file
/// Per-request state shared by the scheduler and the engine. One request is
/// one sequence (no beam search / n > 1).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/sampling_params.hpp"
#include "text/tokenizer.hpp"
#include "sampling/logprobs.hpp"

namespace shardline::engine {

struct GrammarState;  // engine/structured_output/grammar_masks.hpp

enum class SeqStatus { waiting, running, finished };

enum class FinishReason { none, stop, length, abort };

/// A copy of the sequence's KV that Seesaw's prefetcher thread is running
/// (seed 000 §5.2, engine/seesaw/kv_mover.hpp). While one is pending the sequence
/// is in no step, cannot be preempted, and keeps its device blocks.
enum class KvPending {
  none,
  offloading,  ///< waiting: its KV is being copied out to the host KV buffer; its blocks are freed when done
  onboarding,  ///< running: its KV is being copied in from the host (a prefetch); it decodes when done
};

/// "stop" / "length" / "abort" ("" for none) — OpenAI / vLLM finish_reason.
[[nodiscard]] constexpr const char* finish_reason_name(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::none: break;
  }
  return "";
}

struct Sequence {
  std::uint64_t id = 0;
  std::uint64_t arrival = 0;  ///< admission order (scheduler-assigned, FCFS priority)
  std::vector<std::int32_t> prompt_ids;
  std::vector<std::int32_t> output_ids;
  sampling::SamplingParams params;
  std::uint64_t seed = 0;  ///< effective RNG key (params.seed or derived from the id)
  /// Ids masked while output_ids.size() < params.min_tokens.
  std::vector<std::int32_t> min_tokens_masked_ids;

  SeqStatus status = SeqStatus::waiting;
  /// Tokens whose KV is in the cache. Reset to 0 by preemption.
  int num_computed_tokens = 0;
  /// Waiting only: positions [0, num_restore_tokens) whose KV the engine
  /// holds outside the cache (swapped out by a swap preemption, or fetched
  /// from a KV store to resume after a failure) and copies back in when the
  /// scheduler admits the sequence, instead of recomputing them. 0: none.
  int num_restore_tokens = 0;
  /// Positions [0, num_streamed_tokens) whose KV the engine has handed to
  /// its stream sink (or that a resumed request brought from a KV store).
  int num_streamed_tokens = 0;
  /// Its cached head was offered to the stream sink as a prefix link
  /// (KvStreamSink::link_prefix), once, at its first step.
  bool prefix_link_offered = false;
  int num_preemptions = 0;
  /// Prefix caching: prompt positions found cached (shared or copied) at its
  /// first admission with nothing to restore; -1 before (or never).
  int num_cached_tokens = -1;
  /// Part of a micro-batch whose logits are not back yet (pipeline
  /// parallelism): not scheduled again, not preempted, finished only later.
  bool in_flight = false;
  bool abort_requested = false;  ///< aborted while in flight: finish when it lands
  KvPending kv_pending = KvPending::none;

  FinishReason finish_reason = FinishReason::none;
  std::string stop_reason;  ///< the matched stop string, or the stop token id as text
  std::string text;         ///< detokenized output (stop string and what follows cut)
  std::unique_ptr<text::IncrementalDetokenizer> detokenizer;  ///< engine-owned, may be null
  std::vector<std::vector<float>> captured_logits;  ///< EngineConfig::capture_logits rows
  /// With params.logprobs >= 0: one entry per token sampled by this engine
  /// (a resumed sequence's given output_ids have none).
  std::vector<sampling::SampleLogprobs> logprobs;
  /// Structured outputs: the grammar its tokens must match and the mask of
  /// its next token (shared with the mask filler's thread); null when the
  /// request is unconstrained.
  std::shared_ptr<GrammarState> grammar;

  /// Prompt plus generated tokens: every token with a known id.
  [[nodiscard]] int num_tokens() const {
    return static_cast<int>(prompt_ids.size() + output_ids.size());
  }
  [[nodiscard]] int num_prompt_tokens() const { return static_cast<int>(prompt_ids.size()); }
  [[nodiscard]] int num_output_tokens() const { return static_cast<int>(output_ids.size()); }
  /// In its decode phase: prefilled (a token generated) and every position
  /// but the last token's computed (or all of them, while its decode step is
  /// in flight). A decode step computes one token.
  [[nodiscard]] bool is_decoding() const {
    return num_output_tokens() > 0 && num_computed_tokens >= num_tokens() - 1;
  }
  /// Token id at absolute position `pos` (< num_tokens()).
  [[nodiscard]] std::int32_t token_at(int pos) const {
    return pos < num_prompt_tokens() ? prompt_ids[static_cast<std::size_t>(pos)]
                                     : output_ids[static_cast<std::size_t>(pos - num_prompt_tokens())];
  }
  [[nodiscard]] bool is_finished() const { return status == SeqStatus::finished; }
};

}  // namespace shardline::engine
