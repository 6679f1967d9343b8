#pragma once
/// \file
/// The unit of work of an offline job: one input line of an OpenAI Batch
/// JSONL shard, as a request (parsed) and as a result (to be written as one
/// output line). Plain structs shared by the orchestrator, the workers and
/// the message codec (messages/).

#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sampling/sampling_params.hpp"

namespace shardline::worker {

/// One input line of a job: the unit the orchestrator hands out, a worker
/// holds and a result names.
struct LineRef {
  std::uint64_t job_id = 0;
  std::uint64_t line_index = 0;  ///< 0-based, blank lines not counted
  auto operator<=>(const LineRef&) const = default;
};

/// The KV store's request id of choice `choice` of line `line_index`
/// (n <= 128, so the choice fits the low 8 bits).
[[nodiscard]] constexpr std::uint64_t kv_request_key(std::uint64_t line_index, int choice) noexcept {
  return line_index << 8 | static_cast<std::uint64_t>(choice);
}

/// Where one choice of a line resumes after its worker failed (DéjàVu,
/// seed 003 §4.2.3): the tokens it had generated and the KV of its first
/// positions as the KV store kept them.
struct ChoiceResume {
  std::vector<std::int32_t> output_ids;  ///< generated tokens known to be durable
  int num_kv_tokens = 0;                 ///< positions [0, n) of KV in kv_chunk (replicated_tokens)
  /// Canonical chunk (kvstore/kv_stream.hpp) of all layers x [0, num_kv_tokens);
  /// fetched from the store by the worker, empty when num_kv_tokens is 0.
  std::vector<std::byte> kv_chunk;
  bool operator==(const ChoiceResume&) const = default;
};

/// A choice's replicated progress, as its worker reports it to the
/// orchestrator after the KV store acknowledged a flush (the paper's
/// (x, j, t) acknowledgement, seed 003 §4.2.3, with the tokens): positions
/// [0, replicated_tokens) of its KV are durable at the store's sync level and
/// held by every replica that counts, and `output_ids` are tokens it
/// generated (at positions from the prompt's end on), such that
/// ChoiceResume{output_ids, replicated_tokens} is a valid resume
/// (worker/kv_progress.hpp says how). The orchestrator keeps the latest.
struct KvProgress {
  std::uint64_t job_id = 0;
  std::uint64_t line_index = 0;
  int choice = 0;
  int replicated_tokens = 0;
  std::vector<std::int32_t> output_ids;
  bool operator==(const KvProgress&) const = default;
};

/// One input line, parsed and validated as far as the orchestrator can
/// without a tokenizer (the worker checks prompt length against the context).
struct BatchRequest {
  std::uint64_t job_id = 0;
  std::uint64_t line_index = 0;  ///< 0-based index over all shards of the job, in order
  std::string custom_id;         ///< from the line, or the 1-based line number as text
  std::string prompt;            ///< text prompt (empty when prompt_token_ids is given)
  std::vector<std::int32_t> prompt_token_ids;  ///< a prompt given as token ids
  sampling::SamplingParams params;  ///< has_seed set when the line gave "seed"
  bool return_token_ids = false;
  int n = 1;  ///< choices per prompt (>= 1); choice i samples with seed + i
  /// The job's per-micro-batch token budget policy (make_token_budget_policy
  /// names: "fixed", "throttle"); "" = "fixed". Set by JobManager::next_work
  /// from the job; it never changes the line's tokens, only the pace.
  std::string token_budget;
  /// [n] when the line resumes after a failure (choice i from resume[i]);
  /// empty for a fresh line.
  std::vector<ChoiceResume> resume;
  /// The 1-based line number in its shard (blank lines counted), for the
  /// `line` of the line's error result. The orchestrator's own: not on the
  /// wire (a worker sees 0).
  std::uint64_t input_line = 0;

  // ---- structured outputs ----
  /// What the output must match (response_format, guided_*,
  /// structured_outputs; orchestrator/batch_format.hpp): a
  /// sampling::GrammarKind name, "json_schema", "json_object", "regex",
  /// "choice" or "ebnf"; "" = unconstrained.
  std::string grammar_kind;
  std::string grammar_text;                  ///< the schema, regex or grammar
  std::vector<std::string> grammar_choices;  ///< "choice": the allowed outputs
  bool grammar_any_whitespace = true;        ///< JSON kinds: any whitespace between tokens

  // ---- /v1/chat/completions lines ----
  /// A chat line: the worker renders `messages_json` with the chat template
  /// (text/chat_template.hpp) and tokenizes the result without adding
  /// special tokens (the template writes them), as vLLM does.
  bool chat = false;
  /// The conversation: a JSON array of messages, as text (content parts
  /// already joined to strings by the parser).
  std::string messages_json;
  /// `chat_template_kwargs`: a JSON object as text ("" = none); extra
  /// template globals such as Qwen3's enable_thinking.
  std::string chat_template_kwargs_json;
  bool add_generation_prompt = true;
  /// The job's `--chat-template` text; "" = the model folder's template.
  /// Set by JobManager::next_work from the job, like token_budget.
  std::string chat_template;
  /// Chat lines without max_tokens / max_completion_tokens generate up to
  /// the context's end (max_model_len - prompt tokens), as vLLM does.
  bool max_tokens_from_context = false;

  /// Completions `echo`: each choice's text starts with the prompt's text.
  bool echo = false;
};

/// The logprob of one token as output lines show it.
struct TokenLogprobText {
  std::string token;  ///< the token's text, valid UTF-8 (partial characters become U+FFFD)
  std::string bytes;  ///< the token's raw bytes (Tokenizer::token_bytes)
  float logprob = 0.0f;
  bool operator==(const TokenLogprobText&) const = default;
};

/// One generated token's logprobs (sampling/logprobs.hpp) with texts.
struct ChoiceTokenLogprobs {
  TokenLogprobText sampled;
  std::vector<TokenLogprobText> top;  ///< most likely first
  /// Completions `text_offset`: where this token's text starts in the
  /// choice's text, in Unicode code points (after the prompt with echo).
  int text_offset = 0;
  bool operator==(const ChoiceTokenLogprobs&) const = default;
};

/// One choice of a completion.
struct BatchChoice {
  int index = 0;
  std::string text;
  std::string finish_reason;  ///< "stop" or "length"
  std::vector<std::int32_t> token_ids;  ///< filled when return_token_ids
  /// [generated tokens] when the request asked for logprobs; else empty.
  std::vector<ChoiceTokenLogprobs> logprobs;
};

/// The result of one input line: a completion or a per-line error.
struct BatchResult {
  std::uint64_t job_id = 0;
  std::uint64_t line_index = 0;
  std::string custom_id;
  bool ok = false;
  // ok == true:
  bool chat = false;   ///< a chat.completion (else a text_completion)
  int logprobs = -1;   ///< top logprobs asked for (SamplingParams::logprobs); -1 = none
  std::vector<BatchChoice> choices;
  int prompt_tokens = 0;
  int completion_tokens = 0;  ///< over all choices
  /// Of prompt_tokens, those the first choice found in the worker's prefix
  /// cache (engine/prefix_cache.hpp). Not in the output line (it depends on
  /// timing, and a job's output must not): only the job's hit rate.
  int cached_tokens = 0;
  // ok == false (OpenAI batch error object):
  std::string error_code;     ///< e.g. "invalid_json", "missing_prompt", "context_length_exceeded"
  std::string error_message;  ///< human-readable, names the field
};

}  // namespace shardline::worker
